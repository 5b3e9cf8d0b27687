"""D4RL-style HDF5 files: flat ``observations`` / ``next_observations`` datasets.

The rest of a D4RL file (``actions``, ``rewards``, ``terminals``, ``timeouts``, ``infos/*``,
``metadata/*``) is copied exactly. The delta of ``next_observations`` is stored at
``/obsdelta/delta/next_observations``; rows are time, so ``exact`` finds ``observations[t+1]``
in the next row.
"""

from __future__ import annotations

import h5py

from .base import Key, Pair, Source
from .hdf5 import OWN, HDF5Format

OBS = ("observations",)
NEXT = ("next_observations",)
#: D4RL's names, as training reads give them (TorchRL's TED names).
TED_NAMES: dict[Key, Key] = {
    OBS: ("observation",),
    NEXT: ("next", "observation"),
    ("actions",): ("action",),
    ("rewards",): ("next", "reward"),
    ("terminals",): ("next", "terminated"),
    ("timeouts",): ("next", "truncated"),
}


class D4RL(HDF5Format):
    name = "d4rl-hdf5"
    summary = "D4RL-style HDF5 (observations, next_observations, actions, rewards, ...)"

    @classmethod
    def matches(cls, f: h5py.File) -> bool:
        return isinstance(f.get("observations"), h5py.Dataset)

    def pairs(self, source: Source) -> list[Pair]:
        return [Pair(OBS, NEXT, (OWN, "delta", *NEXT), "next_observations", ("observations",))]

    @classmethod
    def ted_name(cls, key: Key) -> Key:
        return TED_NAMES.get(key, key)
