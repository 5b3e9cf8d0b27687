"""A TensorDict saved with ``torch.save`` to a ``.pt`` file.

The file is loaded with ``torch.load(weights_only=True)``: the unpickler builds tensors, plain
containers and the few tensordict classes a saved TensorDict references (:data:`SAFE_GLOBALS`),
and refuses anything else in the pickle before it can run. A compressed ``.pt`` is still a
TensorDict; its obsdelta metadata and exception rows are the non-tensor leaf ``_obsdelta`` at the
root, a dict ``{"meta": <JSON string>, "arrays": {name: tensor}}``, which loads the same way.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
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
#: Where tensordict defines what a pickled TensorDict references (module, names). These are the
#: names tensordict >= 0.15 allow-lists itself; none imports a module named in the pickle, opens
#: files or unpickles nested data. Leaves stored in files (``MemoryMappedTensor``), user
#: tensorclasses and other non-tensor objects stay refused.
_TENSORDICT_GLOBALS = {
    "tensordict._reductions": ("_make_td", "_rebuild_tensordict_files_consolidated"),
    "tensordict._td": ("TensorDict",),
    "tensordict._lazy": ("LazyStackedTensorDict",),
    "tensordict.tensorclass": ("NonTensorData", "NonTensorStack"),
    "tensordict.utils": ("_LockedSchema",),
}
_UNSUPPORTED = re.compile(r"unsupported (?:global: )?GLOBAL (\S+)|unsupported operand (\S+)", re.I)


def safe_globals() -> list[Any]:
    """The tensordict classes and functions a ``torch.save``'d TensorDict references."""
    import importlib

    out = []
    for module_name, names in _TENSORDICT_GLOBALS.items():
        module = importlib.import_module(module_name)
        out += [getattr(module, n) for n in names if hasattr(module, n)]
    return out


def load(path: Path) -> Any:
    """``torch.load`` without running code: only tensors, plain containers and tensordict's
    own classes are built; anything else in the pickle raises :class:`InputError`."""
    try:
        mmap = zipfile.is_zipfile(path)
        with torch.serialization.safe_globals(safe_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # e.g. "pickle protocol 1": refused below
            return torch.load(path, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = _UNSUPPORTED.search(text)
        if found is None and "weights only" not in text.lower():
            raise _damaged(path, exc) from None
        what = (found.group(1) or found.group(2)) if found else "objects other than tensors"
        raise InputError(
            f"the pickle references {what.rstrip('.,')}, which obsdelta does not load "
            "(unpickling it could run code)",
            file=path,
            hint="obsdelta reads .pt files holding a plain TensorDict of tensors; if you trust "
            "this file, load it yourself and save td.clone() or td.memmap(folder)",
        ) from None
    except Exception as exc:  # a damaged pickle can fail in any way while it loads
        raise _damaged(path, exc) from None


def _damaged(path: Path, exc: BaseException) -> InputError:
    first = (str(exc).strip().splitlines() or [""])[0]
    return InputError(
        f"cannot load with torch.load ({type(exc).__name__}: {first})",
        file=path,
        hint="the file is damaged or not a torch.save file",
    )


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
        obj = load(path)
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
