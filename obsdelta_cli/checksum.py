"""Streaming CRC-32 checksums of tensors, in row order, independent of how rows are chunked.

CRC-32 detects accidental corruption (bit rot, truncation, a bad copy); it is not a defence
against deliberate tampering.

>>> import torch
>>> a, b = Crc(), Crc()
>>> a.update(torch.arange(6)); b.update(torch.arange(3)); b.update(torch.arange(3, 6))
>>> a.hex == b.hex
True
"""

from __future__ import annotations

import zlib

import torch


class Crc:
    """A running CRC-32 over the raw bytes of the tensors fed to it."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, t: torch.Tensor) -> None:
        if t.numel():
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
            self.value = zlib.crc32(raw.data, self.value)

    @property
    def hex(self) -> str:
        return f"{self.value:08x}"
