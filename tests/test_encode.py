"""Measuring the codecs on a key's pairs: short pairs coded together give each pair's figures."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from obsdelta_cli.commands import encode
from obsdelta_cli.inputs import open_input, stream_for
from obsdelta_cli.selection import KeyGroup, candidates, pairs_of
from obsdelta_cli.stats import ErrorStats

from .realistic import write_robomimic_real

FIGURES = (
    "rows",
    "exact_rows",
    "exception_rows",
    "max_abs_error",
    "max_rel_error",
    "nonfinite_rows",
    "overflow_rows",
    "over_bound_rows",
    "rmse",
)


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A robomimic low-dim file of 40 demos of 20-40 steps, but one of 700 (several chunks of
    the stream below) and one whose next observations hold a NaN and a value out of float16's
    range."""
    pytest.importorskip("gymnasium")  # the demos are real Hopper-v5 rollouts
    path = write_robomimic_real(
        tmp_path_factory.mktemp("encode") / "demos.hdf5", demos=40, image=0, cameras=False
    )
    with h5py.File(path, "r+") as f:
        for name in f["data/demo_3/obs"]:
            long = np.concatenate([f[f"data/demo_3/obs/{name}"][:]] * 20)[:701]
            for group, rows in (("obs", long[:-1]), ("next_obs", long[1:])):
                del f[f"data/demo_3/{group}/{name}"]
                f[f"data/demo_3/{group}/{name}"] = rows
        nxt = f["data/demo_5/next_obs"]
        name = sorted(nxt)[0]
        values = nxt[name][:]
        values[2, 0], values[4, 0] = np.nan, 1e6
        nxt[name][...] = values
    return path


@pytest.mark.parametrize("bound", [None, 1e-3])
def test_pairs_measured_together_give_the_figures_of_each_measured_apart(
    demos: Path, bound: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt, source = open_input(demos)
    try:
        stream = stream_for(source, -1, 0.004)  # the 700-row demo is read in several chunks
        pairs = pairs_of(fmt, source, None, lambda d: True)
        groups = KeyGroup.group(source, pairs)
        assert len(groups) >= 2 and all(len(g.pairs) == 40 for g in groups)
        for group in groups:
            codecs = candidates(group.dtype, bound)
            assert len(codecs) >= (5 if bound else 4)  # the lossy ones, quantised with a bound
            together = encode.measure_pairs(stream, source, group.pairs, codecs, bound)
            monkeypatch.setattr(encode, "BATCH_BYTES", 0)  # each pair coded on its own
            apart = encode.measure_pairs(stream, source, group.pairs, codecs, bound)
            monkeypatch.undo()
            one_by_one = [ErrorStats() for _ in codecs]
            for pair in group.pairs:
                alone = encode.measure_pairs(stream, source, [pair], codecs, bound)
                for total, s in zip(one_by_one, alone, strict=True):
                    total.merge(s)
            for a, b, c in zip(together, apart, one_by_one, strict=True):
                for name in FIGURES:
                    assert getattr(a, name) == getattr(b, name) == getattr(c, name), name
                assert np.array_equal(a.feature_max_abs, b.feature_max_abs)
                assert np.array_equal(a.feature_max_abs, c.feature_max_abs)
            assert together[0].rows == sum(source.leaves[p.obs_key].shape[0] for p in group.pairs)
        failing = [s for g in groups for s in encode.measure_pairs(stream, source, g.pairs,
                   candidates(g.dtype, bound), bound)]  # fmt: skip
        assert any(s.nonfinite_rows for s in failing)
        assert any(s.exception_rows > s.nonfinite_rows for s in failing)
    finally:
        fmt.close(source)
