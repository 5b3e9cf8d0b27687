"""The rebuild rule, in one place: ``("next", k)[t]`` from what a compressed dataset stores.

``next[t] = codec.decode(root[t], stored[t], root[t+1])``, then every boundary exception row
replaces its row. ``root[t+1]`` is the successor along the time dimension (a row without one
gets its own observation), ``stored`` the per-row leaf of codecs that keep one, and rows past a
replay buffer's ``len`` come back as their own observation. ``inflate``, ``verify``, ``report``
and ``open_dataset`` all rebuild through :class:`Rebuild`, and ``compress`` judges every row on
what :func:`decode` gives, so a reported error is the error of what users get back.

>>> import numpy as np
>>> from obsdelta_cli.codecs import make_codec
>>> from obsdelta_cli.stream import Geometry
>>> obs = np.array([[0.0], [1.0], [2.0], [9.0]], dtype=np.float32)
>>> g = Geometry.of([4], time_dim=0, valid_rows=None)
>>> exc = Exceptions(np.array([3]), np.array([[7.0]], dtype=np.float32))
>>> r = Rebuild(make_codec("exact"), np.dtype(np.float32), obs, None, g, exc)
>>> r.rows(slice(0, 4)).flatten().tolist(), r.take(np.array([3, 0])).flatten().tolist()
([1.0, 2.0, 9.0, 7.0], [7.0, 1.0])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .arrays import dtype_name, dtype_of
from .codecs import Codec, codec_from_config
from .errors import InputError
from .formats.base import Pair, Source, key_str
from .formats.leaf import FlatRows, is_data
from .manifest import KeyRecord, Manifest
from .stream import Geometry, Stream, window


def decode(
    codec: Codec,
    obs: np.ndarray,
    stored: np.ndarray | None,
    successor: np.ndarray | None,
    dtype: np.dtype,
    *,
    view: bool = False,
) -> np.ndarray:
    """A chunk's next observations as the codec rebuilds them, before exceptions are patched;
    with ``view``, to be read only (they may be ``successor`` itself)."""
    if view and codec.rebuilds_as_successor and successor is not None and successor.dtype == dtype:
        return successor
    return codec.decode(obs, stored, successor, dtype)


@dataclass(frozen=True)
class Exceptions:
    """Rows stored in full precision: their sorted row numbers (in memory) and values (lazy)."""

    index: np.ndarray
    #: The shared rows array; this pair's rows start at ``offset``.
    values: Any
    offset: int = 0

    def rows(self) -> np.ndarray:
        """This pair's exception rows, all of them."""
        return np.asarray(self.values[self.offset : self.offset + self.index.size])

    def patch_slice(self, rebuilt: np.ndarray, sl: slice) -> None:
        lo, hi = np.searchsorted(self.index, [sl.start, sl.stop]).tolist()
        if hi > lo:
            rebuilt[self.index[lo:hi] - sl.start] = self.values[self.offset + lo : self.offset + hi]

    def patch_rows(
        self, rebuilt: np.ndarray, idx: np.ndarray, members: np.ndarray | None = None
    ) -> None:
        """Patch the exception rows among ``idx`` into ``rebuilt``. ``members`` (see
        :meth:`bitmap`) finds them without a binary search of every index."""
        if members is not None:
            hit = ((members[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1).astype(bool)
            if bool(hit.any()):
                pos = np.searchsorted(self.index, idx[hit])
                rebuilt[hit] = take(self.values, pos + self.offset)
            return
        pos = np.minimum(np.searchsorted(self.index, idx), self.index.size - 1)
        hit = self.index[pos] == idx
        if bool(hit.any()):
            rebuilt[hit] = take(self.values, pos[hit] + self.offset)

    def bitmap(self, rows: int) -> np.ndarray:
        """One bit per row of ``rows``, set for the exception rows (``rows / 8`` bytes)."""
        bits = np.zeros(rows, dtype=bool)
        bits[self.index] = True
        return np.packbits(bits, bitorder="little")


#: Row numbers: an index array, or a contiguous slice of rows (``step`` 1, in range).
Index = np.ndarray | slice


def take(rows: Any, idx: Index) -> np.ndarray:
    """Rows ``idx`` of a flat leaf, as a new array; a lazy leaf is read in sorted runs, each
    run once, and a slice of rows as one read."""
    if isinstance(idx, slice):
        values = rows[idx]
        # A mapped file's slice is a view of the file, a constant leaf's a broadcast: the
        # caller gets its own rows, in order, as a gather would give them.
        fresh = isinstance(rows, FlatRows) or getattr(rows, "fresh_slices", False)
        return np.ascontiguousarray(values) if fresh else np.array(values)
    if not isinstance(rows, FlatRows):
        return rows[idx]
    if idx.size == 0:
        return np.empty((0, *rows.shape[1:]), dtype=rows.dtype)
    gathered = rows.gather(idx)
    if gathered is not None:
        return gathered
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    out = np.empty((idx.size, *rows.shape[1:]), dtype=rows.dtype)
    # Runs of nearby rows are read as one slice: fewer, larger reads of the HDF5 chunks.
    breaks = np.flatnonzero(np.diff(sorted_idx) > 64) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), idx.size]
    for a, b in zip(starts, ends, strict=True):
        lo, hi = int(sorted_idx[a]), int(sorted_idx[b - 1]) + 1
        block = rows[lo:hi]
        out[order[a:b]] = block[sorted_idx[a:b] - lo]
    return out


#: Rows up to which random reads find exception rows through a bitmap (at most 32 MB).
BITMAP_ROWS = 1 << 28


class RowParts(NamedTuple):
    """Rebuilt rows and what they were rebuilt from."""

    rebuilt: np.ndarray
    obs: np.ndarray
    stored: np.ndarray | None


class Rebuild:
    """Rebuilds the next observations of one stored pair, by contiguous rows or by index."""

    def __init__(
        self,
        codec: Codec,
        dtype: np.dtype,
        obs: Any,
        delta: Any,
        geometry: Geometry,
        exceptions: Exceptions | None,
    ) -> None:
        self.codec = codec
        self.dtype = dtype
        self.obs = obs
        self.delta = delta
        self.geometry = geometry
        self.exceptions = exceptions
        self._memo: tuple[np.ndarray, np.ndarray] | None = None
        self._bitmap: np.ndarray | bool | None = None

    def rows(self, sl: slice) -> np.ndarray:
        """Rows ``sl`` (contiguous), reading the observations once with a one-row overlap."""
        return self.parts(sl).rebuilt

    def parts(self, sl: slice) -> RowParts:
        """Rows ``sl`` (contiguous) with the observations and the stored rows (of the valid
        rows among them) they were rebuilt from: a check hashes the stored leaf, and
        ``inflate`` writes the observations, from the same reads."""
        valid = self.geometry.valid
        if sl.start >= valid:  # past a replay buffer's len: not data, next = obs
            obs = self.obs[sl]
            return RowParts(obs.copy(), obs, None)
        if sl.stop > valid:
            head, tail = self.parts(slice(sl.start, valid)), self.obs[valid : sl.stop]
            return RowParts(
                np.concatenate([head.rebuilt, tail]), np.concatenate([head.obs, tail]), head.stored
            )
        if self.codec.uses_successor:
            obs, successor = window(self.obs, sl, self.geometry)
        else:
            obs, successor = self.obs[sl], None
        stored = None if self.delta is None else self.delta[sl]
        # The window's successors are a new array, nobody else's: they may be the result.
        rebuilt = decode(self.codec, obs, stored, successor, self.dtype, view=True)
        if self.exceptions is not None:
            self.exceptions.patch_slice(rebuilt, sl)
        return RowParts(rebuilt, obs, stored)

    def _members(self) -> np.ndarray | None:
        """The exception rows as a bitmap, for random access; ``None`` past
        :data:`BITMAP_ROWS` rows (its bytes would then count)."""
        if self._bitmap is None and self.exceptions is not None:
            rows = self.geometry.total
            self._bitmap = self.exceptions.bitmap(rows) if rows <= BITMAP_ROWS else False
        return self._bitmap if isinstance(self._bitmap, np.ndarray) else None

    def observations(self, idx: Index) -> np.ndarray:
        """Rows ``idx`` of the observations. The gather is kept for a second call with the same
        index array: a dataset reads the observations and the next ones of one batch, and
        gathers the rows once. Callers must not change the result in place. A slice of rows
        is not kept: it may be the whole file, and the next observations of a slice are rebuilt
        from a read of their own (:meth:`rows`)."""
        if isinstance(idx, slice):
            return take(self.obs, idx)
        memo = self._memo
        if memo is not None and memo[0] is idx:
            return memo[1]
        rows = take(self.obs, idx)
        self._memo = (idx, rows)
        return rows

    def take(self, idx: Index) -> np.ndarray:
        """Rows ``idx`` (any order, or a slice of rows), one gather per leaf."""
        if isinstance(idx, slice):
            return self.rows(idx)
        g = self.geometry
        obs = self.observations(idx)
        successor = None
        if self.codec.uses_successor:
            # A row without a successor gets its own observation, as in the rule.
            successor = take(self.obs, np.where(g.has_successor(idx), idx + g.step, idx))
        stored = None if self.delta is None else take(self.delta, idx)
        rebuilt = decode(self.codec, obs, stored, successor, self.dtype)
        if rebuilt is obs:
            rebuilt = obs.copy()  # the caller may change what it is given
        if self.exceptions is not None:
            self.exceptions.patch_rows(rebuilt, idx, self._members())
        if g.valid < g.total:
            past = idx >= g.valid
            if bool(past.any()):
                rebuilt[past] = obs[past]
        return rebuilt


@dataclass(frozen=True)
class StoredPair:
    """One stored pair of a compressed source: its record, codec and leaves, checked."""

    record: KeyRecord
    pair: Pair
    codec: Codec
    dtype: np.dtype

    def rebuild(self, source: Source, stream: Stream) -> Rebuild:
        """The pair's :class:`Rebuild`, after checking its leaves and arrays against the record."""
        obs = stream.flat(source.leaves[self.pair.obs_key])
        geometry = stream.geometry(source.leaves[self.pair.obs_key])
        delta = None
        if self.pair.delta_key:
            delta = stream.flat(source.leaves[self.pair.delta_key])
        return Rebuild(
            self.codec, self.dtype, obs, delta, geometry, self.exceptions(source, obs, geometry)
        )

    #: Rows of the shared exception arrays this pair's arrays hold (see :class:`ArrayNames`).
    array_rows: int = 0

    def exceptions(self, source: Source, obs: Any, geometry: Geometry) -> Exceptions | None:
        """The exception rows: the index (8 bytes a row, read after the store checked its size)
        must be increasing and inside the valid rows."""
        r = self.record
        if not r.exception_rows:
            return None
        if source.arrays is None or r.arrays is None:
            raise _damaged(source, r, "exception rows are missing")
        n, at = r.exception_rows, r.arrays.offset
        shared = source.arrays.get(r.arrays.index, INT64, (self.array_rows,))
        index = np.asarray(shared[at : at + n])
        ordered = index.size < 2 or bool((index[1:] > index[:-1]).all())
        if not ordered or int(index[0]) < 0 or int(index[-1]) >= geometry.valid:
            raise _damaged(source, r, "exception row index is not increasing inside the rows")
        values = source.arrays.get(r.arrays.rows, self.dtype, (self.array_rows, *obs.shape[1:]))
        return Exceptions(index, values, at)


def _damaged(source: Source, record: KeyRecord, what: str) -> InputError:
    return InputError(
        what,
        file=source.path,
        key=record.name,
        hint="the compressed dataset is damaged; restore it from a copy",
    )


INT64 = np.dtype(np.int64)


def stored_pairs(source: Source, manifest: Manifest) -> list[StoredPair]:
    """Every stored pair, each checked against the leaves on disk: the observation exists with
    the recorded dtype and enough rows, the stored leaf has the observation's shape and the
    stored dtype. Nothing is allocated from a figure the bytes on disk do not back."""
    # Pairs of one name share their exception arrays: each array holds the rows of all of them.
    array_rows: dict[str, int] = {}
    for r in manifest.keys:
        if r.arrays is not None:
            end = r.arrays.offset + r.exception_rows
            array_rows[r.arrays.index] = max(array_rows.get(r.arrays.index, 0), end)
    out = []
    for r in manifest.keys:
        codec = codec_from_config(r.codec)
        pair = Pair(r.obs_key, r.next_key, r.delta_key or (), r.name)
        obs: Any = source.leaves.get(r.obs_key)
        if not is_data(obs):
            raise _damaged(source, r, f"leaf {key_str(r.obs_key)} named in the metadata is missing")
        dtype = dtype_of(r.source_dtype)  # the manifest admits known dtype names only
        if obs.dtype != dtype or len(obs.shape) < manifest.batch_dims:
            raise _damaged(source, r, f"leaf {key_str(r.obs_key)} does not match the metadata")
        rows = math.prod(obs.shape[: manifest.batch_dims])
        if r.rows > rows:
            raise _damaged(source, r, f"metadata claims {r.rows} rows of {rows}")
        stored = codec.stored_dtype(dtype)
        if (stored is None) != (r.delta_key is None) or (
            stored is not None and r.stored_dtype != dtype_name(stored)
        ):
            raise _damaged(source, r, "codec and stored leaf disagree")
        if r.delta_key is not None:
            delta: Any = source.leaves.get(r.delta_key)
            if not is_data(delta) or tuple(delta.shape) != tuple(obs.shape):
                raise _damaged(
                    source, r, f"stored leaf {key_str(r.delta_key)} is missing or misshapen"
                )
            if delta.dtype != stored:
                raise _damaged(source, r, f"stored leaf {key_str(r.delta_key)} has another dtype")
        total = 0
        if r.arrays is not None:
            if source.arrays is None:
                raise _damaged(source, r, "exception rows are missing")
            total = array_rows[r.arrays.index]
            # Sizes only: the stores check the bytes on disk before anything is read.
            source.arrays.get(r.arrays.index, INT64, (total,))
            features = tuple(obs.shape[manifest.batch_dims :])
            source.arrays.get(r.arrays.rows, dtype, (total, *features))
        out.append(StoredPair(r, pair, codec, dtype, total))
    return out
