"""A compressed TED memmap is usable by TorchRL itself.

Its replay buffer plus its own ``NextObservationDelta`` transform rebuild the next observations
within the error obsdelta reported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from obsdelta_cli import compress, inflate

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
    inflate(tmp_path / "small", tmp_path / "back")
    inflated = TensorDict.load_memmap(tmp_path / "back")
    for key in keys:
        rebuilt = batch["next", *key]
        truth = original["next", *key][order]
        assert rebuilt.dtype == truth.dtype
        err = float((rebuilt.double() - truth.double()).abs().max())
        assert 0 < err <= reported["/".join(("next", *key))]
        # TorchRL's own transform and obsdelta's inflate agree bit for bit.
        assert torch.equal(rebuilt, inflated["next", *key][order])
        # The transform leaves only its empty delta node behind; obsdelta's inflate leaves none.
        assert ("next", "delta", *key) not in batch.keys(True, True)


def test_d4rl_reader_reads_the_inflated_file_unchanged(tmp_path: Path) -> None:
    """What d4rl's get_dataset does: every dataset of the file, read with plain h5py."""
    import h5py

    from .conftest import SAMPLE

    def get_dataset(path: Path) -> dict[str, object]:
        out: dict[str, object] = {}
        with h5py.File(path, "r") as f:
            f.visititems(
                lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset) else None
            )
        return out

    original = SAMPLE / "hopper_d4rl.hdf5"
    compress(original, tmp_path / "s.hdf5", codec="exact")
    inflate(tmp_path / "s.hdf5", tmp_path / "back.hdf5")
    want, got = get_dataset(original), get_dataset(tmp_path / "back.hdf5")
    assert list(got) == list(want)
    for name, value in want.items():
        assert type(got[name]) is type(value)
        assert getattr(got[name], "dtype", None) == getattr(value, "dtype", None)
        assert np.asarray(got[name]).tobytes() == np.asarray(value).tobytes(), name


def test_torchrl_rebuilds_a_compressed_ted_hdf5(tmp_path: Path, hopper: TensorDictBase) -> None:
    """PersistentTensorDict.from_h5 opens a TED-HDF5 compressed with fp16, and TorchRL's
    transform rebuilds ("next", obs) within the reported error (at exception rows, which only
    obsdelta rebuilds, the stored delta is zero)."""
    from tensordict import PersistentTensorDict

    from .writers import write_ted_hdf5

    td = hopper.clone()
    td["next", "observation"][5] = 1e6  # beyond float16: an exception row
    src = write_ted_hdf5(td, tmp_path / "in")
    result = compress(src, tmp_path / "small.h5", codec="fp16")
    (key,) = result.keys
    opened = PersistentTensorDict.from_h5(tmp_path / "small.h5", batch_size=[td.shape[0]])
    local = opened.to_tensordict().exclude("obsdelta")
    opened.close()
    batch = _sample_all(local, [("observation",)], tmp_path / "scratch")
    index = batch["index"]
    err = (batch["next", "observation"] - td["next", "observation"][index]).abs().amax(-1)
    assert key.exception_rows == 1
    assert 0 < float(err[index != 5].max()) <= key.max_abs_error
