"""``compress --pack`` against the zstd CLI on the same non-repeating inputs, in one run.

Inputs: Pong frames from real ale-py rollouts (random policy, grayscale, a TED memmap folder)
and a Hopper-like D4RL file (real Hopper-v5 steps, tests/realistic.py). For each: the packed
size and time, and ``tar | zstd -3 -T1`` and ``tar | zstd -19 --long=27`` sizes and times.
Then training reads from the packed Hopper file against sorted h5py reads of the plain one, and
a behaviour-cloning loop fed by each (``reads.py``, in its own process, warm cache).

    python benchmarks/pack.py --pong-steps 3000 --hopper-rows 20000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pong_ted(steps: int, path: Path, seed: int = 0) -> Path:
    """A TED memmap of ``steps`` real Pong transitions (grayscale frames, random actions)."""
    import ale_py
    import gymnasium as gym
    from tensordict import TensorDict

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", obs_type="grayscale")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    frames, nexts, actions, rewards, dones = [], [], [], [], []
    for _ in range(steps):
        action = int(rng.integers(env.action_space.n))
        nxt, reward, term, trunc, _ = env.step(action)
        frames.append(obs)
        nexts.append(nxt)
        actions.append(action)
        rewards.append(reward)
        dones.append(term or trunc)
        obs = env.reset()[0] if term or trunc else nxt
    done = torch.tensor(dones).unsqueeze(-1)
    td = TensorDict(
        {
            "pixels": torch.from_numpy(np.stack(frames)),
            "action": torch.tensor(actions),
            "done": torch.zeros_like(done),
            "next": {
                "pixels": torch.from_numpy(np.stack(nexts)),
                "reward": torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1),
                "done": done,
            },
        },
        batch_size=[steps],
    )
    td.memmap(path)
    return path


def hopper_d4rl(rows: int, path: Path) -> Path:
    from tests.realistic import hopper_rollout, write_d4rl_v2

    write_d4rl_v2(hopper_rollout(rows), path)
    return path


def zstd(src: Path, level: list[str]) -> tuple[int, float]:
    """Bytes and seconds of ``tar | zstd`` (or ``zstd`` on a file)."""
    start = time.perf_counter()
    if src.is_dir():
        tar = subprocess.Popen(
            ["tar", "-C", str(src.parent), "-cf", "-", src.name], stdout=subprocess.PIPE
        )
        out = subprocess.run(
            ["zstd", *level, "-c"], stdin=tar.stdout, capture_output=True, check=True
        )
        tar.wait()
    else:
        out = subprocess.run(["zstd", *level, "-c", str(src)], capture_output=True, check=True)
    return len(out.stdout), time.perf_counter() - start


def raw_bytes(path: Path) -> int:
    from obsdelta_cli.formats import disk_size

    return disk_size(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pong-steps", type=int, default=3000)
    parser.add_argument("--hopper-rows", type=int, default=20000)
    args = parser.parse_args()
    from obsdelta_cli import compress

    work = Path(tempfile.mkdtemp(prefix="obsdelta-pack-bench-"))
    try:
        inputs = {
            "Pong TED memmap": pong_ted(args.pong_steps, work / "pong"),
            "Hopper D4RL": hopper_d4rl(args.hopper_rows, work / "hopper.hdf5"),
        }
        print("| input | raw | --pack | zstd -3 -T1 | zstd -19 --long=27 |")
        print("|---|---|---|---|---|")
        for name, src in inputs.items():
            raw = raw_bytes(src)
            start = time.perf_counter()
            result = compress(src, work / f"{src.name}.packed.h5", pack=True)
            packed_s = time.perf_counter() - start
            z3, z3_s = zstd(src, ["-3", "-T1"])
            z19, z19_s = zstd(src, ["-19", "--long=27", "-T1"])
            print(
                f"| {name} | {raw / 1e6:.1f} MB "
                f"| {raw / result.bytes_after:.2f}x, {packed_s:.1f} s "
                f"| {raw / z3:.2f}x, {z3_s:.1f} s | {raw / z19:.2f}x, {z19_s:.1f} s |"
            )
        hopper = inputs["Hopper D4RL"]
        reads = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("reads.py")), "d4rl", str(hopper),
             str(work / f"{hopper.name}.packed.h5"), "--batches", "1000", "--bc-steps", "500"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        r = json.loads(reads.stdout.splitlines()[-1])
        print()
        print(
            "| packed Hopper D4RL | open_dataset vs sorted h5py reads | BC loop, packed / plain |"
        )
        print("|---|---|---|")
        print(
            f"| {r['rows']:,} rows | {r['packed_rows_per_s']:,.0f} vs "
            f"{r['plain_rows_per_s']:,.0f} rows/s: "
            f"{r['packed_rows_per_s'] / r['plain_rows_per_s']:.2f}x "
            f"| {r['packed_bc_seconds']:.2f} / {r['plain_bc_seconds']:.2f} s: "
            f"{r['packed_bc_seconds'] / r['plain_bc_seconds']:.2f}x |"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
