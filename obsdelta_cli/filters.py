"""HDF5 filters for packed files: the candidates, chunk shapes, the choice per key measured on a
sample of chunks, and the one lossless transform, frame deltas for uint8 images.

Every candidate is a filter pipeline that plain ``h5py`` reads once ``hdf5plugin`` is imported.
The set is small on purpose: each is measured on every key's sample, and each must compress at
several hundred MB/s on one core.

>>> import numpy as np
>>> frames = np.array([[1, 2], [3, 2], [3, 255]], dtype=np.uint8)
>>> undo_frame_delta(frame_delta(frames)).tolist() == frames.tolist()
True
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from .errors import UsageError

#: Raw bytes per chunk: large enough for zstd to find repeats across many rows (frames), small
#: enough that a random row costs one cheap chunk read.
CHUNK_BYTES = 1 << 20
#: Chunks of each key the filter choice is measured on (spread evenly over the key's rows).
SAMPLE_CHUNKS = 4
#: Datasets smaller than this are copied as they are: filters would gain only bytes.
MIN_PACK_BYTES = 1 << 12
#: The transform that stores frame ``t`` minus frame ``t - 1`` (mod 256) within a chunk.
FRAME_DELTA = "frame-delta"


@dataclass(frozen=True)
class Filter:
    """One filter pipeline a packed dataset may get, by name."""

    name: str
    #: ``h5py`` ``create_dataset`` keywords.
    kwargs: Callable[[], dict[str, Any]]
    #: Applies to datasets of this item size at most (shuffles do nothing to bytes).
    itemsize_min: int = 1
    #: Stores frame deltas (uint8 images only).
    transform: str | None = None


def plugins() -> Any:
    """``hdf5plugin``, imported on first use: it registers the filters with HDF5 (writing or
    reading a packed file needs it) and takes a quarter of a second to import."""
    try:
        import hdf5plugin
    except ImportError:
        raise UsageError(
            "packed files need hdf5plugin", hint="pip install 'obsdelta[hdf5plugin]'"
        ) from None
    return hdf5plugin


#: Blosc2's shuffle filters (``hdf5plugin.Blosc2.SHUFFLE`` and ``BITSHUFFLE``).
SHUFFLE, BITSHUFFLE = 1, 2


def _blosc2(shuffle: int) -> Callable[[], dict[str, Any]]:
    # zstd at level 1 inside Blosc2: byte or bit shuffle first, blocks compressed on both cores.
    return lambda: dict(plugins().Blosc2(cname="zstd", clevel=1, filters=shuffle))


def _zstd() -> dict[str, Any]:
    # One zstd frame per chunk: matches reach across the whole chunk (repeated frames).
    return dict(plugins().Zstd(clevel=3))


FILTERS: dict[str, Filter] = {
    "blosc2-shuffle-zstd1": Filter("blosc2-shuffle-zstd1", _blosc2(SHUFFLE), 2),
    "blosc2-bitshuffle-zstd1": Filter("blosc2-bitshuffle-zstd1", _blosc2(BITSHUFFLE)),
    "zstd3": Filter("zstd3", _zstd),
    "frame-delta-zstd3": Filter("frame-delta-zstd3", _zstd, transform=FRAME_DELTA),
}


def is_image(dtype: np.dtype, shape: Sequence[int]) -> bool:
    """uint8 rows of two or more dimensions: frames, where temporal deltas pay."""
    return dtype == np.uint8 and len(shape) >= 3


def candidates(dtype: np.dtype, shape: Sequence[int]) -> list[Filter]:
    """The filters worth measuring on a dataset of ``dtype`` and ``shape``."""
    out = [f for f in FILTERS.values() if dtype.itemsize >= f.itemsize_min and not f.transform]
    if is_image(dtype, shape):
        out.append(FILTERS["frame-delta-zstd3"])
    return out


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
    """The frames back from :func:`frame_delta` (a running sum that wraps at 256)."""
    return np.cumsum(chunk, axis=0, dtype=np.uint8)


def transform_rows(rows: np.ndarray, per_chunk: int, transform: str | None) -> np.ndarray:
    """Apply ``transform`` to ``rows`` (starting on a chunk boundary), chunk by chunk."""
    if transform is None:
        return rows
    out = np.empty_like(rows)
    for start in range(0, len(rows), per_chunk):
        out[start : start + per_chunk] = frame_delta(rows[start : start + per_chunk])
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
    """Bytes ``rows`` take in HDF5 chunks of ``per_chunk`` rows with ``flt`` (measured in a file
    kept in memory, so exactly what the packed file will hold)."""
    data = transform_rows(rows, per_chunk, flt.transform)
    with h5py.File.in_memory() as f:
        ds = f.create_dataset(
            "x", data=data, chunks=(min(per_chunk, len(data)), *data.shape[1:]), **flt.kwargs()
        )
        return int(ds.id.get_storage_size())


def choose(samples: Sequence[np.ndarray], per_chunk: int) -> tuple[Filter, float]:
    """The filter that stores ``samples`` (whole chunks of one key) smallest, and its ratio of
    stored to raw bytes."""
    first = samples[0]
    raw = sum(s.nbytes for s in samples)
    best: tuple[int, Filter] | None = None
    for flt in candidates(first.dtype, first.shape):
        size = sum(compressed_size(s, per_chunk, flt) for s in samples)
        if best is None or size < best[0]:
            best = (size, flt)
    assert best is not None
    return best[1], best[0] / max(1, raw)
