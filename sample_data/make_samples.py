"""Regenerate the sample trajectory datasets in this folder from real simulator rollouts.

Every dataset uses the TorchRL "TED" layout: step t at the root (``observation``, ``action``,
``done``/``terminated``/``truncated``), step t+1 under ``"next"`` (observation, ``reward`` and
the done flags), plus ``("collector", "traj_ids")``. Environments auto-reset when an episode
ends, as TorchRL collectors do, so inside an episode ``("next", obs)[t]`` is bit-identical to
``obs[t + 1]``; this is asserted for every file before it is written.

Needs gymnasium[mujoco], ale-py and torchrl (all provided by ``pip install -e .[dev]``).

Run from the repository root::

    python sample_data/make_samples.py            # writes next to this script
    python sample_data/make_samples.py --out DIR  # writes into DIR
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ale_py
import gymnasium as gym
import mujoco
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

gym.register_envs(ale_py)

# policy(observation, step index inside the episode, rng) -> action passed to env.step
Policy = Callable[[np.ndarray, int, np.random.Generator], Any]
# converts a raw gymnasium observation into the array that is stored
ObsFn = Callable[[Any], np.ndarray]

HOPPER_STEPS = 3000
HOPPER_MAX_EPISODE_STEPS = 150
CHEETAH_ENVS = 4
CHEETAH_STEPS = 250
CHEETAH_MAX_EPISODE_STEPS = 100
RB_CAPACITY = 2048
RB_ROWS = 1500
PONG_STEPS = 200
PONG_MAX_EPISODE_STEPS = 80
PONG_STRIDE = 4


# --------------------------------------------------------------------------- observations


def to_float32(obs: np.ndarray) -> np.ndarray:
    """Cast a MuJoCo float64 observation to float32 (done once, when the step is stored)."""
    return np.asarray(obs, dtype=np.float32)


def downsample_frame(frame: np.ndarray) -> np.ndarray:
    """[210, 160] uint8 grayscale frame -> [1, 53, 40] uint8 by striding."""
    return np.ascontiguousarray(frame[None, ::PONG_STRIDE, ::PONG_STRIDE])


# --------------------------------------------------------------------------- policies


def hopper_policy(obs: np.ndarray, step: int, rng: np.random.Generator) -> np.ndarray:
    """Weak PD controller towards upright joints plus noise: some hops fall, some survive."""
    del step
    torque = -1.0 * obs[2:5] - 0.1 * obs[8:11] + 0.3 * rng.standard_normal(3)
    return np.clip(torque, -1.0, 1.0).astype(np.float32)


def cheetah_policy(obs: np.ndarray, step: int, rng: np.random.Generator) -> np.ndarray:
    """Sinusoidal gait (one phase per joint) plus noise."""
    del obs
    phases = np.linspace(0.0, np.pi, 6)
    gait = 0.8 * np.sin(2.0 * np.pi * step / 20.0 + phases)
    return np.clip(gait + 0.2 * rng.standard_normal(6), -1.0, 1.0).astype(np.float32)


def pong_policy(obs: np.ndarray, step: int, rng: np.random.Generator) -> np.int64:
    """Uniformly random discrete action."""
    del obs, step
    return np.int64(rng.integers(6))


# --------------------------------------------------------------------------- rollouts


def rollout(
    env: gym.Env,
    policy: Policy,
    steps: int,
    seed: int,
    *,
    obs_key: str = "observation",
    obs_fn: ObsFn = to_float32,
    first_traj_id: int = 0,
) -> TensorDict:
    """Run ``steps`` transitions with auto-reset and return them as a TED TensorDict [steps]."""
    rng = np.random.default_rng(seed)
    obs = obs_fn(env.reset(seed=seed)[0])
    rec: dict[str, list[Any]] = defaultdict(list)
    traj_id, ep_step = first_traj_id, 0
    for _ in range(steps):
        action = policy(obs, ep_step, rng)
        raw_next, reward, terminated, truncated, _ = env.step(action)
        next_obs = obs_fn(raw_next)
        for key, value in (
            ("obs", obs),
            ("action", action),
            ("next_obs", next_obs),
            ("reward", reward),
            ("terminated", terminated),
            ("truncated", truncated),
            ("traj_id", traj_id),
        ):
            rec[key].append(value)
        if terminated or truncated:
            obs, traj_id, ep_step = obs_fn(env.reset()[0]), traj_id + 1, 0
        else:
            obs, ep_step = next_obs, ep_step + 1
    return to_ted(rec, obs_key)


def to_ted(rec: dict[str, list[Any]], obs_key: str) -> TensorDict:
    """Stack recorded steps into the TED layout."""
    steps = len(rec["obs"])
    terminated = torch.tensor(rec["terminated"], dtype=torch.bool).unsqueeze(-1)
    truncated = torch.tensor(rec["truncated"], dtype=torch.bool).unsqueeze(-1)
    not_done = torch.zeros(steps, 1, dtype=torch.bool)  # root states are never terminal
    return TensorDict(
        {
            obs_key: torch.from_numpy(np.stack(rec["obs"])),
            "action": torch.from_numpy(np.asarray(rec["action"])),
            "done": not_done,
            "terminated": not_done.clone(),
            "truncated": not_done.clone(),
            "collector": {"traj_ids": torch.tensor(rec["traj_id"], dtype=torch.int64)},
            "next": {
                obs_key: torch.from_numpy(np.stack(rec["next_obs"])),
                "reward": torch.tensor(rec["reward"], dtype=torch.float32).unsqueeze(-1),
                "done": terminated | truncated,
                "terminated": terminated,
                "truncated": truncated,
            },
        },
        batch_size=[steps],
    )


# --------------------------------------------------------------------------- datasets


def make_hopper(steps: int, seed: int) -> TensorDict:
    with gym.make("Hopper-v5", max_episode_steps=HOPPER_MAX_EPISODE_STEPS) as env:
        return rollout(env, hopper_policy, steps, seed)


def make_cheetah() -> TensorDict:
    """[CHEETAH_ENVS, CHEETAH_STEPS]: independent envs, traj_ids unique across the batch."""
    rows, next_id = [], 0
    for env_index in range(CHEETAH_ENVS):
        with gym.make("HalfCheetah-v5", max_episode_steps=CHEETAH_MAX_EPISODE_STEPS) as env:
            td = rollout(env, cheetah_policy, CHEETAH_STEPS, 100 + env_index, first_traj_id=next_id)
        next_id = int(td["collector", "traj_ids"][-1]) + 1
        rows.append(td)
    return torch.stack(rows)


def make_pong() -> TensorDict:
    """Random play; frames downsampled to [1, 53, 40] uint8 and stored under ``pixels``."""
    env = gym.make(
        "ALE/Pong-v5", max_episode_steps=PONG_MAX_EPISODE_STEPS, frameskip=4, obs_type="grayscale"
    )
    with env:
        return rollout(env, pong_policy, PONG_STEPS, 0, obs_key="pixels", obs_fn=downsample_frame)


# --------------------------------------------------------------------------- checks


def check_ted(td: TensorDictBase, obs_key: str = "observation") -> None:
    """Assert the TED invariants along the last batch dimension."""
    done = td["next", "done"]
    assert torch.equal(done, td["next", "terminated"] | td["next", "truncated"])
    assert not td["done"].any(), "root states must be reset/non-terminal"
    within = ~done[..., :-1, 0]  # step t and t+1 belong to the same episode
    now, later = td[..., :-1], td[..., 1:]
    assert torch.equal(now["next", obs_key][within], later[obs_key][within]), "obs mismatch"
    same_traj = now["collector", "traj_ids"] == later["collector", "traj_ids"]
    assert torch.equal(same_traj, within), "traj_ids must change exactly at episode ends"


def assert_same(a: TensorDictBase, b: TensorDictBase) -> None:
    """Same keys, shapes, dtypes and values."""
    assert a.batch_size == b.batch_size
    keys = sorted(a.keys(True, True), key=str)
    assert keys == sorted(b.keys(True, True), key=str), (keys, list(b.keys(True, True)))
    for key in keys:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def episode_ends(td: TensorDictBase) -> tuple[int, int]:
    """(episodes ended by termination, episodes ended by truncation only)."""
    terminated = td["next", "terminated"]
    return int(terminated.sum()), int((td["next", "truncated"] & ~terminated).sum())


# --------------------------------------------------------------------------- writers


def save_memmap(td: TensorDict, path: Path) -> None:
    td.memmap(path)
    assert_same(td, TensorDict.load_memmap(path))


def save_torch(td: TensorDict, path: Path) -> None:
    torch.save(td, path)
    loaded = torch.load(path, weights_only=False)
    assert isinstance(loaded, TensorDict)
    assert_same(td, loaded)


def new_replay_buffer() -> TensorDictReplayBuffer:
    return TensorDictReplayBuffer(storage=LazyMemmapStorage(RB_CAPACITY))


def save_replay_buffer(td: TensorDict, path: Path) -> None:
    """Dump a replay buffer whose storage is larger than the data it holds."""
    rb = new_replay_buffer()
    rb.extend(td)
    rb.dumps(path)
    assert (path / "storage").is_dir() and (path / "storage" / "storage_metadata.json").is_file()
    reloaded = new_replay_buffer()
    reloaded.loads(path)
    assert len(reloaded) == len(td) == RB_ROWS
    # TensorDictReplayBuffer stores an extra "index" entry next to the data
    assert_same(td, reloaded[: len(td)].exclude("index"))


# --------------------------------------------------------------------------- main


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write(
    td: TensorDict, path: Path, saver: Callable[[TensorDict, Path], None], obs_key: str
) -> int:
    """Check, (re)write and summarise one dataset; return its size in bytes."""
    check_ted(td, obs_key)
    if path.is_dir():
        shutil.rmtree(path)
    path.unlink(missing_ok=True)
    saver(td, path)
    n_term, n_trunc = episode_ends(td)
    size = disk_bytes(path)
    print(
        f"{path}: batch {list(td.batch_size)}, terminated {n_term}, "
        f"truncated {n_trunc}, {size} bytes"
    )
    return size


def route_mujoco_warnings() -> None:
    """Print MuJoCo warnings instead of appending them to ./MUJOCO_LOG.TXT."""
    mujoco.set_mju_user_warning(lambda msg: print(f"MuJoCo warning: {msg}", file=sys.stderr))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    route_mujoco_warnings()

    hopper = make_hopper(HOPPER_STEPS, seed=0)
    n_term, n_trunc = episode_ends(hopper)
    assert n_term > 0 and n_trunc > 0, "hopper sample needs both kinds of episode end"
    jobs = [
        (hopper, "hopper_ted", save_memmap, "observation"),
        (make_cheetah(), "halfcheetah_ted.pt", save_torch, "observation"),
        (make_hopper(RB_ROWS, seed=1), "hopper_rb", save_replay_buffer, "observation"),
        (make_pong(), "pong_pixels.pt", save_torch, "pixels"),
    ]
    total = sum(write(td, out / name, saver, key) for td, name, saver, key in jobs)
    print(f"total: {total} bytes")
    assert total < 5_000_000, "sample data must stay under 5 MB"


if __name__ == "__main__":
    main()
