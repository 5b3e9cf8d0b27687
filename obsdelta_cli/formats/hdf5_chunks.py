"""The chunks of a filtered HDF5 dataset read and decoded outside HDF5, on every core.

HDF5 decodes one chunk at a time, under h5py's lock and the interpreter lock: reading every
dataset of a 500 MB file's packed output (zstd chunks) took 0.55 s through h5py, and 0.21 s
this way. Here a chunk's
stored bytes are read with ``pread`` where HDF5's chunk index says they are, and its filter
pipeline is undone in reverse order, as HDF5 undoes it, on a pool of threads (zlib and zstd
release the interpreter lock).

Only what can be decoded exactly as HDF5 decodes it is read this way: a chunked dataset of a
file open read-only, whose stored type is the type h5py gives its values, in chunks of 16 KiB
or more, filtered by deflate, shuffle or hdf5plugin's Zstd, or several of them, with or without
HDF5's Fletcher-32 checksum (an unfiltered chunk is a copy HDF5 makes as fast). The checksum is
checked as HDF5 checks it, and a zstd frame's own content checksum where it has one (hdf5plugin
ignores it): a damaged chunk is an error, never wrong values. Anything else (a chunk never
written, whose values are the fill value; other filters; a chunk that does not decode to its
exact size) is left to HDF5 or reported as damage.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py._objects import phil

from ..errors import InputError
from ..filters import ZSTD_FILTER, ThreadsPerCore, fletcher32, hdf5_library, workers

DEFLATE = int(h5py.h5z.FILTER_DEFLATE)
SHUFFLE = int(h5py.h5z.FILTER_SHUFFLE)
FLETCHER32 = int(h5py.h5z.FILTER_FLETCHER32)
#: Smaller chunks are left to HDF5: below this their Python overhead outweighs the parallel
#: decode. D4RL ships its files in gzip chunks of 30-70 KB (h5py's default chunk shape, often
#: one column a chunk), which HDF5 decodes one at a time and scatters into rows: those are
#: decoded here (``benchmarks/README.md`` says what it gains).
MIN_CHUNK_BYTES = 1 << 14
#: Bands of chunks along time decoded ahead of reads in order.
AHEAD = 2
#: HDF5's chunk option that leaves partial edge chunks unfiltered.
DONT_FILTER_PARTIAL_CHUNKS = 0x0002

#: What a chunk's position is known by: its first element's coordinates.
Coord = tuple[int, ...]
#: Part of an array, one slice per dimension.
Region = tuple[slice, ...]
#: HDF5's record of a stored chunk: filters skipped (bit i: filter i), byte offset, size.
Stored = tuple[int, int, int]

_local = threading.local()
#: The chunk decoders. Not the encoders' pool: a read waiting behind queued encodes
#: (``--pack`` reads while it encodes) would stall both.
decoders = ThreadsPerCore("obsdelta-decode")


def _zstd_decompressor() -> Any | None:
    """This thread's zstd decompressor; ``None`` without ``zstandard``."""
    if not hasattr(_local, "zstd"):
        try:
            import zstandard
        except ImportError:
            _local.zstd = None
        else:
            _local.zstd = zstandard.ZstdDecompressor()
    return _local.zstd


def _decode_errors() -> tuple[type[BaseException], ...]:
    """What a damaged chunk raises as it is decoded."""
    errors: tuple[type[BaseException], ...] = (zlib.error, ValueError, MemoryError)
    if _zstd_decompressor() is not None:
        import zstandard

        errors += (zstandard.ZstdError,)
    return errors


def _chunk_opts(plist: h5py.h5p.PropDCID) -> int | None:
    """The dataset's chunk options (``H5Pget_chunk_opts``), ``None`` where they cannot be
    asked (h5py does not wrap the call)."""
    lib = hdf5_library()
    if lib is None:
        return None
    try:
        get = lib.H5Pget_chunk_opts
    except AttributeError:
        return None
    get.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint)]
    opts = ctypes.c_uint(0)
    # Under h5py's lock, as h5py calls HDF5: the library is not thread-safe, and this is asked
    # from reading threads while other threads use it (a call beside one crashed the process).
    with phil:
        got = get(plist.id, ctypes.byref(opts))
    return int(opts.value) if got >= 0 else None


def unshuffle(data: bytes | memoryview | np.ndarray, itemsize: int) -> np.ndarray:
    """Undo HDF5's shuffle filter: byte 0 of every element came first, then byte 1, ...; bytes
    past the last whole element were left in place.

    >>> unshuffle(bytes([1, 3, 2, 4, 9]), 2).tolist()
    [1, 2, 3, 4, 9]
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    n = len(raw) // itemsize
    if itemsize <= 1 or n <= 1:
        return raw
    out = np.empty_like(raw)
    elements = out[: n * itemsize].reshape(n, itemsize)
    for k in range(itemsize):  # a plane at a time: 3x the speed of one transposing copy
        elements[:, k] = raw[k * n : (k + 1) * n]
    out[n * itemsize :] = raw[n * itemsize :]
    return out


def _pipeline(
    ds: h5py.Dataset, taken: Sequence[int], min_chunk_bytes: int = 0
) -> list[tuple[int, int]] | None:
    """The filters of a chunked dataset, in HDF5's order, each with its first value (deflate's
    level), where every one is among ``taken``, its chunks hold ``min_chunk_bytes`` or more
    and its stored bytes are its values' bytes (no conversion for HDF5 to make); else
    ``None``."""
    try:
        plist = ds.id.get_create_plist()
        if plist.get_layout() != h5py.h5d.CHUNKED or not ds.ndim or not ds.size:
            return None
        if math.prod(ds.chunks) * ds.dtype.itemsize < min_chunk_bytes:
            return None
        filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
        if not filters or any(f[0] not in taken for f in filters):
            return None
        if not ds.id.get_type().equal(h5py.h5t.py_create(ds.dtype)):
            return None
    except (TypeError, ValueError, RuntimeError, OSError):
        return None
    return [(int(f[0]), int(f[2][0]) if len(f[2]) else 0) for f in filters]


def _rows_then(
    chunk: np.ndarray, *, rows: int, post: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    return post(chunk[:rows])


class DirectChunks:
    """Rows of one chunked dataset, its chunks decoded in parallel outside HDF5.

    Made with :meth:`of`, which returns ``None`` for a dataset this does not apply to."""

    def __init__(
        self,
        ds: h5py.Dataset,
        file: Path,
        fd: Callable[[], int],
        pipeline: Sequence[int],
        reopen: Callable[[], h5py.Dataset] | None = None,
    ) -> None:
        # With ``reopen``, the dataset is asked for again when needed, not held.
        self._ds: h5py.Dataset | None = ds if reopen is None else None
        self._reopen = reopen
        self.name: str = ds.name
        self.file, self._fd = file, fd
        try:  # of the file as opened, not of its name; asked here, outside any lock
            self.file_size = os.fstat(fd()).st_size
        except OSError:  # no descriptor yet (a dataset only judged for direct reads)
            self.file_size = file.stat().st_size
        self.pipeline = tuple(pipeline)
        self.shape: tuple[int, ...] = tuple(ds.shape)
        self.chunks: tuple[int, ...] = tuple(ds.chunks)
        self.dtype = ds.dtype
        self.chunk_bytes = math.prod(self.chunks) * self.dtype.itemsize
        #: Chunks in one row of chunks along time (D4RL's hold a column each).
        grid = zip(self.shape[1:], self.chunks[1:], strict=True)
        self.across = math.prod(-(-n // c) for n, c in grid)
        # Whether partial edge chunks were filtered like the others: HDF5 can be told not to,
        # and where that cannot be asked, they are left to HDF5.
        self.edges_direct = _chunk_opts(ds.id.get_create_plist()) == 0
        self._stored: dict[Coord, Stored] | None = None
        # Read ahead (see rows): chunks decoded, or being decoded, for the next read in order.
        self._ahead: dict[Coord, Future[np.ndarray] | None] = {}
        # The same for whole: by chunk number.
        self._whole_ahead: dict[int, Future[np.ndarray] | None] = {}
        #: Rows of the last read: a read that starts inside them or where they end, after
        #: where they start, reads on in order.
        self._start, self._stop = -1, 0
        self._lock = threading.Lock()

    @property
    def ds(self) -> h5py.Dataset:
        """The h5py dataset."""
        if self._ds is not None:
            return self._ds
        assert self._reopen is not None
        return self._reopen()

    @classmethod
    def of(
        cls,
        ds: h5py.Dataset,
        file: Path,
        fd: Callable[[], int],
        reopen: Callable[[], h5py.Dataset] | None = None,
    ) -> DirectChunks | None:
        """For a chunked dataset whose chunks can be decoded here (see the module), else
        ``None``; ``fd`` gives a descriptor of ``file`` open read-only; ``reopen``, where
        given, gives ``ds`` again when it is needed (it is not held)."""
        taken = (DEFLATE, SHUFFLE, ZSTD_FILTER, FLETCHER32)
        filters = _pipeline(ds, taken, MIN_CHUNK_BYTES)
        if filters is None:
            return None
        pipeline = [kind for kind, _ in filters]
        if ZSTD_FILTER in pipeline and _zstd_decompressor() is None:
            return None
        return cls(ds, file, fd, pipeline, reopen)

    def _table(self) -> dict[Coord, Stored]:
        """Every stored chunk, from HDF5's chunk index in one walk."""
        if self._stored is None:
            table: dict[Coord, Stored] = {}

            def add(info: Any) -> None:
                if info.byte_offset is not None:
                    table[tuple(info.chunk_offset)] = (
                        int(info.filter_mask),
                        int(info.byte_offset),
                        int(info.size),
                    )

            dsid = self.ds.id
            try:
                dsid.chunk_iter(add)
            except (AttributeError, NotImplementedError):  # an HDF5 before 1.12.3
                for i in range(dsid.get_num_chunks()):
                    add(dsid.get_chunk_info(i))
            self._stored = table
        return self._stored

    def _damaged(self, coord: Coord, why: str) -> InputError:
        return InputError(
            f"cannot read the chunk at {list(coord)} ({why})",
            file=self.file,
            key=self.name.lstrip("/"),
            hint="the file is damaged",
        )

    def decode(self, coord: Coord, stored: Stored) -> np.ndarray:
        """The chunk at ``coord``, whole (an edge chunk padded as stored), in chunk shape."""
        mask, offset, size = stored
        if offset + size > self.file_size:
            raise self._damaged(coord, "it lies past the end of the file")
        data: Any = os.pread(self._fd(), size, offset)
        if len(data) != size:
            raise self._damaged(coord, "the file ends inside it")
        try:
            for i in reversed(range(len(self.pipeline))):
                if mask & (1 << i):
                    continue  # HDF5 skipped this filter for this chunk
                kind = self.pipeline[i]
                if kind == FLETCHER32:
                    data = self._checked(coord, data)
                elif kind == ZSTD_FILTER:
                    zstd: Any = _zstd_decompressor()  # there is one: see of()
                    data = zstd.decompress(data, max_output_size=self.chunk_bytes)
                elif kind == DEFLATE:
                    data = zlib.decompressobj().decompress(data, self.chunk_bytes + 1)
                else:
                    data = unshuffle(data, self.dtype.itemsize)
        except _decode_errors() as exc:
            raise self._damaged(coord, f"it does not decode: {exc}") from None
        array = np.frombuffer(data, dtype=np.uint8)
        if array.nbytes != self.chunk_bytes:
            got = f"{array.nbytes} bytes, not {self.chunk_bytes}"
            raise self._damaged(coord, f"it decodes to {got}")
        return array.view(self.dtype).reshape(self.chunks)

    def _checked(self, coord: Coord, data: bytes) -> memoryview:
        """A chunk's bytes without the Fletcher-32 checksum HDF5 stored after them, checked as
        HDF5 checks it (also with the bytes of each half swapped, as HDF5 before 1.6.3 wrote
        it)."""
        if len(data) < 4:
            raise self._damaged(coord, "it is shorter than its checksum")
        body = memoryview(data)[:-4]
        stored = int.from_bytes(data[-4:], "little")
        found = fletcher32(body)
        if stored not in (found, ((found & 0x00FF00FF) << 8) | ((found >> 8) & 0x00FF00FF)):
            raise self._damaged(coord, "its checksum does not match")
        return body

    def whole(
        self,
        indices: Sequence[int],
        post: Callable[[np.ndarray], np.ndarray],
        ahead: Sequence[int] = (),
    ) -> list[np.ndarray | None]:
        """Chunks number ``indices`` along time of a dataset chunked along time only, each cut
        to the rows it holds and passed through ``post``, decoded on the pool; ``None`` for one
        HDF5 should read. ``ahead``: chunks the next call will ask for (with the same
        ``post``), decoded meanwhile; any other chunk decoded ahead is dropped."""
        assert self.chunks[1:] == self.shape[1:]
        with self._lock:
            ready, self._whole_ahead = self._whole_ahead, {}
            futures = [ready.pop(i) if i in ready else self._whole(i, post) for i in indices]
            for index in ahead:
                self._whole_ahead[index] = ready.pop(index, None) or self._whole(index, post)
        return [None if f is None else f.result() for f in futures]

    def _whole(
        self, index: int, post: Callable[[np.ndarray], np.ndarray]
    ) -> Future[np.ndarray] | None:
        """Chunk ``index`` along time being decoded (see :meth:`whole`)."""
        coord = (index * self.chunks[0], *[0] * (len(self.shape) - 1))
        stored = self._table().get(coord)
        if stored is None:
            return None
        # An edge chunk holds fewer rows: the others are padding.
        cut = functools.partial(_rows_then, rows=self.shape[0] - coord[0], post=post)
        return self._submit(coord, stored, cut)

    def _band(self, first: int) -> list[Coord]:
        """The chunks of the rows from ``first`` (a chunk boundary along time) on."""
        grid = [range(0, n, c) for n, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        return [(first, *rest) for rest in itertools.product(*grid)]

    def _submit(
        self,
        coord: Coord,
        stored: Stored,
        then: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> Future[np.ndarray] | None:
        """The chunk at ``coord`` being decoded on the pool (and passed through ``then``);
        ``None`` for a partial edge chunk HDF5 must read (see ``edges_direct``)."""
        partial = any(c + k > n for c, k, n in zip(coord, self.chunks, self.shape, strict=True))
        if partial and not self.edges_direct:
            return None
        if then is None:
            return decoders().submit(self.decode, coord, stored)
        return decoders().submit(lambda: then(self.decode(coord, stored)))

    def rows(self, start: int, stop: int, min_chunks: int = 2) -> np.ndarray | None:
        """Rows ``start:stop`` as a new array, every chunk they touch decoded on the pool;
        ``None`` where HDF5 should read them (a chunk never written, or fewer than
        ``min_chunks`` chunks in all: one chunk gains little and HDF5 caches it; the rows
        of one chunk along time may span many, D4RL's chunks holding a column each).

        Reads in order (each starting where the last one stopped, or inside it) are read
        ahead: a chunk the next read starts in is kept, and the following :data:`AHEAD`
        chunks along time are decoded while the caller works."""
        stop = min(stop, self.shape[0])
        per = self.chunks[0]
        bands = (stop - 1) // per - start // per + 1
        if stop - start <= 0 or bands * self.across < min_chunks:
            return None
        table = self._table()
        first, end = start // per * per, -(-stop // per) * per
        wanted = [coord for band in range(first, end, per) for coord in self._band(band)]
        if any(coord not in table for coord in wanted):
            return None  # never written: HDF5 gives the fill value
        with self._lock:
            ready, self._ahead = self._ahead, {}
            futures = {c: ready.pop(c) if c in ready else self._submit(c, table[c]) for c in wanted}
            if stop % per:  # the next read in order starts in the last band
                self._ahead.update({c: futures[c] for c in self._band(end - per)})
            # In order: decode what follows. A read in order may start a little before the
            # last one stopped: a pass that reads each row's successor with it reads the
            # first row of the next read twice (verifying a packed 500 MB D4RL file's
            # observations read them that way, decoding on one core: 0.56-0.63 s, 0.18 s now).
            if self._start < start <= self._stop:
                for band in range(end, min(self.shape[0], end + AHEAD * per), per):
                    for c in self._band(band):
                        if c in ready:
                            self._ahead[c] = ready.pop(c)
                        elif c in table:
                            self._ahead[c] = self._submit(c, table[c])
            self._start, self._stop = start, stop
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        for coord, future in futures.items():
            source, target, local = self._regions(start, stop, coord)
            if future is None:  # HDF5 reads it, in this thread
                try:
                    out[target] = self.ds[source]
                except (OSError, ValueError) as exc:
                    raise self._damaged(coord, str(exc)) from None
            else:
                out[target] = future.result()[local]
        return out

    def _regions(self, start: int, stop: int, coord: Coord) -> tuple[Region, Region, Region]:
        """Where the chunk at ``coord`` meets rows ``start:stop``: in the dataset, in the array
        of those rows, and in the chunk."""
        lows, highs = (start, *[0] * (len(coord) - 1)), (stop, *self.shape[1:])
        source = tuple(
            slice(max(c, lo), min(c + k, hi))
            for c, k, lo, hi in zip(coord, self.chunks, lows, highs, strict=True)
        )
        target = (slice(source[0].start - start, source[0].stop - start), *source[1:])
        local = tuple(slice(s.start - c, s.stop - c) for s, c in zip(source, coord, strict=True))
        return source, target, local


def row_reader(
    ds: h5py.Dataset, file: Path, fd: Callable[[], int]
) -> Callable[[int, int], np.ndarray]:
    """``read(start, stop)``: rows ``start:stop`` of ``ds`` as a new array, its chunks decoded
    on every core where :class:`DirectChunks` applies (reads in order decoded ahead), through
    HDF5 elsewhere. ``fd`` gives a descriptor of ``file``, which must be open read-only.
    The dataset is looked at when first read, and only if it could span two chunks worth
    decoding here: a robomimic file has thousands of datasets of a few rows."""
    direct: DirectChunks | bool | None = False  # False: not looked at yet

    def read(start: int, stop: int) -> np.ndarray:
        nonlocal direct
        if direct is False:
            big = math.prod(ds.shape) * ds.dtype.itemsize >= 2 * MIN_CHUNK_BYTES
            direct = DirectChunks.of(ds, file, fd) if big else None
        if isinstance(direct, DirectChunks):
            rows = direct.rows(start, stop, min_chunks=1)
            if rows is not None:
                return rows
        return np.asarray(ds[start:stop])

    return read


class DirectWrites:
    """Rows written into a new chunked dataset by whole chunks, each filtered on every core
    (deflate, shuffle, Fletcher-32: the pipelines HDF5 ships) and written as stored bytes,
    where HDF5 would filter one chunk at a time under the interpreter lock. A chunk the rows
    fill only in part (an edge chunk, padded as HDF5 pads it) is left to HDF5.

    The stored bytes are those of this machine's zlib, which may differ from what another
    zlib writes for the same values: for a caller that checks values, not stored bytes.
    Made with :meth:`of`, which returns ``None`` for a dataset this does not apply to."""

    def __init__(self, ds: h5py.Dataset, pipeline: Sequence[tuple[int, int]]) -> None:
        self.ds = ds
        self.pipeline = tuple(pipeline)
        self.shape: tuple[int, ...] = tuple(ds.shape)
        self.chunks: tuple[int, ...] = tuple(ds.chunks)
        self.itemsize = ds.dtype.itemsize
        self._pending: list[tuple[Coord, Future[bytes]]] = []
        self._depth = 4 * workers()

    @classmethod
    def of(cls, ds: h5py.Dataset) -> DirectWrites | None:
        """For a chunked dataset filtered only by deflate, shuffle and Fletcher-32 whose
        stored type is its values' type, else ``None``."""
        pipeline = _pipeline(ds, (DEFLATE, SHUFFLE, FLETCHER32))
        return None if pipeline is None else cls(ds, pipeline)

    def encode(self, chunk: np.ndarray) -> bytes:
        """A whole chunk's stored bytes, its filters applied in the pipeline's order."""
        data: Any = chunk.reshape(-1).view(np.uint8)
        for kind, level in self.pipeline:
            if kind == SHUFFLE and self.itemsize > 1:
                data = np.ascontiguousarray(np.asarray(data).reshape(-1, self.itemsize).T)
            elif kind == DEFLATE:
                data = zlib.compress(data, level)
            elif kind == FLETCHER32:
                data = bytes(data) + fletcher32(data).to_bytes(4, "little")
        return bytes(data)

    def write(self, start: int, values: np.ndarray) -> None:
        """Rows ``start:start + len(values)``, ``start`` on a chunk boundary along time (the
        rows are copied: the caller may reuse ``values``)."""
        if start % self.chunks[0]:
            raise ValueError(f"{self.ds.name}: rows from {start}, inside a chunk")
        stop = start + len(values)
        grid = [range(0, n, c) for n, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        for first in range(start, stop, self.chunks[0]):
            for rest in itertools.product(*grid):
                coord = (first, *rest)
                region = tuple(
                    slice(c, min(c + k, n))
                    for c, k, n in zip(coord, self.chunks, self.shape, strict=True)
                )
                local = (slice(first - start, region[0].stop - start), *region[1:])
                whole = all(s.stop - s.start == k for s, k in zip(region, self.chunks, strict=True))
                if whole and region[0].stop <= stop:
                    chunk = np.array(values[local], order="C")
                    self._pending.append((coord, decoders().submit(self.encode, chunk)))
                else:  # an edge chunk, or rows that end inside the chunk: HDF5 writes them
                    self.ds[region] = values[local]
            while len(self._pending) > self._depth:
                self._put()

    def finish(self) -> None:
        """Write every chunk still being filtered."""
        while self._pending:
            self._put()

    def _put(self) -> None:
        coord, future = self._pending.pop(0)
        self.ds.id.write_direct_chunk(coord, future.result())
