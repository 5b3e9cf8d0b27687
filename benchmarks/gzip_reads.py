"""Training reads of a compressed D4RL file as D4RL ships it: gzip, h5py's default chunks.

    python benchmarks/gzip_reads.py [--rows 1000000] [--batches 300] [--h5py-batches 20]

D4RL writes each dataset whole with ``create_dataset(name, data=..., compression="gzip")``, so
h5py picks the chunks: ``(15625, 1)`` for 1 M observations of 11 float32 columns, one column
per chunk. A random row then costs a decode of every column's chunk. The file here has
hopper-medium-v2's layout (``tests/realistic.py``'s ``write_d4rl_v2``: observations,
next_observations, actions, rewards, terminals, timeouts, ``infos/*``, ``metadata/`` with the
behaviour policy's weights), its rows the synthetic episodes of ``inputs.py`` (real Hopper-v5
episodes of varying length, each with its own noise: no row repeats), built once and cached.

It is compressed twice (``compress`` and ``compress --pack``), then, in this one process, with
the files warm: random batches of 256 rows (indices drawn once with a fixed seed, the same for
every reader) read through ``open_dataset`` of each output (every key, next observations
rebuilt, every block checked on its first read), and sorted h5py reads of the gzip original
(``f[name][np.unique(idx)]`` for each of its six transition datasets, h5py's own chunk cache).
Reported per reader: seconds of the first batch (the reader just opened: its checks and first
decodes), then batches per second over the next batches; and the ratio compressed / packed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
from inputs import D4RL_KEYS, blocks, load_pool
from measure import dataset_bytes, remove
from run import PYTHON

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BATCH = 256
MB = 10**6
SEED = 41
#: Seconds of the Hopper-v5 model's step, for the x positions of ``infos/qpos``.
DT = 0.008
Reader = Callable[[np.ndarray], dict[str, np.ndarray]]


def build(root: Path, rows: int) -> Path:
    """The gzip D4RL file of ``rows`` rows, built unless cached (written to a temporary name
    first, so that a cached one is complete)."""
    from tests.realistic import Rollout, write_d4rl_v2

    path = root / f"d4rl-gzip-{rows}.hdf5"
    if path.exists():
        return path
    root.mkdir(parents=True, exist_ok=True)
    parts = list(blocks(load_pool(root), rows, SEED))
    col = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    obs = col[("observation",)]
    # Hopper's observation is qpos[1:] then qvel: qpos[0], the x position, is what the
    # forward velocity integrates to within each episode.
    traj = col[("collector", "traj_ids")]
    starts = np.flatnonzero(np.r_[True, traj[1:] != traj[:-1]])
    x = np.cumsum(obs[:, 5] * DT)
    x -= np.repeat(x[starts] - obs[starts, 5] * DT, np.diff(np.r_[starts, rows]))
    rng = np.random.default_rng(SEED)
    flat = {name: col[key] for name, key in D4RL_KEYS.items()}
    rollout = Rollout(
        observations=obs,
        next_observations=flat["next_observations"],
        actions=flat["actions"],
        rewards=flat["rewards"][:, 0],
        terminals=flat["terminals"][:, 0],
        timeouts=flat["timeouts"][:, 0],
        qpos=np.column_stack([x, obs[:, :5]]).astype(np.float32),
        qvel=obs[:, 5:].copy(),
        log_probs=(-0.5 * rng.chisquare(3, rows) - 0.6).astype(np.float32),
        starts=starts.tolist(),
    )
    partial = path.with_suffix(".partial")
    write_d4rl_v2(rollout, partial)
    partial.rename(path)
    return path


def compress(src: Path, out: Path, *flags: str) -> float:
    """Seconds of ``obsdelta compress SRC -o OUT FLAGS``."""
    start = time.perf_counter()
    argv = [PYTHON, "-m", "obsdelta_cli", "compress", str(src), "-o", str(out), "-f", "-q"]
    subprocess.run([*argv, *flags], check=True)
    return time.perf_counter() - start


def obsdelta_reader(path: Path) -> Reader:
    from obsdelta_cli import open_dataset

    data = open_dataset(path)

    def read(idx: np.ndarray) -> dict[str, np.ndarray]:
        batch = data[idx]
        return {
            "observations": batch["observation"].numpy(),
            "next_observations": batch["next", "observation"].numpy(),
            "actions": batch["action"].numpy(),
        }

    return read


def h5py_reader(path: Path) -> Reader:
    handle = h5py.File(path, "r")
    names = list(D4RL_KEYS)

    def read(idx: np.ndarray) -> dict[str, np.ndarray]:
        rows, inverse = np.unique(idx, return_inverse=True)
        return {name: handle[name][rows][inverse] for name in names}

    return read


def rate(read: Reader, batches: np.ndarray) -> tuple[float, float, dict[str, np.ndarray]]:
    """Seconds of the first batch, batches per second of the others, and the first batch."""
    start = time.perf_counter()
    first = read(batches[0])
    first_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for idx in batches[1:]:
        read(idx)
    return first_seconds, (len(batches) - 1) / (time.perf_counter() - start), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=300, help="batches per obsdelta reader")
    parser.add_argument("--h5py-batches", type=int, default=20, help="batches of h5py's reads")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("out"))
    args = parser.parse_args()
    root, scratch = args.out.resolve() / "inputs", args.out.resolve() / "gzip_reads"
    remove(scratch)
    scratch.mkdir(parents=True)
    try:
        start = time.perf_counter()
        src = build(root, args.rows)
        print(f"input: {src.name}, {dataset_bytes(src) / MB:.1f} MB", end="")
        print(f" ({time.perf_counter() - start:.1f} s to build or find)")
        with h5py.File(src, "r") as f:
            print(f"observations: {f['observations'].shape}, chunks {f['observations'].chunks}")
        small, packed = scratch / "small.hdf5", scratch / "packed.h5"
        for out, flags in ((small, ()), (packed, ("--pack",))):
            seconds = compress(src, out, *flags)
            size = dataset_bytes(out) / MB
            print(f"compress {' '.join(flags)}: {seconds:.1f} s, {size:.1f} MB")
        rng = np.random.default_rng(SEED)
        batches = rng.integers(0, args.rows, (args.batches + 1, BATCH))
        readers = {
            "compressed (gzip chunks), open_dataset": (obsdelta_reader(small), batches),
            "packed, open_dataset": (obsdelta_reader(packed), batches),
            "gzip original, sorted h5py": (h5py_reader(src), batches[: args.h5py_batches + 1]),
        }
        rates, firsts = {}, {}
        for name, (read, indices) in readers.items():
            first_seconds, per_second, firsts[name] = rate(read, indices)
            rates[name] = per_second
            print(f"{name}: first batch {first_seconds:.2f} s, then {per_second:.1f} batches/s")
        reference = firsts["gzip original, sorted h5py"]
        for name, got in firsts.items():
            for key, values in got.items():
                if not np.array_equal(values, reference[key]):
                    raise SystemExit(f"{name}: {key} differs from the original")
    finally:
        remove(scratch)
    ratio = rates["compressed (gzip chunks), open_dataset"] / rates["packed, open_dataset"]
    print(f"\nratio compressed / packed: {ratio:.2f}x (target >= 0.5x)")
    print("\n| reader | batches/s |\n|---|---|")
    for name, per_second in rates.items():
        print(f"| {name} | {per_second:.1f} |")


if __name__ == "__main__":
    main()
