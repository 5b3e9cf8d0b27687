"""A TorchRL replay-buffer dump (``ReplayBuffer.dumps(path)``).

``storage/`` is a tensordict memmap tree of the whole preallocated storage, and
``storage/storage_metadata.json`` says how many rows (``len``) hold data. Rows past ``len`` are
not data: their deltas are stored as zero, so their next observations come back equal to their
observations. Everything else in the dump (writer, sampler, RNG state, buffer metadata) is copied
byte for byte; ``storage/`` is read and written with plain file I/O (:mod:`.memmap_tree`). The
obsdelta metadata is ``obsdelta.json``, the exception rows ``obsdelta.arrays/`` and the original
``meta.json`` bytes ``obsdelta.meta/``, all at the dump's root.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import InputError
from .base import (
    ARRAYS_DIR,
    ArrayStore,
    FolderFormat,
    Plan,
    Sink,
    Source,
    read_sidecar,
    write_sidecar,
)
from .folder_safety import read_json, refuse_links, refuse_own_names
from .memmap_tree import OWN, read_tree, write_tree
from .ted_memmap import NOT_OURS, is_memmap_dir

STORAGE = "storage"
STORAGE_META = "storage_metadata.json"


class TorchRLReplayBuffer(FolderFormat):
    name = "torchrl-rb"
    pack = "leaves"
    summary = "TorchRL ReplayBuffer.dumps() directory (storage/ memmap + storage_metadata.json)"

    @classmethod
    def sniff(cls, path: Path) -> bool:
        storage = path / STORAGE
        if storage.is_symlink():
            return True  # opening the dump refuses the link
        return os.path.lexists(storage / STORAGE_META) and is_memmap_dir(storage)

    def open(self, path: Path) -> Source:
        refuse_links(path)
        meta_file = path / STORAGE / STORAGE_META
        try:
            length = int(read_json(meta_file, hint="the dump is damaged")[1]["len"])
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(
                f"cannot read the buffer length ({type(exc).__name__}: {exc})",
                file=meta_file,
                hint="the dump is damaged",
            ) from None
        meta = read_sidecar(path)
        if meta is None:
            refuse_own_names(path, OWN, NOT_OURS)
        refuse_own_names(path / STORAGE, OWN, f"in {STORAGE}/, where obsdelta never writes it")
        tree = read_tree(path / STORAGE)
        rows = tree.levels[()].fields.get("shape") or []
        if tree.batch_dims == 0 or not 0 <= length <= rows[0]:
            raise InputError(
                f"len {length} does not fit a storage of shape {list(rows)}",
                file=meta_file,
                hint="the dump is damaged",
            )
        return Source(
            path=path,
            leaves=dict(tree.leaves),
            batch_dims=tree.batch_dims,
            meta=meta,
            valid_rows=length,
            arrays=ArrayStore(path / ARRAYS_DIR),
            handle=tree,
        )

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        def ignore(folder: str, names: list[str]) -> set[str]:
            # At the root only: a file of the same name deeper in the dump is the user's.
            return {STORAGE, *OWN} & set(names) if Path(folder) == source.path else set()

        shutil.copytree(source.path, path, ignore=ignore)
        restore = source.meta is not None
        own_root = source.path if restore else path
        leaves = write_tree(source.handle, path / STORAGE, plan, own_root=own_root, restore=restore)
        return Sink(leaves, ArrayStore(path / ARRAYS_DIR), handle=leaves)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        write_sidecar(path, meta)
