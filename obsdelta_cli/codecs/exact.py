"""The lossless ``exact`` codec: ``next_obs[t]`` is ``obs[t+1]`` except at episode boundaries.

Inside an episode the next observation is, bit for bit, the following row's observation, in
almost every dataset. This codec stores nothing per row: ``decode`` returns the successor row.
Every row where that is not bit-identical (episode ends, resets, shuffled rows) becomes an
exception row, stored in full source precision by the pipeline, so the result is always
bit-identical, for floats and integers (uint8 pixels) alike. On shuffled data nearly every row is
an exception: the output is then the input plus an index of 8 bytes per row.

>>> import numpy as np
>>> obs = np.array([[0.0], [1.0], [2.0]], dtype=np.float32)
>>> successor = np.array([[1.0], [2.0], [2.0]], dtype=np.float32)
>>> ExactNext().decode(obs, None, successor, np.dtype(np.float32)).flatten().tolist()
[1.0, 2.0, 2.0]
"""

from __future__ import annotations

import numpy as np

from .base import Codec


class ExactNext(Codec):
    id = "exact"
    summary = "lossless: stores only rows where next_obs[t] is not obs[t+1] (episode ends)"
    uses_successor = True
    lossless = True
    rebuilds_as_successor = True

    def supports(self, dtype: np.dtype) -> bool:
        return dtype != np.bool_

    def stored_dtype(self, source: np.dtype) -> None:
        return None

    def encode(self, obs: np.ndarray, next_obs: np.ndarray, successor: np.ndarray | None) -> None:
        return None

    def decode(
        self,
        obs: np.ndarray,
        stored: np.ndarray | None,
        successor: np.ndarray | None,
        restore_dtype: np.dtype,
    ) -> np.ndarray:
        assert successor is not None
        return successor.astype(restore_dtype, copy=True)
