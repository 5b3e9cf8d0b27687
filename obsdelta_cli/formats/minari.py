"""Minari datasets (``main_data.hdf5``): one group per episode, observations stored once.

Each ``episode_N/observations`` holds T+1 rows, so every observation is already stored once and
there is no next observation to delta-encode. obsdelta recognises the layout to say so.
"""

from __future__ import annotations

import h5py

from ..errors import InputError
from .base import NOTHING_HINT, Pair, Source
from .hdf5 import HDF5Format, h5_groups

ALREADY_ONCE = (
    "is a Minari dataset: each episode stores its T+1 observations once, with no separate "
    "next observations, so there is nothing for obsdelta to remove"
)


class Minari(HDF5Format):
    name = "minari-hdf5"
    summary = "Minari main_data.hdf5 (episode_N groups; observations already stored once)"
    nothing_to_do = ALREADY_ONCE

    @classmethod
    def matches(cls, f: h5py.File) -> bool:
        return any(
            name.startswith("episode_") and "observations" in group for name, group in h5_groups(f)
        )

    def pairs(self, source: Source) -> list[Pair]:
        raise InputError(ALREADY_ONCE, file=source.path, hint=NOTHING_HINT)
