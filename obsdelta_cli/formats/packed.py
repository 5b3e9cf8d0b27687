"""A packed file: one HDF5 file holding a compressed dataset of any container.

``compress --pack`` writes it (:mod:`obsdelta_cli.formats.pack_io`). It mirrors the compressed
dataset it was packed from, the *inner* container, whose name the manifest keeps as
``source_format``:

- every leaf is a dataset at its key's path (``next/delta/observation``, ``observations``,
  ``data/demo_0/obs/agentview_image``), chunked along time and filtered with what measured
  smallest (:mod:`obsdelta_cli.filters`), holding its own values, so that any reader gets
  them; in a file packed by obsdelta 0.2, a uint8 image dataset may hold frame deltas (the
  attribute ``obsdelta_transform`` says so; :class:`PackedLeaf` undoes them);
- an HDF5 inner keeps its other objects as they were (groups, attributes, small, string and
  obsdelta's own datasets), and the creation properties of every repacked dataset in an empty
  twin under ``/obsdelta/pack/layout/<path>``, so ``inflate`` recreates each object as it was;
  a dataset whose columns repeat another's is a virtual dataset mapping them, its other columns
  kept under ``/obsdelta/pack/columns/<path>`` (:mod:`.pack_columns`; :class:`ColumnsLeaf`
  reads it);
- a folder inner keeps every other file (``meta.json`` files, replay-buffer metadata, pickles,
  exception rows) as an opaque byte dataset under ``/obsdelta/pack/files/``, named by index;
  the manifest's ``pack`` entry lists their paths;
- a ``.pt`` inner (:mod:`.pack_pt`) keeps its exception rows and the original file's skeleton
  as opaque byte datasets under ``/obsdelta/pack/files/``, and what is left of the ``.pt``
  file itself (its pickle and zip headers) as ``/obsdelta/pack/skeleton``.

The manifest is the inner dataset's, with ``format`` ``packed-hdf5`` and a ``pack`` entry, so
``verify``, ``report`` and ``open_dataset`` read a packed file like any compressed dataset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..arrays import BFLOAT16, DTYPES, sorted_distinct
from ..errors import InputError, UsageError
from ..filters import FRAME_DELTA, plugins, undo_frame_delta
from .base import SIDECAR, ArrayStore, Format, Key, Plan, Sink, Source, key_str
from .chunk_cache import ChunkCache
from .hdf5 import is_hdf5
from .hdf5_chunks import AHEAD, DirectChunks
from .hdf5_leaves import H5Arrays, H5Leaf, is_bf16, leaf_dtype, leaves_of, read_rows
from .hdf5_meta import read_meta
from .hdf5_objects import attrs_hash, hash_objects_apart
from .hdf5_safety import Allowed, VirtualMap, check_contained, damaged_file, damaged_pack
from .hdf5_walk import OWN, FileReads, file_reads, h5_file, object_at
from .leaf import LazyLeaf
from .pack_columns import COLUMNS, Block, expected_maps, parse_blocks

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
    own mappings were checked against the record when it was opened, and are not followed)."""

    def __init__(self, f: h5py.File, ds: h5py.Dataset, file: Path, blocks: list[Block]) -> None:
        self.file = file
        self.shape = tuple(ds.shape)
        bf16 = is_bf16(ds)
        dtype = BFLOAT16 if bf16 else leaf_dtype(ds.dtype)
        if not ds.is_virtual or len(self.shape) != 2 or dtype is None:
            raise damaged_pack(file, f"{ds.name} is not the virtual dataset the metadata records")
        self.dtype = dtype
        self.np_dtype = ds.dtype
        self.sources: dict[str, h5py.Dataset] = {}
        covered = 0
        for start, stop, source, at in blocks:
            src = self.sources[source] if source in self.sources else f.get(source)
            if (
                not isinstance(src, h5py.Dataset)
                or src.is_virtual
                or src.dtype != ds.dtype
                or src.ndim != 2
                or src.shape[0] != self.shape[0]
                or at + stop - start > src.shape[1]
                or TRANSFORM_ATTR in src.attrs
            ):
                raise damaged_pack(file, f"the source {source} of {ds.name} is missing or unfit")
            if start != covered or stop <= start:
                raise damaged_pack(file, f"the columns of {ds.name} are not recorded in order")
            covered = stop
            self.sources[source] = src
        if covered != self.shape[1]:
            raise damaged_pack(file, f"the columns of {ds.name} are not all recorded")
        self.blocks = blocks
        reads = file_reads(f)
        self._direct = {
            path: DirectChunks.of(src, file, reads.descriptor) if reads.read_only else None
            for path, src in self.sources.items()
        }
        # Reads aligned to the chunks of the source giving most columns touch each once.
        main = max(blocks, key=lambda b: b[1] - b[0])[2]
        chunks = self.sources[main].chunks
        self.chunk_rows = chunks[0] if chunks else 1

    def _gather(self, rows: Any, count: int) -> np.ndarray:
        out = np.empty((count, self.shape[1]), dtype=self.np_dtype)
        read: dict[str, np.ndarray] = {}
        for start, stop, source, at in self.blocks:
            if source not in read:  # each source once, whatever number of blocks it gives
                read[source] = self._read_source(source, rows, count)
            out[:, start:stop] = read[source][:, at : at + stop - start]
        return out.view(BFLOAT16) if self.dtype == BFLOAT16 else out

    def _read_source(self, source: str, rows: Any, count: int) -> np.ndarray:
        direct = self._direct[source]
        if isinstance(rows, slice) and direct is not None:
            block = direct.rows(rows.start, rows.stop)
            if block is not None:
                return block
        return read_rows(self.sources[source], rows, self.file, f"{count} rows")

    def read(self, start: int, stop: int) -> np.ndarray:
        stop = min(stop, self.shape[0])
        return self._gather(slice(start, max(start, stop)), max(0, stop - start))

    def select(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, distinct), one read of each source."""
        return self._gather(rows, len(rows))

    def storage_bytes(self) -> int:
        """The bytes of the columns kept: the others are counted with their source."""
        own = [d for p, d in self.sources.items() if p.startswith(f"{COLUMNS}/")]
        return sum(int(d.id.get_storage_size()) for d in own)

    def write(self, start: int, value: np.ndarray) -> None:
        raise UsageError("a packed file is read-only", file=self.file)


def repacked_leaf(f: h5py.File, file: Path, path: str, entry: Any, cache_bytes: int) -> LazyLeaf:
    """A repacked dataset of an HDF5 inner as a leaf: rebuilt from the sources its manifest
    entry records where its columns are stored once, else as stored."""
    ds = object_at(f, path)
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


class Packed(Format):
    """A packed HDF5 file (``compress --pack``): read like the compressed dataset it holds."""

    name = NAME
    summary = "one packed HDF5 file written by compress --pack"
    #: HDF5 chunk cache per opened dataset; :func:`obsdelta_cli.open_dataset` sets its own.
    cache_bytes = COMMAND_CACHE_BYTES

    @classmethod
    def sniff(cls, path: Path) -> bool:
        return is_packed(path)

    def open(self, path: Path) -> Source:
        plugins()  # the filters must be registered before a dataset is read
        try:
            # The chunk cache asked for (training reads hit the same chunks often); its slots
            # are sized per dataset as the file is walked (hdf5_leaves._cache_slots).
            f = h5_file(path, rdcc_nbytes=self.cache_bytes)
        except (OSError, ValueError) as exc:
            raise damaged_file(path, exc) from None
        # A flat packed file is read through its skeleton, opened apart (.pack_flat).
        handle: h5py.File = f
        memo: dict[str, Any] = {}
        try:
            meta = read_meta(f, path)
            if meta is None:
                raise damaged_pack(path, "the packed file has no obsdelta metadata")
            info = pack_info(meta, path)
            # Before anything is read: the file points nowhere outside itself, and its virtual
            # datasets map exactly what the manifest records.
            check_contained(f, path, virtual_record(info, path))
            batch_dims, valid = meta.get("batch_dims"), meta.get("valid_rows")
            if not isinstance(batch_dims, int) or not (valid is None or isinstance(valid, int)):
                raise damaged_pack(path, "obsdelta metadata field batch_dims is malformed")
            if info["kind"] == "hdf5" and "flat" in info:
                from .pack_flat import Flat  # it builds on this module

                flat = memo["flat"] = Flat(f, path, info, self.cache_bytes)
                handle = flat.open_skeleton()
                leaves = flat.leaves(handle)
                arrays: ArrayStore = H5Arrays(handle, path)
            elif info["kind"] == "hdf5":
                leaves = self._hdf5_leaves(f, path, info)
                arrays = H5Arrays(f, path)
            else:
                leaves = self._folder_leaves(f, path, info)
                arrays = PackedFiles(f, path, _array_files(info))
        except (RuntimeError, OSError, KeyError, ValueError, TypeError) as exc:
            _close(f, memo, handle)
            raise damaged_pack(path, f"cannot read the file's structure ({exc})") from None
        except BaseException:
            _close(f, memo, handle)
            raise
        source = Source(path, leaves, batch_dims, meta, valid, arrays=arrays, handle=handle)
        source.memo.update(memo)
        return source

    def _leaf(self, f: h5py.File, ds: h5py.Dataset, path: Path) -> LazyLeaf:
        return packed_leaf(ds, path, self.cache_bytes, file_reads(f), owner=f)

    def _hdf5_leaves(self, f: h5py.File, path: Path, info: dict[str, Any]) -> dict[Key, Any]:
        repacked: dict[str, Any] = info["datasets"]
        out: dict[Key, Any] = {}
        for key, leaf in leaves_of(f, path).items():
            if key[:2] == (OWN, "pack"):
                continue
            name = key_str(key)
            if name in repacked:
                out[key] = repacked_leaf(f, path, name, repacked[name], self.cache_bytes)
            else:
                out[key] = self._leaf(f, leaf.ds, path)
        return out

    def _folder_leaves(self, f: h5py.File, path: Path, info: dict[str, Any]) -> dict[Key, Any]:
        leaves: dict[Key, Any] = {}
        for entry in info["leaves"]:
            key, kind = tuple(entry["key"]), entry["kind"]
            if kind == "data":
                ds = f.get(key_str(key))
                if not isinstance(ds, h5py.Dataset) or leaf_dtype(ds.dtype) is None:
                    raise damaged_pack(path, f"leaf {key_str(key)} is missing")
                leaves[key] = self._leaf(f, ds, path)
            elif kind == "empty":
                dtype = _named_dtype(str(entry["dtype"]))
                if dtype is None:
                    raise damaged_pack(path, f"leaf {key_str(key)} has an unknown dtype")
                leaves[key] = np.empty([int(d) for d in entry["shape"]], dtype=dtype)
            else:
                leaves[key] = Entry(key)
        return leaves

    def close(self, source: Source) -> None:
        flat = source.memo.get("flat")
        _close(flat.f if flat is not None else source.handle, source.memo, source.handle)

    def object_hashes(
        self,
        opened: Source | Sink,
        skip: Callable[[str], bool],
        known: Mapping[str, str] | None = None,
        recorded: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The inner container's objects, as the inner would hash them: a folder's files by
        path; an HDF5 inner's objects as stored, where a repacked dataset counts as the one
        recorded when its values hash as they did when it was packed."""
        f: h5py.File = opened.handle
        file = Path(f.filename)
        meta = opened.meta if isinstance(opened, Source) else None
        info = pack_info(meta or {}, file)
        if info["kind"] == "pt":  # its reads report damage themselves
            from .pack_pt import pt_hashes  # it builds on this module

            return pt_hashes(opened, file, info, skip)
        try:
            if info["kind"] == "folder":
                return _folder_hashes(f, file, info, skip)
            flat = opened.memo.get("flat") if isinstance(opened, Source) else None
            if flat is not None:
                return _hdf5_hashes(f, file, info, meta or {}, skip, known or {}, flat.leaf)
            return _hdf5_hashes(f, file, info, meta or {}, skip, known or {})
        except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise damaged_pack(file, f"cannot read an object ({exc})") from None

    def value_hashes(self, source: Source) -> dict[str, str]:
        """The repacked datasets of an HDF5 inner: their values hash stands for the object."""
        info = pack_info(source.meta or {}, source.path)
        if info["kind"] != "hdf5":
            return {}
        repacked: dict[str, Any] = info["datasets"]
        return {
            name: entry["values"]
            for name, entry in repacked.items()
            if isinstance(entry, dict) and isinstance(entry.get("values"), str)
        }

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        raise UsageError("a packed file is written by compress --pack", file=path)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        raise UsageError("a packed file is written by compress --pack", file=path)


def _close(f: h5py.File, memo: dict[str, Any] | None, handle: Any) -> None:
    """Close a packed file, and a flat one's skeleton (its temporary file deleted)."""
    flat = (memo or {}).get("flat")
    if flat is not None:
        if handle is not None and handle is not f:
            handle.close()
        flat.close()
    f.close()


def _named_dtype(name: str) -> np.dtype | None:
    """The dtype an empty leaf's entry names: one obsdelta encodes, or a complex one a
    ``.pt`` file may carry along."""
    if name in ("complex64", "complex128"):
        return np.dtype(name)
    return DTYPES.get(name)


def _array_files(info: dict[str, Any]) -> dict[str, int]:
    """Where each exception array of a folder or ``.pt`` inner is among the packed files."""
    if info["kind"] == "pt":
        return {f"obsdelta.arrays/{name}.bin": i for i, name in enumerate(info["arrays"])}
    return {p: i for i, p in enumerate(info["files"])}


def _folder_hashes(
    f: h5py.File, file: Path, info: dict[str, Any], skip: Callable[[str], bool]
) -> dict[str, str]:
    # The rule of formats.base.folder_hashes: leaves, the manifest and exception rows are
    # checked on their own.
    out: dict[str, str] = {}
    for i, rel in enumerate(info["files"]):
        head = rel.split("/")[0]
        if head in (SIDECAR, "obsdelta.arrays") or rel.endswith(".memmap") or skip(rel):
            continue
        out[rel] = xxhash.xxh3_64_hexdigest(file_bytes(f, i, file))
    return out


def values_hash(ds: Any, rows: int, step: int) -> str:
    """xxh3-64 of a dataset's values in row order, read ``step`` rows at a time."""
    h = xxhash.xxh3_64()
    for start in range(0, rows, step):
        block = ds.read(start, min(rows, start + step))
        h.update(np.ascontiguousarray(block).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _hdf5_hashes(
    f: h5py.File,
    file: Path,
    info: dict[str, Any],
    meta: dict[str, Any],
    skip: Callable[[str], bool],
    known: Mapping[str, str],
    member: Callable[[h5py.Dataset, str], LazyLeaf] | None = None,
) -> dict[str, str]:
    """An HDF5 inner's objects; a repacked dataset in ``known`` is taken as recorded there
    (its values are checked as a leaf), the others are read and hashed (a flat file's
    members, ``member``, from their families)."""
    repacked: dict[str, Any] = info["datasets"]
    # The objects kept as they are, in a child: a damaged attribute can crash HDF5 (.apart).
    recorded = meta.get("objects") or {}
    out = hash_objects_apart(f, file, lambda n: n in repacked or skip(n), copied_from=recorded)
    for name, entry in repacked.items():
        if skip(name):
            continue
        ds = object_at(f, name)
        if not isinstance(ds, h5py.Dataset):
            continue  # missing: the caller reports it
        if any(a != TRANSFORM_ATTR for a in ds.attrs):  # the transform mark is the pack's own
            out[f"@{name}"] = attrs_hash(ds, exclude=TRANSFORM_ATTR)
        if name in known:
            out[name] = known[name]
            continue
        leaf = member(ds, name) if member else repacked_leaf(f, file, name, entry, 0)
        rows = ds.shape[0] if ds.ndim else 0
        step = max(1, (4 << 20) // max(1, math.prod(ds.shape[1:]) * ds.dtype.itemsize))
        found = values_hash(leaf, rows, step)
        ok = found == entry.get("values")
        out[name] = str(recorded.get(name)) if ok else f"values {found}"
    return out
