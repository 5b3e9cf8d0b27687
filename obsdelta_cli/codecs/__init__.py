"""Codec registry: one line per codec.

>>> import numpy as np
>>> list(CODECS)
['exact', 'fp16', 'bf16', 'fp32', 'q16', 'q8']
>>> make_codec("fp16").stored_dtype(np.dtype(np.float32))
dtype('float16')
>>> codec_from_config({"id": "q8", "step": 0.002}).step
0.002
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError, UsageError
from .base import Codec
from .cast import BFloat16Delta, Float16Delta, Float32Delta
from .exact import ExactNext
from .quant import Int8Delta, Int16Delta

CODECS: dict[str, type[Codec]] = {
    ExactNext.id: ExactNext,
    Float16Delta.id: Float16Delta,
    BFloat16Delta.id: BFloat16Delta,
    Float32Delta.id: Float32Delta,
    Int16Delta.id: Int16Delta,
    Int8Delta.id: Int8Delta,
}

#: Not a codec: ``--codec auto`` picks, per key, the smallest codec that meets the bound
#: (without a bound: the smallest lossless one, or none where nothing beats the raw bytes).
AUTO = "auto"
#: Lossless unless asked otherwise.
DEFAULT_CODEC = AUTO


def make_codec(codec_id: str, max_abs_error: float | None = None) -> Codec:
    """The codec ``codec_id`` (as given to ``--codec``) set up for an error bound."""
    try:
        cls = CODECS[codec_id]
    except KeyError:
        raise UsageError(
            f"unknown codec {codec_id!r}", hint=f"choose one of {', '.join(CODECS)}, {AUTO}"
        ) from None
    return cls.create(max_abs_error)


def codec_from_config(config: dict[str, Any]) -> Codec:
    """Rebuild a codec from the config stored in a compressed file."""
    codec_id = config.get("id")
    if codec_id not in CODECS:
        raise InputError(
            f"stored codec {codec_id!r} is unknown to this obsdelta",
            hint=f"known codecs: {', '.join(CODECS)}; upgrade obsdelta",
        )
    try:
        return CODECS[codec_id].from_config(config)
    except (KeyError, TypeError, ValueError, UsageError):
        raise InputError(f"stored config of codec {codec_id!r} is invalid: {config}") from None


__all__ = ["AUTO", "CODECS", "DEFAULT_CODEC", "Codec", "codec_from_config", "make_codec"]
