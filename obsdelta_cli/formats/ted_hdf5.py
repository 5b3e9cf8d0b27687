"""A TED TensorDict written to HDF5 by tensordict (``td.to_h5`` / ``PersistentTensorDict``).

Nested keys are groups (``next/observation``). The HDF5 backend stores no batch size, so it is
inferred: the longest shape prefix shared by every dataset (``[T]`` or ``[B, T]``); the compressed
file records it. Deltas follow TED: ``next/delta/<key>``.
"""

from __future__ import annotations

from typing import Any

import h5py

from .base import Key
from .hdf5 import OWN, HDF5Format


class TedHDF5(HDF5Format):
    name = "ted-hdf5"
    summary = "TED TensorDict in HDF5 (td.to_h5; groups such as next/observation)"

    @classmethod
    def matches(cls, f: h5py.File) -> bool:
        return isinstance(f.get("next"), h5py.Group)

    def infer_batch_dims(self, leaves: dict[Key, Any], meta: dict[str, Any] | None) -> int:
        if meta is not None and isinstance(meta.get("batch_dims"), int):
            return int(meta["batch_dims"])
        shapes = [leaf.shape for key, leaf in leaves.items() if key[0] != OWN]
        if not shapes:
            return 1
        prefix = 0
        while all(len(s) > prefix for s in shapes) and len({s[prefix] for s in shapes}) == 1:
            prefix += 1
        return max(1, prefix)
