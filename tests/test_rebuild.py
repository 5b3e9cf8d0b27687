"""The rebuild rule by index: exception rows found through the bitmap or by binary search."""

from __future__ import annotations

import pytest
import torch

from obsdelta_cli import rebuild as rebuild_module
from obsdelta_cli.codecs import make_codec
from obsdelta_cli.rebuild import Exceptions, Rebuild
from obsdelta_cli.stream import Geometry


def _rule(rows: int, seed: int) -> tuple[Rebuild, torch.Tensor]:
    """An exact rebuild over ``rows`` rows with random exception rows, and the true next rows."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(rows, 3, generator=g)
    truth = torch.cat([obs[1:], obs[-1:]])
    index = torch.randperm(rows, generator=g)[: rows // 7].sort().values
    index = torch.unique(torch.cat([index, torch.tensor([0, rows - 1])]))
    values = torch.randn(index.numel(), 3, generator=g)
    truth[index] = values
    geometry = Geometry.of([rows], time_dim=0, valid_rows=None)
    return Rebuild(
        make_codec("exact"), torch.float32, obs, None, geometry, Exceptions(index, values)
    ), truth


@pytest.mark.parametrize("bitmap_rows", [0, 1 << 28])
@pytest.mark.parametrize("rows", [1, 9, 1000, 4099])
def test_rows_by_index_with_and_without_the_bitmap(
    rows: int, bitmap_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rebuild_module, "BITMAP_ROWS", bitmap_rows)
    rule, truth = _rule(rows, rows)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        idx = torch.randint(rows, (min(256, 3 * rows),), generator=g)
        assert torch.equal(rule.take(idx), truth[idx])
    assert (rule._members() is None) == (rows > bitmap_rows)
    assert torch.equal(rule.rows(slice(0, rows)), truth)
