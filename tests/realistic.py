"""Datasets in the layouts real offline-RL datasets ship with, written by the real libraries
(h5py, tensordict, torchrl, minari) from real gymnasium[mujoco] Hopper-v5 rollouts.

- D4RL v2 Gym-MuJoCo (``hopper-medium-v2``): transitions, ``infos/*``, ``metadata/*`` with the
  behaviour policy (whose first dimensions are not the row count), gzip as D4RL writes;
- ``*-medium-replay-v2``: the same, float64 throughout;
- AntMaze/Maze2D/Adroit style: no ``next_observations``;
- shuffled rows;
- robomimic: 200 demos, low-dim float64 keys and uint8 camera keys, contiguous and unfiltered;
- TorchRL offline caches, made by TorchRL's own ``D4RLExperienceReplay`` and
  ``MinariExperienceReplay`` code;
- Minari ``main_data.hdf5`` written by minari's ``DataCollector``;
- TED-HDF5 written by ``td.to_h5``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

GZIP = {"compression": "gzip", "compression_opts": 4}


@dataclass
class Rollout:
    """Flat D4RL-style transitions of Hopper-v5 (random policy), episodes back to back."""

    observations: np.ndarray
    next_observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    timeouts: np.ndarray
    qpos: np.ndarray
    qvel: np.ndarray
    log_probs: np.ndarray
    #: Episode start row of every episode.
    starts: list[int]


def hopper_rollout(rows: int, seed: int = 0, max_steps: int = 60) -> Rollout:
    """``rows`` transitions of Hopper-v5 with a noisy policy; episodes end by termination
    (unhealthy) or by the ``max_steps`` time limit, as in D4RL."""
    import gymnasium as gym

    env = gym.make("Hopper-v5", max_episode_steps=max_steps)
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {k: [] for k in ("o", "n", "a", "r", "d", "t", "qp", "qv", "lp")}
    starts: list[int] = []
    obs, _ = env.reset(seed=seed)
    starts.append(0)
    while len(out["o"]) < rows:
        mean = np.tanh(obs[:3] * 0.5)
        action = np.clip(mean + 0.3 * rng.standard_normal(3), -1, 1).astype(np.float32)
        data = env.unwrapped.data
        out["qp"].append(data.qpos.copy())
        out["qv"].append(data.qvel.copy())
        out["lp"].append(-0.5 * float(((action - mean) / 0.3) ** 2 @ np.ones(3)) - 3 * 0.2)
        nxt, reward, terminated, truncated, _ = env.step(action)
        out["o"].append(obs)
        out["n"].append(nxt)
        out["a"].append(action)
        out["r"].append(reward)
        out["d"].append(terminated)
        out["t"].append(truncated and not terminated)
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
            if len(out["o"]) < rows:
                starts.append(len(out["o"]))
    env.close()
    return Rollout(
        observations=np.asarray(out["o"], np.float32),
        next_observations=np.asarray(out["n"], np.float32),
        actions=np.asarray(out["a"], np.float32),
        rewards=np.asarray(out["r"], np.float32),
        terminals=np.asarray(out["d"], bool),
        timeouts=np.asarray(out["t"], bool),
        qpos=np.asarray(out["qp"], np.float32),
        qvel=np.asarray(out["qv"], np.float32),
        log_probs=np.asarray(out["lp"], np.float32),
        starts=starts,
    )


def _policy(f: h5py.File, obs_dim: int, act_dim: int, dtype: type, seed: int = 1) -> None:
    """The behaviour policy as D4RL v2 files store it under ``metadata/policy/``."""
    rng = np.random.default_rng(seed)
    shapes = {
        "fc0/weight": (256, obs_dim),
        "fc0/bias": (256,),
        "fc1/weight": (256, 256),
        "fc1/bias": (256,),
        "last_fc/weight": (act_dim, 256),
        "last_fc/bias": (act_dim,),
        "last_fc_log_std/weight": (act_dim, 256),
        "last_fc_log_std/bias": (act_dim,),
    }
    for name, shape in shapes.items():
        data = (rng.standard_normal(shape) * 0.05).astype(dtype)
        f.create_dataset(f"metadata/policy/{name}", data=data, **GZIP)
    f["metadata/policy/nonlinearity"] = np.bytes_(b"relu")
    f["metadata/policy/output_distribution"] = np.bytes_(b"tanh_gaussian")


def write_d4rl_v2(
    r: Rollout,
    path: Path,
    *,
    dtype: type = np.float32,
    next_observations: bool = True,
    permutation: np.ndarray | None = None,
) -> Path:
    """hopper-medium-v2's layout (``dtype=np.float64``: hopper-medium-replay-v2's)."""
    p = permutation if permutation is not None else slice(None)
    with h5py.File(path, "w") as f:
        f.create_dataset("observations", data=r.observations[p].astype(dtype), **GZIP)
        if next_observations:
            f.create_dataset("next_observations", data=r.next_observations[p].astype(dtype), **GZIP)
        f.create_dataset("actions", data=r.actions[p].astype(dtype), **GZIP)
        f.create_dataset("rewards", data=r.rewards[p].astype(dtype), **GZIP)
        f.create_dataset("terminals", data=r.terminals[p], **GZIP)
        f.create_dataset("timeouts", data=r.timeouts[p], **GZIP)
        f.create_dataset("infos/action_log_probs", data=r.log_probs[p].astype(dtype), **GZIP)
        f.create_dataset("infos/qpos", data=r.qpos[p].astype(dtype), **GZIP)
        f.create_dataset("infos/qvel", data=r.qvel[p].astype(dtype), **GZIP)
        f["metadata/algorithm"] = np.bytes_(b"SAC")
        f["metadata/iteration"] = np.int64(1_000_000)
        _policy(f, r.observations.shape[1], r.actions.shape[1], dtype)
    return path


# --- robomimic -------------------------------------------------------------------------------

LOW_DIM = {
    "robot0_eef_pos": 3,
    "robot0_eef_quat": 4,
    "robot0_gripper_qpos": 2,
    "robot0_joint_pos": 7,
    "object": 10,
}
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")


def _frames(state: np.ndarray, size: int, phase: float) -> np.ndarray:
    """A deterministic camera frame per state: uint8, channel-last, changes every step."""
    grid = np.linspace(0, np.pi, size)
    y, x = np.meshgrid(grid, grid, indexing="ij")
    out = np.empty((len(state), size, size, 3), np.uint8)
    for c in range(3):
        wave = np.sin(
            x[None] * (1 + state[:, c, None, None]) + y[None] * state[:, c + 3, None, None] + phase
        )
        out[..., c] = np.clip(128 + 100 * wave, 0, 255).astype(np.uint8)
    return out


def write_robomimic_real(
    path: Path,
    *,
    demos: int = 200,
    image: int = 16,
    seed: int = 0,
    steps: tuple = (20, 40),
    cameras: bool = True,
) -> Path:
    """robomimic's layout: ``data/demo_i`` with ``states`` (sim time first), ``actions``,
    ``rewards``, ``dones``, ``obs/<k>`` and ``next_obs/<k>`` where ``next_obs[t] == obs[t+1]``
    plus one extra final frame per demo; contiguous, unfiltered; ``mask/<filter>``. Without
    ``cameras``, a low-dim file as robomimic ships them: no camera keys at all."""
    import gymnasium as gym

    env = gym.make("Hopper-v5", terminate_when_unhealthy=False)
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        total = 0
        for i in range(demos):
            n = int(rng.integers(steps[0], steps[1] + 1))
            env.reset(seed=seed * 10_000 + i)
            raw = env.unwrapped.data
            times, qpos, qvel, actions, rewards = [], [], [], [], []
            for _ in range(n + 1):
                times.append(raw.time)
                qpos.append(raw.qpos.copy())
                qvel.append(raw.qvel.copy())
                if len(actions) < n:
                    a = rng.uniform(-1, 1, 3)
                    _, rew, *_ = env.step(a)
                    actions.append(a)
                    rewards.append(rew)
            qp, qv = np.asarray(qpos), np.asarray(qvel)  # n + 1 states
            state = np.concatenate([np.asarray(times)[:, None], qp, qv], 1)
            full = np.concatenate([qp, qv, qp * qv, np.sin(qp), np.cos(qv)], 1)  # 30 features
            demo = data.create_group(f"demo_{i}")
            demo.attrs["num_samples"] = n
            demo.attrs["model_file"] = "<mujoco model='hopper'><worldbody/></mujoco>"
            demo.create_dataset("states", data=state[:n])
            demo.create_dataset("actions", data=np.asarray(actions))
            demo.create_dataset("rewards", data=np.asarray(rewards))
            dones = np.zeros(n, np.int64)
            dones[-1] = 1
            demo.create_dataset("dones", data=dones)
            col = 0
            series: dict[str, np.ndarray] = {}
            assert full.shape[1] >= sum(LOW_DIM.values())
            for k, d in LOW_DIM.items():
                series[k] = full[:, col : col + d].astype(np.float64)
                col += d
            for j, k in enumerate(CAMERAS if cameras else ()):
                series[k] = _frames(full, image, phase=float(j))
            for k, v in series.items():
                demo.create_dataset(f"obs/{k}", data=v[:n])
            for k, v in series.items():
                demo.create_dataset(f"next_obs/{k}", data=v[1:])
            total += n
        data.attrs["total"] = total
        data.attrs["env_args"] = json.dumps(
            {"env_name": "Lift", "type": 1, "env_kwargs": {"robots": ["Panda"]}}
        )
        names = np.array([f"demo_{i}".encode() for i in range(demos)], dtype="S")
        cut = int(demos * 0.9)
        f.create_dataset("mask/train", data=names[:cut])
        f.create_dataset("mask/valid", data=names[cut:])
    env.close()
    return path


def drifting_frames(base: TensorDictBase, repeat: int, seed: int = 0) -> TensorDictBase:
    """``base`` (Pong's rollout) ``repeat`` times over, its ``pixels`` replaced by a noisy
    background whose pixels drift one step at a time: frame deltas are small, while the frames
    themselves never repeat (the data where storing frame deltas pays most)."""
    gen = torch.Generator().manual_seed(seed)
    frames = torch.cat([base.clone()] * repeat)
    shape = (frames.shape[0], *base["pixels"].shape[1:])
    steps = torch.randint(-1, 2, shape, generator=gen) * (torch.rand(shape, generator=gen) < 0.3)
    start = torch.randint(0, 256, (1, *shape[1:]), generator=gen)
    pixels = ((start + steps.cumsum(0)) % 256).to(torch.uint8)
    frames["pixels"] = pixels
    frames["next", "pixels"] = torch.cat([pixels[1:], pixels[-1:]])
    return frames


def offering_frame_deltas(candidates: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """``candidates`` (of :mod:`obsdelta_cli.filters`) plus the frame-delta filter for uint8
    images, as obsdelta 0.2 offered it: with it, packing writes the files 0.2 wrote."""
    from obsdelta_cli.filters import FILTERS

    def with_deltas(dtype: np.dtype, shape: Any) -> list[Any]:
        image = dtype == np.uint8 and len(shape) >= 3
        return [*candidates(dtype, shape), *([FILTERS["frame-delta-zstd3"]] if image else [])]

    return with_deltas


def demo_order(path: Path) -> list[str]:
    """robomimic's own demo order: numeric."""
    with h5py.File(path, "r") as f:
        return sorted(f["data"], key=lambda d: int(d[5:]))


def write_robomimic_floor(src: Path, path: Path) -> Path:
    """The lossless floor: ``src`` without ``next_obs/``, plus the one final frame per demo and
    key that ``obs/`` cannot give, in one contiguous dataset per key (same filters: none)."""
    order = demo_order(src)
    with h5py.File(src, "r") as f, h5py.File(path, "w") as out:
        for k, v in f.attrs.items():
            out.attrs[k] = v
        out.copy(f["mask"], "mask")
        data = out.create_group("data")
        for k, v in f["data"].attrs.items():
            data.attrs[k] = v
        finals: dict[str, list[np.ndarray]] = {}
        for name in order:
            demo = f["data"][name]
            new = data.create_group(name)
            for k, v in demo.attrs.items():
                new.attrs[k] = v
            for item in demo:
                if item != "next_obs":
                    out.copy(demo[item], f"data/{name}/{item}")
            for k in demo["next_obs"]:
                finals.setdefault(k, []).append(demo["next_obs"][k][-1])
        for k, rows in finals.items():
            out.create_dataset(f"boundary/{k}", data=np.stack(rows))
    return path


# --- TED, TorchRL caches, Minari ---------------------------------------------------------------


def ted_from_rollout(r: Rollout) -> TensorDictBase:
    """A TED TensorDict of the rollout, as a TorchRL collector lays it out."""
    n = len(r.observations)
    t = torch.from_numpy
    term = t(r.terminals)[:, None]
    trunc = t(r.timeouts)[:, None]
    return TensorDict(
        {
            "observation": t(r.observations),
            "action": t(r.actions),
            "done": torch.zeros(n, 1, dtype=torch.bool),
            "terminated": torch.zeros(n, 1, dtype=torch.bool),
            "truncated": torch.zeros(n, 1, dtype=torch.bool),
            "next": {
                "observation": t(r.next_observations),
                "reward": t(r.rewards)[:, None],
                "done": term | trunc,
                "terminated": term,
                "truncated": trunc,
            },
        },
        batch_size=[n],
    )


def write_torchrl_d4rl_cache(d4rl_file: Path, root: Path, dataset_id: str) -> Path:
    """What ``D4RLExperienceReplay(dataset_id, direct_download=True)`` leaves in ``root``,
    made by TorchRL's own code with the download replaced by ``d4rl_file``."""
    from unittest import mock

    from torchrl.data.datasets import d4rl as rl_d4rl

    with (
        mock.patch.dict(rl_d4rl.D4RL_DATASETS, {dataset_id: "file://" + str(d4rl_file)}),
        mock.patch.object(rl_d4rl, "_download_dataset_from_url", lambda url, tmp: str(d4rl_file)),
    ):
        rl_d4rl.D4RLExperienceReplay(
            dataset_id, batch_size=32, root=root, direct_download=True, download=True
        )
    return root / dataset_id


def write_minari_dataset(rows: int, datasets_path: Path, dataset_id: str, seed: int = 0) -> Path:
    """A Minari dataset written by minari's ``DataCollector`` from Hopper-v5; returns its
    ``main_data.hdf5``."""
    import gymnasium as gym
    import minari

    os.environ["MINARI_DATASETS_PATH"] = str(datasets_path)
    env = minari.DataCollector(gym.make("Hopper-v5", max_episode_steps=200))
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    steps = 0
    while True:
        action = np.clip(np.tanh(obs[:3] * 0.5) + 0.3 * rng.standard_normal(3), -1, 1)
        obs, _, terminated, truncated, _ = env.step(action.astype(np.float32))
        steps += 1
        if terminated or truncated:
            if steps >= rows:
                break
            obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
    env.create_dataset(dataset_id=dataset_id, algorithm_name="random-gaussian", author="tests")
    env.close()
    files = list((datasets_path / dataset_id).rglob("main_data.hdf5"))
    assert len(files) == 1, files
    return files[0]


def write_torchrl_minari_cache(datasets_path: Path, root: Path, dataset_id: str) -> Path:
    """What ``MinariExperienceReplay(dataset_id, load_from_local_minari=True)`` leaves in
    ``root``: a TED memmap folder plus ``env_metadata.json``."""
    from torchrl.data.datasets.minari_data import MinariExperienceReplay

    os.environ["MINARI_DATASETS_PATH"] = str(datasets_path)
    MinariExperienceReplay(dataset_id, batch_size=32, root=root, load_from_local_minari=True)
    return root / dataset_id
