"""Quantised codecs: the delta as an integer multiple of a fixed step, sized by the error bound.

``q = round((next_obs - obs) / step)`` is stored as int8 (``q8``) or int16 (``q16``) and rebuilt
as ``obs + q * step`` in the source dtype. With ``--max-abs-error E`` the step is ``1.9 * E``:
the rounding of the delta then costs at most ``0.95 * E``, leaving room for the float rounding of
the sum. Rows whose delta needs more than the integer range, or whose rebuilt value still misses
``E``, become exception rows stored in full precision, so ``E`` holds on every row.

Notes
-----
Only meaningful with an error bound: ``--codec q8`` without ``--max-abs-error`` is refused.

>>> import numpy as np
>>> codec = Int8Delta.create(0.01)
>>> obs = np.zeros((1, 3), dtype=np.float32); nxt = np.array([[0.5, -0.2, 0.013]], dtype=np.float32)
>>> rebuilt = codec.decode(obs, codec.encode(obs, nxt, None), None, np.dtype(np.float32))
>>> bool((np.abs(rebuilt - nxt) <= 0.01).all())
True
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import numpy as np

from ..arrays import from_torch, to_torch, torch_dtype, torch_module
from ..errors import UsageError
from .base import Codec

#: Fraction of the error bound given to quantisation; the rest absorbs float rounding.
STEP_PER_BOUND = 1.9


def _work(dtype: np.dtype) -> np.dtype:
    """The dtype the arithmetic runs in: float32, or float64 for a float64 source."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


class QuantDelta(Codec):
    """Base of the quantised codecs; subclasses name their id and integer dtype."""

    dtype: ClassVar[np.dtype]

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

    def stored_dtype(self, source: np.dtype) -> np.dtype:
        return self.dtype

    def encode(
        self, obs: np.ndarray, next_obs: np.ndarray, successor: np.ndarray | None
    ) -> np.ndarray:
        work = _work(obs.dtype)
        q = next_obs.astype(work)
        with np.errstate(all="ignore"):  # non-finite rows are expected: they become exceptions
            np.subtract(q, obs.astype(work, copy=False), out=q)
            np.divide(q, work.type(self.step), out=q)
        np.rint(q, out=q)  # half to even
        limit = np.iinfo(self.dtype).max
        # Out-of-range and NaN rows decode wrongly and become exceptions; keep the cast defined.
        np.clip(q, -limit, limit, out=q)
        q[np.isnan(q)] = 0
        return q.astype(self.dtype)

    def decode(
        self,
        obs: np.ndarray,
        stored: np.ndarray | None,
        successor: np.ndarray | None,
        restore_dtype: np.dtype,
    ) -> np.ndarray:
        assert stored is not None
        work = _work(restore_dtype)
        if restore_dtype.itemsize < work.itemsize:
            # float16 and bfloat16 sources: torch's narrowing casts keep other NaN bits than
            # numpy's (bits decide which rows are exact), and its float16 cast is ~5x faster.
            torch = torch_module()
            step = to_torch(stored).to(torch.float32) * self.step
            rebuilt = (to_torch(obs).to(torch.float32) + step).to(torch_dtype(restore_dtype))
            return from_torch(rebuilt)
        out = stored.astype(work)
        with np.errstate(all="ignore"):  # overflow to inf makes an exception row, as in torch
            np.multiply(out, work.type(self.step), out=out)
            return np.add(obs.astype(work, copy=False), out, out=out)


class Int8Delta(QuantDelta):
    id = "q8"
    dtype = np.dtype(np.int8)
    summary = "int8 multiples of 1.9*E (needs --max-abs-error E): 1 byte per value"


class Int16Delta(QuantDelta):
    id = "q16"
    dtype = np.dtype(np.int16)
    summary = "int16 multiples of 1.9*E (needs --max-abs-error E): 2 bytes per value"
