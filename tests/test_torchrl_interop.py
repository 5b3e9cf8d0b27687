"""A compressed TED memmap is usable by TorchRL itself.

Its replay buffer plus its own ``NextObservationDelta`` transform rebuild the next observations
within the error obsdelta reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensordict import TensorDict, TensorDictBase

from obsdelta_cli import compress

rl_data = pytest.importorskip("torchrl.data")
rl_transforms = pytest.importorskip("torchrl.envs.transforms")
NextObservationDelta = getattr(rl_transforms, "NextObservationDelta", None)
pytestmark = pytest.mark.skipif(
    NextObservationDelta is None, reason="torchrl has no NextObservationDelta (needs >= 0.13.1)"
)


def _sample_all(td: TensorDictBase, in_keys: list[tuple[str, ...]], tmp: Path) -> TensorDictBase:
    rb = rl_data.TensorDictReplayBuffer(
        storage=rl_data.LazyMemmapStorage(td.shape[0], scratch_dir=tmp),
        sampler=rl_data.SamplerWithoutReplacement(),
        batch_size=td.shape[0],
    )
    rb.append_transform(NextObservationDelta(in_keys=in_keys))
    rb.extend(td)
    return rb.sample()


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
def test_torchrl_rebuilds_within_reported_error(
    codec: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    original = hopper.clone()
    original["agent", "obs"] = hopper["observation"][:, :4] * 3
    original["next", "agent", "obs"] = hopper["next", "observation"][:, :4] * 3
    original.memmap(tmp_path / "in")
    result = compress(tmp_path / "in", tmp_path / "small", codec=codec)
    reported = {k.key: k.max_abs_error for k in result.keys}

    compressed = TensorDict.load_memmap(tmp_path / "small")
    keys = [("observation",), ("agent", "obs")]
    batch = _sample_all(compressed, keys, tmp_path / "scratch")
    order = batch["index"]
    assert sorted(order.tolist()) == list(range(original.shape[0]))
    for key in keys:
        rebuilt = batch["next", *key]
        truth = original["next", *key][order]
        assert rebuilt.dtype == truth.dtype
        err = float((rebuilt.double() - truth.double()).abs().max())
        assert 0 < err <= reported["/".join(("next", *key))]
        # The transform leaves only its empty delta node behind; obsdelta's inflate leaves none.
        assert ("next", "delta", *key) not in batch.keys(True, True)
