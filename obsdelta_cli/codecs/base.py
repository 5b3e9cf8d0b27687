"""The codec interface: how ``next_obs`` is stored given ``obs`` (and ``obs[t+1]``) and rebuilt.

A codec is a small, self-describing unit. Its JSON config is stored beside the data, so a
compressed file can always be decoded with :func:`obsdelta_cli.codecs.codec_from_config`.

A codec works on chunks of rows ``[n, *features]`` and treats each row on its own: it gets the
row's observation, its next observation and, for codecs that use it, its *successor* (the
observation one step later along time, ``obs[t+1]``; for a row with no successor, its own
observation). It returns the per-row stored array (or ``None`` if it stores nothing per row),
and ``decode`` rebuilds the next observation in the *restore dtype* (the source dtype).

Rows a codec cannot represent well enough are not its concern: the pipeline compares every
decoded row with the original and stores the rows that fail as exceptions, in full precision.
The error obsdelta reports is measured on exactly what ``decode`` returns, so the report and
``inflate`` can never disagree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np

from ..arrays import is_float


class Codec(ABC):
    """Turns chunks of ``(obs, next_obs)`` rows into a stored array and back."""

    id: ClassVar[str]
    #: One line for ``--help`` and the README table.
    summary: ClassVar[str] = ""
    #: Whether :meth:`decode` reads the successor row ``obs[t+1]``.
    uses_successor: ClassVar[bool] = False
    #: Rows it keeps are bit-identical; everything else is an exception row.
    lossless: ClassVar[bool] = False
    #: :meth:`decode` gives the successor rows as they are (in the restored dtype): compress,
    #: which only compares the rebuild, then compares those rows instead of a copy.
    rebuilds_as_successor: ClassVar[bool] = False

    @classmethod
    def create(cls, max_abs_error: float | None) -> Self:
        """The codec with parameters suited to an error bound (``None``: no bound)."""
        return cls()

    def get_config(self) -> dict[str, Any]:
        """JSON-serialisable parameters; ``codec_from_config(c.get_config())`` rebuilds ``c``."""
        return {"id": self.id}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Self:
        """Rebuild a codec from :meth:`get_config` output."""
        return cls()

    def supports(self, dtype: np.dtype) -> bool:
        """Whether this codec can encode observations of ``dtype``."""
        return is_float(dtype)

    @abstractmethod
    def stored_dtype(self, source: np.dtype) -> np.dtype | None:
        """The dtype of the per-row stored leaf, or ``None`` if the codec stores no leaf."""

    @abstractmethod
    def encode(
        self, obs: np.ndarray, next_obs: np.ndarray, successor: np.ndarray | None
    ) -> np.ndarray | None:
        """The stored rows for a chunk (``None`` when :meth:`stored_dtype` is ``None``)."""

    @abstractmethod
    def decode(
        self,
        obs: np.ndarray,
        stored: np.ndarray | None,
        successor: np.ndarray | None,
        restore_dtype: np.dtype,
    ) -> np.ndarray:
        """Rebuild ``next_obs`` for a chunk, in ``restore_dtype``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.get_config()})"
