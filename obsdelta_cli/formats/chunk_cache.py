"""Decoded chunks kept for training reads, within a byte budget per dataset.

A filtered HDF5 dataset is decoded a whole chunk at a time. Random rows touch a new chunk
nearly every time: in a D4RL file as D4RL writes it (gzip, h5py's default chunks of one
column each), every row of a batch costs a decode of one chunk per column, and HDF5's own
cache (1 MB a dataset) holds a few of them. Training reads (``open_dataset(cache_mb=...)``)
keep what they decode instead, by *bands*: every column of a chunk's rows, decoded in one read.

:class:`ChunkCache` is the one rule every reader that keeps decoded chunks follows (the
frame-delta datasets of a packed file too): the least recently used dropped once the values
kept pass the budget, with counts of what it decoded and what it served.

>>> cache = ChunkCache(capacity=64)
>>> bands = BandReads(rows=10, band_rows=4, decode=lambda a, b: np.arange(a, b), cache=cache)
>>> bands.select(np.array([1, 2, 9])).tolist(), cache.stats.decodes
([1, 2, 9], 2)
>>> bands.read(0, 3).tolist(), cache.stats.decodes, cache.stats.hits
([0, 1, 2], 2, 1)
>>> cache.nbytes <= cache.capacity
True
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..arrays import sorted_distinct


@dataclass
class CacheStats:
    """What a :class:`ChunkCache` did: bands decoded (put), served from memory, dropped."""

    decodes: int = 0
    hits: int = 0
    evictions: int = 0


class ChunkCache:
    """Decoded bands of one dataset by band number, the least recently used dropped once
    their values pass ``capacity`` bytes. The band just put is always kept (a read needs it),
    so one band larger than the budget is the most it can hold then."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        #: Bytes of the values kept.
        self.nbytes = 0
        self.stats = CacheStats()
        self._kept: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # a DataLoader may read from threads

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, index: int) -> np.ndarray | None:
        """Band ``index`` if kept (now the most recently used)."""
        with self._lock:
            found = self._kept.get(index)
            if found is not None:
                self._kept.move_to_end(index)
                self.stats.hits += 1
            return found

    def clear(self) -> None:
        """Drop every band kept (the counts stay)."""
        with self._lock:
            self._kept.clear()
            self.nbytes = 0

    def put(self, index: int, values: np.ndarray) -> None:
        """Keep band ``index``, just decoded, dropping the least recently used past the budget."""
        with self._lock:
            self.stats.decodes += 1
            old = self._kept.pop(index, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._kept[index] = values
            self.nbytes += values.nbytes
            while self.nbytes > self.capacity and len(self._kept) > 1:
                _, dropped = self._kept.popitem(last=False)
                self.nbytes -= dropped.nbytes
                self.stats.evictions += 1


class BandReads:
    """Rows of a dataset of ``rows`` rows read by whole bands of ``band_rows`` rows (a chunk's
    rows, every column), each decoded once by ``decode(start, stop)`` and kept in ``cache``.
    Values are never handed out by reference: a caller may change what it gets."""

    def __init__(
        self,
        rows: int,
        band_rows: int,
        decode: Callable[[int, int], np.ndarray],
        cache: ChunkCache,
    ) -> None:
        self.rows, self.band_rows = rows, max(1, band_rows)
        self.decode, self.cache = decode, cache

    def _band(self, index: int) -> np.ndarray:
        found = self.cache.get(index)
        if found is None:
            start = index * self.band_rows
            found = self.decode(start, min(self.rows, start + self.band_rows))
            self.cache.put(index, found)
        return found

    def _bands(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [self._band(i) for i in indices]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as a new array."""
        stop = min(stop, self.rows)
        if stop <= start:
            return self.decode(start, start)
        first, last = start // self.band_rows, (stop - 1) // self.band_rows
        parts = self._bands(range(first, last + 1))
        offset = first * self.band_rows
        if len(parts) == 1:
            return parts[0][start - offset : stop - offset].copy()
        return np.concatenate(parts)[start - offset : stop - offset]

    def select(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, distinct) as a new array, each band they touch read once."""
        if not len(rows):
            return self.decode(0, 0)
        band_of = rows // self.band_rows
        touched = sorted_distinct(band_of)
        # Rows are sorted: each band's rows are one run of them.
        bounds = [*np.searchsorted(band_of, touched).tolist(), len(rows)]
        parts = self._bands(touched.tolist())
        out = np.empty((len(rows), *parts[0].shape[1:]), dtype=parts[0].dtype)
        for i, (band, values) in enumerate(zip(touched.tolist(), parts, strict=True)):
            a, b = bounds[i], bounds[i + 1]
            out[a:b] = values[rows[a:b] - band * self.band_rows]
        return out
