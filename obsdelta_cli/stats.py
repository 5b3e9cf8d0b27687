"""Streaming error statistics of a reconstruction against the original next observations.

Errors are measured in float64 on the very tensors ``inflate`` produces, over every valid row,
never a sample.

>>> import torch
>>> s = ErrorStats()
>>> obs = torch.zeros(2, 3); nxt = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
>>> s.update(obs, nxt, stored=nxt, recon=nxt + torch.tensor([[0.0, 0.0, 0.5], [0, 0, 0]]))
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


def _rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return t.reshape(rows, -1)


def bit_equal_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row flag: every element bit-identical (NaN payloads and signed zeros included)."""
    view = _INT_VIEW.get(a.dtype)
    if view is not None:
        a, b = a.view(view), b.view(view)
    return (a == b).all(dim=1)


@dataclass
class ErrorStats:
    """Running error figures for one key; feed it chunk by chunk with :meth:`update`."""

    rows: int = 0
    exact_rows: int = 0
    #: Rows whose source (obs or next obs) holds NaN or inf.
    nonfinite_rows: int = 0
    #: Rows with finite source whose stored delta is not finite (out of the stored dtype's range).
    overflow_rows: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    _sum_sq: float = 0.0
    _count: int = 0

    @property
    def rmse(self) -> float:
        return math.sqrt(self._sum_sq / self._count) if self._count else 0.0

    @property
    def bad_rows(self) -> int:
        return self.nonfinite_rows + self.overflow_rows

    def update(
        self,
        obs: torch.Tensor,
        next_obs: torch.Tensor,
        stored: torch.Tensor,
        recon: torch.Tensor,
        batch_dims: int = 1,
    ) -> None:
        """Add a chunk: ``obs``/``next_obs`` as read, ``stored`` as written, ``recon`` as inflated.

        The first ``batch_dims`` dimensions index rows (transitions); the rest are features.
        """
        n = math.prod(obs.shape[:batch_dims])
        obs, next_obs = _rows(obs, n), _rows(next_obs, n)
        stored, recon = _rows(stored, n), _rows(recon, n)
        self.rows += n
        self.exact_rows += int(bit_equal_rows(recon, next_obs).sum())
        ok = torch.isfinite(obs).all(1) & torch.isfinite(next_obs).all(1)
        self.nonfinite_rows += int((~ok).sum())
        if stored.is_floating_point():
            finite_delta = torch.isfinite(stored).all(1)
            self.overflow_rows += int((ok & ~finite_delta).sum())
            ok &= finite_delta
        if not bool(ok.all()):
            next_obs, recon = next_obs[ok], recon[ok]
        if next_obs.numel() == 0:
            return
        truth = next_obs.double()
        err = (recon.double() - truth).abs_()
        self.max_abs_error = max(self.max_abs_error, float(err.max()))
        self._sum_sq += float(err.square().sum())
        self._count += err.numel()
        scale = truth.abs()  # not in place: for float64, truth *is* the caller's tensor
        nonzero = scale > 0
        if bool(nonzero.any()):
            self.max_rel_error = max(
                self.max_rel_error, float((err[nonzero] / scale[nonzero]).max())
            )
