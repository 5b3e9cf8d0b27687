"""Which rebuilt rows are acceptable, and streaming error statistics over a whole key.

Errors are measured in float64 on the very arrays ``inflate`` produces, over every valid row,
never a sample. The figures do not depend on how rows are chunked: maxima are exact, and the
sum behind the RMSE is taken per row, then per fixed block of rows (chunks hold whole blocks),
and the block sums are added exactly (``math.fsum``).

>>> truth = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]], dtype=np.float32)
>>> s = ErrorStats()
>>> s.update(truth, truth + np.float32([[0.0, 0.0, 0.5], [0, 0, 0]]), exceptions=0, block=1)
>>> s.rows, s.exact_rows, s.max_abs_error, round(s.max_rel_error, 3)
(2, 1, 0.5, 0.25)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .arrays import bits_dtype, is_float


def by_row(a: np.ndarray) -> np.ndarray:
    """``a`` as ``[rows, features]`` (also for no rows, or no feature dimensions)."""
    return a.reshape(a.shape[0], math.prod(a.shape[1:]))


#: Rows at least this wide are reduced row by row; narrower ones (11 floats of a Hopper state)
#: through one matrix product, since numpy loops per row over short rows (~7x slower).
_WIDE_ROW = 256
#: A mask with at most one set element in this many rows (episode ends, where next
#: observations differ from the following observations) is read by the set elements' places
#: alone: a third of the time of the product below at one row in fifty.
_SPARSE = 2


def rows_without(mask: np.ndarray) -> np.ndarray:
    """Per row of a boolean ``[n, width]`` mask: no element set.

    >>> rows_without(np.array([[False, False], [False, True]])).tolist()
    [True, False]
    """
    n, width = mask.shape
    # Usually few elements are set (a chunk's episode ends): the rows of those few.
    found = np.count_nonzero(mask)
    if found <= n // _SPARSE:
        out = np.ones(n, dtype=bool)
        out[np.flatnonzero(mask) // max(1, width)] = False
        return out
    if width >= _WIDE_ROW:
        return ~np.any(mask, axis=1)
    # Counts of set elements, exact in float32 for rows this short.
    counts = mask.astype(np.float32) @ np.ones(width, dtype=np.float32)
    return counts == 0


def bit_equal_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row flag over ``[n, ...]``: every element bit-identical (NaN payloads, signed zeros).

    >>> bit_equal_rows(np.array([[0.0], [1.0]]), np.array([[-0.0], [1.0]])).tolist()
    [False, True]
    """
    if is_float(a.dtype):
        view = bits_dtype(a.dtype)
        a, b = a.view(view), b.view(view)
    rows_a, rows_b = by_row(a), by_row(b)
    word = _word(rows_a, rows_b)
    if word is not None:
        rows_a, rows_b = rows_a.view(word), rows_b.view(word)
    return rows_without(rows_a != rows_b)


#: Unsigned integers by size, widest first: the words rows are compared in.
_WORDS = (np.dtype(np.uint64), np.dtype(np.uint32), np.dtype(np.uint16))


def _word(a: np.ndarray, b: np.ndarray) -> np.dtype | None:
    """The widest unsigned integer that ``a``'s and ``b``'s rows (``[n, k]``, both C-contiguous)
    divide into, wider than their elements; ``None`` if none. Rows are equal bit for bit when
    their words are: a frame of uint8 pixels compared 8 bytes at a time makes an eighth of the
    flags (``bit_equal_rows`` on 168 MB of Pong frames: 0.20 s -> 0.08 s)."""
    if not (a.flags.c_contiguous and b.flags.c_contiguous) or a.dtype != b.dtype:
        return None
    row = a.shape[1] * a.dtype.itemsize
    for word in _WORDS:
        if word.itemsize <= a.dtype.itemsize:
            return None
        if row % word.itemsize == 0:
            return word
    return None


#: Elements per step of the finiteness test of 2-byte floats: the temporary stays in cache.
_FINITE_STEP = 1 << 16


def all_finite(a: np.ndarray) -> bool:
    """Whether every element of a float array is finite.

    float16 and bfloat16 are tested on their bits, a cache-sized step at a time (numpy's
    ``isfinite`` on them is ~8x slower, its ``min`` and ``max`` ~60x): a value is finite unless
    its exponent bits, those of inf, are all set.
    """
    if a.size == 0:
        return True
    if a.dtype.itemsize > 2:
        return bool(np.isfinite(a).all())
    bits = a.reshape(-1).view(np.int16)
    inf = int(np.array(np.inf, dtype=a.dtype).view(np.int16))
    magnitude = np.empty(min(bits.size, _FINITE_STEP), dtype=np.int16)
    for start in range(0, bits.size, _FINITE_STEP):
        part = bits[start : start + _FINITE_STEP]
        out = magnitude[: part.size]
        if np.bitwise_and(part, 0x7FFF, out=out).max() >= inf:
            return False
    return True


def _finite_rows(a: np.ndarray) -> np.ndarray | None:
    """Per-row flag: every element finite; ``None`` when the whole chunk is (the usual case)."""
    if not (is_float(a.dtype) or a.dtype.kind == "c"):
        return None
    if is_float(a.dtype) and all_finite(a):
        return None
    return rows_without(~by_row(np.isfinite(a)))


def column_max(values: np.ndarray) -> np.ndarray:
    """Largest value of each column of a ``[n, width]`` array (``n`` >= 1).

    Reducing over rows of a narrow array is a strided loop; rows are folded ``k`` at a time
    into wide rows first, and the ``k`` partial maxima reduced at the end (max is exact in any
    order).

    >>> column_max(np.arange(10.0).reshape(5, 2)).tolist()
    [8.0, 9.0]
    """
    n, width = values.shape
    k = max(1, 64 // max(1, width))
    full = n - n % k
    parts = []
    if full:
        parts.append(values[:full].reshape(-1, k * width).max(axis=0).reshape(k, width))
    if full < n:
        parts.append(values[full:])
    return np.concatenate(parts).max(axis=0)


def _both(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return b if a is None else a if b is None else a & b


@dataclass
class Verdict:
    """Which rows of a chunk a codec represents acceptably, and why the others fail."""

    ok: np.ndarray
    #: Rows rebuilt bit for bit.
    same: np.ndarray
    #: Rows failing because obs or next obs holds NaN/inf.
    nonfinite: int
    #: Rows with finite source whose stored or rebuilt value is not finite (out of range).
    overflow: int
    #: Rows whose error exceeds the bound.
    over_bound: int


def judge(
    obs: np.ndarray,
    next_obs: np.ndarray,
    stored: np.ndarray | None,
    rebuilt: np.ndarray,
    *,
    bound: float | None,
    exact: bool,
) -> Verdict:
    """Accept a row if it is rebuilt bit for bit, or else if what is stored and rebuilt is finite
    and within ``bound``; with ``exact`` only bit-identical rows pass.

    A non-finite source value always yields a non-finite delta or rebuilt value (or misses the
    bound), so the source itself is only looked at to say why a row failed.
    """
    same = bit_equal_rows(rebuilt, next_obs)
    if exact:
        return Verdict(same, same, 0, 0, int((~same).sum()))
    value_ok = _both(_finite_rows(rebuilt), None if stored is None else _finite_rows(stored))
    ok = np.ones_like(same) if value_ok is None else value_ok.copy()
    over = None
    if bound is not None:
        err = rebuilt.astype(np.float64)
        with np.errstate(all="ignore"):  # inf - inf is NaN, over the bound; overflow is inf
            np.abs(np.subtract(err, next_obs.astype(np.float64, copy=False), out=err), out=err)
        over = ok & ~by_row(err <= bound).all(axis=1)
        ok &= ~over
    failed = ~(same | ok)
    if not bool(failed.any()):
        return Verdict(same | ok, same, 0, 0, 0)
    source_ok = by_row(np.isfinite(obs[failed]) & np.isfinite(next_obs[failed])).all(axis=1)
    nonfinite = int((~source_ok).sum())
    overflow = 0 if value_ok is None else int((~value_ok[failed] & source_ok).sum())
    over_bound = 0 if over is None else int((over[failed] & source_ok).sum())
    return Verdict(same | ok, same, nonfinite, overflow, over_bound)


@dataclass
class ErrorStats:
    """Running error figures for one key; feed it chunk by chunk with :meth:`update`."""

    rows: int = 0
    exact_rows: int = 0
    #: Rows stored in full precision beside the codec's data.
    exception_rows: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    nonfinite_rows: int = 0
    overflow_rows: int = 0
    over_bound_rows: int = 0
    #: Sums of squared errors per block of rows, added exactly at the end.
    _block_sums: list[float] = field(default_factory=list)
    _count: int = 0
    #: Largest absolute error of each feature (flattened), for per-dimension plots.
    feature_max_abs: np.ndarray | None = None

    @property
    def rmse(self) -> float:
        return math.sqrt(math.fsum(self._block_sums) / self._count) if self._count else 0.0

    def merge(self, other: ErrorStats) -> None:
        """Fold in the figures of another part of the same key (another demo, say)."""
        for name in (
            "rows",
            "exact_rows",
            "exception_rows",
            "nonfinite_rows",
            "overflow_rows",
            "over_bound_rows",
            "_count",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self._block_sums.extend(other._block_sums)
        self.max_abs_error = max(self.max_abs_error, other.max_abs_error)
        self.max_rel_error = max(self.max_rel_error, other.max_rel_error)
        self._feature_max(other.feature_max_abs)

    def _add_blocks(self, row_sums: np.ndarray, block: int) -> None:
        n = row_sums.shape[0]
        full = n - n % block
        if full:
            self._block_sums.extend(row_sums[:full].reshape(-1, block).sum(axis=1).tolist())
        if full < n:
            self._block_sums.append(float(row_sums[full:].sum()))

    def _feature_max(self, values: np.ndarray | None) -> None:
        if values is not None:
            old = self.feature_max_abs
            self.feature_max_abs = values if old is None else np.maximum(old, values)

    def count(self, verdict: Verdict) -> None:
        """Add the failure counts of a chunk's verdict."""
        self.nonfinite_rows += verdict.nonfinite
        self.overflow_rows += verdict.overflow
        self.over_bound_rows += verdict.over_bound

    def update(
        self,
        truth: np.ndarray,
        rebuilt: np.ndarray,
        *,
        exceptions: int,
        block: int,
        same: np.ndarray | None = None,
        parts: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Add a chunk of final rows ``[n, ...]`` (exception rows already patched in), a whole
        number of ``block`` rows but for the last; ``same`` flags rows known bit-identical.
        ``parts``: where the chunk is the rows of several parts one after another (short
        demos coded together), ``(rows, block)`` of each, whose blocks are summed apart as if
        each had been added alone."""
        n = truth.shape[0]
        self.rows += n
        self.exception_rows += exceptions
        if same is None:
            same = bit_equal_rows(rebuilt, truth)
        n_same = int(same.sum())
        self.exact_rows += n_same
        self._count += truth.size
        if n_same == n:
            self._feature_max(np.zeros(by_row(truth).shape[1], dtype=np.float64))
            return
        # Rows that differ are finite by construction (see judge), so the figures are finite.
        t, r = (truth, rebuilt) if n_same == 0 else (truth[~same], rebuilt[~same])
        # Exact: a float64 difference of two narrower floats. Never the caller's arrays: both
        # copies are changed in place.
        t64 = t.astype(np.float64, copy=True)
        err = r.astype(np.float64, copy=True)
        with np.errstate(over="ignore"):  # float64 sources far apart: an infinite error
            np.abs(np.subtract(err, t64, out=err), out=err)
        flat = by_row(err)
        features = column_max(flat)
        self._feature_max(features)
        self.max_abs_error = max(self.max_abs_error, float(features.max()))
        # Per row, then per block: each sum sees the same values in the same order whatever
        # the chunking, since a chunk never splits a block.
        differing = np.einsum("ij,ij->i", flat, flat)
        if n_same:
            row_sums = np.zeros(n, dtype=np.float64)
            row_sums[~same] = differing
        else:
            row_sums = differing
        start = 0
        for rows, part_block in parts or [(n, block)]:
            self._add_blocks(row_sums[start : start + rows], part_block)
            start += rows
        # Relative to non-zero originals only: dividing by inf there gives 0.
        base = by_row(np.abs(t64, out=t64))
        base[base == 0] = np.inf
        # Dividing by a subnormal original can overflow: the figure is then the largest float.
        with np.errstate(over="ignore"):
            rel = np.divide(flat, base, out=base)
        largest = min(float(column_max(rel).max()), sys.float_info.max)
        self.max_rel_error = max(self.max_rel_error, largest)
