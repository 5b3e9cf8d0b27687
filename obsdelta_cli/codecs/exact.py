"""The lossless ``exact`` codec: ``next_obs[t]`` is ``obs[t+1]`` except at episode boundaries.

Inside an episode the next observation is, bit for bit, the following row's observation, in
almost every dataset. This codec stores nothing per row: ``decode`` returns the successor row.
Every row where that is not bit-identical (episode ends, resets, shuffled rows) becomes an
exception row, stored in full source precision by the pipeline, so the result is always
bit-identical, for floats and integers (uint8 pixels) alike. On shuffled data nearly every row is
an exception: the output is then the input plus an index of 8 bytes per row.

>>> import torch
>>> obs = torch.tensor([[0.0], [1.0], [2.0]])
>>> ExactNext().decode(obs, None, torch.tensor([[1.0], [2.0], [2.0]]), torch.float32).flatten()
tensor([1., 2., 2.])
"""

from __future__ import annotations

import torch

from .base import Codec


class ExactNext(Codec):
    id = "exact"
    summary = "lossless: stores only rows where next_obs[t] is not obs[t+1] (episode ends)"
    uses_successor = True
    lossless = True

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype != torch.bool

    def stored_dtype(self, source: torch.dtype) -> None:
        return None

    def encode(
        self, obs: torch.Tensor, next_obs: torch.Tensor, successor: torch.Tensor | None
    ) -> None:
        return None

    def decode(
        self,
        obs: torch.Tensor,
        stored: torch.Tensor | None,
        successor: torch.Tensor | None,
        restore_dtype: torch.dtype,
    ) -> torch.Tensor:
        assert successor is not None
        return successor.to(restore_dtype, copy=True)
