"""HDF5 filters for packed files: the candidates, chunk shapes, the choice per key measured on a
sample of chunks, and the encoder that compresses chunks on a pool of threads.

Every candidate is a filter pipeline that plain ``h5py`` reads once ``hdf5plugin`` is imported:
HDF5's own byte shuffle (optional), hdf5plugin's Zstd filter, whose chunk is one zstd frame,
then HDF5's Fletcher-32 checksum. Each frame carries zstd's content checksum too, but
hdf5plugin's Zstd filter ignores zstd's errors (a damaged frame decodes to wrong values
without one): the Fletcher-32 of the stored bytes, which every HDF5 reader checks before it
decodes a chunk, is what makes plain ``h5py`` fail on a damaged chunk. obsdelta's own reader
(:mod:`~obsdelta_cli.formats.hdf5_chunks`) checks both.
Chunks are encoded here, in exactly those bytes, by ``zstandard`` (which releases the
interpreter lock, so both cores compress), and written as they are with
``write_direct_chunk``: HDF5 itself filters nothing, and a chunk's size is known before it is
written. The set is small on purpose: each is measured on every key's sample, and each must
compress at several hundred MB/s on one core.

A dataset is stored as its own values, never transformed: any reader that opens it by name
(robomimic, Minari, TorchRL, plain ``h5py``) gets them once ``hdf5plugin`` is imported, and
HDF5's filter error without it. Files packed by obsdelta 0.2 may hold uint8 frames as frame
deltas under their own names (the attribute ``obsdelta_transform``); obsdelta still reads them
exactly (:func:`undo_frame_delta`), other readers do not (``inflate`` writes the values back).
No HDF5 filter hdf5plugin decodes stores frame deltas: Blosc2's DELTA filter XORs each block
with the chunk's first one, and measured smaller than zstd on no image data here
(benchmarks/README.md, "Image datasets in packed files").

>>> import numpy as np
>>> frames = np.array([[1, 2], [3, 2], [3, 255]], dtype=np.uint8)
>>> undo_frame_delta(frame_delta(frames)).tolist() == frames.tolist()
True
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py._objects import phil

from .errors import UsageError

#: Raw bytes per chunk: large enough for zstd to find repeats across many rows (frames), small
#: enough that a random row costs one cheap chunk read.
CHUNK_BYTES = 1 << 20
#: Chunks of each key the filter choice is measured on (spread evenly over the key's rows).
SAMPLE_CHUNKS = 4
#: Datasets smaller than this are copied as they are. A repacked dataset of an HDF5 input costs
#: a filter pipeline and a layout twin, a few hundred bytes of headers: below 512 bytes of
#: values, compression gains less than that (measured: docs/guide/packing.md).
MIN_PACK_BYTES = 1 << 9
#: The transform of files packed by obsdelta 0.2: frame ``t`` minus frame ``t - 1`` (mod 256)
#: within a chunk, stored under the dataset's own name.
FRAME_DELTA = "frame-delta"
#: hdf5plugin's Zstd filter (its registered HDF5 filter id).
ZSTD_FILTER = 32015
#: zstd's largest block (``ZSTD_BLOCKSIZE_MAX``), bytes.
ZSTD_BLOCK = 1 << 17


def plugins() -> Any:
    """``hdf5plugin``, imported on first use: it registers the filters with HDF5 (writing or
    reading a packed file needs it) and takes a quarter of a second to import."""
    try:
        import hdf5plugin
    except ImportError:
        raise UsageError(
            "packed files need hdf5plugin", hint="pip install 'obsdelta[hdf5plugin]'"
        ) from None
    short_zstd_name(hdf5plugin)
    return hdf5plugin


#: The name HDF5 writes into the filter pipeline of each dataset obsdelta filters with Zstd.
ZSTD_NAME = b"zstd"


class _FilterClass(ctypes.Structure):
    """HDF5's ``H5Z_class2_t``: a filter as registered (``H5Zregister``)."""

    _fields_ = [
        ("version", ctypes.c_int),
        ("id", ctypes.c_int),
        ("encoder_present", ctypes.c_uint),
        ("decoder_present", ctypes.c_uint),
        ("name", ctypes.c_char_p),
        ("can_apply", ctypes.c_void_p),
        ("set_local", ctypes.c_void_p),
        ("filter", ctypes.c_void_p),
    ]


#: hdf5plugin's Zstd filter registered again under :data:`ZSTD_NAME` (kept for the process:
#: HDF5 keeps a pointer to its name), or ``None`` before :func:`short_zstd_name`.
_short_zstd: _FilterClass | None = None


def short_zstd_name(hdf5plugin: Any) -> None:
    """Register hdf5plugin's Zstd filter (the same code, encoding and decoding) again, named
    :data:`ZSTD_NAME`. HDF5 writes the name of the registered filter into every filtered
    dataset's object header, and hdf5plugin's is a sentence of 107 characters with a web
    address: in a packed file of 10,000 small datasets, a megabyte of headers. A reader finds
    the filter by its number, which is unchanged. Done once per process; where the plugin's
    library cannot be found or does not describe the filter as expected, names stay long."""
    global _short_zstd
    if _short_zstd is not None:
        return
    found = sorted(Path(hdf5plugin.PLUGIN_PATH).glob("*h5zstd.*"))
    try:
        info = ctypes.CDLL(str(found[0])).H5PLget_plugin_info
    except (IndexError, OSError, AttributeError):
        return
    info.restype = ctypes.c_void_p
    address = info()
    if not address:
        return
    plugin = _FilterClass.from_address(address)
    if plugin.version != 1 or plugin.id != ZSTD_FILTER or not plugin.filter:
        return
    short = _FilterClass.from_buffer_copy(plugin)
    short.name = ZSTD_NAME
    try:
        h5py.h5z.register_filter(ctypes.addressof(short))
    except (RuntimeError, ValueError, OSError):  # hdf5plugin's registration stays
        return
    _short_zstd = short


_local = threading.local()


def _zstandard() -> Any:
    """``zstandard``, which writing packed files needs (reading needs only hdf5plugin)."""
    try:
        import zstandard
    except ImportError:
        raise UsageError(
            "writing packed files needs zstandard", hint="pip install 'obsdelta[hdf5plugin]'"
        ) from None
    return zstandard


def _compressor(level: int, hash_log: int | None = None) -> Any:
    """This thread's zstd compressor at ``level``, with a hash table of ``2**hash_log``
    entries where given (a compressor is not shared between threads)."""
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    if (level, hash_log) not in cache:
        zstandard = _zstandard()
        # Every frame ends with its content checksum (4 bytes), which zstd decoders check.
        if hash_log is None:
            made = zstandard.ZstdCompressor(level=level, write_checksum=True)
        else:
            params = zstandard.ZstdCompressionParameters.from_level(
                level, hash_log=hash_log, write_checksum=1
            )
            made = zstandard.ZstdCompressor(compression_params=params)
        cache[level, hash_log] = made
    return cache[level, hash_log]


@dataclass(frozen=True)
class Filter:
    """One filter pipeline a packed dataset may get, by name: optional byte shuffle, then zstd
    at ``level`` over the whole chunk."""

    name: str
    level: int
    shuffle: bool = False
    #: Applies to datasets of this item size at most (shuffles do nothing to bytes).
    itemsize_min: int = 1
    #: Stores frame deltas (uint8 images only).
    transform: str | None = None
    #: log2 of the entries of zstd's match-finding table (``None``: the level's own). Only
    #: the encoder's speed and the stored bytes depend on it; any zstd decoder reads them.
    hash_log: int | None = None

    def kwargs(self) -> dict[str, Any]:
        """``h5py`` ``create_dataset`` keywords for the pipeline (shuffle runs first, the
        Fletcher-32 checksum last)."""
        return dict(shuffle=self.shuffle, fletcher32=True, **plugins().Zstd(clevel=self.level))

    def encode(self, rows: np.ndarray, per_chunk: int) -> bytes:
        """One stored chunk from its ``rows`` (at most ``per_chunk``, C-contiguous, of the
        dataset's dtype): the bytes the HDF5 pipeline would store, checksum included. An
        edge chunk is padded with zeros to the full chunk, as HDF5 stores it."""
        frame = self._frame(rows, per_chunk)
        return frame + fletcher32(frame).to_bytes(4, "little")

    def _frame(self, rows: np.ndarray, per_chunk: int) -> bytes:
        """The zstd frame of a chunk (after the shuffle, before the checksum)."""
        if self.transform == FRAME_DELTA:
            rows = frame_delta(rows)
        if len(rows) < per_chunk:
            full = np.zeros((per_chunk, *rows.shape[1:]), dtype=rows.dtype)
            full[: len(rows)] = rows
            rows = full
        raw = rows.reshape(-1).view(np.uint8)
        zstd = _compressor(self.level, self.hash_log)
        if not self.shuffle or rows.dtype.itemsize == 1:
            return bytes(zstd.compress(raw))
        # HDF5's shuffle: byte 0 of every element, then byte 1, ... Planes at least a zstd
        # block long fill blocks of their own but for one at each plane's edge: one call, as
        # small to 0.2% and 1.3-1.5x as fast as the flushes below (measured on D4RL chunks).
        planes = np.ascontiguousarray(raw.reshape(-1, rows.dtype.itemsize).T)
        if planes.shape[1] >= ZSTD_BLOCK:
            return bytes(zstd.compress(planes))
        # Shorter planes each end a block, so each gets its own entropy tables (sign and
        # exponent bytes repeat, low mantissa bytes barely do): 4-10% smaller on chunks of a
        # few 100 KB, where one block would mix the planes. Still one frame, its size in the
        # header.
        stream, block = zstd.compressobj(size=planes.nbytes), _zstandard().COMPRESSOBJ_FLUSH_BLOCK
        out = [piece for plane in planes for piece in (stream.compress(plane), stream.flush(block))]
        return b"".join([*out, stream.flush()])


FILTERS: dict[str, Filter] = {
    # A table of 1,024 entries (level 1's own has 16,384): the low bytes of float values are
    # nearly random, and looking them up in a table that stays in the core's first cache
    # costs less than in one that does not. On D4RL chunks of 1 MB (Hopper observations and
    # actions), shuffled: 1.15-1.6x the speed of level 1's table, and 0.3-0.8% smaller.
    "shuffle-zstd1": Filter("shuffle-zstd1", 1, shuffle=True, itemsize_min=2, hash_log=10),
    "zstd3": Filter("zstd3", 3),
    # Written by obsdelta 0.2 only, and never offered now: other readers would take its frame
    # deltas for frames. Kept so that such files can be written again to test their reads.
    "frame-delta-zstd3": Filter("frame-delta-zstd3", 3, transform=FRAME_DELTA),
}


@functools.cache
def hdf5_library() -> Any:
    """The HDF5 library h5py runs on (found among the process's mapped files, Linux), for a
    call h5py does not wrap; ``None`` where it is not found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({ln.split()[-1] for ln in maps if "libhdf5" in ln and "_hl" not in ln})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.H5Fset_dset_no_attrs_hint.argtypes = [ctypes.c_int64, ctypes.c_bool]
            return lib
        except (OSError, AttributeError):
            continue
    return None


#: Words of one block of the pure numpy Fletcher-32 (products and sums stay exact in float64).
_WORDS = 1 << 16
_WEIGHTS = np.arange(_WORDS, dtype=np.float64)


@functools.cache
def _hdf5_fletcher32() -> Any:
    """HDF5's own ``H5_checksum_fletcher32`` (called without the interpreter lock), ``None``
    where the library h5py runs on does not export it."""
    lib = hdf5_library()
    try:
        fn = lib.H5_checksum_fletcher32 if lib is not None else None
    except AttributeError:
        return None
    if fn is not None:
        fn.restype, fn.argtypes = ctypes.c_uint32, [ctypes.c_void_p, ctypes.c_size_t]
    return fn


def fletcher32(data: bytes | memoryview) -> int:
    """HDF5's Fletcher-32 of ``data`` (its ``fletcher32`` filter stores it, little-endian,
    after a chunk's filtered bytes, and every HDF5 reader checks it before decoding).

    >>> hex(fletcher32(b"abcde"))
    '0x4ff029c7'
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    fn = _hdf5_fletcher32()
    if fn is not None:
        return int(fn(raw.ctypes.data, raw.size))
    # HDF5's sums of big-endian 16-bit words (an odd last byte is the high byte of one),
    # reduced mod 65535 with a nonzero sum never reduced to 0.
    n = (raw.size + 1) // 2
    blocks = -(-n // _WORDS)
    padded = np.zeros(blocks * _WORDS * 2, dtype=np.uint8)
    padded[: raw.size] = raw
    words = padded.view(">u2").reshape(blocks, _WORDS).astype(np.float64)
    sums, weighted = words.sum(axis=1), words @ _WEIGHTS
    sum1 = int(sums.sum())
    sum2 = sum((n - b * _WORDS) * int(sums[b]) - int(weighted[b]) for b in range(blocks))
    return (_reduced(sum2) << 16) | _reduced(sum1)


def _reduced(total: int) -> int:
    return 0 if total == 0 else (total - 1) % 65535 + 1


def minimal_headers(f: h5py.File) -> None:
    """Datasets created in ``f`` get object headers of the minimum size, without the room
    HDF5 keeps for attributes (``H5Fset_dset_no_attrs_hint``, HDF5 1.10.5+): 127 bytes fewer
    per dataset, which counts in small packed files and in robomimic's thousands of
    datasets. An attribute added later still fits (in a continuation block). Where the call
    cannot be made, headers keep their usual size."""
    lib = hdf5_library()
    if lib is not None:
        with phil:  # as h5py calls HDF5, which is not thread-safe
            lib.H5Fset_dset_no_attrs_hint(f.id.id, True)


def workers() -> int:
    """Threads that encode chunks: one per core this process may use."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


class ThreadsPerCore:
    """A pool of threads, one per core (:func:`workers`), started on first use and kept for
    the process. A forked child (a DataLoader worker) has none of the parent's threads, so a
    task given to the parent's pool would wait forever: it starts its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._starting = threading.Lock()  # asked from several threads
        os.register_at_fork(after_in_child=self._forget)

    def __call__(self) -> ThreadPoolExecutor:
        with self._starting:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(workers(), thread_name_prefix=self.name)
            return self._pool

    @property
    def started(self) -> bool:
        return self._pool is not None

    def _forget(self) -> None:
        self._pool, self._starting = None, threading.Lock()


#: The chunk encoders.
pool = ThreadsPerCore("obsdelta-encode")


def candidates(dtype: np.dtype, shape: Sequence[int]) -> list[Filter]:
    """The filters worth measuring on a dataset of ``dtype`` and ``shape``: those that store its
    values as they are (frames included: see the module's note)."""
    return [f for f in FILTERS.values() if dtype.itemsize >= f.itemsize_min and not f.transform]


def chunk_rows(shape: Sequence[int], itemsize: int) -> int:
    """Rows per chunk along the first (time) dimension: about :data:`CHUNK_BYTES`."""
    row = max(1, math.prod(shape[1:]) * itemsize)
    return max(1, min(shape[0] if shape else 1, CHUNK_BYTES // row))


def frame_delta(chunk: np.ndarray) -> np.ndarray:
    """Frame ``t`` minus frame ``t - 1`` (uint8, wrapping), the first frame kept: lossless."""
    out = chunk.copy()
    np.subtract(chunk[1:], chunk[:-1], out=out[1:])
    return out


def undo_frame_delta(chunk: np.ndarray) -> np.ndarray:
    """The frames back from :func:`frame_delta` (a running sum that wraps at 256), a frame at a
    time: 13x the speed of ``np.cumsum`` along the first axis (15 GB/s against 1.1 here)."""
    out = np.empty_like(chunk)
    if len(chunk):
        out[0] = chunk[0]
    for t in range(1, len(chunk)):
        np.add(out[t - 1], chunk[t], out=out[t])
    return out


def family(path: str) -> str:
    """The key a dataset's filter is chosen for: its path with numbers blanked, so one choice
    serves every robomimic demo (``data/demo_#/obs/agentview_image``).

    >>> family("data/demo_12/obs/agentview_image")
    'data/demo_#/obs/agentview_image'
    """
    return re.sub(r"\d+", "#", path)


def sample_rows(length: int, per_chunk: int, chunks: int = SAMPLE_CHUNKS) -> list[slice]:
    """Up to ``chunks`` whole chunks of rows, spread evenly over ``length`` rows."""
    total = -(-length // per_chunk)
    picks = sorted({round(i * (total - 1) / max(1, chunks - 1)) for i in range(min(chunks, total))})
    return [slice(c * per_chunk, min(length, (c + 1) * per_chunk)) for c in picks]


def compressed_size(rows: np.ndarray, per_chunk: int, flt: Filter) -> int:
    """Bytes ``rows`` (starting on a chunk boundary) take in chunks of ``per_chunk`` rows with
    ``flt``: exactly the chunks the packed file will hold."""
    rows = np.ascontiguousarray(rows)
    return sum(
        len(flt.encode(rows[i : i + per_chunk], per_chunk)) for i in range(0, len(rows), per_chunk)
    )


def choose(samples: Sequence[np.ndarray], per_chunk: int) -> tuple[Filter, float]:
    """The filter that stores ``samples`` (whole chunks of one key) smallest, and its ratio of
    stored to raw bytes (every candidate measured on :func:`pool`)."""
    first = samples[0]
    raw = sum(s.nbytes for s in samples)
    sizes = [
        (flt, [pool().submit(compressed_size, s, per_chunk, flt) for s in samples])
        for flt in candidates(first.dtype, first.shape)
    ]
    best = min(sizes, key=lambda fs: sum(f.result() for f in fs[1]))
    return best[0], sum(f.result() for f in best[1]) / max(1, raw)
