"""Regenerate the sample trajectory datasets in this folder from real simulator rollouts.

Most datasets use the TorchRL "TED" layout: step t at the root (``observation``, ``action``,
``done``/``terminated``/``truncated``), step t+1 under ``"next"`` (observation, ``reward`` and
the done flags), plus ``("collector", "traj_ids")``. Environments auto-reset when an episode
ends, as TorchRL collectors do, so inside an episode ``("next", obs)[t]`` is bit-identical to
``obs[t + 1]``; this is asserted for every file before it is written.

Two HDF5 files follow other public layouts, built from the same kind of rollout:
``hopper_d4rl.hdf5`` (D4RL Gym-MuJoCo v2: flat ``observations``/``next_observations`` rows with
``terminals``/``timeouts``) and ``hopper_robomimic.hdf5`` (robomimic: one ``data/demo_<i>`` group
per episode with ``obs/`` and ``next_obs/``, including rendered RGB frames). Their in-episode
identities are asserted too, and every HDF5 file is re-opened and compared after writing.

Needs gymnasium[mujoco], ale-py, torchrl and h5py (all provided by ``pip install -e .[dev]``).
The robomimic file renders MuJoCo frames off-screen; ``MUJOCO_GL`` defaults to ``egl`` here
(set ``MUJOCO_GL=osmesa`` where EGL is not available).

Run from the repository root::

    python sample_data/make_samples.py            # writes next to this script
    python sample_data/make_samples.py --out DIR  # writes into DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ale_py
import gymnasium as gym
import h5py
import mujoco
import numpy as np
import torch
from gymnasium.envs.mujoco import MujocoEnv
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

gym.register_envs(ale_py)

# policy(observation, step index inside the episode, rng) -> action passed to env.step
Policy = Callable[[np.ndarray, int, np.random.Generator], Any]
# converts a raw gymnasium observation into the array that is stored
ObsFn = Callable[[Any], np.ndarray]
# reads extra per-state arrays (simulator state, rendered frame) from the env
Probe = Callable[[gym.Env], dict[str, np.ndarray]]
# recorded steps of a rollout, one list entry per transition
Record = dict[str, list[Any]]

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

D4RL_STEPS = 5000
D4RL_MAX_EPISODE_STEPS = 200
D4RL_SEED = 2
D4RL_METADATA: dict[str, Any] = {
    "algorithm": np.bytes_(b"sample-pd-controller"),
    "env_name": np.bytes_(b"Hopper-v5"),
    "max_episode_steps": np.int32(D4RL_MAX_EPISODE_STEPS),
    "seed": np.int32(D4RL_SEED),
}
D4RL_FILE = "hopper_d4rl.hdf5"
GZIP_LEVEL = 4  # h5py's default level, which D4RL and robomimic files were written with

ROBOMIMIC_FILE = "hopper_robomimic.hdf5"
ROBOMIMIC_DEMOS = 6
ROBOMIMIC_VALID_DEMOS = 1  # the last demos form mask/valid, the others mask/train
ROBOMIMIC_STEPS = 500  # enough for ROBOMIMIC_DEMOS complete episodes
ROBOMIMIC_SEED = 20
ROBOMIMIC_IMAGE_KEY = "camera_image"
# passed to gymnasium.make and recorded in data.attrs["env_args"]
ROBOMIMIC_ENV_KWARGS: dict[str, Any] = {
    "max_episode_steps": 120,
    "render_mode": "rgb_array",
    "width": 32,
    "height": 32,
}
ROBOMIMIC_GYM_TYPE = 2  # robomimic EnvType.GYM_TYPE (1 is robosuite)


# --------------------------------------------------------------------------- observations


def to_float32(obs: np.ndarray) -> np.ndarray:
    """Cast a MuJoCo float64 observation to float32 (done once, when the step is stored)."""
    return np.asarray(obs, dtype=np.float32)


def downsample_frame(frame: np.ndarray) -> np.ndarray:
    """[210, 160] uint8 grayscale frame -> [1, 53, 40] uint8 by striding."""
    return np.ascontiguousarray(frame[None, ::PONG_STRIDE, ::PONG_STRIDE])


def mujoco_state(env: gym.Env) -> dict[str, np.ndarray]:
    """Copies of the simulator's ``qpos`` and ``qvel`` (float64)."""
    sim = env.unwrapped
    assert isinstance(sim, MujocoEnv)
    return {"qpos": sim.data.qpos.copy(), "qvel": sim.data.qvel.copy()}


def mujoco_state_and_frame(env: gym.Env) -> dict[str, np.ndarray]:
    """``mujoco_state`` plus the frame of the env's default camera, uint8 [H, W, 3]."""
    return {**mujoco_state(env), ROBOMIMIC_IMAGE_KEY: np.ascontiguousarray(env.render())}


def stack_extras(extras: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-step probe dicts -> one stacked array per key."""
    return {key: np.stack([extra[key] for extra in extras]) for key in extras[0]}


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


def collect(
    env: gym.Env,
    policy: Policy,
    steps: int,
    seed: int,
    *,
    obs_fn: ObsFn = to_float32,
    probe: Probe | None = None,
    first_traj_id: int = 0,
) -> Record:
    """Run ``steps`` transitions with auto-reset and record them step by step.

    ``probe(env)``, if given, is read for every state: its values before step t are recorded
    under ``"extra"`` and after step t (before any reset) under ``"next_extra"``.
    """
    rng = np.random.default_rng(seed)
    obs = obs_fn(env.reset(seed=seed)[0])
    extra = probe(env) if probe else {}
    rec: Record = defaultdict(list)
    traj_id, ep_step = first_traj_id, 0
    for _ in range(steps):
        action = policy(obs, ep_step, rng)
        raw_next, reward, terminated, truncated, _ = env.step(action)
        next_obs = obs_fn(raw_next)
        next_extra = probe(env) if probe else {}
        for key, value in (
            ("obs", obs),
            ("action", action),
            ("next_obs", next_obs),
            ("reward", reward),
            ("terminated", terminated),
            ("truncated", truncated),
            ("traj_id", traj_id),
            ("extra", extra),
            ("next_extra", next_extra),
        ):
            rec[key].append(value)
        if terminated or truncated:
            obs, traj_id, ep_step = obs_fn(env.reset()[0]), traj_id + 1, 0
            extra = probe(env) if probe else {}
        else:
            obs, extra, ep_step = next_obs, next_extra, ep_step + 1
    return rec


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
    rec = collect(env, policy, steps, seed, obs_fn=obs_fn, first_traj_id=first_traj_id)
    return to_ted(rec, obs_key)


def to_ted(rec: Record, obs_key: str) -> TensorDict:
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


def make_d4rl_hopper() -> dict[str, np.ndarray]:
    """Hopper transitions as D4RL rows, keyed by dataset path; infos are read before each step."""
    with gym.make("Hopper-v5", max_episode_steps=D4RL_MAX_EPISODE_STEPS) as env:
        rec = collect(env, hopper_policy, D4RL_STEPS, D4RL_SEED, probe=mujoco_state)
    terminated = np.array(rec["terminated"], dtype=bool)
    truncated = np.array(rec["truncated"], dtype=bool)
    infos = stack_extras(rec["extra"])
    return {
        "observations": np.stack(rec["obs"]),
        "next_observations": np.stack(rec["next_obs"]),
        "actions": np.stack(rec["action"]),
        "rewards": np.array(rec["reward"], dtype=np.float32),
        # D4RL's collector records a timeout, not a terminal, when both happen on one step
        "terminals": terminated & ~truncated,
        "timeouts": truncated,
        "infos/qpos": infos["qpos"],
        "infos/qvel": infos["qvel"],
    }


def make_robomimic_hopper() -> list[dict[str, np.ndarray]]:
    """The first ROBOMIMIC_DEMOS complete Hopper episodes, rendered, one robomimic demo each."""
    with gym.make("Hopper-v5", **ROBOMIMIC_ENV_KWARGS) as env:
        rec = collect(
            env, hopper_policy, ROBOMIMIC_STEPS, ROBOMIMIC_SEED, probe=mujoco_state_and_frame
        )
    ends = np.flatnonzero(np.array(rec["terminated"]) | np.array(rec["truncated"]))
    assert len(ends) >= ROBOMIMIC_DEMOS, "raise ROBOMIMIC_STEPS"
    starts = [0, *(ends[:-1] + 1)]
    bounds = zip(starts[:ROBOMIMIC_DEMOS], ends[:ROBOMIMIC_DEMOS], strict=True)
    return [robomimic_demo(rec, slice(start, end + 1)) for start, end in bounds]


def robomimic_demo(rec: Record, steps: slice) -> dict[str, np.ndarray]:
    """One episode in robomimic's per-demo layout, keyed by path inside ``data/demo_<i>``."""
    obs, next_obs = stack_extras(rec["extra"][steps]), stack_extras(rec["next_extra"][steps])
    dones = np.zeros(len(obs["qpos"]), dtype=np.int64)
    dones[-1] = 1
    return {
        "actions": np.stack(rec["action"][steps]).astype(np.float64),
        "rewards": np.array(rec["reward"][steps], dtype=np.float64),
        "dones": dones,
        "states": np.concatenate([obs["qpos"], obs["qvel"]], axis=1),
        **{f"obs/{key}": value for key, value in obs.items()},
        **{f"next_obs/{key}": value for key, value in next_obs.items()},
    }


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


def check_d4rl(data: dict[str, np.ndarray]) -> None:
    """Assert D4RL's row invariants and that ``infos`` hold the state of each observation."""
    obs, terminals, timeouts = data["observations"], data["terminals"], data["timeouts"]
    assert terminals.any() and timeouts.any(), "need both kinds of episode end"
    assert not (terminals & timeouts).any()
    within = ~(terminals | timeouts)[:-1]  # row t and t+1 belong to the same episode
    assert np.array_equal(data["next_observations"][:-1][within], obs[1:][within]), "obs mismatch"
    # Hopper-v5 observes qpos[1:] and clip(qvel, -10, 10), in float64, cast once to float32
    qvel = np.clip(data["infos/qvel"], -10.0, 10.0)
    state = np.concatenate([data["infos/qpos"][:, 1:], qvel], axis=1).astype(np.float32)
    assert np.array_equal(state, obs), "infos/qpos, infos/qvel out of step with observations"


def check_robomimic(demos: list[dict[str, np.ndarray]]) -> None:
    """Assert robomimic's per-demo invariants: obs/next_obs shifted by one, done at the end."""
    for demo in demos:
        steps = len(demo["actions"])
        assert demo["dones"].tolist() == [0] * (steps - 1) + [1]
        states = np.concatenate([demo["obs/qpos"], demo["obs/qvel"]], axis=1)
        assert np.array_equal(demo["states"], states)
        assert demo[f"obs/{ROBOMIMIC_IMAGE_KEY}"].dtype == np.uint8
        for key in (key for key in demo if key.startswith("obs/")):
            next_value = demo["next_" + key]
            assert len(demo[key]) == len(next_value) == steps, key
            assert np.array_equal(next_value[:-1], demo[key][1:]), f"{key} mismatch"


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


@dataclass
class H5Layout:
    """What an HDF5 file holds: datasets by path, which of them are gzipped, group attributes."""

    datasets: dict[str, Any]
    gzipped: set[str]
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)


def d4rl_layout(data: dict[str, np.ndarray]) -> H5Layout:
    """Rows gzipped at the root and under ``infos/``, small scalars under ``metadata/``."""
    metadata = {f"metadata/{name}": value for name, value in D4RL_METADATA.items()}
    return H5Layout({**data, **metadata}, gzipped=set(data))


def robomimic_layout(demos: list[dict[str, np.ndarray]]) -> H5Layout:
    """``data/demo_<i>/...`` (observations gzipped), ``data`` attributes and train/valid masks."""
    names = [f"demo_{index}" for index in range(len(demos))]
    datasets = {
        f"data/{name}/{key}": value
        for name, demo in zip(names, demos, strict=True)
        for key, value in demo.items()
    }
    split = len(names) - ROBOMIMIC_VALID_DEMOS
    datasets["mask/train"] = np.array(names[:split], dtype="S")
    datasets["mask/valid"] = np.array(names[split:], dtype="S")
    env_args = {
        "env_name": "Hopper-v5",
        "type": ROBOMIMIC_GYM_TYPE,
        "env_kwargs": ROBOMIMIC_ENV_KWARGS,
    }
    attrs: dict[str, dict[str, Any]] = {
        "data": {
            "total": sum(len(demo["actions"]) for demo in demos),
            "env_args": json.dumps(env_args, indent=4),
        },
    }
    for name, demo in zip(names, demos, strict=True):
        attrs[f"data/{name}"] = {"num_samples": len(demo["actions"])}
    gzipped = {path for path in datasets if "/obs/" in path or "/next_obs/" in path}
    return H5Layout(datasets, gzipped, attrs)


def save_hdf5(layout: H5Layout, path: Path) -> None:
    """Write and re-check the layout; gzipped datasets get h5py's automatic chunk shape."""
    with h5py.File(path, "w") as f:
        for name, value in layout.datasets.items():
            if name in layout.gzipped:
                f.create_dataset(name, data=value, compression="gzip", compression_opts=GZIP_LEVEL)
            else:
                f.create_dataset(name, data=value)
        for group, attrs in layout.attrs.items():
            f[group].attrs.update(attrs)
    check_hdf5(layout, path)


def h5_datasets(group: h5py.Group) -> dict[str, h5py.Dataset]:
    """Every dataset below ``group``, keyed by path."""
    found: dict[str, h5py.Dataset] = {}

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset):
            found[name] = obj

    group.visititems(visit)
    return found


def check_hdf5(layout: H5Layout, path: Path) -> None:
    """Re-open the file: exactly the layout's datasets and attributes, same dtypes and values."""
    with h5py.File(path, "r") as f:
        stored = h5_datasets(f)
        assert sorted(stored) == sorted(layout.datasets), sorted(stored)
        for name, value in layout.datasets.items():
            dset, expected = stored[name], np.asarray(value)
            assert dset.dtype == expected.dtype and np.array_equal(dset[()], expected), name
            gzipped = name in layout.gzipped
            assert dset.compression == ("gzip" if gzipped else None), name
            assert (dset.chunks is not None) == gzipped, name
        for group, attrs in layout.attrs.items():
            assert sorted(f[group].attrs) == sorted(attrs), group
            for key, value in attrs.items():
                assert f[group].attrs[key] == value, (group, key)


def write_hdf5(layout: H5Layout, path: Path, summary: str) -> int:
    """(Re)write and summarise one HDF5 file; return its size in bytes."""
    path.unlink(missing_ok=True)
    save_hdf5(layout, path)
    size = disk_bytes(path)
    print(f"{path}: {summary}, {size} bytes")
    return size


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


def use_headless_gl() -> None:
    """Render MuJoCo off-screen through EGL unless MUJOCO_GL already names a backend."""
    os.environ.setdefault("MUJOCO_GL", "egl")


def write_d4rl(out: Path) -> int:
    data = make_d4rl_hopper()
    check_d4rl(data)
    terminals, timeouts = int(data["terminals"].sum()), int(data["timeouts"].sum())
    summary = f"{len(data['observations'])} rows, terminals {terminals}, timeouts {timeouts}"
    return write_hdf5(d4rl_layout(data), out / D4RL_FILE, summary)


def write_robomimic(out: Path) -> int:
    demos = make_robomimic_hopper()
    check_robomimic(demos)
    lengths = [len(demo["actions"]) for demo in demos]
    summary = f"{len(demos)} demos of {lengths} steps"
    return write_hdf5(robomimic_layout(demos), out / ROBOMIMIC_FILE, summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    route_mujoco_warnings()
    use_headless_gl()

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
    total += write_d4rl(out) + write_robomimic(out)
    print(f"total: {total} bytes")
    assert total < 5_000_000, "sample data must stay under 5 MB"


if __name__ == "__main__":
    main()
