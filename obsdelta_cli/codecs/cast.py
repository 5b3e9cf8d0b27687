"""Cast codecs: ``delta = next_obs - obs`` cast once to a narrower float dtype.

These store exactly what TorchRL's ``NextObservationDelta`` stores (``("next", "delta", k)`` of a
float dtype) and rebuild it the same way, ``obs.to(dtype) + delta.to(dtype)``, so a file written
with them can be sampled by TorchRL's own transform.

Notes
-----
The subtraction runs in the wider of the source and stored dtypes (for a float32 source and
``fp16`` that is float32, as in TorchRL). A delta beyond the stored dtype's range becomes ``inf``
in the cast; the pipeline turns such rows into exception rows (or refuses the key with
``--no-exceptions``) and never writes them.

>>> import torch
>>> codec = Float16Delta()
>>> obs = torch.tensor([[1.0, 2.0]]); nxt = torch.tensor([[1.5, 1.0]])
>>> codec.decode(obs, codec.encode(obs, nxt, None), None, torch.float32)
tensor([[1.5000, 1.0000]])
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Codec


class CastDelta(Codec):
    """Base of the cast codecs; subclasses only name their id and dtype."""

    dtype: ClassVar[torch.dtype]

    def stored_dtype(self, source: torch.dtype) -> torch.dtype:
        return self.dtype

    def encode(
        self, obs: torch.Tensor, next_obs: torch.Tensor, successor: torch.Tensor | None
    ) -> torch.Tensor:
        work = torch.promote_types(obs.dtype, self.dtype)
        return (next_obs.to(work) - obs.to(work)).to(self.dtype)

    def decode(
        self,
        obs: torch.Tensor,
        stored: torch.Tensor | None,
        successor: torch.Tensor | None,
        restore_dtype: torch.dtype,
    ) -> torch.Tensor:
        assert stored is not None
        # The same expression TorchRL's NextObservationDelta.forward evaluates.
        return obs.to(restore_dtype) + stored.to(restore_dtype)


class Float16Delta(CastDelta):
    id = "fp16"
    dtype = torch.float16
    summary = "float16 delta (TorchRL's default): 11 significant bits, |delta| <= 65504"


class BFloat16Delta(CastDelta):
    id = "bf16"
    dtype = torch.bfloat16
    summary = "bfloat16 delta: 8 significant bits, float32's range"


class Float32Delta(CastDelta):
    id = "fp32"
    dtype = torch.float32
    summary = "float32 delta: for float64 sources or deltas beyond float16's range"
