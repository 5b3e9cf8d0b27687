"""A TorchRL replay-buffer dump (``ReplayBuffer.dumps(path)``).

``storage/`` is a tensordict memmap tree of the whole preallocated storage, and
``storage/storage_metadata.json`` says how many rows (``len``) hold data. Rows past ``len`` are
not data: their deltas are stored as zero, so their next observations come back equal to their
observations. Everything else in the dump (writer, sampler, RNG
state, buffer metadata) is copied unchanged. The obsdelta metadata is ``obsdelta.json`` and the
exception rows ``obsdelta.arrays/``, both at the dump's root.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .base import ARRAYS_DIR, SIDECAR, ArrayStore, Sink, Source, read_sidecar, write_sidecar
from .ted import TensorDictFormat
from .ted_memmap import is_memmap_dir, load_memmap_dir

if TYPE_CHECKING:  # tensordict costs seconds to import; HDF5 work never needs it
    from tensordict import TensorDictBase

STORAGE = "storage"
STORAGE_META = "storage_metadata.json"


class TorchRLReplayBuffer(TensorDictFormat):
    name = "torchrl-rb"
    summary = "TorchRL ReplayBuffer.dumps() directory (storage/ memmap + storage_metadata.json)"

    @classmethod
    def sniff(cls, path: Path) -> bool:
        return (path / STORAGE / STORAGE_META).is_file() and is_memmap_dir(path / STORAGE)

    def open(self, path: Path) -> Source:
        meta_file = path / STORAGE / STORAGE_META
        try:
            length = int(json.loads(meta_file.read_text())["len"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(
                f"cannot read the buffer length ({type(exc).__name__}: {exc})",
                file=meta_file,
                hint="the dump is damaged",
            ) from None
        td = load_memmap_dir(path / STORAGE)
        if td.batch_dims == 0 or not 0 <= length <= td.shape[0]:
            raise InputError(
                f"len {length} does not fit a storage of shape {list(td.shape)}",
                file=meta_file,
                hint="the dump is damaged",
            )
        meta = read_sidecar(path)
        arrays = ArrayStore(path / ARRAYS_DIR)
        return self.source(path, td, meta, valid_rows=length, arrays=arrays)

    def materialise(
        self, path: Path, template: TensorDictBase, source: Source
    ) -> tuple[TensorDictBase, ArrayStore]:
        ignore = shutil.ignore_patterns(STORAGE, SIDECAR, ARRAYS_DIR)
        shutil.copytree(source.path, path, ignore=ignore)
        out = template.memmap_like(path / STORAGE)
        shutil.copy2(source.path / STORAGE / STORAGE_META, path / STORAGE / STORAGE_META)
        return out, ArrayStore(path / ARRAYS_DIR)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        write_sidecar(path, meta)
