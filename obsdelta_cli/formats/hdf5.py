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
import errno
import json
import os
import re
from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from ..errors import InputError, OutputError, UsageError
from .base import ArrayStore, Format, Key, LeafSpec, Plan, Sink, Source, key_str
from .leaf import FlatRows, LazyLeaf

MAGIC = b"\x89HDF\r\n\x1a\n"
META_ATTR = "obsdelta"
OWN = "obsdelta"
#: Attribute marking a uint16 dataset that holds bfloat16 bits (numpy has no bfloat16).
BF16_ATTR = "obsdelta_dtype"

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

    def write(self, start: int, value: torch.Tensor) -> None:
        if self.bf16:
            value = value.view(torch.int16)
        array = value.contiguous().numpy()
        self.ds[start : start + len(array)] = array.view(self.ds.dtype)


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


def read_meta(f: h5py.File, file: Path) -> dict[str, Any] | None:
    raw = f.attrs.get(META_ATTR)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except (TypeError, ValueError):
        raise InputError(
            "the obsdelta attribute is not JSON", file=file, hint="damaged file"
        ) from None
    if not isinstance(meta, dict):
        raise InputError("the obsdelta attribute is not a JSON object", file=file)
    return meta


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
        array = (rows.view(torch.int16) if rows.dtype == torch.bfloat16 else rows).numpy()
        if name not in group:
            feats = array.shape[1:]
            # Exceptions are usually few: small chunks keep a handful of rows small on disk.
            chunk_rows = max(1, min(1024, (1 << 16) // max(1, array[:1].nbytes)))
            ds = group.create_dataset(
                name,
                shape=(0, *feats),
                maxshape=(None, *feats),
                dtype=array.dtype,
                chunks=(chunk_rows, *feats),
                **self.kwargs,
            )
            if rows.dtype == torch.bfloat16:
                ds.attrs[BF16_ATTR] = "bfloat16"
        ds = group[name]
        n = ds.shape[0]
        ds.resize(n + len(array), axis=0)
        ds[n:] = array

    def storage_bytes(self, name: str) -> int | None:
        ds = self.f.get(f"{OWN}/arrays/{name}")
        return None if ds is None else int(ds.id.get_storage_size())

    def get(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
        ds = self.f.get(f"{OWN}/arrays/{name}")
        if ds is None or tuple(ds.shape) != tuple(shape):
            raise InputError(
                f"array {name} is missing or not of shape {list(shape)}",
                file=self.file,
                hint="the compressed file is damaged",
            )
        return FlatRows(H5Leaf(ds, self.file), 1)


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
            return False  # damaged: detection reports it precisely

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
        except BaseException:
            f.close()
            raise
        return Source(path, leaves, batch_dims, meta, arrays=H5Arrays(f, path), handle=f)

    def infer_batch_dims(self, leaves: dict[Key, Any], meta: dict[str, Any] | None) -> int:
        return self.batch_dims

    def close(self, source: Source) -> None:
        source.handle.close()

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        src: h5py.File = source.handle
        try:
            out = h5py.File(path, "w", libver=src.libver)
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
            new_layouts[key_str(key)] = {"maxshape": list(original.maxshape)}
        leaves: dict[Key, Any] = {}
        for key, spec in plan.new.items():
            ds = self._new_dataset(src, out, key, spec, kwargs, layouts)
            leaves[key] = H5Leaf(ds, path)
        arrays_kwargs = kwargs if kwargs is not None else _arrays_kwargs(src, plan)
        arrays = H5Arrays(out, path, arrays_kwargs)
        return Sink(leaves, arrays, copied=True, handle=(out, new_layouts))

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
                    name, shape=spec.shape, dtype=dtype, chunks=chunks, **kwargs
                )
        else:  # inflate: recreate the original from its recorded layout
            layout = src.get(f"{OWN}/layout/{path}")
            if layout is None:
                ds = group.create_dataset(name, shape=spec.shape, dtype=dtype)
            else:
                maxshape = tuple(layouts.get(path, {}).get("maxshape") or spec.shape)
                dcpl = dcpl_like(layout.id.get_create_plist(), True)
                ds = _create(group, name, layout.dtype, spec.shape, maxshape, dcpl)
                copy_attrs(layout, ds)
        if spec.dtype == torch.bfloat16:
            ds.attrs[BF16_ATTR] = "bfloat16"
        return ds

    def discard(self, sink: Sink) -> None:
        _close_quietly(sink.handle[0])

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        out, new_layouts = sink.handle
        try:
            if meta is not None:
                meta["hdf5_layouts"] = new_layouts
                out.attrs[META_ATTR] = json.dumps(meta)
            out.flush()
            out.close()
        except (OSError, RuntimeError) as exc:
            _close_quietly(out)
            if isinstance(exc, RuntimeError) and "write failed" not in str(exc):
                raise
            raise write_error(path, exc) from None


def _close_quietly(f: h5py.File) -> None:
    """Close an output being abandoned after a failure (it is deleted next).

    A write that failed (full disk, file size limit, I/O error) leaves HDF5 with dirty metadata
    it tries to flush again on close; a second failure there leaves the library in a state where
    the next call touching the file crashes the process. So the file's descriptor is first
    pointed at ``/dev/null``: the flush on close then succeeds, writing nowhere.
    """
    if not f.id.valid:
        return
    with contextlib.suppress(OSError, RuntimeError, ValueError, TypeError):
        if f.mode == "r+":
            fd = int(f.id.get_vfd_handle())
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
    with contextlib.suppress(OSError, RuntimeError):
        f.close()


_H5_ERRNO = re.compile(r"errno = (\d+)")
_H5_MESSAGE = re.compile(r"error message = '([^']*)'")


def write_error(path: Path, exc: Exception) -> OutputError:
    """One line for an HDF5 write that failed (HDF5's messages span lines and name the
    temporary): the system's reason where HDF5 gives it, else HDF5's first words."""
    text = " ".join(str(exc).split())
    found = _H5_MESSAGE.search(text)
    code = _H5_ERRNO.search(text)
    if found:
        reason = found.group(1)
    elif code and int(code.group(1)) in errno.errorcode:
        reason = os.strerror(int(code.group(1)))
    elif "write failed" in text:
        reason = "HDF5: file write failed"
    else:
        reason = text.split(" (", 1)[0] or type(exc).__name__
    return OutputError(
        f"cannot write ({reason})",
        file=path.parent / path.name.split(".obsdelta-tmp-")[0].lstrip("."),
        hint="check free space and permissions; nothing was written",
    )


def _arrays_kwargs(src: h5py.File, plan: Plan) -> dict[str, Any]:
    """Exception arrays get the built-in compression of the datasets they stand in for."""
    for key in plan.replaced:
        ds = src[key_str(key)]
        if ds.compression in ("gzip", "lzf"):
            return {"compression": ds.compression, "compression_opts": ds.compression_opts}
    return {}


def _keep_layout(out: h5py.File, original: h5py.Dataset) -> None:
    """An empty dataset with ``original``'s dtype, creation properties and attributes."""
    path = original.name.lstrip("/")
    parent, _, name = f"{OWN}/layout/{path}".rpartition("/")
    group = out.require_group(parent)
    dcpl = original.id.get_create_plist()
    chunked = dcpl.get_layout() == h5py.h5d.CHUNKED
    shape = (0, *original.shape[1:])
    maxshape = (None if chunked else 0, *original.shape[1:])
    layout = _create(group, name, original.dtype, shape, maxshape, dcpl_like(dcpl, True))
    copy_attrs(original, layout)


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
