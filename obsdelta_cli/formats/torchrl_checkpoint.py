"""TorchRL's storage checkpoints that already store each observation once.

``FlatStorageCheckpointer`` and ``NestedStorageCheckpointer`` write a replay-buffer dump whose
``storage/`` holds each trajectory's observations once (T+1 rows, ``TED2Flat`` /
``TED2Nested``) with the ``shift``, ``is_full`` and ``_storage_shape`` entries TorchRL needs to
rebuild ``("next", obs)`` when it loads them; ``H5StorageCheckpointer`` writes the same as
``storage/checkpoint.h5`` (one ``traj_N`` group per trajectory). There is no next observation
for obsdelta to remove: it recognises them to say so, as for Minari files.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InputError
from .base import Format, Plan, Sink, Source
from .hdf5 import is_hdf5, open_h5

ALREADY_ONCE = (
    "is a TorchRL storage checkpoint (FlatStorageCheckpointer, NestedStorageCheckpointer or "
    "H5StorageCheckpointer): each trajectory stores its observations once and TorchRL rebuilds "
    "the next observations when it loads it, so there is nothing for obsdelta to remove"
)
#: Why ``--pack`` does not take one either.
NOT_PACKED = (
    "--pack does not take it either: its jagged (nested) tensors and TorchRL's own entries "
    "(shift, is_full) are read back only by TorchRL"
)
HINT = "load it with TorchRL as it is, or compress the folder with a general-purpose compressor"
#: What marks a checkpoint's storage: entries TorchRL's TED2Flat / TED2Nested add.
MARKS = ("_storage_shape", "shift", "is_full")
#: Bytes of a ``meta.json`` looked at for the marks (they come first: TorchRL writes them so).
LOOKED_AT = 1 << 16


def checkpoint_kind(path: Path) -> str | None:
    """``"flat"``, ``"nested"`` or ``"h5"`` for a TorchRL checkpoint at ``path`` (a dump, its
    ``storage/`` folder, or the ``.h5`` file itself), else ``None``. Nothing is parsed: the
    marks are looked for in the first bytes of ``meta.json``, or among an HDF5 file's root
    names."""
    if path.is_dir() and not path.is_symlink():
        storage = path / "storage" if (path / "storage").is_dir() else path
        meta = storage / "meta.json"
        if meta.is_file() and not meta.is_symlink():
            with meta.open("rb") as fh:
                head = fh.read(LOOKED_AT).decode("utf-8", "replace")
            if all(f'"{mark}"' in head for mark in MARKS):
                return "nested" if re.search(r'"is_nested":\s*true', head) else "flat"
            return None
        return next((k for f in sorted(storage.glob("*.h5")) if (k := _h5_kind(f))), None)
    return _h5_kind(path) if path.is_file() else None


def _h5_kind(path: Path) -> str | None:
    if path.is_symlink() or not is_hdf5(path):
        return None
    with open_h5(path) as f:
        names = set(f)
    return "h5" if {*MARKS, "_len"} <= names else None


class TorchRLCheckpoint(Format):
    name = "torchrl-checkpoint"
    summary = "TorchRL Flat/Nested/H5StorageCheckpointer dump (observations already stored once)"
    nothing_to_do = ALREADY_ONCE

    @classmethod
    def sniff(cls, path: Path) -> bool:
        return checkpoint_kind(path) is not None

    def open(self, path: Path) -> Source:
        raise InputError(f"{ALREADY_ONCE}; {NOT_PACKED}", file=path, hint=HINT)

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        raise InputError(ALREADY_ONCE, file=source.path, hint=HINT)

    def finish(self, path: Path, sink: Sink, meta: dict[str, object] | None) -> None:
        raise InputError(ALREADY_ONCE, file=path, hint=HINT)
