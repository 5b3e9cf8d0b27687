"""The rebuild rule by index: exception rows found through the bitmap or by binary search."""

from __future__ import annotations

import numpy as np
import pytest

from obsdelta_cli import rebuild as rebuild_module
from obsdelta_cli.codecs import make_codec
from obsdelta_cli.rebuild import Exceptions, Rebuild
from obsdelta_cli.stream import Geometry


def _rule(rows: int, seed: int) -> tuple[Rebuild, np.ndarray]:
    """An exact rebuild over ``rows`` rows with random exception rows, and the true next rows."""
    g = np.random.default_rng(seed)
    obs = g.standard_normal((rows, 3), dtype=np.float32)
    truth = np.concatenate([obs[1:], obs[-1:]])
    index = np.sort(g.permutation(rows)[: rows // 7])
    index = np.unique(np.concatenate([index, [0, rows - 1]])).astype(np.int64)
    values = g.standard_normal((index.size, 3), dtype=np.float32)
    truth[index] = values
    geometry = Geometry.of([rows], time_dim=0, valid_rows=None)
    return Rebuild(
        make_codec("exact"), np.dtype(np.float32), obs, None, geometry, Exceptions(index, values)
    ), truth


@pytest.mark.parametrize("bitmap_rows", [0, 1 << 28])
@pytest.mark.parametrize("rows", [1, 9, 1000, 4099])
def test_rows_by_index_with_and_without_the_bitmap(
    rows: int, bitmap_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rebuild_module, "BITMAP_ROWS", bitmap_rows)
    rule, truth = _rule(rows, rows)
    g = np.random.default_rng(1)
    for _ in range(20):
        idx = g.integers(rows, size=min(256, 3 * rows))
        assert np.array_equal(rule.take(idx), truth[idx])
    assert (rule._members() is None) == (rows > bitmap_rows)
    assert np.array_equal(rule.rows(slice(0, rows)), truth)
