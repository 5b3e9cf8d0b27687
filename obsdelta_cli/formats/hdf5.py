"""What the HDF5 layouts share: lazy h5py leaves, exact copies, and obsdelta's own group.

Every object that is not rewritten is copied with HDF5's own object copy, so its values, dtype,
shape, chunks, filters, fill value and attributes come out exactly as they went in. Groups on
the way to a rewritten dataset are recreated with their attributes and creation properties.

A compressed file keeps obsdelta's objects in one root group, ``/obsdelta``:

- ``layout/<path>``: for each next-observation dataset that was removed, an empty dataset with
  its dtype, chunks, filters, fill value and attributes, so ``inflate`` can recreate it exactly;
- ``arrays/<name>``: exception rows and their row index;
- ``delta/<path>`` in the D4RL and robomimic layouts: the stored delta of ``<path>``.

The metadata is the JSON root attribute ``obsdelta``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import zlib
from abc import abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import xxhash

from ..errors import (
    InputError,
    UsageError,
    write_error,
)
from .base import ArrayStore, Format, Key, LeafSpec, Plan, Sink, Source, key_str
from .leaf import FlatRows, LazyLeaf

MAGIC = b"\x89HDF\r\n\x1a\n"
META_ATTR = "obsdelta"
OWN = "obsdelta"
#: Attribute marking a uint16 dataset that holds bfloat16 bits (numpy has no bfloat16).
BF16_ATTR = "obsdelta_dtype"
#: Attribute of obsdelta's opaque arrays: the torch dtype of their values.
ARRAY_DTYPE = "obsdelta_dtype"

hdf5plugin: Any
try:  # registers Zstd, Blosc, LZ4, ... filters for reading and writing, when installed
    import hdf5plugin
except ImportError:  # pragma: no cover - exercised when the extra is not installed
    hdf5plugin = None


def is_hdf5(path: Path) -> bool:
    """Whether ``path`` is a file starting with the HDF5 signature."""
    if not path.is_file():
        return False
    with path.open("rb") as fh:
        return fh.read(8) == MAGIC


def open_h5(path: Path) -> h5py.File:
    """Open read-only, turning a damaged file into :class:`InputError` and refusing a file that
    points outside itself (:func:`check_contained`)."""
    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as exc:
        raise _damaged(path, exc) from None
    try:
        check_contained(f, path)
    except BaseException:
        f.close()
        raise
    return f


def _damaged(path: Path, exc: BaseException) -> InputError:
    return InputError(
        f"cannot open as HDF5 ({exc})", file=path, hint="the file is truncated or damaged"
    )


_OUTSIDE_HINT = (
    "obsdelta reads only data stored inside the file; copy the data in "
    "(e.g. h5py's Group.copy, or h5repack) and retry"
)
#: Files already found self-contained, by (device, inode, size, mtime): detection opens a file
#: once per HDF5 layout, and a file with many objects takes a while to walk.
_CONTAINED: set[tuple[int, int, int, int]] = set()


def check_contained(f: h5py.File, path: Path) -> None:
    """Refuse a file that points outside itself, before anything follows the pointer.

    Every link is listed without being followed (``H5Lvisit`` descends through hard links only),
    and every dataset's creation properties are read without reading its data. Refused, naming
    the object: external links; soft links (dangling ones, and also those naming an object
    inside the file: obsdelta copies objects exactly, and a link would come out as a second
    copy of its target); other user-defined links; datasets whose raw data sits in external
    files; virtual datasets, whose data sits in other datasets, usually other files.
    """
    try:
        st = path.stat()
    except OSError:
        st = None
    stamp = None if st is None else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if stamp is not None and stamp in _CONTAINED:
        return
    try:
        _check_links(f, path)
        _check_datasets(f, path)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise _damaged(path, exc) from None
    if stamp is not None:
        _CONTAINED.add(stamp)


def _check_links(f: h5py.File, path: Path) -> None:
    found: list[tuple[bytes, int]] = []

    def visit(name: bytes, info: Any) -> None:
        if info.type != h5py.h5l.TYPE_HARD:
            found.append((name, info.type))
            return None
        return None

    f.id.links.visit(visit, info=True)
    if not found:
        return
    # External links first: a soft link is resolved below only once none exists.
    found.sort(key=lambda item: (item[1] == h5py.h5l.TYPE_SOFT, item[1] != h5py.h5l.TYPE_EXTERNAL))
    name, kind = found[0]
    obj = "/" + name.decode(errors="replace")
    hint = _OUTSIDE_HINT
    if kind == h5py.h5l.TYPE_EXTERNAL:
        target_file, target = (v.decode(errors="replace") for v in f.id.links.get_val(name))
        what = f"object {obj} is an external link to {target_file}:{target}"
    elif kind == h5py.h5l.TYPE_SOFT:
        target = f.id.links.get_val(name).decode(errors="replace")
        if _resolves(f, name):
            what = f"object {obj} is a soft link to {target}, which obsdelta does not follow"
            hint = (
                "obsdelta copies HDF5 objects exactly and would store the link as a second "
                f"copy of {target}; delete the link (del f['{obj}']) or replace it by the object"
            )
        else:
            what = f"object {obj} is a soft link to {target}, which does not exist"
            hint = f"delete the dangling link (del f['{obj}']) and retry"
    else:
        what = f"object {obj} is a user-defined link (type {kind})"
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    raise InputError(what + more, file=path, hint=hint)


def _resolves(f: h5py.File, name: bytes) -> bool:
    """Whether a soft link names an object (no external link exists in the file by now)."""
    try:
        return bool(f.id.links.exists(name)) and h5py.h5o.open(f.id, name) is not None
    except (KeyError, OSError, RuntimeError, ValueError):
        return False


def _check_datasets(f: h5py.File, path: Path) -> None:
    problems: list[str] = []

    def visit(name: bytes, info: Any) -> None:
        if info.type != h5py.h5o.TYPE_DATASET:
            return None
        dcpl = h5py.h5o.open(f.id, name).get_create_plist()
        obj = "/" + name.decode(errors="replace")
        if dcpl.get_layout() == h5py.h5d.VIRTUAL:
            count = dcpl.get_virtual_count()
            files = sorted({dcpl.get_virtual_filename(i) for i in range(count)})
            problems.append(
                f"dataset {obj} is a virtual dataset mapping {', '.join(files) or 'nothing'}"
            )
        elif dcpl.get_external_count():
            raw = dcpl.get_external(0)[0].decode(errors="replace")
            problems.append(f"dataset {obj} stores its data in the external file {raw}")
        return None

    h5py.h5o.visit(f.id, visit, info=True)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(problems[0] + more, file=path, hint=_OUTSIDE_HINT)


def torch_dtype(dtype: np.dtype) -> torch.dtype | None:
    """The torch dtype of a numeric numpy dtype, ``None`` for strings, compounds and the like."""
    if dtype.kind not in "biuf" or dtype.byteorder == ">":
        return None
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        return None


def _numpy(dtype: torch.dtype) -> np.dtype:
    if dtype == torch.bfloat16:
        return np.dtype(np.uint16)
    return torch.empty(0, dtype=dtype).numpy().dtype


class H5Leaf(LazyLeaf):
    """An h5py dataset read and written by row slices."""

    def __init__(self, ds: h5py.Dataset, file: Path) -> None:
        self.ds = ds
        self.file = file
        self.shape = tuple(ds.shape)
        self.bf16 = ds.attrs.get(BF16_ATTR) == "bfloat16"
        dtype = torch.bfloat16 if self.bf16 else torch_dtype(ds.dtype)
        assert dtype is not None
        self.dtype = dtype
        chunks = ds.chunks
        #: Rows per HDF5 chunk along the first dimension: reads aligned to it touch each chunk once.
        self.chunk_rows = chunks[0] if chunks else 1
        self._mapped: torch.Tensor | bool | None = None

    def storage_bytes(self) -> int:
        """Bytes the dataset takes in the file, after its filters."""
        return int(self.ds.id.get_storage_size())

    def read(self, start: int, stop: int) -> torch.Tensor:
        try:
            array = self.ds[start:stop]
        except (OSError, ValueError) as exc:
            raise InputError(
                f"cannot read rows {start}:{stop} ({exc})",
                file=self.file,
                key=self.ds.name.lstrip("/"),
                hint="the file is damaged",
            ) from None
        t = torch.from_numpy(np.ascontiguousarray(array))
        return t.view(torch.bfloat16) if self.bf16 else t

    def mapped(self) -> torch.Tensor | None:
        """A contiguous, unfiltered dataset mapped read-only (copy on write) from the file, for
        random access at memory speed; ``None`` for chunked or filtered ones."""
        if self._mapped is None:
            self._mapped = False
            dcpl = self.ds.id.get_create_plist()
            offset = self.ds.id.get_offset()
            dtype = self.ds.dtype
            nbytes = math.prod(self.shape) * dtype.itemsize
            if (
                dcpl.get_layout() == h5py.h5d.CONTIGUOUS
                and offset is not None
                and nbytes
                and dtype.byteorder in "=<|"
                and offset + nbytes <= self.file.stat().st_size
            ):
                array = np.memmap(self.file, dtype, mode="c", offset=offset, shape=self.shape)
                t = torch.from_numpy(array)
                self._mapped = t.view(torch.bfloat16) if self.bf16 else t
        return self._mapped if isinstance(self._mapped, torch.Tensor) else None

    def select(self, rows: np.ndarray) -> torch.Tensor:
        """Rows ``rows`` (sorted, distinct) in one read."""
        try:
            array = self.ds[rows]
        except (OSError, ValueError) as exc:
            raise InputError(
                f"cannot read {len(rows)} rows ({exc})",
                file=self.file,
                key=self.ds.name.lstrip("/"),
                hint="the file is damaged",
            ) from None
        t = torch.from_numpy(np.ascontiguousarray(array))
        return t.view(torch.bfloat16) if self.bf16 else t

    def write(self, start: int, value: torch.Tensor) -> None:
        if self.bf16:
            value = value.view(torch.int16)
        array = value.contiguous().numpy()
        self.ds[start : start + len(array)] = array.view(self.ds.dtype)


class OpaqueLeaf(LazyLeaf):
    """obsdelta's own array rows in an opaque dataset, one element per row.

    HDF5 readers (tensordict's ``PersistentTensorDict`` among them) treat opaque data as
    non-tensor, so these arrays never get in the way of a batch size. The dtype and the
    feature shape are attributes.
    """

    def __init__(self, ds: h5py.Dataset, file: Path, dtype: torch.dtype, features: tuple[int, ...]):
        self.ds = ds
        self.file = file
        self.dtype = dtype
        self.shape = (ds.shape[0], *features)
        self.chunk_rows = ds.chunks[0] if ds.chunks else 1

    def read(self, start: int, stop: int) -> torch.Tensor:
        try:
            array = self.ds[start:stop]
        except (OSError, ValueError) as exc:
            raise InputError(
                f"cannot read rows {start}:{stop} ({exc})",
                file=self.file,
                key=self.ds.name.lstrip("/"),
                hint="the file is damaged",
            ) from None
        raw = torch.from_numpy(np.ascontiguousarray(array).view(np.uint8).reshape(-1))
        return raw.view(self.dtype).reshape(-1, *self.shape[1:])

    def write(self, start: int, value: torch.Tensor) -> None:
        raw = value.contiguous().reshape(len(value), -1).view(torch.uint8).numpy()
        self.ds[start : start + len(value)] = raw.view(self.ds.dtype).reshape(-1)


def leaves_of(f: h5py.File, file: Path) -> dict[Key, Any]:
    """Numeric datasets (not obsdelta's own arrays and layouts), keyed by their path."""
    out: dict[Key, Any] = {}

    def visit(name: str, obj: Any) -> None:
        if not isinstance(obj, h5py.Dataset):
            return
        parts = tuple(name.split("/"))
        if parts[:2] in ((OWN, "arrays"), (OWN, "layout")):
            return
        if obj.ndim and (torch_dtype(obj.dtype) is not None or obj.attrs.get(BF16_ATTR)):
            out[parts] = H5Leaf(obj, file)

    f.visititems(visit)
    return out


#: A manifest longer than this is stored zlib-compressed in the dataset ``/obsdelta/manifest``
#: (one record per robomimic demo and key adds up), the root attribute then naming it: an HDF5
#: attribute holds at most 64 KB.
PLAIN_META_BYTES = 1 << 15
MANIFEST = f"{OWN}/manifest"
#: Largest manifest read back: far beyond any obsdelta writes, so a crafted file cannot make
#: reading it take more memory than this.
MAX_META_BYTES = 1 << 28


def write_meta(out: h5py.File, meta: dict[str, Any]) -> None:
    """Store the manifest: as the JSON root attribute, or when long, zlib-compressed in an
    opaque dataset (non-tensor data to HDF5 readers) that the attribute names."""
    text = json.dumps(meta)
    if len(text) <= PLAIN_META_BYTES:
        out.attrs[META_ATTR] = text
        return
    packed = np.frombuffer(zlib.compress(text.encode(), 6), dtype=np.uint8)
    ds = out.create_dataset(
        MANIFEST, shape=packed.shape, dtype=h5py.opaque_dtype(np.dtype("V1")), track_times=False
    )
    ds[...] = packed.view(ds.dtype)
    out.attrs[META_ATTR] = json.dumps({"manifest": MANIFEST})


def read_meta(f: h5py.File, file: Path) -> dict[str, Any] | None:
    raw = f.attrs.get(META_ATTR)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
        if isinstance(meta, dict) and set(meta) == {"manifest"}:
            meta = json.loads(_packed_manifest(f, file))
    except (TypeError, ValueError, KeyError, OSError, zlib.error):
        raise InputError(
            "the obsdelta metadata is not readable JSON", file=file, hint="damaged file"
        ) from None
    if not isinstance(meta, dict):
        raise InputError("the obsdelta attribute is not a JSON object", file=file)
    return meta


def _packed_manifest(f: h5py.File, file: Path) -> bytes:
    """The zlib-compressed manifest of ``/obsdelta/manifest``, its size checked first."""
    ds = f.get(MANIFEST)
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.itemsize != 1:
        raise ValueError("no manifest dataset")
    if ds.shape[0] > min(MAX_META_BYTES, file.stat().st_size):
        raise ValueError("manifest dataset larger than the file")
    inflater = zlib.decompressobj()
    text = inflater.decompress(ds[()].tobytes(), MAX_META_BYTES)
    if inflater.unconsumed_tail:
        raise ValueError("manifest too long")
    return text


def copy_attrs(src: Any, dst: Any) -> None:
    """Copy attributes with their exact stored types."""
    for name in src.attrs:
        dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)


def dcpl_like(src: h5py.h5p.PropDCID, same_dtype: bool) -> h5py.h5p.PropDCID:
    """Creation properties (layout, chunks, filters, fill value) following ``src``'s; for another
    dtype, the chunks and lossless filters only (a fill value or scale-offset is dtype-bound)."""
    if same_dtype:
        return src.copy()
    new = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if src.get_layout() == h5py.h5d.CHUNKED:
        new.set_chunk(src.get_chunk())
        for i in range(src.get_nfilters()):
            code, flags, values, _name = src.get_filter(i)
            if code not in (h5py.h5z.FILTER_SCALEOFFSET, h5py.h5z.FILTER_NBIT):
                new.set_filter(code, flags, values)
    return new


def _create(
    group: h5py.Group,
    name: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    maxshape: tuple[int | None, ...],
    dcpl: h5py.h5p.PropDCID,
) -> h5py.Dataset:
    # No modification times: the same input and flags give the same bytes.
    dcpl.set_obj_track_times(False)
    unlimited = tuple(h5py.h5s.UNLIMITED if m is None else m for m in maxshape)
    space = h5py.h5s.create_simple(shape, unlimited)
    tid = h5py.h5t.py_create(dtype, logical=True)
    return h5py.Dataset(h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl))


def compression_kwargs(name: str) -> dict[str, Any]:
    """h5py ``create_dataset`` keywords for ``--h5-compression``."""
    if name == "none":
        return {}
    if name in ("gzip", "lzf"):
        return {"compression": name, "shuffle": True}
    if name in ("zstd", "blosc"):
        if hdf5plugin is None:
            raise UsageError(
                f"--h5-compression {name} needs hdf5plugin",
                hint="pip install 'obsdelta[hdf5plugin]', or use gzip or lzf",
            )
        if name == "zstd":
            return dict(hdf5plugin.Zstd(clevel=3))
        # zstd inside Blosc: lz4 hardly shrinks the noisy low bits of float deltas.
        return dict(hdf5plugin.Blosc(cname="zstd", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE))
    raise UsageError(
        f"unknown --h5-compression {name!r}", hint=f"choose one of {', '.join(H5_COMPRESSIONS)}"
    )


H5_COMPRESSIONS = ("gzip", "lzf", "zstd", "blosc", "none")


class H5Arrays(ArrayStore):
    """Exception rows in resizable datasets under ``/obsdelta/arrays``."""

    def __init__(self, f: h5py.File, file: Path, kwargs: dict[str, Any] | None = None) -> None:
        self.f = f
        self.file = file
        self.kwargs = kwargs or {}

    def append(self, name: str, rows: torch.Tensor) -> None:
        group = self.f.require_group(f"{OWN}/arrays")
        features = tuple(rows.shape[1:])
        row_bytes = max(1, math.prod(features) * rows.element_size())
        if name not in group:
            # Exceptions are usually few: small chunks keep a handful of rows small on disk.
            chunk_rows = max(1, min(256, (1 << 14) // row_bytes))
            ds = group.create_dataset(
                name,
                shape=(0,),
                maxshape=(None,),
                dtype=h5py.opaque_dtype(np.dtype(f"V{row_bytes}")),
                chunks=(chunk_rows,),
                track_times=False,
                **self.kwargs,
            )
            ds.attrs[ARRAY_DTYPE] = str(rows.dtype).removeprefix("torch.")
        ds = group[name]
        n = ds.shape[0]
        ds.resize(n + len(rows), axis=0)
        OpaqueLeaf(ds, self.file, rows.dtype, features).write(n, rows)

    def storage_bytes(self, name: str) -> int | None:
        ds = self.f.get(f"{OWN}/arrays/{name}")
        return None if ds is None else int(ds.id.get_storage_size())

    def get(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
        ds = self.f.get(f"{OWN}/arrays/{name}")
        if isinstance(ds, h5py.Dataset) and h5py.check_opaque_dtype(ds.dtype):
            features = tuple(shape[1:])
            stored = str(ds.attrs.get(ARRAY_DTYPE, ""))
            row_bytes = max(1, math.prod(features) * dtype.itemsize)
            if (
                ds.shape == (shape[0],)
                and stored == str(dtype).removeprefix("torch.")
                and ds.dtype.itemsize == row_bytes
            ):
                return FlatRows(OpaqueLeaf(ds, self.file, dtype, features), 1)
        elif isinstance(ds, h5py.Dataset) and tuple(ds.shape) == tuple(shape):
            return FlatRows(H5Leaf(ds, self.file), 1)  # format 1: numeric arrays
        raise InputError(
            f"array {name} is missing or not of shape {list(shape)} {dtype}",
            file=self.file,
            hint="the compressed file is damaged",
        )


class HDF5Format(Format):
    """Base of the HDF5 layouts: they differ in how they are recognised and how pairs are found."""

    options = frozenset({"h5_compression"})
    #: Leading dimensions that index transitions.
    batch_dims = 1

    @classmethod
    def sniff(cls, path: Path) -> bool:
        if not is_hdf5(path):
            return False
        try:
            with h5py.File(path, "r") as f:
                check_contained(f, path)  # before matches() follows any link
                return cls.matches(f)
        except OSError:
            return False  # cannot be opened: detection reports it precisely
        except (RuntimeError, KeyError, ValueError) as exc:  # opens, but its structure is damaged
            raise InputError(
                f"cannot read the file's structure ({exc})", file=path, hint="the file is damaged"
            ) from None

    @classmethod
    @abstractmethod
    def matches(cls, f: h5py.File) -> bool:
        """Whether the open file has this layout."""

    def open(self, path: Path) -> Source:
        f = open_h5(path)
        try:
            meta = read_meta(f, path)
            leaves = leaves_of(f, path)
            batch_dims = self.infer_batch_dims(leaves, meta)
        except (RuntimeError, OSError, KeyError) as exc:  # h5py's errors on a damaged file
            f.close()
            raise InputError(
                f"cannot read the file's structure ({exc})", file=path, hint="the file is damaged"
            ) from None
        except BaseException:
            f.close()
            raise
        return Source(path, leaves, batch_dims, meta, arrays=H5Arrays(f, path), handle=f)

    def infer_batch_dims(self, leaves: dict[Key, Any], meta: dict[str, Any] | None) -> int:
        return self.batch_dims

    def close(self, source: Source) -> None:
        source.handle.close()

    def object_hashes(self, opened: Source | Sink, skip: Callable[[str], bool]) -> dict[str, str]:
        f: h5py.File = opened.handle
        file = Path(f.filename)
        if id(f) in _OUTPUT_FDS:  # an output being written: its raw chunks must be on disk
            try:
                f.flush()
            except (OSError, RuntimeError) as exc:
                raise write_error(file, exc) from None
        try:
            return _object_hashes(f, file, skip)
        except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise InputError(
                f"cannot read an object ({exc})", file=file, hint="the file is damaged"
            ) from None

    def bookkeeping(self, source: Source, removed: list[Key]) -> int:
        f: h5py.File = source.handle
        gone = {key_str(k) for k in removed}
        total = sum(_header_bytes(f[name], group=False) for name in gone if name in f)
        parents = {name.rpartition("/")[0] for name in gone}
        for parent in parents - {""}:
            group = f[parent]
            emptied = all(f"{parent}/{child}" in gone for child in group)
            if emptied and not len(group.attrs):
                total += _header_bytes(group, group=True)
        return total

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        src: h5py.File = source.handle
        try:
            out = h5py.File(path, "w", libver=src.libver)
            _OUTPUT_FDS[id(out)] = int(out.id.get_vfd_handle())
        except OSError as exc:
            raise write_error(path, exc) from None
        try:
            return self._fill_structure(src, out, path, source, plan)
        except (OSError, RuntimeError) as exc:
            _close_quietly(out)
            if isinstance(exc, RuntimeError) and "write failed" not in str(exc):
                raise
            raise write_error(path, exc) from None
        except BaseException:
            _close_quietly(out)
            raise

    def _fill_structure(
        self, src: h5py.File, out: h5py.File, path: Path, source: Source, plan: Plan
    ) -> Sink:
        copy_attrs(src, out)
        if META_ATTR in out.attrs:
            del out.attrs[META_ATTR]
        dropped = {key_str(k) for k in source.leaves if k not in set(plan.order)}
        _copy_tree(src, out, dropped)
        compression = plan.options.get("h5_compression")
        kwargs = compression_kwargs(compression) if compression else None
        layouts = dict((source.meta or {}).get("hdf5_layouts") or {})
        new_layouts: dict[str, Any] = {}
        for key in plan.replaced:
            original = src[key_str(key)]
            _keep_layout(out, original)
            alloc = original.id.get_create_plist().get_alloc_time()
            new_layouts[key_str(key)] = {"maxshape": list(original.maxshape), "alloc_time": alloc}
        leaves: dict[Key, Any] = {}
        for key, spec in plan.new.items():
            ds = self._new_dataset(src, out, key, spec, kwargs, layouts)
            leaves[key] = H5Leaf(ds, path)
        arrays_kwargs = kwargs if kwargs is not None else _arrays_kwargs(src, plan)
        arrays = H5Arrays(out, path, arrays_kwargs)
        extra = {"hdf5_layouts": new_layouts}
        return Sink(leaves, arrays, copied=True, handle=out, extra=extra)

    def _new_dataset(
        self,
        src: h5py.File,
        out: h5py.File,
        key: Key,
        spec: LeafSpec,
        kwargs: dict[str, Any] | None,
        layouts: dict[str, Any],
    ) -> h5py.Dataset:
        path = key_str(key)
        parent, _, name = path.rpartition("/")
        group = out.require_group(parent) if parent else out
        dtype = _numpy(spec.dtype)
        if spec.replaces is not None:  # compress: a delta replacing a next-observation dataset
            original = src[key_str(spec.replaces)]
            if kwargs is None:
                dcpl = dcpl_like(original.id.get_create_plist(), original.dtype == dtype)
                ds = _create(group, name, dtype, spec.shape, original.maxshape, dcpl)
            else:
                # Chunks of whole rows: a filter then sees each row's values together.
                rows = original.chunks[0] if original.chunks else None
                chunks = (rows, *spec.shape[1:]) if rows else True
                ds = group.create_dataset(
                    name, shape=spec.shape, dtype=dtype, chunks=chunks, track_times=False, **kwargs
                )
        else:  # inflate: recreate the original from its recorded layout
            layout = src.get(f"{OWN}/layout/{path}")
            if layout is None:
                ds = group.create_dataset(name, shape=spec.shape, dtype=dtype, track_times=False)
            else:
                recorded = layouts.get(path) or {}
                maxshape = tuple(recorded.get("maxshape") or spec.shape)
                dcpl = dcpl_like(layout.id.get_create_plist(), True)
                if recorded.get("alloc_time") in _ALLOC_TIMES:
                    dcpl.set_alloc_time(recorded["alloc_time"])
                ds = _create(group, name, layout.dtype, spec.shape, maxshape, dcpl)
                copy_attrs(layout, ds)
        if spec.dtype == torch.bfloat16:
            ds.attrs[BF16_ATTR] = "bfloat16"
        return ds

    def discard(self, sink: Sink) -> None:
        _close_quietly(sink.handle)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        out = sink.handle
        try:
            if meta is not None:
                write_meta(out, meta)
            out.flush()
            out.close()
            _OUTPUT_FDS.pop(id(out), None)
        except (OSError, RuntimeError) as exc:
            _close_quietly(out)
            if isinstance(exc, RuntimeError) and "write failed" not in str(exc):
                raise
            raise write_error(path, exc) from None


def _object_hashes(f: h5py.File, file: Path, skip: Callable[[str], bool]) -> dict[str, str]:
    """xxh3-64 of every dataset as stored (creation properties and raw chunks, never
    decompressed) and of every object's attributes, for the objects ``skip`` keeps."""
    out = {"@": _attrs_hash(f, exclude=META_ATTR)}
    fd = os.open(file, os.O_RDONLY)
    try:

        def visit(name: str, obj: Any) -> None:
            if name == OWN or name.startswith(f"{OWN}/") or skip(name):
                return
            if isinstance(obj, h5py.Dataset):
                out[name] = _raw_hash(obj, fd)
            if len(obj.attrs):  # an attribute added to an object without any is still caught
                out[f"@{name}"] = _attrs_hash(obj)

        f.visititems(visit)
    finally:
        os.close(fd)
    return out


def _attrs_hash(obj: Any, exclude: str | None = None) -> str:
    h = xxhash.xxh3_64()
    for name in sorted(obj.attrs):
        if name == exclude:
            continue
        value = np.asarray(obj.attrs[name])
        h.update(f"{name}\0{value.dtype.str}\0{value.shape}\0".encode())
        h.update(obj.attrs.get_id(name).get_type().encode())  # how the stored bytes read
        h.update(repr(value.tolist()).encode() if value.dtype.kind == "O" else value.tobytes())
    return h.hexdigest()


def _raw_hash(ds: h5py.Dataset, fd: int) -> str:
    """A dataset as stored: dtype, shape, creation properties, then its raw chunks in chunk
    order (each with its position and filter mask) or its contiguous bytes."""
    h = xxhash.xxh3_64()
    props = (ds.dtype.str, ds.shape, ds.maxshape, ds.chunks, ds.compression, ds.compression_opts)
    h.update(repr((props, ds.shuffle, ds.fletcher32, ds.scaleoffset)).encode())
    dsid, dcpl = ds.id, ds.id.get_create_plist()
    # The stored type in full (byte order, bit layout), not only what numpy makes of it.
    h.update(dsid.get_type().encode())
    h.update(dsid.get_space().encode())
    h.update(repr([dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]).encode())
    fill = np.zeros(1, dtype=ds.dtype)
    if dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
        dcpl.get_fill_value(fill)
    h.update(fill.tobytes())
    layout = dcpl.get_layout()
    if layout == h5py.h5d.CHUNKED:
        # Every chunk of the grid, found through the chunk index as a read would find it.
        grid = [range(0, n, c) for n, c in zip(ds.shape, ds.chunks or (), strict=True)]
        cells = math.prod(len(r) for r in grid)
        if cells > 4 * dsid.get_num_chunks() + 1024:
            raise ValueError(f"{ds.name}: {cells} chunk places for {dsid.get_num_chunks()} chunks")
        for offset in itertools.product(*grid):
            try:
                mask, raw = dsid.read_direct_chunk(offset)
            except (KeyError, OSError, RuntimeError, ValueError):
                h.update(f"{offset}: none".encode())
                continue
            h.update(f"{offset}: {mask} {len(raw)}".encode())
            h.update(raw)
    elif layout == h5py.h5d.CONTIGUOUS:
        offset = dsid.get_offset()
        if offset is not None:
            _hash_span(h, fd, offset, dsid.get_storage_size())
    else:  # compact: the values live in the object header
        h.update(np.ascontiguousarray(ds[()]).tobytes())
    return h.hexdigest()


def _hash_span(h: Any, fd: int, offset: int, size: int) -> None:
    """Feed ``size`` bytes of the file at ``offset`` to ``h``, 4 MiB at a time."""
    done = 0
    while done < size:
        piece = os.pread(fd, min(1 << 22, size - done), offset + done)
        if not piece:
            raise ValueError(f"storage at {offset} runs past the end of the file")
        h.update(piece)
        done += len(piece)


def _header_bytes(obj: Any, *, group: bool) -> int:
    """An object's header, and for a group its link index and name heap."""
    info = h5py.h5o.get_info(obj.id)
    total = int(info.hdr.space.total)
    if group:
        total += int(info.meta_size.obj.index_size + info.meta_size.obj.heap_size)
    return total


#: The file descriptor of each output being written, by ``id`` of its h5py file.
_OUTPUT_FDS: dict[int, int] = {}


def _close_quietly(f: h5py.File) -> None:
    """Close an output being abandoned after a failure (it is deleted next).

    A write that failed (full disk, file size limit, I/O error) leaves HDF5 with dirty metadata
    it tries to flush again on close; a second failure there leaves the library in a state where
    the next call touching the file crashes the process. So the file's descriptor is first
    pointed at ``/dev/null``: the flush on close then succeeds, writing nowhere.
    """
    # The descriptor was noted when the file was created: asking HDF5 for it now could crash.
    fd = _OUTPUT_FDS.pop(id(f), None)
    if fd is None:
        return  # closed already, or not an output
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    with contextlib.suppress(OSError, RuntimeError):
        f.close()


def _arrays_kwargs(src: h5py.File, plan: Plan) -> dict[str, Any]:
    """Exception arrays get the built-in compression of the datasets they stand in for."""
    for key in plan.replaced:
        ds = src[key_str(key)]
        if ds.compression in ("gzip", "lzf"):
            return {"compression": ds.compression, "compression_opts": ds.compression_opts}
    return {}


def _is_plain(ds: h5py.Dataset) -> bool:
    """Contiguous, unfiltered, default fill, no attributes, fixed size: what ``create_dataset``
    with a shape and dtype alone makes (robomimic's default)."""
    dcpl = ds.id.get_create_plist()
    return (
        dcpl.get_layout() == h5py.h5d.CONTIGUOUS
        and dcpl.get_nfilters() == 0
        and dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_DEFAULT
        and not len(ds.attrs)
        and ds.maxshape == ds.shape
        and torch_dtype(ds.dtype) is not None
    )


def _keep_layout(out: h5py.File, original: h5py.Dataset) -> None:
    """A dataset with ``original``'s shape, dtype, creation properties and attributes that is
    never written, so it takes no storage; nothing for a plain dataset (``inflate`` recreates
    one from its shape and dtype). It has the batch shape, so readers that check every dataset
    against a batch size (``PersistentTensorDict.from_h5``) accept the file."""
    if _is_plain(original):
        return
    path = original.name.lstrip("/")
    parent, _, name = f"{OWN}/layout/{path}".rpartition("/")
    group = out.require_group(parent)
    dcpl = dcpl_like(original.id.get_create_plist(), True)
    chunked = dcpl.get_layout() == h5py.h5d.CHUNKED
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_INCR if chunked else h5py.h5d.ALLOC_TIME_LATE)
    layout = _create(group, name, original.dtype, original.shape, original.maxshape, dcpl)
    copy_attrs(original, layout)


#: Allocation times HDF5 knows (a recorded one is restored on inflate).
_ALLOC_TIMES = (h5py.h5d.ALLOC_TIME_EARLY, h5py.h5d.ALLOC_TIME_LATE, h5py.h5d.ALLOC_TIME_INCR)


def _copy_tree(src: h5py.Group, dst: h5py.Group, dropped: set[str]) -> None:
    """Copy ``src`` into ``dst`` except the datasets in ``dropped`` and obsdelta's own group."""
    for name, obj in src.items():
        path = obj.name.lstrip("/")
        if path == OWN or path in dropped:
            continue
        if isinstance(obj, h5py.Group) and any(d.startswith(path + "/") for d in dropped):
            group = h5py.Group(
                h5py.h5g.create(dst.id, name.encode(), gcpl=obj.id.get_create_plist())
            )
            copy_attrs(obj, group)
            _copy_tree(obj, group, dropped)
            if not len(group) and not len(group.attrs) and len(obj):
                del dst[name]  # emptied by the rewrite, and nothing else to keep
        else:
            src.copy(obj, dst, name=name)


def h5_groups(group: h5py.Group) -> Iterator[tuple[str, h5py.Group]]:
    """Subgroups of ``group`` in storage order."""
    for name, obj in group.items():
        if isinstance(obj, h5py.Group):
            yield name, obj
