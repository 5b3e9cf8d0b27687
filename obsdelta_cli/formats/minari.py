"""Minari datasets (``main_data.hdf5``): one group per episode, observations stored once.

Each ``episode_N/observations`` holds T+1 rows, so every observation is already stored once and
there is no next observation to delta-encode. obsdelta recognises the layout to say so.
"""

from __future__ import annotations

from collections.abc import Iterable

import h5py

from ..errors import InputError
from .base import NOTHING_HINT, Key, Pair, Source, episode_order
from .hdf5 import HDF5Format, h5_groups

ALREADY_ONCE = (
    "is a Minari dataset: each episode stores its T+1 observations once, with no separate "
    "next observations, so there is nothing for obsdelta to remove"
)


#: Minari's names inside an episode, as training reads give them (TorchRL's TED names).
TED_NAMES: dict[str, Key] = {
    "actions": ("action",),
    "rewards": ("next", "reward"),
    "terminations": ("next", "terminated"),
    "truncations": ("next", "truncated"),
}


class Minari(HDF5Format):
    name = "minari-hdf5"
    summary = "Minari main_data.hdf5 (episode_N groups; observations already stored once)"
    nothing_to_do = ALREADY_ONCE
    observations_once = True

    @classmethod
    def ted_name(cls, key: Key) -> Key:
        rest = key[1:]  # inside episode_N
        if rest[0] == "observations":
            return rest[1:] or ("observation",)
        return TED_NAMES.get(rest[0], rest) if len(rest) == 1 else rest

    @classmethod
    def episodes(cls, keys: Iterable[Key]) -> list[list[Key]]:
        found: dict[str, list[Key]] = {}
        for key in keys:
            if key[0].startswith("episode_") and len(key) > 1:
                found.setdefault(key[0], []).append(key)
        return [found[name] for name in sorted(found, key=episode_order)]

    @classmethod
    def matches(cls, f: h5py.File) -> bool:
        return any(
            name.startswith("episode_") and "observations" in group for name, group in h5_groups(f)
        )

    def pairs(self, source: Source) -> list[Pair]:
        raise InputError(ALREADY_ONCE, file=source.path, hint=NOTHING_HINT)
