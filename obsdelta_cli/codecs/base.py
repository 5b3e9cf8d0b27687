"""The codec interface: how a delta is made from ``(obs, next_obs)`` and undone.

A codec is a small, self-describing unit. Its JSON config is stored beside the data, so a
compressed file can always be decoded with :func:`obsdelta_cli.codecs.codec_from_config`.

Reconstruction is defined once, here, for every codec: ``next = decode(obs, stored)`` computed in
the *restore dtype* (the source dtype recorded at compress time). The error obsdelta reports is
measured on exactly this computation, so the report and ``inflate`` can never disagree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch


class Codec(ABC):
    """Turns a chunk of ``(obs, next_obs)`` rows into a stored delta and back.

    Subclasses set :attr:`id` and implement :meth:`stored_dtype`, :meth:`encode` and
    :meth:`decode`. Chunks are row slices along the first dimension, so a codec must treat
    every row independently.
    """

    id: ClassVar[str]
    #: One line for ``--help`` and the README table.
    summary: ClassVar[str] = ""

    def get_config(self) -> dict[str, Any]:
        """JSON-serialisable parameters; ``codec_from_config(c.get_config())`` rebuilds ``c``."""
        return {"id": self.id}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Codec:
        """Rebuild a codec from :meth:`get_config` output."""
        return cls()

    def supports(self, dtype: torch.dtype) -> bool:
        """Whether this codec can encode observations of ``dtype``."""
        return dtype.is_floating_point

    @abstractmethod
    def stored_dtype(self, source: torch.dtype) -> torch.dtype:
        """The dtype of the stored delta leaf for a source of dtype ``source``."""

    @abstractmethod
    def encode(self, obs: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
        """Return the stored delta for a chunk of rows."""

    @abstractmethod
    def decode(
        self, obs: torch.Tensor, stored: torch.Tensor, restore_dtype: torch.dtype
    ) -> torch.Tensor:
        """Rebuild ``next_obs`` (in ``restore_dtype``) from ``obs`` and the stored delta."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.get_config()})"
