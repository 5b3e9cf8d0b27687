"""HDF5 datasets as leaves: lazy numeric datasets, obsdelta's opaque arrays, and the store of
exception rows."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py._objects import phil

from ..arrays import DTYPES, bfloat16, dtype_name, is_bfloat16
from ..errors import InputError
from .base import ArrayStore, Key
from .chunk_cache import BandReads, ChunkCache
from .hdf5_chunks import DirectChunks
from .hdf5_safety import scale_offset
from .hdf5_types import stored_type
from .hdf5_walk import (
    OWN,
    FileReads,
    Held,
    file_reads,
    objects_of,
    shared_of,
)
from .leaf import FlatRows, LazyLeaf, map_private, read_exact

MAGIC = b"\x89HDF\r\n\x1a\n"
META_ATTR = "obsdelta"


def replaced_twins(own: str = OWN) -> str:
    """Where a compressed HDF5 file whose own group is ``own`` keeps an empty dataset with
    the creation properties and attributes of each next-observation dataset it replaced:
    ``inflate`` recreates the dataset from its twin."""
    return f"{own}/layout"


#: Attribute marking a uint16 dataset that holds bfloat16 bits (numpy has no bfloat16).
BF16_ATTR = "obsdelta_dtype"
#: Rows a filtered chunk spans at least for random reads to pay off its decode.
FEW_ROWS = 64
#: Attribute of obsdelta's opaque arrays: the dtype of their values, by its metadata name.
ARRAY_DTYPE = "obsdelta_dtype"


def leaf_dtype(dtype: np.dtype) -> np.dtype | None:
    """The dtype a leaf of a dataset of ``dtype`` has: that of a number obsdelta reads (in the
    machine's order); ``None`` for strings, compounds, big-endian numbers and the like.

    >>> leaf_dtype(np.dtype("<f4")), leaf_dtype(np.dtype(">f4")), leaf_dtype(np.dtype("f16"))
    (dtype('float32'), None, None)
    """
    if dtype in _LEAF_DTYPES:
        return _LEAF_DTYPES[dtype]
    found = None
    if dtype.kind in "biuf" and dtype.byteorder != ">":
        found = DTYPES.get(dtype.name)
    _LEAF_DTYPES[dtype] = found
    return found


#: :func:`leaf_dtype` of each dtype seen: a dtype's ``name`` takes numpy 10 µs to make, and a
#: robomimic file's thousands of datasets have a handful of dtypes between them.
_LEAF_DTYPES: dict[np.dtype, np.dtype | None] = {}


def h5_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype HDF5 stores a leaf of ``dtype`` as (bfloat16 as its uint16 bits)."""
    return np.dtype(np.uint16) if is_bfloat16(dtype) else np.dtype(dtype)


def read_rows(ds: h5py.Dataset, rows: Any, file: Path, what: str) -> np.ndarray:
    """``ds[rows]`` as a contiguous array; a failed read is one :class:`InputError`."""
    try:
        return np.ascontiguousarray(ds[rows])
    except (OSError, ValueError) as exc:
        raise InputError(
            f"cannot read {what} ({exc})",
            file=file,
            key=ds.name.lstrip("/"),
            hint="the file is damaged",
        ) from None


def copy_attrs(src: Any, dst: Any, exclude: str | None = None) -> None:
    """Copy attributes with their exact stored types and dataspaces, through HDF5's own calls:
    h5py's ``attrs`` took about 100 µs an attribute (a Minari file has thousands, an object
    may hold 100,000). ``exclude``: an attribute not copied (copied, then deleted, it would
    leave its room unused in the object's header, which HDF5 never gives back)."""
    names: list[bytes] = []
    with phil:
        # In h5py's order: by creation where the object tracks it, else by name.
        tracked = src.id.get_create_plist().get_attr_creation_order() & h5py.h5p.CRT_ORDER_TRACKED
        order = h5py.h5.INDEX_CRT_ORDER if tracked else h5py.h5.INDEX_NAME
        h5py.h5a.iterate(src.id, names.append, index_type=order)
        for name in names:
            if exclude is not None and name == exclude.encode():
                continue
            attr = h5py.h5a.open(src.id, name)
            space, stored = attr.get_space(), stored_type(attr.get_type())
            # The type built anew: HDF5 encodes it as the file's format asks, not as the
            # source's did (a packed file's newer format would otherwise stay in the copy).
            copy = h5py.h5a.create(dst.id, name, stored.anew, space)
            if space.get_simple_extent_type() != h5py.h5s.NULL:  # an empty one has no value
                value = np.empty(space.shape, dtype=stored.dtype)
                attr.read(value, mtype=stored.raw)
                copy.write(value, mtype=stored.raw)


def contiguous_span(
    ds: h5py.Dataset, file_size: int, shape: tuple[int, ...] | None = None
) -> tuple[int, int] | None:
    """``(offset, nbytes)`` of a contiguous dataset's allocated storage, where it lies whole
    inside a file of ``file_size`` bytes; ``None`` for other layouts or unallocated storage.
    ``shape``: the dataset's, where the caller has it (asking HDF5 costs 13 µs)."""
    dsid = ds.id
    # Only a contiguous dataset with storage allocated in the file has an offset (not a
    # chunked, compact, virtual or external one), and asking is cheaper than the layout.
    offset = dsid.get_offset()
    if offset is None:
        return None
    nbytes = math.prod(dsid.shape if shape is None else shape) * dsid.dtype.itemsize
    if not nbytes or offset + nbytes > file_size:
        return None
    return int(offset), int(nbytes)


def is_bf16(ds: h5py.Dataset) -> bool:
    """Whether ``ds`` holds bfloat16 bits. Only a 16-bit integer dataset can: the attribute is
    asked of no other, as looking up an absent one costs more than the rest of a leaf's set-up
    (a robomimic file has thousands of datasets)."""
    dtype = ds.id.dtype  # the dataset's own ``dtype`` takes h5py's lock: 20 µs, this 1 µs
    return dtype.itemsize == 2 and dtype.kind in "iu" and ds.attrs.get(BF16_ATTR) == "bfloat16"


class H5Leaf(LazyLeaf):
    """An h5py dataset read and written by row slices."""

    def __init__(
        self,
        ds: h5py.Dataset,
        file: Path,
        reads: FileReads | None = None,
        owner: h5py.File | None = None,
    ) -> None:
        """``owner``: the File ``ds`` was opened from, where it is open read-only: the leaf
        then holds no handle of its own, but asks the file's held objects (:class:`Held`)
        for one when it needs it, so that a file's thousands of leaves do not hold as many
        open datasets."""
        self._ds: h5py.Dataset | None = ds
        self._held: tuple[Held, str] | None = None
        if owner is not None and owner.mode == "r":
            self._ds, self._held = None, (shared_of(owner).held, ds.name.lstrip("/"))
        self.file = file
        self.shape = tuple(ds.shape)
        # Asked of the low-level dataset, once: each of h5py's own properties takes its lock
        # and costs 15-25 µs, which a robomimic file's thousands of leaves pay several times.
        stored = ds.id.dtype
        self.bf16 = is_bf16(ds)
        dtype = bfloat16() if self.bf16 else leaf_dtype(stored)
        assert dtype is not None
        self.dtype = dtype
        # A dataset with an offset is contiguous: it has no chunks to ask about.
        chunks = None if ds.id.get_offset() is not None else ds.chunks
        #: Rows per HDF5 chunk along the first dimension: reads aligned to it touch each chunk once.
        self.chunk_rows = chunks[0] if chunks else 1
        self._filterable = chunks is not None  # only a chunked dataset has filters
        self._stored = stored
        self._mapped: np.ndarray | bool | None = None
        self._offset: int | bool | None = None
        self._chunked: DirectChunks | bool | None = None
        #: Decoded bands kept for random reads (:meth:`keep_decoded`); ``None``: none kept.
        self.bands: BandReads | None = None
        # ``ds.file`` makes a new h5py File object, under h5py's lock, per call: asked once.
        if reads is None:
            opened = ds.file  # a new File object, held: the leaf holds its dataset anyway
            reads = FileReads(file, opened.mode == "r", lambda: opened)
        self._reads = reads
        #: Bytes stored by a dataset that is not chunked (its header says, no chunk index is
        #: read), asked while it is open where the file is read-only (where they cannot change):
        #: asked later, a dataset the walk no longer holds is opened again.
        self._storage: int | None = None
        if self._held is not None:
            self._raw_offset(ds)  # asked while the dataset is open: reads need no handle
            if not self._filterable:
                self._storage = int(ds.id.get_storage_size())

    @property
    def ds(self) -> h5py.Dataset:
        """The h5py dataset."""
        if self._ds is not None:
            return self._ds
        assert self._held is not None
        held, name = self._held
        ds: h5py.Dataset = held.get(name)
        return ds

    def close(self) -> None:
        """Let go of the file's descriptor (shared by the leaves of one file) and mapping; a
        later read opens them again."""
        self._reads.close()
        self._mapped = None

    def storage_bytes(self) -> int:
        """Bytes the dataset takes in the file, after its filters."""
        if self._storage is not None:
            return self._storage
        return int(self.ds.id.get_storage_size())

    @property
    def changes_values(self) -> str | None:
        if not self._filterable:
            return None
        if scale_offset(self.ds.id.get_create_plist()):
            return "is stored with HDF5's scale-offset filter, which rounds"
        return None

    def slow_random_rows(self) -> str | None:
        """How the dataset's chunks make random rows slow to read, or ``None``: filtered
        chunks of one column (a row decodes one chunk per column), or of fewer than
        :data:`FEW_ROWS` rows; a dataset of one band of chunks is read once."""
        chunks = self.ds.chunks if self._filterable else None
        if (
            chunks is None
            or self.shape[0] <= chunks[0]
            or not self.ds.id.get_create_plist().get_nfilters()
        ):
            return None
        if tuple(chunks[1:]) != self.shape[1:]:
            return "one column" if math.prod(chunks[1:]) == 1 else "part of a row"
        return f"{chunks[0]} rows" if chunks[0] < FEW_ROWS else None

    def keep_decoded(self, cache_bytes: int) -> bool:
        """Keep up to ``cache_bytes`` of decoded chunks for random reads (training), where
        the dataset is filtered (each read decodes whole chunks): whether it now does. A
        scale-offset dataset is left to HDF5 (see :func:`~.hdf5_safety.scale_offset`)."""
        if not self._filterable or cache_bytes <= 0:
            return False
        dcpl = self.ds.id.get_create_plist()
        if not dcpl.get_nfilters() or scale_offset(dcpl):
            return False
        cache = ChunkCache(cache_bytes)
        self.bands = BandReads(self.shape[0], self.chunk_rows, self._read_stored, cache)
        return True

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.bands is not None:
            return self.bands.read(start, stop)
        return self._read_stored(start, stop)

    def _read_stored(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as stored, nothing kept."""
        raw = self._raw_rows(start, stop)
        if raw is not None:
            return raw
        chunked = self.direct_chunks()
        array = None if chunked is None else chunked.rows(start, stop)
        if array is None:
            array = read_rows(self.ds, slice(start, stop), self.file, f"rows {start}:{stop}")
        return self._typed(array)

    def _typed(self, array: np.ndarray) -> np.ndarray:
        """Values as HDF5 reads them, in the leaf's dtype (bfloat16 bits seen as bfloat16)."""
        return array.view(self.dtype) if array.dtype != self.dtype else array

    def direct_chunks(self) -> DirectChunks | None:
        """The dataset's chunks decoded outside HDF5, on every core, where that applies (a
        filtered, chunked dataset of a file open read-only; see :mod:`.hdf5_chunks`)."""
        if self._chunked is None:
            chunked = None
            if self._reads.read_only and self.ds.chunks is not None:
                reopen = None
                if self._held is not None:
                    # What ``ds`` does, without holding the leaf: a cycle through it would
                    # keep the file's descriptor open until the collector ran.
                    held, name = self._held
                    reopen = functools.partial(held.get, name)
                chunked = DirectChunks.of(self.ds, self.file, self._reads.descriptor, reopen)
            self._chunked = chunked if chunked is not None else False
        return self._chunked if isinstance(self._chunked, DirectChunks) else None

    def _raw_rows(self, start: int, stop: int) -> np.ndarray | None:
        """Rows of a contiguous, unfiltered dataset of a file open read-only, read with
        ``preadv`` at their offset: the same bytes HDF5 would return, but without holding the
        interpreter lock, so reading overlaps encoding. ``None`` where this does not apply."""
        offset = self._raw_offset()
        if offset is None or not self._reads.read_only:
            return None
        fd, cold = self._reads.open()
        row_bytes = math.prod(self.shape[1:]) * self._stored.itemsize
        count = max(0, min(stop, self.shape[0]) - start)
        try:
            at, end = offset + start * row_bytes, offset + self.shape[0] * row_bytes
            out = read_exact(fd, at, count * row_bytes, str(self.file), cold, end)
        except OSError:
            return None  # let HDF5 report it
        return out.view(self.dtype).reshape(count, *self.shape[1:])

    def _raw_offset(self, ds: h5py.Dataset | None = None) -> int | None:
        """Where the values of a contiguous (so unfiltered), native-order dataset start in the
        file, if they lie inside it; ``None`` otherwise. ``ds``: the dataset, where the caller
        has it open."""
        if self._offset is None:
            self._offset = False
            if not self._filterable:  # a chunked dataset has no offset
                span = contiguous_span(ds or self.ds, self._reads.file_size(), self.shape)
                if span is not None and self._stored.byteorder in "=<|":
                    self._offset = span[0]
        return self._offset if self._offset is not False else None

    def mapped(self) -> np.ndarray | None:
        """A contiguous, unfiltered dataset mapped read-only (copy on write) from the file, for
        random access at memory speed; ``None`` for chunked or filtered ones."""
        if self._mapped is None:
            self._mapped = False
            offset = self._raw_offset()
            if offset is not None:
                fd = self._reads.descriptor()  # the file HDF5 opened, not the name's
                array = map_private(fd, self._stored, self.shape, offset)
                self._mapped = array.view(self.dtype)
        return self._mapped if isinstance(self._mapped, np.ndarray) else None

    def select(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, distinct) in one read."""
        if self.bands is not None:
            return self.bands.select(rows)
        return self._typed(read_rows(self.ds, rows, self.file, f"{len(rows)} rows"))

    def write(self, start: int, value: np.ndarray) -> None:
        array = np.ascontiguousarray(value)
        self.ds[start : start + len(array)] = array.view(self.ds.dtype)


class OpaqueLeaf(LazyLeaf):
    """obsdelta's own array rows in an opaque dataset, one element per row.

    HDF5 readers (tensordict's ``PersistentTensorDict`` among them) treat opaque data as
    non-tensor, so these arrays never get in the way of a batch size. The dtype and the
    feature shape are attributes.
    """

    def __init__(self, ds: h5py.Dataset, file: Path, dtype: np.dtype, features: tuple[int, ...]):
        self.ds = ds
        self.file = file
        self.dtype = dtype
        self.shape = (ds.shape[0], *features)
        self.chunk_rows = ds.chunks[0] if ds.chunks else 1

    def read(self, start: int, stop: int) -> np.ndarray:
        array = read_rows(self.ds, slice(start, stop), self.file, f"rows {start}:{stop}")
        raw = array.view(np.uint8).reshape(-1)
        return raw.view(self.dtype).reshape(len(array), *self.shape[1:])

    def write(self, start: int, value: np.ndarray) -> None:
        raw = np.ascontiguousarray(value).reshape(len(value), -1).view(np.uint8)
        self.ds[start : start + len(value)] = raw.view(self.ds.dtype).reshape(-1)


def leaves_of(
    f: h5py.File,
    file: Path,
    unread: dict[Key, str] | None = None,
    own: str = OWN,
    *,
    leaf: Callable[[str, h5py.Dataset], Any] | None = None,
) -> dict[Key, Any]:
    """Numeric datasets (not the arrays and layouts of obsdelta's group ``own``), keyed by
    their path; numbers stored big-endian, which obsdelta does not read, go to ``unread`` with
    why. ``leaf(name, dataset)`` makes each leaf (``None``: the dataset is not one) where an
    :class:`H5Leaf` is not what the caller reads: made once, as the walk holds the dataset."""
    out: dict[Key, Any] = {}
    reads = file_reads(f)
    skipped = (f"{own}/arrays", f"{own}/layout")
    inside = tuple(f"{s}/" for s in skipped)
    for name, obj in objects_of(f):
        if not isinstance(obj, h5py.Dataset) or name in skipped or name.startswith(inside):
            continue
        parts = tuple(name.split("/"))
        dtype = obj.id.dtype
        if obj.id.rank and (leaf_dtype(dtype) is not None or is_bf16(obj)):
            made = H5Leaf(obj, file, reads, owner=f) if leaf is None else leaf(name, obj)
            if made is not None:
                out[parts] = made
        elif unread is not None and dtype.kind in "biuf" and dtype.byteorder == ">":
            unread[parts] = f"is stored big-endian ({dtype.str}): obsdelta does not read it"
    return out


#: Exception arrays up to this size are read whole from a file open read-only.
SMALL_ARRAY = 8 << 20


class H5Arrays(ArrayStore):
    """Exception rows in resizable datasets under ``arrays`` of obsdelta's group ``own``: in
    ``/obsdelta``, opaque datasets of one element per row (:class:`OpaqueLeaf`), which tensor
    readers of the file's root pass over; in ``/metadata/obsdelta``, where readers take
    nothing for data, numbers of their own dtype and shape (tensordict cannot size a group of
    only opaque datasets, and reads every group of a D4RL file, ``metadata`` included)."""

    def __init__(
        self, f: h5py.File, file: Path, kwargs: dict[str, Any] | None = None, own: str = OWN
    ) -> None:
        self.f = f
        self.file = file
        self.kwargs = kwargs or {}
        self.group = f"{own}/arrays"
        self.opaque = own == OWN
        # Arrays found and checked, by what was asked, in a file open read-only (where they
        # cannot change): the pairs of a key share two arrays, and each of a robomimic file's
        # hundreds of pairs asks for both.
        self._found: dict[tuple[str, np.dtype, tuple[int, ...]], Any] | None = (
            {} if f.mode == "r" else None
        )

    def append(self, name: str, rows: np.ndarray) -> None:
        group = self.f.require_group(self.group)
        features = tuple(rows.shape[1:])
        row_bytes = max(1, math.prod(features) * rows.itemsize)
        if not self.opaque and not is_bfloat16(rows.dtype):
            self._append_numbers(group, name, rows, row_bytes)
            return
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
            ds.attrs[ARRAY_DTYPE] = dtype_name(rows.dtype)
        ds = group[name]
        n = ds.shape[0]
        ds.resize(n + len(rows), axis=0)
        OpaqueLeaf(ds, self.file, rows.dtype, features).write(n, rows)

    def _append_numbers(
        self, group: h5py.Group, name: str, rows: np.ndarray, row_bytes: int
    ) -> None:
        if name not in group:
            chunk_rows = max(1, min(256, (1 << 14) // row_bytes))
            group.create_dataset(
                name,
                shape=(0, *rows.shape[1:]),
                maxshape=(None, *rows.shape[1:]),
                dtype=rows.dtype,
                chunks=(chunk_rows, *rows.shape[1:]),
                track_times=False,
                **self.kwargs,
            )
        ds = group[name]
        n = ds.shape[0]
        ds.resize(n + len(rows), axis=0)
        ds[n:] = rows

    def storage_bytes(self, name: str) -> int | None:
        ds = self.f.get(f"{self.group}/{name}")
        return None if ds is None else int(ds.id.get_storage_size())

    def get(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        if self._found is None:
            return self._get(name, dtype, shape)
        asked = (name, dtype, tuple(shape))
        if asked not in self._found:
            found = self._get(name, dtype, shape)
            if isinstance(found, FlatRows) and math.prod(shape) * dtype.itemsize <= SMALL_ARRAY:
                # Read whole, once: each pair reads its few rows of it, and a read through
                # h5py costs a pair more than its rows (a robomimic file: 5,000 pairs).
                found = found[:]
            self._found[asked] = found
        return self._found[asked]

    def _get(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        # The dtype is the manifest's: the array's own attribute (ARRAY_DTYPE) is for other
        # readers, and is not read here. Its value is a variable-length string, which HDF5
        # reads through a heap address: damaged, that crashed the process.
        try:
            ds = self.f.get(f"{self.group}/{name}")
            opaque = isinstance(ds, h5py.Dataset) and h5py.check_opaque_dtype(ds.dtype)
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise InputError(
                f"cannot read array {name} ({' '.join(str(exc).split())})",
                file=self.file,
                hint="the compressed file is damaged",
            ) from None
        if opaque:
            features = tuple(shape[1:])
            row_bytes = max(1, math.prod(features) * dtype.itemsize)
            if ds.shape == (shape[0],) and ds.dtype.itemsize == row_bytes:
                return FlatRows(OpaqueLeaf(ds, self.file, dtype, features), 1)
        elif (
            isinstance(ds, h5py.Dataset)
            and tuple(ds.shape) == tuple(shape)
            and ds.dtype == h5_dtype(dtype)
        ):  # numbers: format 1, and arrays in /metadata/obsdelta
            return FlatRows(H5Leaf(ds, self.file), 1)
        raise InputError(
            f"array {name} is missing or not of shape {list(shape)} {dtype}",
            file=self.file,
            hint="the compressed file is damaged",
        )
