"""Writing a packed file from a compressed container, and unpacking it back (the layout is
described in :mod:`.packed`).

Packing reads the inner container once: each dataset (an HDF5 dataset, or a folder's memmap
leaf) is hashed as its rows pass and written in chunks along time with the filter measured
smallest for its key; everything else is kept as it is. Unpacking writes the inner container
back: a folder file for file, an HDF5 file object for object with each dataset's original
creation properties, so that its own checks (raw chunks and attributes, as recorded at compress
time) pass again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..arrays import BFLOAT16, dtype_name
from ..errors import InputError, UsageError
from ..filters import (
    FILTERS,
    MIN_PACK_BYTES,
    Filter,
    choose,
    chunk_rows,
    family,
    minimal_headers,
    pool,
    sample_rows,
    workers,
)
from ..manifest import Manifest
from .base import SIDECAR, Key, Source, key_str, write_sidecar
from .hdf5 import (
    ALLOC_TIMES,
    Groups,
    closed_on_failure,
    copy_attrs,
    create_dataset,
    dcpl_like,
    finish_output,
    new_output,
)
from .hdf5_copy import Relinks, copy_object, copy_values
from .hdf5_leaves import (
    BF16_ATTR,
    LAYOUT_TWINS,
    META_ATTR,
    OWN,
    h5_dtype,
    leaf_dtype,
    objects_of,
)
from .hdf5_meta import MANIFEST, write_meta
from .hdf5_objects import hash_objects_apart
from .hdf5_safety import damaged_pack, reading_pack, scale_offset
from .leaf import FileLeaf, LazyLeaf
from .pack_columns import Shared, kept_path, plan_columns, write_virtual
from .packed import (
    COMMAND_CACHE_BYTES,
    FILES,
    NAME,
    PACK,
    TRANSFORM_ATTR,
    file_bytes,
    pack_info,
    repacked_leaf,
)

#: Library versions of a packed file: v1.10 object headers and chunk indexes (fixed arrays:
#: one lookup per chunk), readable by any HDF5 from 1.10 on.
LIBVER = ("v110", "v110")
#: A small chunked dataset whose chunk index takes more bytes than this is repacked, not
#: copied (see ``_repackable``).
HEAVY_INDEX = 512
#: Rows are moved in blocks of about this many bytes (whole chunks).
BLOCK_BYTES = 8 << 20
#: A packed file's manifest longer than this is stored compressed, at a quarter to a third of
#: its size (the 4.2 KB of a replay-buffer dump's, 1.2 KB): the dataset that holds it costs an
#: object header of about 110 bytes, which compression gains back from a few hundred bytes on.
PLAIN_MANIFEST_BYTES = 1 << 9

Reader = Callable[[int, int], np.ndarray]


@dataclass
class Chooser:
    """The filter of each key family, measured on the first dataset of the family seen.

    With ``sample`` (``report --pack``), datasets get only their sampled chunks, and ``extra``
    adds up what the others would take, extrapolated from the sampled ones."""

    choices: dict[str, tuple[Filter, float]] = field(default_factory=dict)
    sample: bool = False
    extra: float = 0.0

    def pick(self, path: str, read: Reader, shape: tuple[int, ...], per: int) -> Filter:
        fam = family(path)
        if fam not in self.choices:
            samples = [read(sl.start, sl.stop) for sl in sample_rows(shape[0], per)]
            self.choices[fam] = choose(samples, per)
        return self.choices[fam][0]


def _stored(a: np.ndarray) -> np.ndarray:
    """Rows as HDF5 holds them: bfloat16 as its uint16 bits."""
    return a.view(np.uint16) if a.dtype == BFLOAT16 else a


class DatasetWriter:
    """Dataset ``name`` of ``group``, chunked along its first dimension with the filter
    ``chooser`` picks for its key ``path`` (measured on rows from ``read``, which gives new
    arrays), filled with rows in order: each chunk is encoded on a pool of threads once its
    rows are all given, and written as stored bytes, while the rows that follow come; they
    are hashed as they come.

    :meth:`fill` fills it from ``read``; :class:`Early` has the compress pass give the rows."""

    def __init__(
        self,
        group: h5py.Group,
        name: str,
        path: str,
        read: Reader,
        shape: tuple[int, ...],
        dtype: np.dtype,
        chooser: Chooser,
    ) -> None:
        self.path, self.read, self.shape, self.dtype = path, read, shape, np.dtype(dtype)
        self.sample = chooser.sample
        self.per = chunk_rows(shape, self.dtype.itemsize)
        self.flt = chooser.pick(path, read, shape, self.per)
        self.ds = group.create_dataset(
            name,
            shape=shape,
            dtype=self.dtype,
            chunks=(self.per, *shape[1:]),
            track_times=False,
            **self.flt.kwargs(),
        )
        if self.flt.transform:
            self.ds.attrs[TRANSFORM_ATTR] = self.flt.transform
        self._chooser = chooser
        self._tail = (0,) * (len(shape) - 1)
        self._depth = 2 * workers()  # chunks being encoded at most
        self.begin()

    def begin(self) -> None:
        """Start again from the first row (the inner container is written again, see
        :class:`~obsdelta_cli.commands.compress.Unpaid`): each chunk is written again, in
        place, with the same bytes."""
        self.done = 0
        self.hash = xxhash.xxh3_64()
        self._rows: np.ndarray | None = None  # the chunk being filled, from row _first
        self._first = self._filled = 0
        self._pending: list[tuple[int, Future[bytes]]] = []

    def fill(self) -> dict[str, Any]:
        """Write every row from ``read``, :data:`BLOCK_BYTES` at a time (with the chooser's
        ``sample``, only its sampled chunks, and add what the others would take to its
        ``extra``); return the dataset's entry for the manifest (filter, hash)."""
        if self.sample:
            taken = stored = 0
            for sl in sample_rows(self.shape[0], self.per):
                data = self.flt.encode(self._given(self.read(sl.start, sl.stop)), self.per)
                self.ds.id.write_direct_chunk((sl.start, *self._tail), data)
                taken, stored = taken + sl.stop - sl.start, stored + len(data)
            self._chooser.extra += stored * (self.shape[0] / taken - 1)
            return {"filter": self.flt.name, "chunk_rows": self.per, "values": ""}
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        step = self.per * max(1, BLOCK_BYTES // max(1, self.per * row))
        for start in range(0, self.shape[0], step):
            self.write(start, self.read(start, min(self.shape[0], start + step)), owned=True)
        return self.finish()

    def _given(self, value: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(value, dtype=self.dtype)

    def write(self, start: int, value: np.ndarray, *, owned: bool = False) -> None:
        """Rows ``start:start + len(value)``, the rows before them all given; ``owned``: the
        caller leaves ``value`` alone from now on (whole chunks of it are encoded without a
        copy)."""
        if start != self.done:  # the pass writes every leaf in order
            raise RuntimeError(f"{self.path}: rows from {start} given after {self.done}")
        rows = self._given(value)
        self.hash.update(rows.reshape(-1).view(np.uint8).data)
        at = 0
        while at < len(rows):
            if owned and self._filled == 0 and len(rows) - at >= self.per:
                self._rows, self._filled = rows[at : at + self.per], self.per
                at += self.per
            else:
                if self._rows is None:  # a new one: the pool may be encoding the last one
                    self._rows = np.empty((self.per, *self.shape[1:]), dtype=self.dtype)
                take = min(self.per - self._filled, len(rows) - at)
                self._rows[self._filled : self._filled + take] = rows[at : at + take]
                self._filled += take
                at += take
            if self._filled == self.per:
                self._submit()
        self.done += len(rows)
        while len(self._pending) > self._depth or (self._pending and self._pending[0][1].done()):
            self._put(*self._pending.pop(0))

    def _submit(self) -> None:
        """Encode the chunk filled so far on the pool."""
        assert self._rows is not None
        rows = self._rows[: self._filled]
        self._pending.append((self._first, pool().submit(self.flt.encode, rows, self.per)))
        self._first += self._filled
        self._rows, self._filled = None, 0

    def _put(self, first: int, future: Future[bytes]) -> None:
        self.ds.id.write_direct_chunk((first, *self._tail), future.result())

    def finish(self) -> dict[str, Any]:
        """Write what is left; the dataset's entry for the manifest (filter, hash)."""
        if self._filled:
            self._submit()
        while self._pending:
            self._put(*self._pending.pop(0))
        if self.done != self.shape[0]:
            raise RuntimeError(f"{self.path}: {self.done} of {self.shape[0]} rows given")
        return {"filter": self.flt.name, "chunk_rows": self.per, "values": self.hash.hexdigest()}


class Leaf(LazyLeaf):
    """A leaf of a folder inner container whose rows go to a :class:`DatasetWriter` (see
    :class:`Early`): written, never read."""

    readable = False

    def __init__(self, writer: DatasetWriter) -> None:
        self.writer, self.shape, self.dtype = writer, writer.shape, writer.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        raise UsageError("a leaf being packed is not read back", key=self.writer.path)

    def write(self, start: int, value: np.ndarray) -> None:
        self.writer.write(start, value)


class Early:
    """The leaves of a folder inner container that go straight into the packed file ``out``
    as the inner container is written (``compress --pack``), rather than to the inner
    container's files (left sparse, never written or read) and from there into the packed file:
    the leaves kept unchanged, of at least :data:`~obsdelta_cli.filters.MIN_PACK_BYTES`, not
    bfloat16. Called with a key and its input leaf, it gives the leaf to write, or ``None``."""

    def __init__(self, out: h5py.File, chooser: Chooser) -> None:
        self.out, self.chooser = out, chooser
        self.writers: dict[Key, DatasetWriter] = {}

    def __call__(self, key: Key, source: LazyLeaf) -> Leaf | None:
        writer = self.writers.get(key)
        if writer is not None:  # the inner container written again
            writer.begin()
            return Leaf(writer)
        filtered = _filtered(source.shape, np.dtype(source.dtype))  # else stored as it is
        if not is_dataset_key(key) or not filtered or source.dtype == BFLOAT16:
            return None  # left to the packing step, which refuses a bad key
        group, name = _group_of(self.out, key)
        path, shape = key_str(key), tuple(source.shape)
        writer = DatasetWriter(group, name, path, source.read, shape, source.dtype, self.chooser)
        self.writers[key] = writer
        return Leaf(writer)

    def entries(self) -> dict[Key, dict[str, Any]]:
        """Each leaf's entry for the manifest, once the inner container is complete."""
        return {key: writer.finish() for key, writer in self.writers.items()}


def packed_manifest(manifest: Manifest, inner: str, info: dict[str, Any]) -> Manifest:
    """The packed file's manifest: the inner one, saying where it came from."""
    info = {**info, "inner_hash": manifest.to_json()["manifest_hash"]}
    extra = {**manifest.extra, "pack": info}
    return replace(manifest, container=NAME, source_container=inner, extra=extra)


def inner_manifest(manifest: Manifest, file: Path) -> Manifest:
    """The inner container's manifest back from a packed file's (checked against its hash)."""
    info = pack_info(manifest.to_json(), file)
    extra = {k: v for k, v in manifest.extra.items() if k != "pack"}
    if manifest.source_container is None:
        raise InputError("obsdelta metadata field source_format is missing", file=file)
    inner = replace(manifest, container=manifest.source_container, source_container=None)
    inner = replace(inner, extra=extra)
    if inner.to_json()["manifest_hash"] != info["inner_hash"]:
        what = "obsdelta metadata field pack.inner_hash does not match the manifest"
        raise damaged_pack(file, what)
    return inner


# ---------------------------------------------------------------------------------------------
# Packing


@contextmanager
def packed_output(path: Path) -> Iterator[h5py.File]:
    """A new packed file, to be filled by :func:`~.packing.pack_into`; flushed and closed at
    the end (see :func:`h5_output`)."""
    with h5_output(path, LIBVER) as f:
        minimal_headers(f)
        yield f


@contextmanager
def h5_output(path: Path, libver: Any) -> Iterator[h5py.File]:
    """A new HDF5 file, flushed and closed at the end; a failed write is one
    :class:`OutputError`, and the file is left for the caller to delete."""
    f = new_output(path, libver)
    with closed_on_failure(f, path):
        yield f
        finish_output(f)


def _group_like(src: h5py.Group, dst: h5py.Group, name: str) -> h5py.Group:
    """Group ``name`` of ``dst`` with ``src``'s creation properties and attributes (obsdelta's
    own group may exist already: the twins live in it)."""
    if name in dst:
        group = dst[name]
    else:
        gcpl = src.id.get_create_plist()
        group = h5py.Group(h5py.h5g.create(dst.id, name.encode(), gcpl=gcpl))
    copy_attrs(src, group)
    return group


def _repackable(ds: h5py.Dataset, flat: bool = False) -> bool:
    """A numeric dataset of rows, stored in the file, worth filtering, or with a heavy chunk
    index: HDF5's copy of a chunked dataset keeps its index, a version-1 B-tree of 2.1-2.6 KB
    in files of HDF5's oldest format however small the dataset (a Minari episode's
    ``rewards``, ``terminations`` and ``truncations``), where a repacked one costs about
    0.4 KB with its layout twin. Not one whose filter is scale-offset: unpacking would encode
    its values again, which need not give back the bytes it stored (they are copied as they
    are). ``flat``: whatever its size, as its rows join others' (:mod:`.pack_flat`)."""
    dcpl = ds.id.get_create_plist()
    layout = dcpl.get_layout()
    return (
        ds.ndim >= 1
        and leaf_dtype(ds.dtype) is not None
        and (flat or ds.nbytes >= MIN_PACK_BYTES or _heavy_index(ds, layout))
        and layout in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED)
        and dcpl.get_external_count() == 0
        and 0 not in ds.shape
        and not scale_offset(dcpl)
    )


def _heavy_index(ds: h5py.Dataset, layout: int) -> bool:
    """Whether a chunked dataset's chunk index takes more than :data:`HEAVY_INDEX` bytes."""
    if layout != h5py.h5d.CHUNKED:
        return False
    return h5py.h5o.get_info(ds.id).meta_size.obj.index_size > HEAVY_INDEX


def _absent_chunks(ds: h5py.Dataset) -> list[list[int]] | None:
    """Offsets of the chunks never written (``None``: all are), where some are missing; a
    contiguous dataset never written has none at all."""
    dsid = ds.id
    if ds.chunks is None:
        return None if dsid.get_storage_size() else []
    stored = {tuple(dsid.get_chunk_info(i).chunk_offset) for i in range(dsid.get_num_chunks())}
    grid = np.stack(
        np.meshgrid(*[np.arange(0, n, c) for n, c in zip(ds.shape, ds.chunks, strict=True)]),
        -1,
    ).reshape(-1, ds.ndim)
    if len(stored) == len(grid):
        return None
    return [list(map(int, o)) for o in grid if tuple(int(x) for x in o) not in stored]


def copy_structure(
    src: h5py.File,
    out: h5py.File,
    rewritten: Container[str],
    rewrite: Callable[[h5py.Dataset, h5py.Group, str, str], None],
) -> None:
    """Copy ``src`` into ``out`` object for object but its manifest (the packed one holds
    it), with its root attributes; each dataset whose path is in ``rewritten`` is given to
    ``rewrite(dataset, parent in out, name, path)`` instead."""
    copy_attrs(src, out)  # with their stored types, as every other object's
    if META_ATTR in out.attrs:
        del out.attrs[META_ATTR]
    relinks = Relinks()

    def walk(group: h5py.Group, dst: h5py.Group) -> None:
        # A list, not h5py's view: iterating the view holds h5py's lock, which a chunk encoder
        # thread may need (to free an h5py object) while this thread waits for it.
        for name, obj in list(group.items()):
            path = obj.name.lstrip("/")
            # A second link to an object copied already links to its copy.
            if path == MANIFEST or relinks.relinked(obj, dst, name):
                continue
            if isinstance(obj, h5py.Group):
                walk(obj, _group_like(obj, dst, name))
            elif path in rewritten:
                rewrite(obj, dst, name, path)
            else:
                copy_object(group, obj, dst, name)

    walk(src, out)


def pack_hdf5(src: h5py.File, out: h5py.File, chooser: Chooser) -> dict[str, Any]:
    datasets: dict[str, Any] = {}
    repacked = {
        name: obj
        for name, obj in objects_of(src)
        if isinstance(obj, h5py.Dataset) and _repacked(obj, name)
    }
    shared = plan_columns(repacked)
    groups = Groups(out)

    def rewrite(ds: h5py.Dataset, dst: h5py.Group, name: str, path: str) -> None:
        datasets[path] = _repack(ds, dst, name, path, groups, chooser, shared.get(path))

    copy_structure(src, out, repacked, rewrite)
    return {"kind": "hdf5", "libver": list(src.libver), "datasets": datasets}


def _repacked(ds: h5py.Dataset, path: str, flat: bool = False) -> bool:
    """Whether a dataset of an HDF5 inner is rewritten (obsdelta's exception rows and layouts
    are copied as they are)."""
    own = path.split("/")[:2] in ([OWN, "arrays"], [OWN, "layout"])
    return _repackable(ds, flat) and not own


def _repack(
    ds: h5py.Dataset,
    dst: h5py.Group,
    name: str,
    path: str,
    groups: Groups,
    chooser: Chooser,
    shared: Shared | None,
) -> dict[str, Any]:
    if shared is None:

        def read(start: int, stop: int) -> np.ndarray:
            return np.asarray(ds[start:stop])

        entry = DatasetWriter(dst, name, path, read, ds.shape, ds.dtype, chooser).fill()
    else:
        entry = _write_kept(ds, path, groups, chooser, shared)
        write_virtual(dst, name, ds, shared)
    copy_attrs(ds, dst[name])
    # The twin: the original creation properties, never written, so taking no storage.
    parent, _, leaf = f"{LAYOUT_TWINS}/{path}".rpartition("/")
    dcpl = dcpl_like(ds.id.get_create_plist(), True)
    chunked = dcpl.get_layout() == h5py.h5d.CHUNKED
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_INCR if chunked else h5py.h5d.ALLOC_TIME_LATE)
    create_dataset(groups(parent), leaf, ds.dtype, ds.shape, ds.maxshape, dcpl)
    entry["alloc_time"] = ds.id.get_create_plist().get_alloc_time()
    absent = _absent_chunks(ds)
    if absent is not None:
        entry["absent"] = absent
    return entry


def _write_kept(
    ds: h5py.Dataset, path: str, groups: Groups, chooser: Chooser, shared: Shared
) -> dict[str, Any]:
    """A dataset whose columns repeat others': the columns it keeps, in their own dataset (the
    dataset itself is virtual, mapping those and the repeated ones)."""
    entry: dict[str, Any] = {"filter": None, "values": shared.values, "columns": shared.blocks}
    if shared.kept:
        kept = shared.kept

        def read(start: int, stop: int) -> np.ndarray:
            return np.asarray(ds[start:stop])[:, kept]

        parent, _, leaf = kept_path(path).rpartition("/")
        shape = (ds.shape[0], len(kept))
        own = DatasetWriter(groups(parent), leaf, kept_path(path), read, shape, ds.dtype, chooser)
        written = own.fill()
        entry.update(filter=written["filter"], chunk_rows=written["chunk_rows"])
    return entry


def pack_folder(
    inner: Source, out: h5py.File, chooser: Chooser, early: dict[Key, dict[str, Any]]
) -> dict[str, Any]:
    root = inner.path
    leaf_files: dict[str, Key] = {}
    entries: list[dict[str, Any]] = []
    for key, leaf in inner.leaves.items():
        dataset_key(key, root)
        if isinstance(leaf, FileLeaf) and leaf.shape:
            rel = Path(leaf.path).relative_to(root).as_posix()
            leaf_files[rel] = key
            entries.append({"key": list(key), "kind": "data", "file": rel})
        else:
            entries.append(other_entry(key, leaf))
    files: list[str] = []
    dirs: list[str] = []
    datasets: dict[str, Any] = {}
    for item in sorted(root.rglob("*")):
        rel = item.relative_to(root).as_posix()
        if item.is_symlink():
            raise UsageError("--pack cannot keep a symbolic link", file=item)
        if item.is_dir():
            dirs.append(rel)
        elif rel in leaf_files:
            key = leaf_files[rel]
            if key in early:  # written as the inner container was; its file left empty
                datasets[key_str(key)] = early[key]
            else:
                datasets[key_str(key)] = pack_leaf(inner.leaves[key], key, out, chooser)
        elif rel != SIDECAR:  # the manifest: the packed one holds it
            write_bytes(out, f"{FILES}/f{len(files)}", item.read_bytes())
            files.append(rel)
    return {"kind": "folder", "leaves": entries, "files": files, "dirs": dirs, "datasets": datasets}


def other_entry(key: Key, leaf: Any) -> dict[str, Any]:
    """The manifest entry of a leaf that is not packed as a dataset: an empty array (its shape
    and dtype), or a non-array entry the inner container keeps itself."""
    if isinstance(leaf, np.ndarray):
        shape, dtype = list(leaf.shape), dtype_name(leaf.dtype)
        return {"key": list(key), "kind": "empty", "shape": shape, "dtype": dtype}
    return {"key": list(key), "kind": "entry"}


def is_dataset_key(key: Key) -> bool:
    """Whether ``key`` can be the path of a dataset of the packed file."""
    return key[0] != OWN and all(p not in ("", ".", "..") and "/" not in p for p in key)


def dataset_key(key: Key, file: Path) -> None:
    """Refuse a key that cannot be the path of a dataset of the packed file."""
    if not is_dataset_key(key):
        raise UsageError(
            f"key {key_str(key)!r} cannot be an HDF5 dataset name", file=file, key=key_str(key)
        )


def _group_of(out: h5py.File, key: Key) -> tuple[h5py.Group, str]:
    """The group of ``out`` that holds the dataset at ``key``'s path (made if missing), and the
    dataset's name in it."""
    parent, name = key[:-1], key[-1]
    return (out.require_group(key_str(parent)) if parent else out), name


def _filtered(shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether a leaf's dataset is filtered: not empty, and of :data:`MIN_PACK_BYTES` or more
    (a smaller one is stored as it is)."""
    return 0 not in shape and math.prod(shape) * dtype.itemsize >= MIN_PACK_BYTES


def pack_leaf(leaf: LazyLeaf, key: Key, out: h5py.File, chooser: Chooser) -> dict[str, Any]:
    """Write ``leaf`` as the dataset at its key's path, filtered (as it is when too small);
    return its entry for the manifest."""
    dtype = h5_dtype(leaf.dtype)
    group, name = _group_of(out, key)

    def read(start: int, stop: int) -> np.ndarray:
        return _stored(leaf.read(start, stop))

    if _filtered(leaf.shape, dtype):
        entry = DatasetWriter(group, name, key_str(key), read, leaf.shape, dtype, chooser).fill()
    else:  # too small to filter
        group.create_dataset(name, data=read(0, leaf.shape[0]), track_times=False)
        entry = {"filter": None}
    if leaf.dtype == BFLOAT16:
        group[name].attrs[BF16_ATTR] = "bfloat16"
    return entry


def write_bytes(out: h5py.File, path: str, data: bytes) -> None:
    """An opaque byte dataset (non-array data to HDF5 readers), zstd-compressed when long."""
    array = np.frombuffer(data, dtype=np.uint8).view(h5py.opaque_dtype(np.dtype("V1")))
    if len(data) < MIN_PACK_BYTES:
        out.create_dataset(path, data=array, track_times=False)
        return
    chunks = (min(len(data), 1 << 20),)
    kwargs = FILTERS["zstd3"].kwargs()
    out.create_dataset(path, data=array, chunks=chunks, track_times=False, **kwargs)


# ---------------------------------------------------------------------------------------------
# Unpacking


def _safe_rel(rel: Any, file: Path) -> Path:
    """A relative path from the manifest, refused if it would leave the output folder."""
    parts = str(rel).split("/") if isinstance(rel, str) else []
    if not parts or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise damaged_pack(file, f"the packed file names an unsafe path ({rel!r})")
    return Path(*parts)


def _copy_rows(leaf: Any, rows: int, write: Callable[[int, np.ndarray], None], step: int) -> None:
    for start in range(0, rows, step):
        write(start, _stored(leaf.read(start, min(rows, start + step))))


def unpack_folder(packed: Source, info: dict[str, Any], inner: Manifest, out: Path) -> None:
    f: h5py.File = packed.handle
    out.mkdir()
    for rel in info["dirs"]:
        (out / _safe_rel(rel, packed.path)).mkdir(parents=True, exist_ok=True)
    for i, rel in enumerate(info["files"]):
        (out / _safe_rel(rel, packed.path)).write_bytes(file_bytes(f, i, packed.path))
    for entry in info["leaves"]:
        if entry.get("kind") != "data":
            continue
        leaf = packed.leaves[tuple(entry["key"])]
        target = out / _safe_rel(entry.get("file"), packed.path)
        row_bytes = max(1, math.prod(leaf.shape[1:]) * leaf.dtype.itemsize)
        with target.open("wb") as fh:

            def put(start: int, block: np.ndarray, fh: Any = fh) -> None:
                fh.write(np.ascontiguousarray(block).tobytes())

            _copy_rows(leaf, leaf.shape[0], put, max(1, BLOCK_BYTES // row_bytes))
    write_sidecar(out, inner.to_json())


def _check_kept(packed: Source, datasets: dict[str, Any], inner: Manifest) -> None:
    """The objects unpacking copies whole (those not repacked), checked against the inner
    container's record before HDF5 is asked to copy them, as inflate checks what it copies:
    HDF5 can crash on a damaged object it copies."""
    # Read from the file the objects are in: a flat packed file's skeleton is apart.
    with reading_pack(packed.path):
        held = Path(packed.handle.filename)
        found = hash_objects_apart(
            packed.handle, held, lambda name: name in datasets, copied_from=inner.objects
        )
    differing = inner.object_differing(found, all_recorded=False)
    if differing is not None:
        name, recorded, _ = differing
        what = "is not in its record" if recorded is None else "does not match its hash"
        raise damaged_pack(packed.path, f"object {name or '/'} {what}")


def unpack_hdf5(packed: Source, info: dict[str, Any], inner: Manifest, out: Path) -> None:
    src: h5py.File = packed.handle
    if inner.objects:  # recorded by format 2 on
        _check_kept(packed, info["datasets"], inner)
    libver = info.get("libver")
    with (
        h5_output(out, tuple(libver) if isinstance(libver, list) else None) as f,
        reading_pack(packed.path),
    ):
        copy_attrs(src, f)
        if META_ATTR in f.attrs:  # a flat packed file's skeleton has none
            del f.attrs[META_ATTR]
        _unpack_group(packed, src, f, info["datasets"])
        if OWN in f and not len(f[OWN]):
            del f[OWN]
        write_meta(f, inner.to_json())


def _unpack_group(
    packed: Source,
    group: h5py.Group,
    dst: h5py.Group,
    datasets: dict[str, Any],
    relinks: Relinks | None = None,
) -> None:
    relinks = Relinks() if relinks is None else relinks
    for name, obj in group.items():
        path = obj.name.lstrip("/")
        if path in (PACK, MANIFEST) or relinks.relinked(obj, dst, name):
            continue
        if isinstance(obj, h5py.Group):
            _unpack_group(packed, obj, _group_like(obj, dst, name), datasets, relinks)
        elif path in datasets:
            _restore(packed, obj, dst, name, path, datasets[path])
        elif path.startswith(f"{OWN}/") and not isinstance(obj, h5py.Dataset):
            # obsdelta's own objects are groups and datasets: anything else is a damaged
            # header, which HDF5's object copy met with a crash.
            raise damaged_pack(packed.path, f"obsdelta's object {path} is not a dataset")
        elif path.startswith(f"{OWN}/arrays/"):
            # Not an object copy: HDF5 reads the attribute's string through a heap address,
            # which damage turned into a crash; the values are checked against the rows'
            # hashes as inflate reads them, and the manifest gives the dtype.
            copy_values(obj, dst, name)
        else:
            copy_object(group, obj, dst, name)


def _restore(
    packed: Source, ds: h5py.Dataset, dst: h5py.Group, name: str, path: str, entry: Any
) -> None:
    """Recreate a repacked dataset with its original creation properties and values (those of
    a flat packed file's member: its twin in the skeleton, and its rows of its family)."""
    flat = packed.memo.get("flat")
    twin = ds if flat is not None else packed.handle.get(f"{LAYOUT_TWINS}/{path}")
    if not isinstance(twin, h5py.Dataset) or twin.shape != ds.shape or twin.dtype != ds.dtype:
        raise damaged_pack(packed.path, f"the original layout of {path} is missing")
    dcpl = dcpl_like(twin.id.get_create_plist(), True)
    if entry.get("alloc_time") in ALLOC_TIMES:
        dcpl.set_alloc_time(entry["alloc_time"])
    new = create_dataset(dst, name, twin.dtype, twin.shape, twin.maxshape, dcpl)
    for attr in ds.attrs:
        if attr != TRANSFORM_ATTR:
            new.attrs.create(attr, ds.attrs[attr], dtype=ds.attrs.get_id(attr).dtype)
    if flat is not None:
        leaf = flat.leaf(ds, path)
    else:
        leaf = repacked_leaf(packed.handle, packed.path, path, entry, COMMAND_CACHE_BYTES)
    absent = entry.get("absent")
    if absent == []:
        return  # never written: no storage, as the original
    if absent:
        # Only the chunks the original had: a chunk never written stays unallocated.
        skip = {tuple(o) for o in absent}
        chunks = new.chunks or ()
        grid = np.stack(
            np.meshgrid(*[np.arange(0, n, c) for n, c in zip(new.shape, chunks, strict=True)]),
            -1,
        ).reshape(-1, new.ndim)
        for o in grid:
            if tuple(int(x) for x in o) in skip:
                continue
            sel = tuple(
                slice(int(a), min(n, int(a) + c))
                for a, n, c in zip(o, new.shape, chunks, strict=True)
            )
            new[sel] = _stored(leaf.read(sel[0].start, sel[0].stop))[(slice(None), *sel[1:])]
        return
    per = new.chunks[0] if new.chunks else 1
    row_bytes = max(1, math.prod(new.shape[1:]) * new.dtype.itemsize)
    step = per * max(1, BLOCK_BYTES // max(1, per * row_bytes))

    def put(start: int, block: np.ndarray) -> None:
        new[start : start + len(block)] = block.view(new.dtype)

    _copy_rows(leaf, new.shape[0], put, step)
