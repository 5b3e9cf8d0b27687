"""A TensorDict saved with ``torch.save`` to a ``.pt`` file.

The whole TensorDict is unpickled (memory-mapped where torch can), so only open ``.pt`` files
you trust, exactly as with ``torch.load``. A compressed ``.pt`` is still a TensorDict; its obsdelta
metadata is the non-tensor string leaf ``_obsdelta`` at the root.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from ..errors import InputError
from .base import Format, Source

META_KEY = "_obsdelta"
_PICKLE_MAGIC = b"\x80"  # protocol 2+ pickles, torch's legacy format


class TedPt(Format):
    name = "ted-pt"
    summary = "TensorDict saved with torch.save (.pt)"

    @classmethod
    def sniff(cls, path: Path) -> bool:
        if not path.is_file():
            return False
        with path.open("rb") as fh:
            head = fh.read(4)
        return zipfile.is_zipfile(path) or head[:1] == _PICKLE_MAGIC

    def open(self, path: Path) -> Source:
        try:
            obj = torch.load(path, weights_only=False, mmap=zipfile.is_zipfile(path))
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
            raise InputError(
                f"cannot load with torch.load ({type(exc).__name__}: {exc})",
                file=path,
                hint="the file is damaged or not a torch.save file",
            ) from None
        if not isinstance(obj, TensorDictBase):
            raise InputError(
                f"holds a {type(obj).__name__}, not a TensorDict",
                file=path,
                hint="save a TED TensorDict with torch.save(td, path)",
            )
        meta = None
        if META_KEY in obj.keys():
            raw = obj.get_non_tensor(META_KEY)
            obj = obj.exclude(META_KEY)
            try:
                meta = json.loads(raw)
            except (TypeError, ValueError):
                raise InputError(
                    f"the {META_KEY} entry is not valid JSON", file=path, hint="the file is damaged"
                ) from None
        return Source(path=path, td=obj, meta=meta)

    def create(self, path: Path, template: TensorDictBase, source: Source) -> TensorDictBase:
        return template.apply(lambda t: torch.empty(t.shape, dtype=t.dtype))

    def finish(self, path: Path, out: TensorDictBase, meta: dict[str, Any] | None) -> None:
        if meta is not None:
            out.set_non_tensor(META_KEY, json.dumps(meta))
        torch.save(out, path)
