"""``compress --pack`` against the zstd CLI on every format ``--pack`` takes, in one run.

    python benchmarks/pack.py [--out benchmarks/out] [--repeat N] [--z19-max-mb 200] [--quick]
                              [--only NAME...] [--flat]

Every input is non-repeating data in the layout its format ships with:

- realistic sizes of every format: a TED memmap folder (the TorchRL collector layout of
  ``sample_data/hopper_ted``, 3,000 rows like the sample, and 100,000 rows), a TorchRL
  replay-buffer dump, a ``.pt`` file (``torch.save``) and a TED-HDF5 file (``td.to_h5``, gzip)
  of the same 100,000 rows, a D4RL
  v2 file (``hopper-medium-v2``'s layout, gzip, ``infos/*`` and ``metadata/*``; real Hopper-v5
  rollouts, ``tests/realistic.py``) and a robomimic file with two 84x84 camera keys;
- layouts of many short episodes, and with nothing to encode: a robomimic low-dim file of
  1,000 demos, a D4RL file without ``next_observations`` (AntMaze's layout) and a Minari file
  written by minari's ``DataCollector``;
- inputs of 300 MB and more for the speed check: Pong frames from real ale-py rollouts (random
  policy, grayscale, a TED memmap folder), and the contiguous D4RL file and TED memmap folder
  of ``run.py`` (``inputs.py``: real Hopper-v5 episodes, each with its own noise);

For each: the input's bytes on disk, then bytes and wall time of ``compress --pack`` (with
``--flat``: ``compress --pack --flat``, for the HDF5 inputs; the CLI, start-up included),
``zstd -3 -T1`` and ``zstd -19 --long=27 -T1`` (on a file; ``tar | zstd`` on a folder), each
timed as ``run.py`` times its commands (``Bench.time``: cold input, programs warm, the baselines
ending with ``&& sync`` as obsdelta flushes its own output; median of ``--repeat`` runs). ``zstd
-19`` takes minutes per 100 MB of float data here: inputs over ``--z19-max-mb`` skip it. Then
training reads from the packed D4RL v2 file against sorted h5py reads of the plain one, and a
behaviour-cloning loop fed by each (``reads.py``, warm cache).

Needs ale-py (``pip install -e ".[dev]"``) for the Pong input, torchrl for the replay-buffer
dump, and the ``zstd`` program.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from inputs import D4RL, TED, BenchInput, blocks, ensure_input, load_pool, write_ted
from measure import can_drop_caches, dataset_bytes, remove
from run import PYTHON, ZSTD, ZSTD_TAR, Bench, Timing, loadavg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MB = 10**6
#: ``zstd`` levels compared, as ``run.py``'s ``zstd -1 -T1`` command with these options.
LEVELS = {"zstd -3 -T1": "-3 -T1", "zstd -19 --long=27 -T1": "-19 --long=27 -T1"}


@dataclass(frozen=True)
class PackInput(BenchInput):
    """An input with its own row label."""

    name: str = ""

    @property
    def label(self) -> str:
        return self.name


Builder = Callable[[Path], Path]


# -- inputs ---------------------------------------------------------------------------------


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
        action = int(rng.integers(env.action_space.n))  # type: ignore[attr-defined]
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


def hopper_ted(rows: int, seed: int) -> Builder:
    """A TED memmap folder of ``rows`` non-repeating Hopper transitions (``inputs.py``)."""

    def build(path: Path) -> Path:
        pool = load_pool(path.parent)
        write_ted(path, rows, blocks(pool, rows, seed))
        return path

    return build


def from_ted(ted: Builder, write: Callable[..., Path]) -> Builder:
    """Another container of the TED that ``ted`` builds, written by ``tests/writers.py``."""

    def build(path: Path) -> Path:
        from tensordict import TensorDict

        source = ted(path.with_name(path.name + ".ted"))
        td = TensorDict.load_memmap(source).clone()
        out = write(td, path)
        remove(source)
        remove(path.parent / "scratch")  # the replay buffer's own working folder
        return out

    return build


def d4rl_v2(rows: int, next_observations: bool = True) -> Builder:
    def build(path: Path) -> Path:
        from tests.realistic import hopper_rollout, write_d4rl_v2

        return write_d4rl_v2(hopper_rollout(rows), path, next_observations=next_observations)

    return build


def robomimic(demos: int, image: int, steps: tuple[int, int] = (20, 40)) -> Builder:
    def build(path: Path) -> Path:
        from tests.realistic import write_robomimic_real

        return write_robomimic_real(path, demos=demos, image=image, steps=steps, cameras=image > 0)

    return build


def minari(steps: int) -> Builder:
    """A Minari dataset written by minari's ``DataCollector`` (Hopper-v5, random-gaussian
    policy: episodes of 48 steps on average); its ``main_data.hdf5``."""

    def build(path: Path) -> Path:
        from tests.realistic import write_minari_dataset

        return write_minari_dataset(steps, path, "hopper/random-v0")

    return build


def built(root: Path, name: str, label: str, suffix: str, build: Builder) -> PackInput:
    """The input ``name``, built unless a complete one is cached (its marker is written last)."""
    path = root / f"{name}{suffix}"
    marker = root / f"{name}.pack.json"
    start = time.perf_counter()
    cached = marker.exists() and path.exists()
    if not cached:
        remove(marker)
        remove(path)
        root.mkdir(parents=True, exist_ok=True)
        # A builder may put the input elsewhere (a Minari file lies deep in its datasets tree).
        path = build(path)
        marker.write_text(json.dumps({"seconds": time.perf_counter() - start, "path": str(path)}))
    recorded = json.loads(marker.read_text())
    path, seconds = Path(recorded.get("path", path)), recorded["seconds"]
    size = dataset_bytes(path)
    return PackInput(TED, size / 1e9, path, 0, size, seconds, cached, 0, label)


def large(item: BenchInput, label: str) -> PackInput:
    return PackInput(TED, item.size_gb, item.path, item.rows, item.bytes, 0.0, True, 0, label)


def inputs(root: Path, args: argparse.Namespace) -> list[PackInput]:
    """Every input of the table (realistic sizes of each format first, then the large ones)."""
    from tests.writers import write_pt, write_rb, write_ted_hdf5

    medium = hopper_ted(100_000, 12)
    realistic: list[tuple[str, str, str, Builder]] = [
        ("ted-3k", "TED memmap, Hopper, 3,000 rows", "", hopper_ted(3_000, 11)),
        ("ted-100k", "TED memmap, Hopper, 100,000 rows", "", medium),
        ("rb-100k", "TorchRL replay-buffer dump, 100,000 rows", "", from_ted(medium, write_rb)),
        (
            "pt-100k",
            "`.pt` (torch.save of a TensorDict), 100,000 rows",
            ".pt",
            from_ted(medium, write_pt),
        ),
        ("tedh5-100k", "TED-HDF5 (gzip), 100,000 rows", ".h5", from_ted(medium, write_ted_hdf5)),
        ("d4rl-v2-50k", "D4RL v2 (hopper-medium-v2 layout), 50,000 rows", ".hdf5", d4rl_v2(50_000)),
        ("robomimic-84", "robomimic, 100 demos, two 84x84 cameras", ".hdf5", robomimic(100, 84)),
        (
            "robomimic-low-1000",
            "robomimic low-dim, 1,000 demos of 40-80 steps",
            ".hdf5",
            robomimic(1000, 0, (40, 80)),
        ),
        (
            "d4rl-no-next-100k",
            "D4RL without `next_observations` (AntMaze-style), 100,000 rows",
            ".hdf5",
            d4rl_v2(100_000, next_observations=False),
        ),
        (
            "minari-100k",
            "Minari (`DataCollector`), 100,000 steps, 2,104 episodes",
            "",
            minari(100_000),
        ),
    ]
    realistic = [spec for spec in realistic if not args.only or spec[0] in args.only]
    items = [built(root, *spec) for spec in realistic]
    if args.quick:
        return items
    pong = f"Pong, {args.pong_steps:,} real ale-py steps (210x160 grayscale), TED memmap"
    if not args.only or "pong" in args.only:
        items.append(
            built(root, f"pong-{args.pong_steps}", pong, "", lambda p: pong_ted(args.pong_steps, p))
        )
    for layout, name in ((D4RL, "D4RL HDF5 (contiguous)"), (TED, "TED memmap")):
        if args.only and f"{layout}-large" not in args.only:
            continue
        item = ensure_input(root, layout, args.large_gb, 21 if layout == D4RL else 22)
        items.append(large(item, f"Hopper {name}, {item.bytes / MB:,.0f} MB, {item.rows:,} rows"))
    return items


# -- timing ---------------------------------------------------------------------------------


def zstd_argv(src: Path, out: Path, options: str) -> list[str]:
    """``run.py``'s ``zstd -1 -T1 ... && sync`` command with other ``options``."""
    script = (ZSTD_TAR if src.is_dir() else ZSTD).replace("-1 -T1", options)
    where = [str(src.parent), src.name] if src.is_dir() else [str(src)]
    return ["bash", "-c", script, "zstd", *where, str(out)]


def cell(t: Timing | None, item: BenchInput) -> str:
    if t is None or t.seconds is None or not t.output_bytes:
        return t.status if t is not None else "-"
    return f"{item.bytes / t.output_bytes:.2f}x, {t.seconds:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("out") / "pack")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--pong-steps", type=int, default=5000)
    parser.add_argument("--large-gb", type=float, default=0.5)
    parser.add_argument("--z19-max-mb", type=float, default=200)
    parser.add_argument("--quick", action="store_true", help="realistic sizes only")
    parser.add_argument("--no-reads", action="store_true", help="skip the training reads")
    parser.add_argument(
        "--flat", action="store_true", help="compress --pack --flat (HDF5 inputs of episodes)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only these inputs: names of realistic size, pong, d4rl-large, ted-large",
    )
    args = parser.parse_args()
    if shutil.which("zstd") is None:
        raise SystemExit("zstd is needed: apt-get update && apt-get install -y zstd")
    root, scratch = args.out.resolve() / "inputs", args.out.resolve() / "work"
    remove(scratch)
    scratch.mkdir(parents=True)
    obsdelta = [PYTHON, "-m", "obsdelta_cli"]
    bench = Bench(obsdelta, can_drop_caches(), args.repeat, scratch)
    load = loadavg()
    rows = []
    ours_name = "compress --pack" + (" --flat" if args.flat else "")
    try:
        items = inputs(root, args)
        for item in items:
            packed = scratch / f"{item.path.name}.packed.h5"
            argv = [*obsdelta, "compress", str(item.path), "-o", str(packed), "--pack", "-q"]
            argv += ["--flat"] if args.flat else []
            ours = bench.time(item, ours_name, argv, [item.path], packed)
            theirs: list[Timing | None] = []
            for name, options in LEVELS.items():
                if "-19" in options and item.bytes > args.z19_max_mb * MB:
                    theirs.append(None)
                    continue
                out = scratch / "z.zst"
                theirs.append(
                    bench.time(
                        item, name, zstd_argv(item.path, out, options), [item.path], out, keep=False
                    )
                )
            rows.append((item, ours, theirs))
            if "D4RL v2" not in item.label:
                remove(packed)
    finally:
        print()
        print(f"load average at the start: {load}; at the end: {loadavg()}")
        print()
        ours_col = "`--pack --flat`" if args.flat else "`--pack`"
        print(f"| input | raw | {ours_col} | `zstd -3 -T1` | `zstd -19 --long=27` |")
        print("|---|---|---|---|---|")
        for item, ours, theirs in rows:
            z3, z19 = theirs
            skipped = f"not run (over {args.z19_max_mb:g} MB)"
            print(
                f"| {item.label} | {item.bytes / MB:,.1f} MB | {cell(ours, item)} "
                f"| {cell(z3, item)} | {cell(z19, item) if z19 is not None else skipped} |"
            )
    d4rl = next((item for item, *_ in rows if "D4RL v2" in item.label), None)
    if d4rl is not None and not args.no_reads:
        reads_table(d4rl.path, scratch / f"{d4rl.path.name}.packed.h5")
    remove(scratch)


def reads_table(plain: Path, packed: Path) -> None:
    """Training reads and a behaviour-cloning loop: the packed file vs sorted h5py reads."""
    reads = subprocess.run(
        [PYTHON, str(Path(__file__).with_name("reads.py")), "d4rl", str(plain), str(packed),
         "--batches", "1000", "--bc-steps", "500"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    r = json.loads(reads.stdout.splitlines()[-1])
    print()
    print("| packed D4RL v2 | open_dataset vs sorted h5py reads | BC loop, packed / plain |")
    print("|---|---|---|")
    print(
        f"| {r['rows']:,} rows | {r['packed_rows_per_s']:,.0f} vs "
        f"{r['plain_rows_per_s']:,.0f} rows/s: "
        f"{r['packed_rows_per_s'] / r['plain_rows_per_s']:.2f}x "
        f"| {r['packed_bc_seconds']:.2f} / {r['plain_bc_seconds']:.2f} s: "
        f"{r['packed_bc_seconds'] / r['plain_bc_seconds']:.2f}x |"
    )


if __name__ == "__main__":
    main()
