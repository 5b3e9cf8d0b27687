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

Both directions run in torch (imported when a chunk is first coded): its float16 and bfloat16
casts are about 10x faster than numpy's, and they give TorchRL's bits, NaN payloads included.

>>> import numpy as np
>>> codec = Float16Delta()
>>> obs = np.array([[1.0, 2.0]], dtype=np.float32); nxt = np.array([[1.5, 1.0]], dtype=np.float32)
>>> codec.decode(obs, codec.encode(obs, nxt, None), None, np.dtype(np.float32)).tolist()
[[1.5, 1.0]]
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..arrays import dtype_of, from_torch, to_torch, torch_dtype, torch_module
from .base import Codec


class CastDelta(Codec):
    """Base of the cast codecs; subclasses only name their id and dtype."""

    #: The stored dtype's name (bfloat16's dtype is made only when it is asked for).
    stored: ClassVar[str]

    def stored_dtype(self, source: np.dtype) -> np.dtype:
        return dtype_of(self.stored)

    def encode(
        self, obs: np.ndarray, next_obs: np.ndarray, successor: np.ndarray | None
    ) -> np.ndarray:
        torch = torch_module()  # its float casts: ~10x numpy's speed (see the module docstring)

        dtype = torch_dtype(dtype_of(self.stored))
        work = torch.promote_types(torch_dtype(obs.dtype), dtype)
        return from_torch((to_torch(next_obs).to(work) - to_torch(obs).to(work)).to(dtype))

    def decode(
        self,
        obs: np.ndarray,
        stored: np.ndarray | None,
        successor: np.ndarray | None,
        restore_dtype: np.dtype,
    ) -> np.ndarray:
        assert stored is not None
        restore = torch_dtype(restore_dtype)  # torch's casts, as in encode
        # The same expression TorchRL's NextObservationDelta.forward evaluates.
        return from_torch(to_torch(obs).to(restore) + to_torch(stored).to(restore))


class Float16Delta(CastDelta):
    id = "fp16"
    stored = "float16"
    summary = "float16 delta (TorchRL's default): 11 significant bits, |delta| <= 65504"


class BFloat16Delta(CastDelta):
    id = "bf16"
    stored = "bfloat16"
    summary = "bfloat16 delta: 8 significant bits, float32's range"


class Float32Delta(CastDelta):
    id = "fp32"
    stored = "float32"
    summary = "float32 delta: for float64 sources or deltas beyond float16's range"
