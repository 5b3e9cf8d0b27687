"""Which rebuilt rows are acceptable, and streaming error statistics over a whole key.

Errors are measured in float64 on the very tensors ``inflate`` produces, over every valid row,
never a sample.

>>> import torch
>>> truth = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
>>> s = ErrorStats()
>>> s.update(truth, truth + torch.tensor([[0.0, 0.0, 0.5], [0, 0, 0]]), exceptions=0)
>>> s.rows, s.exact_rows, s.max_abs_error, round(s.max_rel_error, 3)
(2, 1, 0.5, 0.25)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def bit_equal_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row flag over ``[n, ...]``: every element bit-identical (NaN payloads, signed zeros)."""
    view = _INT_VIEW.get(a.dtype)
    if view is not None:
        a, b = a.view(view), b.view(view)
    return by_row(a == b).all(dim=1)


def _finite_rows(t: torch.Tensor) -> torch.Tensor:
    if not (t.is_floating_point() or t.is_complex()):
        return torch.ones(t.shape[0], dtype=torch.bool)
    return by_row(torch.isfinite(t)).all(dim=1)


@dataclass
class Verdict:
    """Which rows of a chunk a codec represents acceptably, and why the others fail."""

    ok: torch.Tensor
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
    """Accept a row if it is rebuilt bit for bit, or else if everything is finite and within
    ``bound``; with ``exact`` only bit-identical rows pass."""
    same = bit_equal_rows(rebuilt, next_obs)
    if exact:
        return Verdict(same, 0, 0, int((~same).sum()))
    source_ok = _finite_rows(obs) & _finite_rows(next_obs)
    value_ok = _finite_rows(rebuilt)
    if stored is not None:
        value_ok &= _finite_rows(stored)
    ok = source_ok & value_ok
    over = torch.zeros_like(ok)
    if bound is not None:
        err = by_row((rebuilt.double() - next_obs.double()).abs_())
        over = ok & ~(err <= bound).all(dim=1)
        ok &= ~over
    nonfinite = ~same & ~source_ok
    overflow = ~same & source_ok & ~value_ok
    return Verdict(same | ok, int(nonfinite.sum()), int(overflow.sum()), int((over & ~same).sum()))


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
    _sum_sq: float = 0.0
    _count: int = 0
    #: Largest absolute error of each feature (flattened), for per-dimension plots.
    feature_max_abs: torch.Tensor | None = None

    @property
    def rmse(self) -> float:
        return math.sqrt(self._sum_sq / self._count) if self._count else 0.0

    def merge(self, other: ErrorStats) -> None:
        """Fold in the figures of another part of the same key (another demo, say)."""
        for name in (
            "rows",
            "exact_rows",
            "exception_rows",
            "nonfinite_rows",
            "overflow_rows",
            "over_bound_rows",
            "_sum_sq",
            "_count",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
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

    def update(self, truth: torch.Tensor, rebuilt: torch.Tensor, *, exceptions: int) -> None:
        """Add a chunk of final rows ``[n, ...]`` (exception rows already patched in)."""
        n = truth.shape[0]
        self.rows += n
        self.exception_rows += exceptions
        same = bit_equal_rows(rebuilt, truth)
        self.exact_rows += int(same.sum())
        self._count += truth.numel()
        if bool(same.all()):
            self._feature_max(torch.zeros(by_row(truth).shape[1], dtype=torch.float64))
            return
        # Rows that differ are finite by construction (see judge), so the figures are finite.
        t = truth[~same].double()
        err = (rebuilt[~same].double() - t).abs_()
        self.max_abs_error = max(self.max_abs_error, float(err.max()))
        self._feature_max(by_row(err).amax(dim=0))
        self._sum_sq += float(err.square().sum())
        scale = t.abs()
        nonzero = scale > 0
        if bool(nonzero.any()):
            rel = float((err[nonzero] / scale[nonzero]).max())
            self.max_rel_error = max(self.max_rel_error, rel)
