"""Codec registry: one line per codec.

>>> import torch
>>> sorted(CODECS)
['bf16', 'fp16', 'fp32']
>>> get_codec("fp16").stored_dtype(torch.float32)
torch.float16
>>> codec_from_config({"id": "bf16"}).id
'bf16'
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError, UsageError
from .base import Codec
from .cast import BFloat16Delta, Float16Delta, Float32Delta

CODECS: dict[str, type[Codec]] = {
    Float16Delta.id: Float16Delta,
    BFloat16Delta.id: BFloat16Delta,
    Float32Delta.id: Float32Delta,
}

DEFAULT_CODEC = Float16Delta.id


def get_codec(codec_id: str) -> Codec:
    """Return a codec with default parameters by its id (``--codec``)."""
    try:
        return CODECS[codec_id]()
    except KeyError:
        raise UsageError(
            f"unknown codec {codec_id!r}", hint=f"choose one of {', '.join(CODECS)}"
        ) from None


def codec_from_config(config: dict[str, Any]) -> Codec:
    """Rebuild a codec from the config stored in a compressed file."""
    codec_id = config.get("id")
    if codec_id not in CODECS:
        raise InputError(
            f"stored codec {codec_id!r} is unknown to this obsdelta",
            hint=f"known codecs: {', '.join(CODECS)}; upgrade obsdelta",
        )
    return CODECS[codec_id].from_config(config)


__all__ = ["CODECS", "DEFAULT_CODEC", "Codec", "codec_from_config", "get_codec"]
