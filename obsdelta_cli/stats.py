"""Which rebuilt rows are acceptable, and streaming error statistics over a whole key.

Errors are measured in float64 on the very tensors ``inflate`` produces, over every valid row,
never a sample. The figures do not depend on how rows are chunked: maxima are exact, and the
sum behind the RMSE is taken per row, then per fixed block of rows (chunks hold whole blocks),
and the block sums are added exactly (``math.fsum``).

>>> import torch
>>> truth = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
>>> s = ErrorStats()
>>> s.update(truth, truth + torch.tensor([[0.0, 0.0, 0.5], [0, 0, 0]]), exceptions=0, block=1)
>>> s.rows, s.exact_rows, s.max_abs_error, round(s.max_rel_error, 3)
(2, 1, 0.5, 0.25)
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

_INT_VIEW = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def by_row(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, features]`` (also for no rows, or no feature dimensions)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


#: Rows at least this wide are reduced row by row; narrower ones (11 floats of a Hopper state)
#: through one matrix product, since numpy and torch loop per row over short rows (~7x slower).
_WIDE_ROW = 256


def rows_without(mask: torch.Tensor) -> torch.Tensor:
    """Per row of a boolean ``[n, width]`` mask: no element set.

    >>> rows_without(torch.tensor([[False, False], [False, True]])).tolist()
    [True, False]
    """
    n, width = mask.shape
    if width >= _WIDE_ROW or n == 0:
        return ~mask.any(dim=1)
    # Counts of set elements, exact in float32 for rows this short.
    counts = mask.view(torch.uint8).to(torch.float32) @ torch.ones(width)
    return counts == 0


def bit_equal_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row flag over ``[n, ...]``: every element bit-identical (NaN payloads, signed zeros).

    >>> bit_equal_rows(torch.tensor([[0.0], [1.0]]), torch.tensor([[-0.0], [1.0]])).tolist()
    [False, True]
    """
    view = _INT_VIEW.get(a.dtype)
    if view is not None:
        a, b = a.view(view), b.view(view)
    a, b = by_row(a), by_row(b)
    try:
        differ = torch.from_numpy(a.numpy() != b.numpy())  # numpy's compare is vectorised
    except TypeError:  # a dtype numpy lacks
        differ = a != b
    return rows_without(differ)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of a float tensor is finite, in one pass without a mask: NaN
    propagates through torch's min and max, and an infinity is one of them."""
    if t.numel() == 0:
        return True
    if t.dtype in (torch.float32, torch.float64):
        return bool(np.isfinite(t.numpy()).all())
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def _finite_rows(t: torch.Tensor) -> torch.Tensor | None:
    """Per-row flag: every element finite; ``None`` when the whole chunk is (the usual case)."""
    if not (t.is_floating_point() or t.is_complex()):
        return None
    if t.is_floating_point() and all_finite(t):
        return None
    return rows_without(~by_row(torch.isfinite(t)))


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


def _both(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a & b


@dataclass
class Verdict:
    """Which rows of a chunk a codec represents acceptably, and why the others fail."""

    ok: torch.Tensor
    #: Rows rebuilt bit for bit.
    same: torch.Tensor
    #: Rows failing because obs or next obs holds NaN/inf.
    nonfinite: int
    #: Rows with finite source whose stored or rebuilt value is not finite (out of range).
    overflow: int
    #: Rows whose error exceeds the bound.
    over_bound: int


def judge(
    obs: torch.Tensor,
    next_obs: torch.Tensor,
    stored: torch.Tensor | None,
    rebuilt: torch.Tensor,
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
    ok = torch.ones_like(same) if value_ok is None else value_ok.clone()
    over = None
    if bound is not None:
        err = (rebuilt.double() - next_obs.double()).abs_()
        over = ok & ~by_row(err <= bound).all(dim=1)
        ok &= ~over
    failed = ~(same | ok)
    if not bool(failed.any()):
        return Verdict(same | ok, same, 0, 0, 0)
    source_ok = by_row(torch.isfinite(obs[failed]) & torch.isfinite(next_obs[failed])).all(1)
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
    feature_max_abs: torch.Tensor | None = None

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

    def _feature_max(self, values: torch.Tensor | None) -> None:
        if values is not None:
            old = self.feature_max_abs
            self.feature_max_abs = values if old is None else torch.maximum(old, values)

    def count(self, verdict: Verdict) -> None:
        """Add the failure counts of a chunk's verdict."""
        self.nonfinite_rows += verdict.nonfinite
        self.overflow_rows += verdict.overflow
        self.over_bound_rows += verdict.over_bound

    def update(
        self,
        truth: torch.Tensor,
        rebuilt: torch.Tensor,
        *,
        exceptions: int,
        block: int,
        same: torch.Tensor | None = None,
    ) -> None:
        """Add a chunk of final rows ``[n, ...]`` (exception rows already patched in), a whole
        number of ``block`` rows but for the last; ``same`` flags rows known bit-identical."""
        n = truth.shape[0]
        self.rows += n
        self.exception_rows += exceptions
        if same is None:
            same = bit_equal_rows(rebuilt, truth)
        n_same = int(same.sum())
        self.exact_rows += n_same
        self._count += truth.numel()
        if n_same == n:
            self._feature_max(torch.zeros(by_row(truth).shape[1], dtype=torch.float64))
            return
        # Rows that differ are finite by construction (see judge), so the figures are finite.
        t, r = (truth, rebuilt) if n_same == 0 else (truth[~same], rebuilt[~same])
        # Exact: a float64 difference of two narrower floats. Never the caller's tensors: both
        # copies are changed in place.
        t64 = t.to(torch.float64, copy=True)
        err = r.to(torch.float64, copy=True).sub_(t64).abs_()
        flat = by_row(err).numpy()
        features = column_max(flat)
        self._feature_max(torch.from_numpy(features))
        self.max_abs_error = max(self.max_abs_error, float(features.max()))
        # Per row, then per block: each sum sees the same values in the same order whatever
        # the chunking, since a chunk never splits a block.
        differing = np.einsum("ij,ij->i", flat, flat)
        if n_same:
            row_sums = np.zeros(n, dtype=np.float64)
            row_sums[(~same).numpy()] = differing
        else:
            row_sums = differing
        full = n - n % block
        if full:
            self._block_sums.extend(row_sums[:full].reshape(-1, block).sum(axis=1).tolist())
        if full < n:
            self._block_sums.append(float(row_sums[full:].sum()))
        # Relative to non-zero originals only: dividing by inf there gives 0.
        base = by_row(t64.abs_()).numpy()
        base[base == 0] = np.inf
        # Dividing by a subnormal original can overflow: the figure is then the largest float.
        with np.errstate(over="ignore"):
            rel = np.divide(flat, base, out=base)
        largest = min(float(column_max(rel).max()), sys.float_info.max)
        self.max_rel_error = max(self.max_rel_error, largest)
