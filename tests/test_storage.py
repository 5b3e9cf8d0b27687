"""ObsdeltaStorage: TorchRL replay buffers sample straight from a compressed file."""

from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import ObsdeltaError, compress, inflate, open_dataset
from obsdelta_cli.errors import UsageError

from .conformance import bits_equal
from .conftest import SAMPLE, tree_hash
from .test_dataset import READABLE
from .writers import WRITERS

rl_data = pytest.importorskip("torchrl.data")

from obsdelta_cli.storage import FLAGS, ObsdeltaStorage  # noqa: E402  (after the skip)

SLICE = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, TensorDictBase]]:
    """Each compressed file (exact codec) with every row of its original, as open_dataset
    serves the original: the TED sample as it is, the D4RL sample with TED names, and its [N]
    rewards and flags as TorchRL's [N, 1]."""
    tmp = tmp_path_factory.mktemp("storage")
    out = {}
    for name, src in (("ted", SAMPLE / "hopper_ted"), ("d4rl", SAMPLE / "hopper_d4rl.hdf5")):
        small = tmp / f"small{src.suffix}"
        compress(src, small, codec="exact")
        original = open_dataset(src)
        rows = original[torch.arange(len(original))]
        for key in FLAGS:
            if rows[key].dim() == 1:
                rows[key] = rows[key].unsqueeze(-1)
        out[name] = (small, rows)
        original.close()
    return out


def _buffer(storage: ObsdeltaStorage, sampler: object, batch: int) -> object:
    return rl_data.TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=batch)


#: What SliceSampler writes over in its batches: its truncation mark, and done | that mark.
MARKED = (("next", "truncated"), ("next", "done"))


@pytest.mark.parametrize("name", ["ted", "d4rl"])
def test_random_batches_are_the_original_rows(name: str, files: dict) -> None:
    path, original = files[name]
    rb = _buffer(ObsdeltaStorage(path), rl_data.RandomSampler(), 128)
    for _ in range(3):
        batch = rb.sample()
        bits_equal(batch.exclude("index"), original[batch["index"]])  # every leaf, bit for bit
        assert batch["next", "reward"].shape == (128, 1)


@pytest.mark.parametrize("name", ["ted", "d4rl"])
def test_slices_stay_inside_episodes(name: str, files: dict) -> None:
    path, original = files[name]
    storage = ObsdeltaStorage(path)
    rb = _buffer(storage, rl_data.SliceSampler(slice_len=SLICE), 8 * SLICE)
    ends = original["next", "done"].reshape(-1)
    for _ in range(5):
        batch = rb.sample()
        index = batch["index"].reshape(-1, SLICE)
        assert bool((index.diff(dim=1) == 1).all())  # consecutive rows
        # No episode ends before a slice's last row: a slice never runs into the next episode.
        assert not bool(ends[index[:, :-1]].any())
        # The sampler's truncation mark is on each slice's last row only.
        truncated = batch["next", "truncated"].reshape(-1, SLICE)
        assert bool(truncated[:, -1].all())
        rows = original[index.reshape(-1)]
        bits_equal(batch.exclude("index", *MARKED), rows.exclude(*MARKED))
        assert torch.equal(batch["next", "done"], rows["next", "done"] | truncated.reshape(-1, 1))
    if name == "ted":  # the sampler found the episodes by the collector's trajectory ids
        ids = original["collector", "traj_ids"][index]
        assert bool((ids == ids[:, :1]).all())
    assert torch.equal(storage.ends, ends | (torch.arange(len(original)) == len(original) - 1))


def test_episode_ends_are_read_once(files: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first batch, a slice batch reads only its own rows: the done flags the
    sampler looks at every time come from memory."""
    path, _ = files["d4rl"]
    storage = ObsdeltaStorage(path)
    rb = _buffer(storage, rl_data.SliceSampler(slice_len=SLICE), 4 * SLICE)
    rb.sample()
    reads: list[int] = []
    read = storage._data.read

    def counted(idx: torch.Tensor, keys: object = None) -> TensorDictBase:
        reads.append(idx.numel())
        return read(idx, keys)

    monkeypatch.setattr(storage._data, "read", counted)
    for _ in range(3):
        rb.sample()
    assert reads == [4 * SLICE] * 3
    column = storage[:]["next", "done"]  # the lazy view reads one leaf, from memory now
    assert reads == [4 * SLICE] * 3 and column.shape == (len(storage), 1)


def test_robomimic_demos_end_episodes() -> None:
    """robomimic's dones mark success only: a failed demo ends without one. The storage's
    ends mark every demo's last row, for SliceSampler(ends=...)."""
    path = SAMPLE / "hopper_robomimic.hdf5"
    with h5py.File(path) as f:
        demos = sorted(f["data"], key=lambda d: int(d.rpartition("_")[2]))
        lengths = [int(f["data"][d].attrs["num_samples"]) for d in demos]
    demo_of = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    storage = ObsdeltaStorage(path)
    last_rows = torch.tensor(lengths).cumsum(0) - 1
    assert bool(storage.ends[last_rows].all())
    sampler = rl_data.SliceSampler(slice_len=SLICE, ends=storage.ends, cache_values=True)
    batch = _buffer(storage, sampler, 16 * SLICE).sample()
    demo = demo_of[batch["index"].reshape(-1, SLICE)]
    assert bool((demo == demo[:, :1]).all())


@pytest.mark.parametrize("fmt", READABLE)
def test_every_format(fmt: str, tmp_path: Path, hopper: TensorDictBase) -> None:
    """Whatever the layout, a buffer's batch is open_dataset's rows (flags as [N, 1])."""
    src = WRITERS[fmt](hopper[:400], tmp_path / "in")
    small = tmp_path / f"small{src.suffix}"
    compress(src, small, codec="exact")
    data = open_dataset(src)
    storage = ObsdeltaStorage(small)
    assert len(storage) == len(data)
    batch = _buffer(storage, rl_data.RandomSampler(), 64).sample()
    rows = data[batch["index"]]
    for key in FLAGS:
        if key in rows.keys(True) and rows[key].dim() == 1:
            rows[key] = rows[key].unsqueeze(-1)
    # A replay-buffer dump keeps its own "index" leaf; the buffer writes the sampled index there.
    bits_equal(batch.exclude("index"), rows.exclude("index"))
    storage.close()


def test_writing_is_refused(files: dict) -> None:
    path, _ = files["ted"]
    before = tree_hash(path)
    storage = ObsdeltaStorage(path)
    rb = _buffer(storage, rl_data.RandomSampler(), 4)
    batch = rb.sample()
    for write in (
        lambda: rb.extend(batch),
        lambda: rb.add(batch[0]),
        lambda: rb.__setitem__(0, batch[0]),
        lambda: rb.empty(),
    ):
        with pytest.raises(UsageError, match="read-only") as err:
            write()
        assert isinstance(err.value, ObsdeltaError)
    assert len(storage) == 3000 and tree_hash(path) == before


def test_lossy_rows_within_the_reported_bound(tmp_path: Path, hopper: TensorDictBase) -> None:
    hopper.memmap(tmp_path / "in")
    result = compress(tmp_path / "in", tmp_path / "small", codec="fp16")
    (bound,) = [k.max_abs_error for k in result.keys if k.key == "next/observation"]
    inflate(tmp_path / "small", tmp_path / "back")
    back = open_dataset(tmp_path / "back")
    rb = _buffer(ObsdeltaStorage(tmp_path / "small"), rl_data.SamplerWithoutReplacement(), 1000)
    for _ in range(3):  # every row once
        batch = rb.sample()
        index = batch["index"]
        bits_equal(batch.exclude("index"), back[index])  # what inflate gives, bit for bit
        err = (batch["next", "observation"] - hopper["next", "observation"][index]).abs().max()
        assert 0 < float(err) <= bound
        bits_equal(
            batch.exclude("index", ("next", "observation")),
            hopper[index].exclude(("next", "observation")),
        )


def test_checkpoints_and_pickles(files: dict, tmp_path: Path) -> None:
    path, original = files["d4rl"]
    rb = _buffer(ObsdeltaStorage(path), rl_data.RandomSampler(), 64)
    rb.dumps(tmp_path / "ckpt")  # the storage's part names the file; its rows stay there
    other = ObsdeltaStorage(SAMPLE / "hopper_robomimic.hdf5")
    restored = _buffer(other, rl_data.RandomSampler(), 64)
    restored.loads(tmp_path / "ckpt")
    assert other.path == path and len(other) == len(original)
    batch = restored.sample()
    bits_equal(batch.exclude("index"), original[batch["index"]])
    copy = pickle.loads(pickle.dumps(other))  # what a spawned process receives
    bits_equal(copy.get(torch.tensor([[3, 1], [4, 1]])), original[torch.tensor([[3, 1], [4, 1]])])
    assert copy.get(7)["observation"].shape == (11,)
    mask = torch.arange(len(copy)) % 1000 == 3
    assert torch.equal(copy.get(mask)["action"], original["action"][mask])


def test_rows_view(files: dict) -> None:
    path, original = files["ted"]
    storage = ObsdeltaStorage(path)
    rows = storage[:]
    assert len(rows) == 3000 and ("collector", "traj_ids") in rows.keys(True, True)
    assert torch.equal(rows["next", "done"], original["next", "done"])
    assert torch.equal(rows["next", "observation"], original["next", "observation"])
    bits_equal(rows["next"], original["next"])
    assert rows.get("missing", None) is None
    with pytest.raises(KeyError):
        rows["missing"]
    bits_equal(rows[10:20], original[10:20])
    bits_equal(rows.to_tensordict(), original)
    picked = storage[(torch.tensor([5, 2]),)]
    assert torch.equal(picked["action"], original["action"][[5, 2]])


def test_without_torchrl_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import obsdelta_cli.storage as module

    monkeypatch.setattr(module, "TensorStorage", object)
    with pytest.raises(ImportError, match=r"obsdelta\[torchrl\]"):
        ObsdeltaStorage(SAMPLE / "hopper_d4rl.hdf5")


def test_readme_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from .test_readme import _python_blocks

    (block,) = [b for b in _python_blocks() if "ObsdeltaStorage" in b]
    compress(SAMPLE / "hopper_ted", tmp_path / "hopper_small")  # as the main command does
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), scope)
    batch = scope["batch"]
    assert isinstance(batch, TensorDictBase) and batch.shape == (8, 32)


@pytest.mark.parametrize(
    ("capacity", "written"),
    [
        (2000, [(0, 1000), (1000, 2500)]),  # wrapped: rows 2000-2499 overwrote 0-499
        (2950, [(0, 2950)]),  # full, its last episode unfinished (as TorchRL's D4RL caches)
        (3000, [(0, 2950)]),  # spare capacity
    ],
)
@pytest.mark.parametrize("by", ["end_key", "traj_key"])
def test_slices_are_torchrl_s_own(
    tmp_path: Path, hopper: TensorDictBase, capacity: int, written: list, by: str
) -> None:
    """On a replay-buffer dump, compressed or not, SliceSampler draws the same rows from
    ObsdeltaStorage as from TorchRL's own storage loaded from the dump, for the same seed:
    episodes that wrap around a full buffer's end included."""
    rb = rl_data.TensorDictReplayBuffer(storage=rl_data.LazyMemmapStorage(capacity))
    for start, stop in written:
        rb.extend(hopper[start:stop])
    rb.dumps(tmp_path / "dump")
    compress(tmp_path / "dump", tmp_path / "small")
    theirs = rl_data.TensorDictReplayBuffer(storage=rl_data.LazyMemmapStorage(capacity))
    theirs.loads(tmp_path / "dump")
    key = {"end_key": ("next", "done"), "traj_key": ("collector", "traj_ids")}[by]
    drawn = []
    for storage in (theirs._storage, ObsdeltaStorage(tmp_path / "dump"),
                    ObsdeltaStorage(tmp_path / "small")):  # fmt: skip
        torch.manual_seed(0)
        idx, _ = rl_data.SliceSampler(slice_len=32, **{by: key}).sample(storage, 8192)
        drawn.append(idx if isinstance(idx, torch.Tensor) else torch.stack(list(idx), -1))
    assert torch.equal(drawn[0], drawn[1]) and torch.equal(drawn[0], drawn[2])
    if capacity == 2000:  # the draw does cross the end of the storage, as TorchRL's does
        steps = drawn[0].reshape(-1, 32)
        assert ((steps[:, 1:] - steps[:, :-1]) < 0).any()
