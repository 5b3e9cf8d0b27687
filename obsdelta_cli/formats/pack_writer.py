"""Packed datasets written chunk by chunk: the filter of each key family (:class:`Chooser`),
the writer that encodes chunks on a pool of threads as rows come (:class:`DatasetWriter`), and
the leaves the compress pass gives straight to it (:class:`Early`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..arrays import dtype_name, is_bfloat16
from ..errors import UsageError
from ..filters import (
    FILTERS,
    MIN_PACK_BYTES,
    Filter,
    choose,
    chunk_rows,
    family,
    pool,
    sample_rows,
    workers,
)
from .base import Key, key_str
from .hdf5_leaves import BF16_ATTR, h5_dtype
from .hdf5_walk import OWN
from .leaf import LazyLeaf
from .pack_leaves import (
    TRANSFORM_ATTR,
)

#: Rows are moved in blocks of about this many bytes (whole chunks).
BLOCK_BYTES = 8 << 20

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


def stored_rows(a: np.ndarray) -> np.ndarray:
    """Rows as HDF5 holds them: bfloat16 as its uint16 bits."""
    return a.view(np.uint16) if is_bfloat16(a.dtype) else a


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
        if not is_dataset_key(key) or not filtered or is_bfloat16(source.dtype):
            return None  # left to the packing step, which refuses a bad key
        group, name = _group_of(self.out, key)
        path, shape = key_str(key), tuple(source.shape)
        writer = DatasetWriter(group, name, path, source.read, shape, source.dtype, self.chooser)
        self.writers[key] = writer
        return Leaf(writer)

    def entries(self) -> dict[Key, dict[str, Any]]:
        """Each leaf's entry for the manifest, once the inner container is complete."""
        return {key: writer.finish() for key, writer in self.writers.items()}


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
        return stored_rows(leaf.read(start, stop))

    if _filtered(leaf.shape, dtype):
        entry = DatasetWriter(group, name, key_str(key), read, leaf.shape, dtype, chooser).fill()
    else:  # too small to filter
        group.create_dataset(name, data=read(0, leaf.shape[0]), track_times=False)
        entry = {"filter": None}
    if is_bfloat16(leaf.dtype):
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
