"""Leaves the pipeline can stream: torch tensors, or lazy datasets read and written by rows.

Containers that map their data (tensordict memmaps, ``.pt`` files) hand the pipeline plain
tensors. Containers that must be read explicitly (HDF5) hand it a :class:`LazyLeaf`, which reads
and writes slices along the first dimension only. :func:`as_rows` gives both the same face: a
leaf flattened over its batch dimensions, ``[rows, *features]``, indexable by row slices.

>>> import torch
>>> as_rows(torch.zeros(2, 3, 4), batch_dims=2).shape
torch.Size([6, 4])
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch


class LazyLeaf(ABC):
    """A dataset read and written by slices of its first dimension."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @abstractmethod
    def read(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the first dimension, as a tensor."""

    @abstractmethod
    def write(self, start: int, value: torch.Tensor) -> None:
        """Store ``value`` at rows ``start:start + len(value)`` of the first dimension."""


class FlatRows:
    """A :class:`LazyLeaf` seen as ``[rows, *features]`` over its first ``batch_dims`` dims."""

    def __init__(self, leaf: LazyLeaf, batch_dims: int) -> None:
        self.leaf = leaf
        self.per_first = math.prod(leaf.shape[1:batch_dims])
        self.features = tuple(leaf.shape[batch_dims:])
        self.shape = torch.Size((math.prod(leaf.shape[:batch_dims]), *self.features))
        self.dtype = leaf.dtype

    def _span(self, key: slice) -> tuple[int, int]:
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise ValueError("only contiguous row slices are supported")
        return start, max(start, stop)

    def __getitem__(self, key: slice) -> torch.Tensor:
        start, stop = self._span(key)
        first, last = start // self.per_first, -(-stop // self.per_first)
        block = self.leaf.read(first, last).reshape(-1, *self.features)
        offset = first * self.per_first
        return block[start - offset : stop - offset]

    def __setitem__(self, key: slice, value: Any) -> None:
        start, stop = self._span(key)
        if start % self.per_first or (stop % self.per_first and stop != self.shape[0]):
            raise ValueError("writes must cover whole rows of the first dimension")
        rows = torch.as_tensor(value, dtype=self.dtype).expand(stop - start, *self.features)
        self.leaf.write(start // self.per_first, rows.reshape(-1, *self.leaf.shape[1:]))


Rows = torch.Tensor | FlatRows


def as_rows(leaf: torch.Tensor | LazyLeaf, batch_dims: int) -> Rows:
    """``leaf`` as ``[rows, *features]``: a free view for tensors, a wrapper for lazy leaves."""
    if isinstance(leaf, LazyLeaf):
        return FlatRows(leaf, batch_dims)
    return leaf.reshape(-1, *leaf.shape[batch_dims:])


def nbytes(leaf: torch.Tensor | LazyLeaf) -> int:
    """Bytes of a leaf's values."""
    return math.prod(leaf.shape) * leaf.dtype.itemsize


def is_data(leaf: object) -> bool:
    """Whether ``leaf`` holds array data (not a tensordict ``NonTensorData`` or similar)."""
    return isinstance(leaf, torch.Tensor | LazyLeaf)
