"""D4RL-style HDF5 files: flat ``observations`` / ``next_observations`` datasets.

The rest of a D4RL file (``actions``, ``rewards``, ``terminals``, ``timeouts``, ``infos/*``,
``metadata/*``) is copied exactly. obsdelta's own group (exception rows, the layout of
``next_observations``, a delta of it) is ``/metadata/obsdelta`` in a file with a ``metadata``
group, as D4RL's own files have: D4RL readers take every root object for data and set
``metadata`` apart (TorchRL's ``D4RLExperienceReplay`` builds its cache from a compressed file
as from the original). Rows are time, so ``exact`` finds ``observations[t+1]`` in the next row.
"""

from __future__ import annotations

import h5py

from .base import Key, Pair, Source
from .hdf5 import HDF5Format
from .hdf5_walk import OWN, OWN_IN_METADATA, own_key

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

    @classmethod
    def own_place(cls, f: h5py.File) -> str:
        metadata = f.get("metadata")
        return OWN_IN_METADATA if isinstance(metadata, h5py.Group) and len(metadata) else OWN

    def pairs(self, source: Source) -> list[Pair]:
        delta = (*own_key(self.own_for(source)), "delta", *NEXT)
        return [Pair(OBS, NEXT, delta, "next_observations", ("observations",))]

    @classmethod
    def ted_name(cls, key: Key) -> Key:
        return TED_NAMES.get(key, key)
