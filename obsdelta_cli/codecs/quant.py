"""Quantised codecs: the delta as an integer multiple of a fixed step, sized by the error bound.

``q = round((next_obs - obs) / step)`` is stored as int8 (``q8``) or int16 (``q16``) and rebuilt
as ``obs + q * step`` in the source dtype. With ``--max-abs-error E`` the step is ``1.9 * E``:
the rounding of the delta then costs at most ``0.95 * E``, leaving room for the float rounding of
the sum. Rows whose delta needs more than the integer range, or whose rebuilt value still misses
``E``, become exception rows stored in full precision, so ``E`` holds on every row.

Notes
-----
Only meaningful with an error bound: ``--codec q8`` without ``--max-abs-error`` is refused.

>>> import torch
>>> codec = Int8Delta.create(0.01)
>>> obs = torch.zeros(1, 3); nxt = torch.tensor([[0.5, -0.2, 0.013]])
>>> rebuilt = codec.decode(obs, codec.encode(obs, nxt, None), None, torch.float32)
>>> bool(((rebuilt - nxt).abs() <= 0.01).all())
True
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import torch

from ..errors import UsageError
from .base import Codec

#: Fraction of the error bound given to quantisation; the rest absorbs float rounding.
STEP_PER_BOUND = 1.9


class QuantDelta(Codec):
    """Base of the quantised codecs; subclasses name their id and integer dtype."""

    dtype: ClassVar[torch.dtype]

    def __init__(self, step: float) -> None:
        if not step > 0:
            raise UsageError(f"quantisation step must be positive, got {step}")
        self.step = float(step)

    @classmethod
    def create(cls, max_abs_error: float | None) -> Self:
        if not max_abs_error:
            raise UsageError(
                f"codec {cls.id} needs a positive --max-abs-error",
                hint=f"e.g. --codec {cls.id} --max-abs-error 1e-3, or --codec auto",
            )
        return cls(STEP_PER_BOUND * max_abs_error)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.id, "step": self.step}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        return cls(float(config["step"]))

    def stored_dtype(self, source: torch.dtype) -> torch.dtype:
        return self.dtype

    def encode(
        self, obs: torch.Tensor, next_obs: torch.Tensor, successor: torch.Tensor | None
    ) -> torch.Tensor:
        work = torch.promote_types(obs.dtype, torch.float32)
        q = torch.round((next_obs.to(work) - obs.to(work)) / self.step)
        limit = torch.iinfo(self.dtype).max
        # Out-of-range and NaN rows decode wrongly and become exceptions; keep the cast defined.
        return torch.nan_to_num(q, nan=0.0).clamp_(-limit, limit).to(self.dtype)

    def decode(
        self,
        obs: torch.Tensor,
        stored: torch.Tensor | None,
        successor: torch.Tensor | None,
        restore_dtype: torch.dtype,
    ) -> torch.Tensor:
        assert stored is not None
        work = torch.promote_types(restore_dtype, torch.float32)
        return (obs.to(work) + stored.to(work) * self.step).to(restore_dtype)


class Int8Delta(QuantDelta):
    id = "q8"
    dtype = torch.int8
    summary = "int8 multiples of 1.9*E (needs --max-abs-error E): 1 byte per value"


class Int16Delta(QuantDelta):
    id = "q16"
    dtype = torch.int16
    summary = "int16 multiples of 1.9*E (needs --max-abs-error E): 2 bytes per value"
