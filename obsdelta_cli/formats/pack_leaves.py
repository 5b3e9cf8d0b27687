"""The names and leaves of a packed file (:mod:`.packed`), shared by its reader and its
writers (:mod:`.pack_io`, :mod:`.pack_flat`, :mod:`.pack_pt`, :mod:`.pack_unpack`): where
obsdelta keeps its own objects, the manifest's ``pack`` entry, and the leaves that read a
repacked dataset (frame deltas undone, columns rebuilt from the datasets they repeat)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..arrays import bfloat16, is_bfloat16, sorted_distinct
from ..errors import InputError, UsageError
from ..filters import FRAME_DELTA, undo_frame_delta
from .base import ArrayStore, Key
from .chunk_cache import ChunkCache
from .hdf5 import is_hdf5
from .hdf5_chunks import AHEAD, DirectChunks
from .hdf5_leaves import H5Leaf, is_bf16, leaf_dtype, read_rows
from .hdf5_meta import read_meta
from .hdf5_safety import Allowed, VirtualMap, damaged_pack
from .hdf5_walk import OWN, FileReads, file_reads, h5_file, held_at, object_at
from .leaf import LazyLeaf
from .pack_columns import KEPT_ROOTS, Block, expected_maps, parse_blocks

NAME = "packed-hdf5"
PACK = f"{OWN}/pack"
#: Files of a folder inner, ``f0``, ``f1``, ... in the order the manifest lists them.
FILES = f"{PACK}/files"
#: Attribute naming the transform a dataset's values went through.
TRANSFORM_ATTR = "obsdelta_transform"
#: Chunk cache of a packed file opened for training (``open_dataset(cache_mb=...)``).
DEFAULT_CACHE_BYTES = 256 << 20
#: Chunk cache for the commands, which read each chunk once in order.
COMMAND_CACHE_BYTES = 16 << 20


def pack_info(meta: dict[str, Any], file: Path) -> dict[str, Any]:
    """The manifest's ``pack`` entry, its shape checked."""
    info = meta.get("pack")
    kinds = {"kind": str, "datasets": dict, "inner_hash": str}
    if not isinstance(info, dict) or any(not isinstance(info.get(k), t) for k, t in kinds.items()):
        raise damaged_pack(file, "obsdelta metadata field pack is missing or malformed")
    if info["kind"] in ("folder", "pt"):
        names = ("files", "dirs", "leaves") if info["kind"] == "folder" else ("leaves", "arrays")
        for name in names:
            if not isinstance(info.get(name), list):
                raise damaged_pack(file, f"obsdelta metadata field pack.{name} is malformed")
    elif info["kind"] != "hdf5":
        raise damaged_pack(file, f"obsdelta metadata field pack.kind is unknown ({info['kind']!r})")
    return info


def is_packed(path: Path) -> bool:
    """Whether ``path`` is a packed file (an HDF5 file whose manifest says so)."""
    if not is_hdf5(path):
        return False
    try:
        with h5_file(path) as f:
            meta = read_meta(f, path)
    except (OSError, ValueError, RuntimeError, KeyError, InputError):
        return False  # not readable as one: detection reports it precisely
    return meta is not None and meta.get("format") == NAME


class PackedLeaf(LazyLeaf):
    """A dataset holding frame deltas, read by whole chunks with the deltas undone; the last
    chunks decoded are kept (up to ``cache_bytes``) for random access."""

    def __init__(self, ds: h5py.Dataset, file: Path, cache_bytes: int, reads: FileReads) -> None:
        self.ds, self.file = ds, file
        self.shape = tuple(ds.shape)
        self.dtype = np.dtype(np.uint8)
        self.chunk_rows = ds.chunks[0] if ds.chunks else max(1, self.shape[0])
        #: The chunks decoded last, kept for random reads (the rule of every training read).
        self.cache = ChunkCache(cache_bytes)
        self._last = -2  # the last chunk read: reads in order are decoded ahead
        # Chunks decoded outside HDF5 only from a file open read-only: no write can be pending.
        whole = ds.chunks is not None and tuple(ds.chunks[1:]) == self.shape[1:]
        direct = whole and reads.read_only
        self._direct = DirectChunks.of(ds, file, reads.descriptor) if direct else None

    def _chunks(self, indices: Sequence[int]) -> list[np.ndarray]:
        """Chunks ``indices``, the deltas undone: those not kept are decoded on every core.
        Reads in order (each starting in or just after the last one's chunks) have the
        :data:`AHEAD` chunks that follow decoded meanwhile."""
        kept = {i: v for i in indices if (v := self.cache.get(i)) is not None}
        found = dict(kept)
        missing = [i for i in indices if i not in found]
        in_order = self._last <= indices[0] <= self._last + 1 if indices else False
        if indices:
            self._last = indices[-1]
        if (missing or in_order) and self._direct is not None:
            total = -(-self.shape[0] // self.chunk_rows)
            ahead = range(self._last + 1, min(total, self._last + 1 + AHEAD)) if in_order else ()
            got = self._direct.whole(missing, undo_frame_delta, ahead)
            for index, frames in zip(missing, got, strict=True):
                if frames is not None:
                    found[index] = frames
        out = []
        for index in indices:
            frames = found.get(index)
            if frames is None:  # left to HDF5
                start = index * self.chunk_rows
                rows = slice(start, start + self.chunk_rows)
                frames = undo_frame_delta(read_rows(self.ds, rows, self.file, "a chunk"))
            if index not in kept:
                self.cache.put(index, frames)
            out.append(frames)
        return out

    def read(self, start: int, stop: int) -> np.ndarray:
        stop = min(stop, self.shape[0])
        if stop <= start:
            return np.empty((0, *self.shape[1:]), dtype=np.uint8)
        first, last = start // self.chunk_rows, (stop - 1) // self.chunk_rows
        parts = self._chunks(range(first, last + 1))
        block = parts[0] if len(parts) == 1 else np.concatenate(parts)
        offset = first * self.chunk_rows
        return np.ascontiguousarray(block[start - offset : stop - offset])

    def select(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, distinct), decoding each chunk they touch once."""
        out = np.empty((len(rows), *self.shape[1:]), dtype=np.uint8)
        chunk_of = rows // self.chunk_rows
        touched = [int(i) for i in sorted_distinct(chunk_of)]
        for index, frames in zip(touched, self._chunks(touched), strict=True):
            mask = chunk_of == index
            out[mask] = frames[rows[mask] - index * self.chunk_rows]
        return out

    def storage_bytes(self) -> int:
        return int(self.ds.id.get_storage_size())

    def write(self, start: int, value: np.ndarray) -> None:
        raise UsageError("a packed file is read-only", file=self.file)


def packed_leaf(
    ds: h5py.Dataset,
    file: Path,
    cache_bytes: int,
    reads: FileReads,
    owner: h5py.File | None = None,
) -> LazyLeaf:
    """A packed dataset as a leaf, its transform undone as it is read; ``reads``: those its
    file's leaves share (:func:`~.hdf5_walk.file_reads`); ``owner``: the File ``ds`` was
    opened from, as for :class:`~.hdf5_leaves.H5Leaf`."""
    transform = ds.attrs.get(TRANSFORM_ATTR)
    if transform is None:
        return H5Leaf(ds, file, reads, owner=owner)
    if transform != FRAME_DELTA or ds.dtype != np.uint8:
        raise damaged_pack(file, f"{ds.name} holds values transformed in an unknown way")
    return PackedLeaf(ds, file, cache_bytes, reads)


class ColumnsLeaf(LazyLeaf):
    """A deduplicated dataset read from its sources as the manifest records them (the file's
    own mappings were checked against the record when it was opened, and are not followed).

    The sources are asked for by path when they are read (:func:`~.hdf5_walk.held_at`), not
    held: a robomimic file of 2,000 demos has 6,500 such datasets, and each holding its
    sources open kept thousands of datasets open past what the walk holds (HDF5 keeps 12-28
    KB for each)."""

    def __init__(self, f: h5py.File, ds: h5py.Dataset, file: Path, blocks: list[Block]) -> None:
        self.file = file
        self.shape = tuple(ds.shape)
        bf16 = is_bf16(ds)
        dtype = bfloat16() if bf16 else leaf_dtype(ds.dtype)
        if not ds.is_virtual or len(self.shape) != 2 or dtype is None:
            raise damaged_pack(file, f"{ds.name} is not the virtual dataset the metadata records")
        self.dtype = dtype
        self.np_dtype = ds.dtype
        self._f = f
        reads = file_reads(f)
        #: Each source's chunks decoded outside HDF5, where they can be; ``None``: by HDF5.
        self._direct: dict[str, DirectChunks | None] = {}
        # Each source's columns and chunks, asked once however many blocks it gives.
        widths: dict[str, int] = {}
        chunks_of: dict[str, tuple[int, ...] | None] = {}
        covered = 0
        for start, stop, source, at in blocks:
            if source not in widths:
                src = held_at(f, source)  # as the file's walk holds it, else opened here
                if (
                    not isinstance(src, h5py.Dataset)
                    or src.is_virtual
                    or src.dtype != ds.dtype
                    or src.ndim != 2
                    or src.shape[0] != self.shape[0]
                    or TRANSFORM_ATTR in src.attrs
                ):
                    raise damaged_pack(
                        file, f"the source {source} of {ds.name} is missing or unfit"
                    )
                widths[source], chunks_of[source] = src.shape[1], src.chunks
                again = functools.partial(held_at, f, source)
                self._direct[source] = (
                    DirectChunks.of(src, file, reads.descriptor, again) if reads.read_only else None
                )
            if at + stop - start > widths[source]:
                raise damaged_pack(file, f"the source {source} of {ds.name} is missing or unfit")
            if start != covered or stop <= start:
                raise damaged_pack(file, f"the columns of {ds.name} are not recorded in order")
            covered = stop
        if covered != self.shape[1]:
            raise damaged_pack(file, f"the columns of {ds.name} are not all recorded")
        self.blocks = blocks
        # Reads aligned to the chunks of the source giving most columns touch each once.
        main = max(blocks, key=lambda b: b[1] - b[0])[2]
        chunks = chunks_of[main]
        self.chunk_rows = chunks[0] if chunks else 1

    def _gather(self, rows: Any, count: int) -> np.ndarray:
        out = np.empty((count, self.shape[1]), dtype=self.np_dtype)
        read: dict[str, np.ndarray] = {}
        for start, stop, source, at in self.blocks:
            if source not in read:  # each source once, whatever number of blocks it gives
                read[source] = self._read_source(source, rows, count)
            out[:, start:stop] = read[source][:, at : at + stop - start]
        return out.view(self.dtype) if is_bfloat16(self.dtype) else out

    def _read_source(self, source: str, rows: Any, count: int) -> np.ndarray:
        direct = self._direct[source]
        if isinstance(rows, slice) and direct is not None:
            block = direct.rows(rows.start, rows.stop)
            if block is not None:
                return block
        return read_rows(held_at(self._f, source), rows, self.file, f"{count} rows")

    def read(self, start: int, stop: int) -> np.ndarray:
        stop = min(stop, self.shape[0])
        return self._gather(slice(start, max(start, stop)), max(0, stop - start))

    def select(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, distinct), one read of each source."""
        return self._gather(rows, len(rows))

    def storage_bytes(self) -> int:
        """The bytes of the columns kept: the others are counted with their source."""
        own = [p for p in self._direct if p.startswith(KEPT_ROOTS)]
        return sum(int(held_at(self._f, p).id.get_storage_size()) for p in own)

    def write(self, start: int, value: np.ndarray) -> None:
        raise UsageError("a packed file is read-only", file=self.file)


def repacked_leaf(
    f: h5py.File,
    file: Path,
    path: str,
    entry: Any,
    cache_bytes: int,
    *,
    ds: h5py.Dataset | None = None,
) -> LazyLeaf:
    """A repacked dataset of an HDF5 inner as a leaf: rebuilt from the sources its manifest
    entry records where its columns are stored once, else as stored; ``ds``: the dataset at
    ``path``, where the caller holds it."""
    ds = object_at(f, path) if ds is None else ds
    if not isinstance(ds, h5py.Dataset):
        raise damaged_pack(file, f"the repacked dataset {path} is missing")
    columns = entry.get("columns") if isinstance(entry, dict) else None
    if columns is None:  # a virtual dataset the metadata does not record was refused on open
        return packed_leaf(ds, file, cache_bytes, file_reads(f), owner=f)
    return ColumnsLeaf(f, ds, file, parse_blocks(columns, file, path))


def virtual_record(info: dict[str, Any], file: Path) -> Allowed:
    """The mappings the manifest allows each virtual dataset of a packed file."""
    recorded: dict[str, list[Block]] = {}
    if info["kind"] == "hdf5":
        flat = info.get("flat")
        families = [e for e in flat if isinstance(e, dict)] if isinstance(flat, list) else []
        entries = [*info["datasets"].items(), *((e.get("path"), e) for e in families)]
        for path, entry in entries:
            if isinstance(entry, dict) and entry.get("columns") is not None:
                if not isinstance(path, str):
                    raise damaged_pack(file, "obsdelta metadata field pack.flat is malformed")
                recorded[path] = parse_blocks(entry["columns"], file, path)

    def allowed(path: str, shape: tuple[int, ...]) -> list[VirtualMap] | None:
        blocks = recorded.get(path)
        return None if blocks is None else expected_maps(blocks, shape)

    return allowed


class PackedFiles(ArrayStore):
    """Exception rows of a folder inner: its ``obsdelta.arrays/<name>.bin`` files, kept in the
    packed file as opaque byte datasets."""

    def __init__(self, f: h5py.File, file: Path, index: dict[str, int]) -> None:
        self.f, self.file, self.index = f, file, index

    def _dataset(self, name: str) -> h5py.Dataset | None:
        i = self.index.get(f"obsdelta.arrays/{name}.bin")
        ds = None if i is None else self.f.get(f"{FILES}/f{i}")
        return ds if isinstance(ds, h5py.Dataset) else None

    def storage_bytes(self, name: str) -> int | None:
        ds = self._dataset(name)
        return None if ds is None else int(ds.id.get_storage_size())

    def get(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        if math.prod(shape) == 0:
            return np.empty(shape, dtype=dtype)
        ds = self._dataset(name)
        expected = math.prod(shape) * dtype.itemsize
        if ds is None or ds.shape != (expected,):
            raise damaged_pack(self.file, f"array {name} is missing or not {expected} bytes long")
        raw = read_rows(ds, slice(None), self.file, f"array {name}").view(np.uint8)
        return raw.copy().view(dtype).reshape(shape)


class Entry:
    """A non-array entry of a folder inner (tensordict's ``NonTensorData``): its files are
    among the packed files; it is never data."""

    def __init__(self, key: Key) -> None:
        self.key = key


def file_bytes(f: h5py.File, index: int, file: Path) -> bytes:
    """The bytes of packed file number ``index`` of a folder inner."""
    ds = f.get(f"{FILES}/f{index}")
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
        raise damaged_pack(file, f"packed file f{index} is missing")
    return read_rows(ds, slice(None), file, f"packed file f{index}").tobytes()


def byte_blocks(f: h5py.File, path: str, file: Path, block: int = 8 << 20) -> Iterator[bytes]:
    """The bytes of the opaque byte dataset ``path``, ``block`` at a time."""
    ds = f.get(path)
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.itemsize != 1:
        raise damaged_pack(file, f"{path} is missing")
    for start in range(0, ds.shape[0], block):
        yield read_rows(ds, slice(start, start + block), file, path).tobytes()
