"""robomimic HDF5 files: ``data/demo_N/obs/<name>`` beside ``data/demo_N/next_obs/<name>``.

Every demo is its own episode, so each ``(obs/<name>, next_obs/<name>)`` of each demo is a pair
with its own rows; reports add a name up over all demos, as ``next_obs/<name>``. Deltas are
stored at ``/obsdelta/delta/data/demo_N/next_obs/<name>``; everything else (``actions``,
``states``, ``rewards``, ``dones``, the ``mask`` group, every attribute) is copied exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

import h5py

from .base import Key, Pair, Source, episode_order
from .hdf5 import OWN, HDF5Format, h5_groups

#: robomimic's names inside a demo, as training reads give them (TorchRL's TED names).
TED_NAMES: dict[str, Key] = {
    "actions": ("action",),
    "rewards": ("next", "reward"),
    "dones": ("next", "done"),
    "states": ("state",),
}


class Robomimic(HDF5Format):
    name = "robomimic-hdf5"
    summary = "robomimic HDF5 (data/demo_N/obs/<name> and next_obs/<name>)"

    @classmethod
    def matches(cls, f: h5py.File) -> bool:
        data = f.get("data")
        return isinstance(data, h5py.Group) and any(
            isinstance(demo.get("obs"), h5py.Group) for _, demo in h5_groups(data)
        )

    def pairs(self, source: Source) -> list[Pair]:
        out = []
        for demo_name, demo in h5_groups(source.handle["data"]):
            obs = demo.get("obs")
            if not isinstance(obs, h5py.Group):
                continue
            for name in obs:
                base = ("data", demo_name)
                next_key = (*base, "next_obs", name)
                out.append(
                    Pair(
                        (*base, "obs", name),
                        next_key,
                        (OWN, "delta", *next_key),
                        f"next_obs/{name}",
                        (f"obs/{name}", name),
                    )
                )
        return out

    @classmethod
    def ted_name(cls, key: Key) -> Key:
        rest = key[2:]  # inside data/demo_N
        if rest[0] == "obs" and len(rest) > 1:
            return rest[1:]
        if rest[0] == "next_obs" and len(rest) > 1:
            return ("next", *rest[1:])
        return TED_NAMES.get(rest[0], rest) if len(rest) == 1 else rest

    @classmethod
    def episodes(cls, keys: Iterable[Key]) -> list[list[Key]]:
        demos: dict[str, list[Key]] = {}
        for key in keys:
            if key[0] == "data" and len(key) > 2:
                demos.setdefault(key[1], []).append(key)
        return [demos[name] for name in sorted(demos, key=episode_order)]
