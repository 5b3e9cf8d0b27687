"""TED rollouts saved by tensordict as a memmap directory (``td.memmap(prefix)``).

Each (sub-)TensorDict is a folder with a ``meta.json``; each leaf a raw ``<key>.memmap`` buffer.
The folder is read and written with plain file I/O (:mod:`.memmap_tree`): opening one never
imports tensordict nor unpickles anything. A compressed directory is still an ordinary tensordict
memmap (``TensorDict.load_memmap`` opens it); the obsdelta metadata is the extra file
``obsdelta.json`` at its root, exception rows, if any, are raw files in the extra folder
``obsdelta.arrays/``, and the original bytes of every ``meta.json`` compress rewrote are kept in
``obsdelta.meta/`` for inflate to put back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import InputError
from .base import (
    ARRAYS_DIR,
    SIDECAR,
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

#: Why a plain folder cannot hold obsdelta's own names: it is no obsdelta output.
NOT_OURS = f"in a dataset obsdelta did not write (it has no {SIDECAR})"


def is_memmap_dir(path: Path) -> bool:
    """Whether ``path`` is a folder with a tensordict ``meta.json`` at its root (a link or a
    damaged file in its place claims to be one: opening the folder says what is wrong)."""
    meta = path / "meta.json"
    if not (path.is_dir() and os.path.lexists(meta)):
        return False
    try:
        _, content = read_json(meta)
    except InputError:
        return True
    return isinstance(content, dict) and "shape" in content


class TedMemmap(FolderFormat):
    name = "ted-memmap"
    pack = "leaves"
    summary = "TensorDict.memmap() directory (meta.json + *.memmap leaves)"

    @classmethod
    def sniff(cls, path: Path) -> bool:
        return is_memmap_dir(path)

    def open(self, path: Path) -> Source:
        refuse_links(path)
        meta = read_sidecar(path)
        if meta is None:
            refuse_own_names(path, OWN, NOT_OURS)
        tree = read_tree(path)
        return Source(
            path=path,
            leaves=dict(tree.leaves),
            batch_dims=tree.batch_dims,
            meta=meta,
            arrays=ArrayStore(path / ARRAYS_DIR),
            handle=tree,
        )

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        restore = source.meta is not None
        own_root = source.path if restore else path
        leaves = write_tree(source.handle, path, plan, own_root=own_root, restore=restore)
        return Sink(leaves, ArrayStore(path / ARRAYS_DIR), handle=leaves)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        write_sidecar(path, meta)
