"""open_dataset: lazy TED transitions from every format, compressed or plain, for training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDictBase
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    get_worker_info,
)

from obsdelta_cli import collate, compress, inflate, open_dataset
from obsdelta_cli.formats import FORMATS

from .conformance import bits_equal, check_layout, everything
from .writers import WRITERS

# Packed files are outputs only (compress --pack); tests/test_pack.py trains from them.
READABLE = [f for f in FORMATS if FORMATS[f].nothing_to_do is None and f in WRITERS]


@pytest.mark.parametrize("codec", ["exact", "fp16"])
@pytest.mark.parametrize("fmt", READABLE)
def test_compressed_reads_like_inflated(
    fmt: str, codec: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    check_layout(WRITERS[fmt](hopper[:700], tmp_path / "in"), tmp_path, codec)


def test_indexing(tmp_path: Path, hopper: TensorDictBase) -> None:
    hopper.memmap(tmp_path / "in")
    compress(tmp_path / "in", tmp_path / "small", codec="exact")
    data = open_dataset(tmp_path / "small")
    assert len(data) == 3000
    one = data[7]
    assert one.batch_size == torch.Size([]) and torch.equal(
        one["next", "observation"], hopper["next", "observation"][7]
    )
    assert torch.equal(data[-1]["next", "observation"], hopper["next", "observation"][-1])
    window = data[10:20]
    assert window.batch_size == torch.Size([10])
    assert torch.equal(window["next", "observation"], hopper["next", "observation"][10:20])
    picks = torch.tensor([2999, 0, 1234, 1234])
    assert torch.equal(data[picks]["next", "observation"], hopper["next", "observation"][picks])
    with pytest.raises(IndexError):
        data[3000]


@pytest.mark.parametrize("codec", ["exact", "fp16"])
def test_a_batch_is_its_own_rows_whatever_the_caller_does_with_index_and_result(
    tmp_path: Path, hopper: TensorDictBase, codec: str
) -> None:
    """The observations of a batch are gathered once for both keys; an index tensor changed in
    place between reads, or a batch changed by the caller, never leaks into the next read."""
    hopper.memmap(tmp_path / "in")
    compress(tmp_path / "in", tmp_path / "small", codec=codec)
    inflate(tmp_path / "small", tmp_path / "back")
    data = open_dataset(tmp_path / "small")
    truth = open_dataset(tmp_path / "back")  # what inflate gives, read plainly
    idx = torch.tensor([5, 999, 1000, 2999, 17])
    for step in range(3):
        batch = data.read(idx)
        assert torch.equal(batch["observation"], hopper["observation"][idx])
        bits_equal(batch, truth.read(idx.clone()))
        batch["observation"].zero_()  # the caller's to change
        batch["next", "observation"].fill_(7.0)
        idx.add_(step + 1).remainder_(3000)  # the same tensor, other rows


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader(tmp_path: Path, hopper: TensorDictBase, workers: int) -> None:
    hopper.memmap(tmp_path / "in")
    compress(tmp_path / "in", tmp_path / "small", codec="exact")
    data = open_dataset(tmp_path / "small")
    # Whole batches per read (__getitems__), shuffled, in worker processes or not.
    loader = DataLoader(data, batch_size=256, shuffle=True, collate_fn=collate, num_workers=workers)
    seen = torch.zeros(len(data), dtype=torch.bool)
    for batch in loader:
        assert batch.batch_size[0] <= 256
        rows = batch["next", "observation"]
        # Each row is some transition of the rollout, rebuilt bit for bit.
        match = (rows[:, None] == hopper["next", "observation"][None]).all(-1)
        assert bool(match.any(1).all())
        seen |= match.any(0)
    assert bool(seen.all())
    # A sampler of whole batches works too, and so do single items stacked by collate.
    sampler = BatchSampler(RandomSampler(data), batch_size=100, drop_last=False)
    assert sum(
        b.batch_size[0]
        for b in DataLoader(data, sampler=sampler, batch_size=None, collate_fn=collate)
    ) == len(data)
    first = collate([data[i] for i in range(32)])
    assert torch.equal(first["next", "observation"], hopper["next", "observation"][:32])


def _collate_in_worker(batch: TensorDictBase) -> TensorDictBase:
    info = get_worker_info()
    # A forked worker reads through file handles it opened itself, never the parent's.
    assert info is None or info.dataset._pid == os.getpid()
    return collate(batch)


@pytest.mark.parametrize(
    ("fmt", "context"),
    [("ted-memmap", "fork"), ("d4rl-hdf5", "fork"), ("d4rl-hdf5", "spawn")],
)
def test_dataloader_workers_serve_the_same_rows(
    fmt: str, context: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    src = WRITERS[fmt](hopper[:700], tmp_path / "in")
    small = tmp_path / f"small{src.suffix}"
    compress(src, small, codec="exact")
    data = open_dataset(small)
    data[torch.arange(len(data))]  # the parent has read the file (HDF5 state) before forking
    loaded = []
    for workers in (0, 2):
        batches = BatchSampler(SequentialSampler(data), batch_size=64, drop_last=False)
        loader = DataLoader(
            data,
            sampler=batches,
            batch_size=None,
            collate_fn=_collate_in_worker,
            num_workers=workers,
            multiprocessing_context=context if workers else None,
        )
        loaded.append(torch.cat(list(loader)))
    bits_equal(loaded[1], loaded[0])
    bits_equal(loaded[0], everything(src))


def test_d4rl_and_robomimic_get_ted_names() -> None:
    sample = Path(__file__).parents[1] / "sample_data"
    d4rl = open_dataset(sample / "hopper_d4rl.hdf5")[0:4]
    assert {"observation", "action"} <= set(d4rl.keys())
    assert {"observation", "reward", "terminated", "truncated", "done"} <= set(d4rl["next"].keys())
    robo = open_dataset(sample / "hopper_robomimic.hdf5")
    assert len(robo) == 463  # demos concatenated
    batch = robo[0:463]
    assert batch["camera_image"].dtype == torch.uint8
    assert {"camera_image", "qpos", "qvel", "reward", "done"} <= set(batch["next"].keys())


def test_minari_transitions(tmp_path: Path, hopper: TensorDictBase) -> None:
    """Minari stores T+1 observations per episode: one row per transition, and the next
    observation is observations[t + 1] of the same episode."""
    src = WRITERS["minari-hdf5"](hopper, tmp_path / "main_data")
    rows = everything(src)
    assert rows.shape[0] == hopper.shape[0]
    for key in (("observation",), ("next", "observation"), ("action",), ("next", "reward")):
        assert torch.equal(rows[key].reshape(hopper[key].shape), hopper[key]), key
    ends = hopper["next", "done"].reshape(-1)
    assert torch.equal(rows["next", "done"], ends)


def test_rows_come_from_the_transitions_not_from_metadata(
    tmp_path: Path, hopper: TensorDictBase
) -> None:
    """D4RL v2 files keep the behaviour policy under metadata/: a 3x256 weight matrix is not
    three transitions."""
    import h5py

    src = WRITERS["d4rl-hdf5"](hopper, tmp_path / "in")
    with h5py.File(src, "a") as f:
        f["metadata/policy/last_fc/weight"] = torch.randn(3, 256).numpy()
        f["metadata/policy/fc0/weight"] = torch.randn(256, 11).numpy()
        f["infos/qpos"] = torch.randn(hopper.shape[0], 6).numpy()
    for path in (src, tmp_path / "small.hdf5"):
        if path != src:
            compress(src, path)
        data = open_dataset(path)
        assert len(data) == hopper.shape[0]
        batch = data[torch.arange(len(data))]
        assert ("metadata", "policy", "last_fc", "weight") not in batch.keys(True, True)
        assert batch["infos", "qpos"].shape == (hopper.shape[0], 6)
        data.close()
