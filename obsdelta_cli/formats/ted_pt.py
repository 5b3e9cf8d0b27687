"""A TensorDict saved with ``torch.save`` to a ``.pt`` file.

The whole TensorDict is unpickled (memory-mapped where torch can), so only open ``.pt`` files
you trust, exactly as with ``torch.load``. A compressed ``.pt`` is still a TensorDict; its obsdelta
metadata and exception rows are the non-tensor leaf ``_obsdelta`` at the root, a dict
``{"meta": <JSON string>, "arrays": {name: tensor}}``.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import InputError
from .base import ArrayStore, MemoryArrays, Sink, Source
from .ted import TensorDictFormat

if TYPE_CHECKING:  # tensordict costs seconds to import; HDF5 work never needs it
    from tensordict import TensorDictBase

META_KEY = "_obsdelta"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format
_PICKLE_MAGIC = b"\x80"  # protocol 2+ pickles, torch's legacy format


class TedPt(TensorDictFormat):
    name = "ted-pt"
    summary = "TensorDict saved with torch.save (.pt)"

    @classmethod
    def sniff(cls, path: Path) -> bool:
        if not path.is_file():
            return False
        with path.open("rb") as fh:
            head = fh.read(4)
        return head == _ZIP_MAGIC or head[:1] == _PICKLE_MAGIC

    def open(self, path: Path) -> Source:
        try:
            obj = torch.load(path, weights_only=False, mmap=zipfile.is_zipfile(path))
        except Exception as exc:  # a damaged pickle can fail in any way while it loads
            raise InputError(
                f"cannot load with torch.load ({type(exc).__name__}: {exc})",
                file=path,
                hint="the file is damaged or not a torch.save file",
            ) from None
        from tensordict import TensorDictBase

        if not isinstance(obj, TensorDictBase):
            raise InputError(
                f"holds a {type(obj).__name__}, not a TensorDict",
                file=path,
                hint="save a TED TensorDict with torch.save(td, path)",
            )
        if obj.batch_dims == 0:
            raise InputError(
                "holds a TensorDict without batch dimensions",
                file=path,
                hint="save the rollout with batch size [T] or [B, T]",
            )
        if META_KEY not in obj.keys():
            return self.source(path, obj, None)
        entry = obj.get_non_tensor(META_KEY)
        try:
            meta = json.loads(entry["meta"])
            arrays = dict(entry["arrays"])
        except (TypeError, ValueError, KeyError):
            raise InputError(
                f"the {META_KEY} entry is not obsdelta metadata", file=path, hint="damaged file"
            ) from None
        return self.source(path, obj.exclude(META_KEY), meta, arrays=MemoryArrays(arrays))

    def materialise(
        self, path: Path, template: TensorDictBase, source: Source
    ) -> tuple[TensorDictBase, ArrayStore]:
        return template.apply(lambda t: torch.empty(t.shape, dtype=t.dtype)), MemoryArrays()

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        td = sink.handle
        if meta is not None:
            assert isinstance(sink.arrays, MemoryArrays)
            entry = {"meta": json.dumps(meta), "arrays": sink.arrays.collect()}
            td.set_non_tensor(META_KEY, entry)
        torch.save(td, path)
