"""Benchmark inputs: non-repeating Hopper-v5 transitions of a given size, built block by block.

Simulating 2 GB of transitions (about 17 M steps) with MuJoCo takes about 30 minutes on one core
here (about 10,000 Hopper-v5 steps per second), so inputs are made in two stages:

1. **A pool of real episodes**, simulated once and cached: gymnasium's ``Hopper-v5``, each
   episode reset with its own seed and driven by a Gaussian policy whose standard deviation is
   drawn per episode (log-uniform in [0.03, 1]), clipped to the action bounds, until the episode
   ends (``POOL_STEPS`` steps in all, about 4,000 episodes of 9 to 150 steps).
2. **Synthetic episodes built from the pool**, as many as the size asks: each one is a pool
   episode drawn at random, whose states (the L observations and the final next observation)
   get a per-episode, per-dimension scale (uniform in [0.8, 1.25]) and offset (normal, 0.1
   standard deviation of that dimension), plus a Gaussian random walk with a per-episode,
   per-dimension step (0.1% to 2% of that dimension's standard deviation). Actions get normal
   noise (sd 0.05, clipped to [-1, 1]) and rewards a per-episode scale and normal noise (sd
   0.01). Episode lengths and end flags are those of the pool episode.

Because the observation and next observation rows of an episode are cut from one transformed
sequence of states, ``next_obs[t]`` is bit-identical to ``obs[t+1]`` inside an episode, as in
a real collection, and differs at episode ends. Every float carries fresh noise, so no byte
sequence repeats: ``zstd -1`` compresses an input about as much as it compresses the untouched
pool (``run.py`` prints both). The last row of an input that ends inside an episode is marked
truncated.

Everything is drawn from ``numpy.random.default_rng`` with fixed seeds: an input is the same on
every machine with the same numpy. Inputs are written block by block (``BLOCK_ROWS`` rows) into
files created at full size, so memory stays bounded whatever the size, and cached under
``OUT/inputs`` with a sibling ``.json`` marker written last; a marker from another ``RECIPE``
means a rebuild.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from measure import dataset_bytes, remove

RECIPE = 2  # bump when the way inputs are built changes: cached inputs are then rebuilt
ENV_ID = "Hopper-v5"
POOL_STEPS = 200_000
POOL_SEED = 20_000
BLOCK_ROWS = 1 << 16  # rows generated and written at a time
GB = 10**9
TED, D4RL = "ted", "d4rl"
LAYOUTS = (TED, D4RL)
OBS_DIM, ACT_DIM = 11, 3
# TED keys -> (dtype, trailing shape); the layout of sample_data/hopper_ted.
TED_KEYS: dict[tuple[str, ...], tuple[str, tuple[int, ...]]] = {
    ("observation",): ("float32", (OBS_DIM,)),
    ("action",): ("float32", (ACT_DIM,)),
    ("done",): ("bool", (1,)),
    ("terminated",): ("bool", (1,)),
    ("truncated",): ("bool", (1,)),
    ("next", "observation"): ("float32", (OBS_DIM,)),
    ("next", "reward"): ("float32", (1,)),
    ("next", "done"): ("bool", (1,)),
    ("next", "terminated"): ("bool", (1,)),
    ("next", "truncated"): ("bool", (1,)),
    ("collector", "traj_ids"): ("int64", ()),
}
D4RL_KEYS: dict[str, tuple[str, ...]] = {
    "observations": ("observation",),
    "next_observations": ("next", "observation"),
    "actions": ("action",),
    "rewards": ("next", "reward"),
    "terminals": ("next", "terminated"),
    "timeouts": ("next", "truncated"),
}

Columns = dict[tuple[str, ...], np.ndarray]


@dataclass(frozen=True)
class BenchInput:
    """One input dataset on disk."""

    layout: str
    size_gb: float
    path: Path
    rows: int
    bytes: int
    build_seconds: float
    cached: bool
    seed: int

    @property
    def label(self) -> str:
        name = "TED memmap" if self.layout == TED else "D4RL HDF5"
        return f"{name} {self.size_gb:g} GB"


# -- the pool of real episodes ------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """Real episodes: ``states`` holds L+1 states per episode (observations, then the last next
    observation); ``actions``/``rewards`` hold L rows per episode."""

    states: np.ndarray  # [sum(L + 1), OBS_DIM] float32
    actions: np.ndarray  # [sum(L), ACT_DIM] float32
    rewards: np.ndarray  # [sum(L)] float32
    lengths: np.ndarray  # [E] int64
    terminated: np.ndarray  # [E] bool: the episode ended by termination, not a time limit

    @property
    def step_starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    @property
    def state_starts(self) -> np.ndarray:
        return self.step_starts + np.arange(len(self.lengths))


def simulate_pool(steps: int = POOL_STEPS, seed: int = POOL_SEED) -> Pool:
    """Roll out Hopper-v5 under Gaussian policies until ``steps`` transitions are collected."""
    import gymnasium as gym

    env = gym.make(ENV_ID)
    rng = np.random.default_rng(seed)
    states, actions, rewards, lengths, terminated = [], [], [], [], []
    total, episode = 0, 0
    while total < steps:
        obs, _ = env.reset(seed=seed + episode)
        std = math.exp(rng.uniform(math.log(0.03), 0.0))
        ep_states, ep_actions, ep_rewards = [obs], [], []
        while True:
            action = np.clip(rng.normal(0.0, std, ACT_DIM), -1.0, 1.0).astype(np.float32)
            obs, reward, term, trunc, _ = env.step(action)
            ep_states.append(obs)
            ep_actions.append(action)
            ep_rewards.append(reward)
            if term or trunc:
                break
        states.append(np.asarray(ep_states, np.float32))
        actions.append(np.asarray(ep_actions, np.float32))
        rewards.append(np.asarray(ep_rewards, np.float32))
        lengths.append(len(ep_actions))
        terminated.append(bool(term))
        total += len(ep_actions)
        episode += 1
    env.close()
    return Pool(
        np.concatenate(states),
        np.concatenate(actions),
        np.concatenate(rewards),
        np.asarray(lengths, np.int64),
        np.asarray(terminated, bool),
    )


def load_pool(root: Path) -> Pool:
    """The pool, simulated once and cached as ``pool-r<RECIPE>.npz``."""
    path = root / f"pool-r{RECIPE}.npz"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        pool = simulate_pool()
        partial = path.with_suffix(".partial.npz")
        np.savez(partial, **pool.__dict__)
        partial.rename(path)
        print(f"simulated {ENV_ID} pool in {time.perf_counter() - start:.0f} s", flush=True)
    with np.load(path) as saved:
        return Pool(**{name: saved[name] for name in saved.files})


# -- synthetic episodes -------------------------------------------------------------------------


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(s, s + n)`` for each start and length."""
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return offsets + np.arange(int(lengths.sum()))


def episodes(pool: Pool, rng: np.random.Generator | None, picks: np.ndarray) -> Columns:
    """TED columns (without trajectory ids) of the pool episodes ``picks``, each transformed
    with its own random draws; ``rng=None`` copies them untouched (the real reference)."""
    lengths = pool.lengths[picks]
    sizes = lengths + 1
    states = pool.states[ranges(pool.state_starts[picks], sizes)]
    steps = ranges(pool.step_starts[picks], lengths)
    actions, rewards = pool.actions[steps], pool.rewards[steps]
    if rng is not None:
        count, std = len(picks), pool.states.std(axis=0)
        row = np.repeat(np.arange(count), sizes)
        scale = rng.uniform(0.8, 1.25, (count, OBS_DIM))
        offset = rng.normal(0.0, 0.1, (count, OBS_DIM)) * std
        step = rng.uniform(0.001, 0.02, (count, OBS_DIM)) * std
        noise = rng.standard_normal(states.shape) * step[row]
        walk = np.cumsum(noise, axis=0)
        first = np.cumsum(sizes) - sizes
        walk -= np.repeat(walk[first] - noise[first], sizes, axis=0)
        states = (states * scale[row] + offset[row] + walk).astype(np.float32)
        noisy = actions + rng.normal(0.0, 0.05, actions.shape)
        actions = np.clip(noisy, -1.0, 1.0).astype(np.float32)
        reward_scale = np.repeat(rng.uniform(0.9, 1.1, count), lengths)
        noisy = rewards * reward_scale + rng.normal(0.0, 0.01, rewards.shape)
        rewards = noisy.astype(np.float32)
    last_state = np.zeros(len(states), bool)
    last_state[np.cumsum(sizes) - 1] = True
    first_state = np.zeros(len(states), bool)
    first_state[np.cumsum(sizes) - sizes] = True
    last_step = np.zeros(len(actions), bool)
    last_step[np.cumsum(lengths) - 1] = True
    terminated = last_step & np.repeat(pool.terminated[picks], lengths)
    truncated = last_step & ~terminated
    false = np.zeros((len(actions), 1), bool)
    return {
        ("observation",): states[~last_state],
        ("action",): actions,
        ("done",): false,
        ("terminated",): false,
        ("truncated",): false,
        ("next", "observation"): states[~first_state],
        ("next", "reward"): rewards[:, None],
        ("next", "done"): (terminated | truncated)[:, None],
        ("next", "terminated"): terminated[:, None],
        ("next", "truncated"): truncated[:, None],
        ("episode",): np.repeat(np.arange(len(picks)), lengths),
    }


def blocks(pool: Pool, rows: int, seed: int | None) -> Iterator[Columns]:
    """``rows`` rows of synthetic episodes (``seed=None``: the pool itself, in order), in blocks
    of ``BLOCK_ROWS``; the last row is marked truncated if it ends inside an episode."""
    rng = None if seed is None else np.random.default_rng([RECIPE, seed])
    per_batch = max(1, int(BLOCK_ROWS / pool.lengths.mean()))
    pending: list[Columns] = []
    have, done, next_traj, next_pick = 0, 0, 0, 0
    while done < rows:
        want = min(BLOCK_ROWS, rows - done)
        while have < want:
            if rng is None:
                picks = np.arange(next_pick, next_pick + per_batch) % len(pool.lengths)
                next_pick += per_batch
            else:
                picks = rng.integers(0, len(pool.lengths), per_batch)
            batch = episodes(pool, rng, picks)
            batch[("collector", "traj_ids")] = batch.pop(("episode",)) + next_traj
            next_traj += per_batch
            pending.append(batch)
            have += len(batch[("action",)])
        merged = {key: np.concatenate([b[key] for b in pending]) for key in pending[0]}
        block = {key: value[:want] for key, value in merged.items()}
        pending = [{key: value[want:] for key, value in merged.items()}]
        have -= want
        done += want
        if done == rows:
            end_inside = not block[("next", "done")][-1, 0]
            block[("next", "truncated")][-1, 0] |= end_inside
            block[("next", "done")][-1, 0] |= end_inside
        yield block


# -- writers ------------------------------------------------------------------------------------


def row_bytes(layout: str) -> int:
    """Bytes one row takes in ``layout``."""

    def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
        return np.dtype(dtype).itemsize * math.prod(shape)

    if layout == TED:
        return sum(nbytes(*spec) for spec in TED_KEYS.values())
    flat = {key: spec for key, spec in TED_KEYS.items() if key in D4RL_KEYS.values()}
    return sum(nbytes(*spec) for spec in flat.values())


def rows_for(layout: str, size_gb: float) -> int:
    return math.ceil(size_gb * GB / row_bytes(layout))


def write_ted(path: Path, rows: int, source: Iterator[Columns]) -> None:
    """A TED memmap folder, as ``TensorDict.memmap`` writes it (``meta.json`` and one raw
    ``.memmap`` file per leaf): created at full size with ``memmap_like``, then filled."""
    import torch
    from tensordict import TensorDict

    def leaf(dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros((1, *shape), dtype=getattr(torch, dtype))

    template = TensorDict({k: leaf(*spec) for k, spec in TED_KEYS.items()}, batch_size=[1])
    out = template.expand(rows).memmap_like(path)
    start = 0
    for block in source:
        stop = start + len(block[("action",)])
        out[start:stop] = TensorDict(
            {key: torch.from_numpy(block[key]) for key in TED_KEYS}, batch_size=[stop - start]
        )
        start = stop


def write_d4rl(path: Path, rows: int, source: Iterator[Columns]) -> None:
    """A D4RL-layout HDF5 file: contiguous datasets, no chunks, no filters; per-step scalars
    are 1-D, as in D4RL."""
    with h5py.File(path, "w") as handle:
        datasets = {}
        for name, key in D4RL_KEYS.items():
            dtype, shape = TED_KEYS[key]
            shape = () if shape == (1,) else shape
            datasets[name] = handle.create_dataset(name, shape=(rows, *shape), dtype=dtype)
        start = 0
        for block in source:
            stop = start + len(block[("action",)])
            for name, key in D4RL_KEYS.items():
                array = block[key]
                datasets[name][start:stop] = array[:, 0] if datasets[name].ndim == 1 else array
            start = stop


WRITERS = {TED: write_ted, D4RL: write_d4rl}


def input_path(root: Path, layout: str, name: str) -> Path:
    return root / (f"{name}.hdf5" if layout == D4RL else name)


def read_marker(marker: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(marker.read_text()))
    except (OSError, ValueError):
        return {}


def ensure_input(
    root: Path, layout: str, size_gb: float, seed: int | None, name: str | None = None
) -> BenchInput:
    """The input for ``layout``, ``size_gb`` and ``seed`` (None: the real pool, untouched),
    built unless cached. A sibling ``<name>.json`` marks a complete input; it is written last."""
    pool = load_pool(root)
    label = "real" if seed is None else f"s{seed}"
    name = name or f"{layout}-{size_gb:g}GB-{label}"
    path = input_path(root, layout, name)
    marker = path.with_name(path.name + ".json")
    rows = rows_for(layout, size_gb)
    if seed is None:
        rows = min(rows, int(pool.lengths.sum()))
    recorded = read_marker(marker)
    cached = (
        recorded.get("recipe") == RECIPE
        and recorded.get("rows") == rows
        and recorded.get("seed") == seed
        and path.exists()
    )
    if not cached:
        remove(marker)
        remove(path)
        root.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        WRITERS[layout](path, rows, blocks(pool, rows, seed))
        os.sync()
        recorded = {
            "recipe": RECIPE,
            "rows": rows,
            "seed": seed,
            "build_seconds": time.perf_counter() - start,
        }
        marker.write_text(json.dumps(recorded))
    size = dataset_bytes(path)
    return BenchInput(
        layout=layout,
        size_gb=size_gb if seed is not None else round(size / GB, 3),
        path=path,
        rows=rows,
        bytes=size,
        build_seconds=float(recorded["build_seconds"]),
        cached=cached,
        seed=-1 if seed is None else seed,
    )
