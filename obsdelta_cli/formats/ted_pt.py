"""A TensorDict saved with ``torch.save`` to a ``.pt`` file.

The file is loaded with ``torch.load(weights_only=True)``: the unpickler builds tensors, plain
containers and the few tensordict classes a saved TensorDict references (:data:`SAFE_GLOBALS`),
and refuses anything else in the pickle before it can run. A compressed ``.pt`` is still a
TensorDict; its obsdelta metadata and exception rows are the non-tensor leaf ``_obsdelta`` at the
root, a dict ``{"meta": <JSON string>, "arrays": {name: tensor}}``, which loads the same way.

``compress`` also keeps the input file's skeleton (:mod:`.zip_skeleton`: every byte but the
tensors' storages) as the array ``pt.skeleton``, its layout in the manifest (``pt_file``) and its
hash among the manifest's objects, so ``inflate`` writes the original file back byte for byte.
Where the file's storages hold more than the leaves' values (views of a larger tensor,
overlapping views) or the file has no zip records (torch's legacy format), nothing is kept and
``inflate`` saves the TensorDict anew with ``torch.save``.

The leaves and arrays handed to the rest of obsdelta are numpy arrays sharing the tensors'
memory (:func:`~obsdelta_cli.arrays.from_torch`); torch and tensordict are imported only when a
``.pt`` file is read or written.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from ..arrays import from_torch, is_tensor, to_torch, torch_module
from ..errors import InputError
from ..manifest import parse
from .base import ArrayStore, Key, MemoryArrays, Plan, Sink, Source, key_str
from .ted import TensorDictFormat, leaves_of
from .zip_skeleton import Layout, find, write

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
#: Manifest entry with the layout of the original file, and the array holding its skeleton
#: (also the name of the skeleton's hash among the manifest's objects).
PT_FILE = "pt_file"
SKELETON = "pt.skeleton"
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
    torch = torch_module()

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


def array_bytes(a: np.ndarray) -> np.ndarray:
    """An array's bytes in memory order, as a buffer."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _as_arrays(values: dict[Any, Any]) -> dict[Any, Any]:
    """``values`` with each tensor as an array sharing its memory (other objects as they are)."""
    return {k: from_torch(v) if is_tensor(v) else v for k, v in values.items()}


def original_file(
    meta: dict[str, Any] | None, arrays: ArrayStore | None, file: Path
) -> tuple[Layout, bytes] | None:
    """The layout and skeleton of the ``.pt`` file a compressed dataset was compressed from,
    where its manifest records them (``None`` for older files and unmapped inputs)."""
    spec = (meta or {}).get(PT_FILE)
    if spec is None:
        return None
    layout = Layout.from_json(spec, file)
    return layout, _skeleton(layout, arrays, file)


def _skeleton(layout: Layout, arrays: ArrayStore | None, file: Path) -> bytes:
    if arrays is None:
        raise InputError(f"array {SKELETON} is missing", file=file, hint="the file is damaged")
    skeleton = arrays.get(SKELETON, np.dtype(np.uint8), (layout.skeleton_bytes,))
    return bytes(array_bytes(np.asarray(skeleton[0 : layout.skeleton_bytes])))


def original_hashes(
    meta: dict[str, Any] | None, arrays: ArrayStore | None, file: Path
) -> dict[str, str]:
    """The hash of the original file's skeleton a compressed dataset keeps, by the name
    :data:`SKELETON` (an object of the container, as :meth:`Format.object_hashes` gives them);
    none where none is recorded."""
    spec = (meta or {}).get(PT_FILE)
    if spec is None:
        return {}
    layout = Layout.from_json(spec, file)
    try:
        skeleton = _skeleton(layout, arrays, file)
    except InputError:
        return {}  # missing or cut short: the caller reports the object as missing
    return {SKELETON: xxhash.xxh3_64_hexdigest(skeleton)}


@dataclass
class PtSink(Sink):
    """A ``.pt`` output being written. On compress: the input file's skeleton, if it maps. On
    inflate: the original file's layout and skeleton, if recorded, and the leaves a lossy codec
    rebuilt (their records' CRC-32 is computed again)."""

    skeleton: bytes | None = None
    original: tuple[Layout, bytes] | None = None
    changed: frozenset[Key] = field(default_factory=frozenset)


class TedPt(TensorDictFormat):
    name = "ted-pt"
    pack = "file"
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
        if not (isinstance(entry, Mapping) and isinstance(entry.get("meta"), str)):
            # A user's own leaf of that name: refused rather than taken for obsdelta's (or
            # dropped from the output).
            raise InputError(
                f"key {META_KEY} is a name obsdelta writes itself, and it holds no obsdelta "
                "metadata",
                file=path,
                hint=f"rename the key {META_KEY}: obsdelta keeps its own metadata there",
            )
        try:
            meta = json.loads(entry["meta"])
            arrays = _as_arrays(dict(entry["arrays"]))
        except (TypeError, ValueError, KeyError):
            raise InputError(
                f"the {META_KEY} entry is not obsdelta metadata", file=path, hint="damaged file"
            ) from None
        return self.source(path, obj.exclude(META_KEY), meta, arrays=MemoryArrays(arrays))

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        base = super().create(path, source, plan)
        sink = PtSink(**{f.name: getattr(base, f.name) for f in fields(Sink)})
        if source.meta is None:  # compress: how the input file is laid out
            found = find(source.path, source.leaves)
            if found is not None:
                layout, sink.skeleton = found
                raw = np.frombuffer(bytearray(sink.skeleton), dtype=np.uint8)
                sink.arrays.append(SKELETON, raw)
                sink.extra[PT_FILE] = layout.to_json()
            return sink
        sink.original = original_file(source.meta, source.arrays, source.path)
        if sink.original is not None:
            for hole in sink.original[0].holes:
                leaf = sink.leaves.get(hole.ref)
                if not (isinstance(leaf, np.ndarray) and leaf.nbytes == hole.size):
                    raise InputError(
                        f"the recorded layout of the .pt file has {hole.size} bytes for "
                        f"{key_str(hole.ref)}, which is not a tensor of that size",
                        file=source.path,
                        hint="the compressed dataset is damaged; restore it from a copy",
                    )
            manifest = parse(source.meta, file=source.path)
            sink.changed = frozenset(r.next_key for r in manifest.keys if not r.lossless)
        return sink

    def materialise(
        self, path: Path, template: TensorDictBase, source: Source
    ) -> tuple[TensorDictBase, ArrayStore]:
        import torch

        return template.apply(lambda t: torch.empty(t.shape, dtype=t.dtype)), MemoryArrays()

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        import torch

        td = sink.handle
        if meta is None and isinstance(sink, PtSink) and sink.original is not None:
            # inflate: the original file, as it was
            tensors = _as_arrays(leaves_of(td))
            layout, skeleton = sink.original
            write(path, layout, skeleton, lambda h: [array_bytes(tensors[h.ref])], sink.changed)
            return
        if meta is not None:
            assert isinstance(sink.arrays, MemoryArrays)
            arrays = {name: to_torch(a) for name, a in sink.arrays.collect().items()}
            entry = {"meta": json.dumps(meta), "arrays": arrays}
            td.set_non_tensor(META_KEY, entry)
        # Through a file object: a failed write is then the system's OSError (ENOSPC, ...),
        # where torch's own file writer says only "unexpected pos".
        with path.open("wb") as fh:
            torch.save(td, fh)

    def object_hashes(
        self,
        opened: Source | Sink,
        skip: Callable[[str], bool],
        known: Mapping[str, str] | None = None,
        recorded: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The skeleton of the original file, kept in a compressed ``.pt``."""
        if isinstance(opened, PtSink):
            found = {SKELETON: xxhash.xxh3_64_hexdigest(opened.skeleton)} if opened.skeleton else {}
        elif isinstance(opened, Source):
            found = original_hashes(opened.meta, opened.arrays, opened.path)
        else:
            found = {}
        return {k: v for k, v in found.items() if not skip(k)}
