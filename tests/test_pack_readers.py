"""Packed files read by other libraries: every dataset that keeps its original name reads, with
plain h5py and hdf5plugin, as the original's values (frames included), and robomimic's and
Minari's own loaders give what they give on the original."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from tensordict import TensorDictBase

from obsdelta_cli import compress
from obsdelta_cli.commands.pack import packable
from obsdelta_cli.formats import detect, key_str
from obsdelta_cli.formats.hdf5 import is_hdf5

from . import realistic as R
from .conftest import ROOT, load_sample, marked_h5py_only
from .writers import WRITERS

#: Rollouts every packable format is written from: MuJoCo floats, Atari frames (uint8), and
#: frames that drift a step at a time (whose frame deltas compress best).
ROLLOUTS = ["hopper", "pong", "drifting"]


def rollout_of(name: str) -> TensorDictBase:
    if name == "drifting":
        return R.drifting_frames(load_sample("pong_pixels.pt"), 2)
    return load_sample({"hopper": "hopper_ted", "pong": "pong_pixels.pt"}[name])


def h5_datasets(path: Path, skip: str | None = None) -> dict[str, np.ndarray]:
    """Every dataset of an HDF5 file as plain h5py reads it, by path (those under ``skip``
    left out)."""
    out: dict[str, np.ndarray] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and not (skip and name.startswith(skip)):
            out[name] = obj[()]

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def original_datasets(src: Path) -> dict[str, np.ndarray]:
    """The original's datasets by the name a packed file gives them: an HDF5 file's as h5py
    reads them, another container's leaves at their key paths."""
    if is_hdf5(src):
        return h5_datasets(src)
    fmt = detect(src)
    opened = fmt.open(src)
    try:
        return {
            key_str(key): leaf if isinstance(leaf, np.ndarray) else leaf.read(0, leaf.shape[0])
            for key, leaf in opened.leaves.items()
            if isinstance(leaf, np.ndarray) or hasattr(leaf, "read")
        }
    finally:
        fmt.close(opened)


@pytest.mark.parametrize("rollout", ROLLOUTS)
@pytest.mark.parametrize("name", marked_h5py_only(packable()))
def test_every_dataset_reads_as_the_original(name: str, rollout: str, tmp_path: Path) -> None:
    """Each dataset of a packed file that has a name of the original's holds its values, read
    by plain h5py in a fresh interpreter that imports only h5py and hdf5plugin."""
    pytest.importorskip("hdf5plugin")
    if name == "torchrl-rb":
        pytest.importorskip("torchrl")
    src = WRITERS[name](rollout_of(rollout), tmp_path / "in")
    packed = tmp_path / "packed.h5"
    compress(src, packed, pack=True)
    want = original_datasets(src)
    dumped = tmp_path / "read.npz"
    script = (
        "import sys, h5py, hdf5plugin, numpy as np\n"
        "out = {}\n"
        "def visit(name, obj):\n"
        "    if isinstance(obj, h5py.Dataset) and not name.startswith('obsdelta'):\n"
        "        out[name] = obj[()]\n"
        "with h5py.File(sys.argv[1], 'r') as f:\n"
        "    f.visititems(visit)\n"
        "np.savez(sys.argv[2], **{k.replace('/', '|'): v for k, v in out.items()})\n"
    )
    subprocess.run([sys.executable, "-c", script, packed, dumped], check=True, cwd=ROOT)
    with np.load(dumped) as npz:
        got = {k.replace("|", "/"): npz[k] for k in npz.files}
    shared = sorted(set(got) & set(want))
    assert shared, (sorted(got), sorted(want))
    for path in shared:
        assert got[path].dtype == want[path].dtype, path
        assert np.array_equal(got[path], want[path]), path
    if rollout != "hopper":  # the frames are among them
        assert any(got[p].dtype == np.uint8 and got[p].ndim >= 3 for p in shared)


def _robomimic_items(path: Path) -> list[dict[str, Any]]:
    """Every fifth sequence robomimic's SequenceDataset gives from ``path``, images included."""
    from robomimic.utils import obs_utils
    from robomimic.utils.dataset import SequenceDataset

    obs_utils.initialize_obs_utils_with_obs_specs(
        {"obs": {"low_dim": list(R.LOW_DIM), "rgb": list(R.CAMERAS)}}
    )
    ds = SequenceDataset(
        hdf5_path=str(path),
        obs_keys=[*R.LOW_DIM, *R.CAMERAS],
        dataset_keys=("actions", "rewards", "dones"),
        seq_length=10,
        hdf5_cache_mode=None,
        hdf5_use_swmr=False,
        load_next_obs=False,
    )
    try:
        return [ds[i] for i in range(0, len(ds), 5)]
    finally:
        if ds.hdf5_file is not None:
            ds.hdf5_file.close()


def test_robomimic_sequence_dataset_reads_packed_images(tmp_path: Path) -> None:
    """robomimic's SequenceDataset on a packed file of 84x84 camera frames: the same items,
    pixels included, as from the original."""
    pytest.importorskip("robomimic")
    pytest.importorskip("gymnasium")
    src = R.write_robomimic_real(tmp_path / "lift.hdf5", demos=6, image=84)
    packed = tmp_path / "lift.h5"
    compress(src, packed, pack=True)
    want, got = _robomimic_items(src), _robomimic_items(packed)
    assert len(want) == len(got) > 0
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for key in R.CAMERAS:  # the frames are compared, not only the low-dim keys
            assert key in a["obs"]
        for group in ("obs", "actions", "rewards", "dones"):
            x, y = a[group], b[group]
            pairs = [(k, x[k], y[k]) for k in x] if isinstance(x, dict) else [(group, x, y)]
            for k, u, v in pairs:
                assert np.asarray(u).dtype == np.asarray(v).dtype and np.array_equal(u, v), k


def _minari_with_frames(root: Path, dataset_id: str) -> Path:
    """A Minari dataset written by minari's DataCollector (Hopper-v5), whose observations are
    then made 16x16 RGB frames (uint8), the observation space in its metadata too; returns
    its ``main_data.hdf5``."""
    import gymnasium as gym
    from minari.serialization import serialize_space

    main = R.write_minari_dataset(300, root, dataset_id)
    rng = np.random.default_rng(0)
    with h5py.File(main, "r+") as f:
        for name in f:
            obs = f[name]["observations"]
            rows = obs.shape[0]
            del f[name]["observations"]
            background = rng.integers(0, 256, (1, 16, 16, 3))
            moving = (np.arange(rows)[:, None, None, None] * 3 + background) % 256
            f[name].create_dataset("observations", data=moving.astype(np.uint8))
    space = serialize_space(gym.spaces.Box(0, 255, (16, 16, 3), np.uint8))
    meta_file = main.parent / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["observation_space"] = space
    meta_file.write_text(json.dumps(meta))
    with h5py.File(main, "r+") as f:
        if "observation_space" in f.attrs:
            f.attrs["observation_space"] = space
    return main


def test_minari_load_dataset_reads_packed_frames(tmp_path: Path, monkeypatch: Any) -> None:
    """minari.load_dataset on a dataset whose main_data.hdf5 is a packed file: every episode
    as from the original, frames included."""
    minari = pytest.importorskip("minari")
    pytest.importorskip("gymnasium")
    datasets = tmp_path / "datasets"
    main = _minari_with_frames(datasets, "frames/test-v0")
    packed = tmp_path / "main_data.h5"
    compress(main, packed, pack=True)

    def episodes() -> list[Any]:
        data = minari.load_dataset("frames/test-v0")
        return list(data.iterate_episodes())

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(datasets))
    want = episodes()
    shutil.copyfile(packed, main)
    got = episodes()
    assert len(want) == len(got) > 1
    for a, b in zip(want, got, strict=True):
        assert a.observations.dtype == np.uint8 and a.observations.ndim == 4
        for field in ("observations", "actions", "rewards", "terminations", "truncations"):
            u, v = getattr(a, field), getattr(b, field)
            assert u.dtype == v.dtype and np.array_equal(u, v), field
