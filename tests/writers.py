"""Writers that store a real TED rollout in every format obsdelta reads, with the real libraries
(tensordict, TorchRL, h5py), laid out as those ecosystems lay them out."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

H5 = {"compression": "gzip", "compression_opts": 4}


def write_memmap(td: TensorDictBase, path: Path) -> Path:
    td.memmap(path)
    return path


def write_pt(td: TensorDictBase, path: Path) -> Path:
    path = path.with_suffix(".pt")
    torch.save(td, path)
    return path


def write_rb(td: TensorDictBase, path: Path) -> Path:
    """A TorchRL replay-buffer dump holding ``td`` (flattened), with spare capacity."""
    rl_data = pytest.importorskip("torchrl.data")
    flat = td.reshape(-1) if td.batch_dims > 1 else td
    rb = rl_data.TensorDictReplayBuffer(
        storage=rl_data.LazyMemmapStorage(flat.shape[0] + 37, scratch_dir=path.parent / "scratch")
    )
    rb.extend(flat)
    rb.dumps(path)
    return path


def write_ted_hdf5(td: TensorDictBase, path: Path) -> Path:
    """tensordict's own HDF5 writer, with gzip as users pass it."""
    path = path.with_suffix(".h5")
    td.to_h5(path, compression="gzip")
    return path


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _episodes(td: TensorDictBase) -> list[TensorDictBase]:
    """Split a [T] rollout after every done step (the last episode may be unfinished)."""
    flat = td.reshape(-1)
    ends = (flat["next", "done"].reshape(-1).nonzero().flatten() + 1).tolist()
    bounds = [0, *[e for e in ends if e < flat.shape[0]], flat.shape[0]]
    return [flat[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _observation_keys(td: TensorDictBase) -> list[str]:
    return [
        k
        for k in td.keys()
        if isinstance(k, str)
        and k not in ("next", "collector")
        and k in td["next"].keys()
        and k not in ("done", "terminated", "truncated")
    ]


def write_d4rl(td: TensorDictBase, path: Path) -> Path:
    """D4RL's layout: flat datasets, gzip, chunked, float32, bool flags, infos and metadata."""
    flat = td.reshape(-1)
    (obs_key,) = _observation_keys(flat)
    path = path.with_suffix(".hdf5")
    terminated = _np(flat["next", "terminated"].reshape(-1))
    with h5py.File(path, "w") as f:
        f.create_dataset("observations", data=_np(flat[obs_key]), chunks=True, **H5)
        f.create_dataset("next_observations", data=_np(flat["next", obs_key]), chunks=True, **H5)
        f.create_dataset("actions", data=_np(flat["action"]), chunks=True, **H5)
        f.create_dataset("rewards", data=_np(flat["next", "reward"].reshape(-1)), **H5)
        f.create_dataset("terminals", data=terminated, **H5)
        timeouts = _np(flat["next", "truncated"].reshape(-1)) & ~terminated
        f.create_dataset("timeouts", data=timeouts, **H5)
        f.create_dataset("infos/traj_ids", data=_np(flat["collector", "traj_ids"]), **H5)
        f["metadata/algorithm"] = np.bytes_(b"obsdelta-test")
        f["metadata"].attrs["note"] = "written by the obsdelta tests"
    return path


def write_robomimic(td: TensorDictBase, path: Path) -> Path:
    """robomimic's layout: one demo per episode, obs/ and next_obs/, attributes and a mask."""
    path = path.with_suffix(".hdf5")
    episodes = _episodes(td)
    keys = _observation_keys(td)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["total"] = sum(e.shape[0] for e in episodes)
        data.attrs["env_args"] = json.dumps({"env_name": "test", "type": 2, "env_kwargs": {}})
        for i, ep in enumerate(episodes):
            demo = data.create_group(f"demo_{i}")
            demo.attrs["num_samples"] = ep.shape[0]
            demo.create_dataset("actions", data=_np(ep["action"]).astype(np.float64))
            demo.create_dataset(
                "rewards", data=_np(ep["next", "reward"].reshape(-1)).astype(np.float64)
            )
            dones = np.zeros(ep.shape[0], dtype=np.int64)
            dones[-1] = int(ep["next", "done"][-1].item())
            demo.create_dataset("dones", data=dones)
            for k in keys:
                for group, source in (("obs", ep[k]), ("next_obs", ep["next", k])):
                    demo.create_dataset(f"{group}/{k}", data=_np(source), **H5)
        names = [f"demo_{i}".encode() for i in range(len(episodes))]
        f.create_dataset("mask/train", data=np.array(names[:-1] or names, dtype="S"))
        f.create_dataset("mask/valid", data=np.array(names[-1:], dtype="S"))
    return path


def write_minari(td: TensorDictBase, path: Path) -> Path:
    """Minari's layout: one group per episode, T+1 observations stored once."""
    path = path.with_suffix(".hdf5")
    (obs_key,) = _observation_keys(td)
    with h5py.File(path, "w") as f:
        for i, ep in enumerate(_episodes(td)):
            group = f.create_group(f"episode_{i}")
            group.attrs["id"] = i
            observations = torch.cat([ep[obs_key], ep["next", obs_key][-1:]])
            group.create_dataset("observations", data=_np(observations))
            group.create_dataset("actions", data=_np(ep["action"]))
            group.create_dataset("rewards", data=_np(ep["next", "reward"].reshape(-1)))
            group.create_dataset("terminations", data=_np(ep["next", "terminated"].reshape(-1)))
            group.create_dataset("truncations", data=_np(ep["next", "truncated"].reshape(-1)))
    return path


#: One writer per format in the registry; a new format without a writer fails test_formats.
WRITERS: dict[str, Callable[[TensorDictBase, Path], Path]] = {
    "ted-memmap": write_memmap,
    "ted-pt": write_pt,
    "torchrl-rb": write_rb,
    "d4rl-hdf5": write_d4rl,
    "robomimic-hdf5": write_robomimic,
    "minari-hdf5": write_minari,
    "ted-hdf5": write_ted_hdf5,
}


def write_packed(td: TensorDictBase, path: Path) -> Path:
    """A packed file (an output only: ``compress --pack`` of a TED memmap)."""
    from obsdelta_cli import compress

    src = write_memmap(td, path.with_name(path.name + "-src"))
    out = path.with_suffix(".h5")
    compress(src, out, pack=True)
    return out


#: Formats that are only ever written by obsdelta, with how the tests make one.
OUTPUT_WRITERS: dict[str, Callable[[TensorDictBase, Path], Path]] = {"packed-hdf5": write_packed}

#: TorchRL's storage checkpointers that store each observation once, by kind.
CHECKPOINTERS = {
    "flat": "FlatStorageCheckpointer",
    "nested": "NestedStorageCheckpointer",
    "h5": "H5StorageCheckpointer",
}


def write_checkpoint(td: TensorDictBase, path: Path, kind: str = "flat") -> Path:
    """A replay-buffer dump of ``td`` written through TorchRL's checkpointer of ``kind``."""
    rl_data = pytest.importorskip("torchrl.data")
    from torchrl.data.replay_buffers import checkpointers

    rb = rl_data.TensorDictReplayBuffer(storage=rl_data.LazyMemmapStorage(td.shape[0]))
    rb.extend(td)
    rb._storage.checkpointer = getattr(checkpointers, CHECKPOINTERS[kind])()
    rb.dumps(path)
    return path


#: Layouts obsdelta recognises to say there is nothing to remove, with no writer of their own.
RECOGNISED_WRITERS: dict[str, Callable[[TensorDictBase, Path], Path]] = {
    "torchrl-checkpoint": write_checkpoint
}

#: Formats whose keys follow TED (``k`` and ``("next", k)``), so TED tensordicts round-trip.
TED_KEYED = ["ted-memmap", "ted-pt", "torchrl-rb", "ted-hdf5"]


def read_h5_td(path: Path) -> TensorDictBase:
    """A TED HDF5 file as an in-memory TensorDict (obsdelta's own group left out)."""
    leaves: dict[tuple[str, ...], torch.Tensor] = {}

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset) and not name.startswith("obsdelta"):
            tensor = torch.from_numpy(obj[()])
            if obj.attrs.get("obsdelta_dtype") == "bfloat16":  # numpy has no bfloat16
                tensor = tensor.view(torch.bfloat16)
            leaves[tuple(name.split("/"))] = tensor

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    shapes = [v.shape for v in leaves.values()]
    batch = 0
    while all(len(s) > batch for s in shapes) and len({s[batch] for s in shapes}) == 1:
        batch += 1
    out = TensorDict(batch_size=shapes[0][:batch])
    for key in sorted(leaves):
        out.set(key, leaves[key])
    return out
