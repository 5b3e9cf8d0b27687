"""How small a packed file of many short episodes can be while its library still reads it.

    python benchmarks/pack_floor.py [--out benchmarks/out] [--demos 1000] [--episodes 2000]

robomimic's ``SequenceDataset`` and ``minari.load_dataset`` open each episode's datasets at
their paths (``data/demo_12/obs/object``), so a packed file they read holds every group and
dataset of the file as an HDF5 object, each with its own object header, however its values are
stored. For a robomimic low-dim file (``tests/realistic.py``'s ``write_robomimic_real``,
20-40 steps a demo, no cameras), a robomimic file with two 16x16 camera keys and a Minari file
(minari's ``DataCollector``, Hopper-v5 episodes), this prints, in bytes:

- the input and ``zstd -3 -T1`` of it;
- ``compress --pack`` (each dataset at its path) and ``compress --pack --flat`` (each family
  of datasets stored as one, which the libraries cannot read);
- the *floor*: the headers alone, an HDF5 file in the packed files' format version (v1.10 object
  headers of the minimum size, compact groups) holding every group and dataset of what
  ``--pack`` stores at their paths (the compressed file's: robomimic's ``next_obs`` removed),
  with their attributes, shapes and types and no values, plus the stored bytes of the flat
  file's families (every value, compressed together). No layout with every dataset at its path
  stores less, unless its values compress better than the flat families do.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import h5py
from measure import remove
from objects import build
from run import PYTHON

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_minari(root: Path, episodes: int) -> Path:
    """A Minari dataset of at least ``episodes`` episodes, built unless cached; its
    ``main_data.hdf5``."""
    from tests.realistic import write_minari_dataset

    home = root / f"minari-{episodes}"
    found = list(home.rglob("main_data.hdf5"))
    if found and _episodes(found[0]) >= episodes:
        return found[0]
    remove(home)
    # The collector's Hopper-v5 episodes last 47 steps on average: rows for the episodes.
    main = write_minari_dataset(episodes * 60, home, "hopper/floor-v0")
    assert _episodes(main) >= episodes, f"{_episodes(main)} episodes"
    return main


def _episodes(main: Path) -> int:
    with h5py.File(main, "r") as f:
        return len(f)


def floor_bytes(src: Path, dst: Path) -> int:
    """Bytes of an HDF5 file (v1.10 headers of the minimum size, as packed files are written)
    holding every group and dataset of ``src`` but obsdelta's own, with their attributes, and
    no values."""
    from obsdelta_cli.filters import minimal_headers

    with h5py.File(src, "r") as s, h5py.File(dst, "w", libver=("v110", "v110")) as d:
        minimal_headers(d)

        def visit(name: str, obj: h5py.HLObject) -> None:
            if name == "obsdelta" or name.startswith("obsdelta/"):
                return
            if isinstance(obj, h5py.Dataset):
                made: h5py.HLObject = d.create_dataset(
                    name, shape=obj.shape, dtype=obj.dtype, track_times=False
                )
            else:
                made = d.require_group(name)
            for key, value in obj.attrs.items():
                made.attrs[key] = value

        for key, value in s.attrs.items():
            if key != "obsdelta":
                d.attrs[key] = value
        s.visititems(visit)
    return dst.stat().st_size


def stored_bytes(path: Path, under: str) -> int:
    """Bytes the datasets under ``under`` store (their chunks, as written)."""
    total = 0
    with h5py.File(path, "r") as f:

        def visit(_name: str, obj: h5py.HLObject) -> None:
            nonlocal total
            if isinstance(obj, h5py.Dataset):
                total += obj.id.get_storage_size()

        f[under].visititems(visit)
    return total


def obsdelta(*args: str) -> None:
    run = subprocess.run([PYTHON, "-m", "obsdelta_cli", *args, "-q"], capture_output=True)
    if run.returncode:
        raise SystemExit(f"obsdelta {' '.join(args)}: {run.stderr.decode().strip()}")


def measure(src: Path, scratch: Path, compressible: bool) -> dict[str, int]:
    packed, flat, small, skeleton = (
        scratch / n for n in ("packed.h5", "flat.h5", "small.hdf5", "skeleton.h5")
    )
    zstd = subprocess.run(["zstd", "-3", "-T1", "-q", "-c", str(src)], capture_output=True)
    obsdelta("compress", str(src), "-o", str(packed), "--pack", "-f")
    obsdelta("compress", str(src), "-o", str(flat), "--pack", "--flat", "-f")
    if compressible:  # what --pack stores at the paths: the compressed file's objects
        obsdelta("compress", str(src), "-o", str(small), "-f")
    headers = floor_bytes(small if compressible else src, skeleton)
    families = stored_bytes(flat, "obsdelta/pack/flat")
    sizes = {
        "input": src.stat().st_size,
        "zstd -3": len(zstd.stdout),
        "--pack": packed.stat().st_size,
        "--pack --flat": flat.stat().st_size,
        "headers": headers,
        "families": families,
        "floor": headers + families,
    }
    for path in (packed, flat, small, skeleton):
        remove(path)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("out"))
    parser.add_argument("--demos", type=int, default=1000)
    parser.add_argument("--camera-demos", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=2000)
    args = parser.parse_args()
    root, scratch = args.out.resolve() / "inputs", args.out.resolve() / "floor"
    remove(scratch)
    scratch.mkdir(parents=True)
    minari = build_minari(root, args.episodes)
    inputs = {
        f"robomimic low-dim, {args.demos:,} demos": (
            build(root, args.demos, cameras=False),
            True,
        ),
        f"robomimic, {args.camera_demos:,} demos, 2 cameras 16x16": (
            build(root, args.camera_demos, cameras=True),
            True,
        ),
        f"Minari, {_episodes(minari):,} episodes": (minari, False),
    }
    rows = []
    try:
        for name, (src, compressible) in inputs.items():
            sizes = measure(src, scratch, compressible)
            print(name, sizes, flush=True)
            rows.append((name, sizes))
    finally:
        remove(scratch)
    cols = ["input", "zstd -3", "--pack", "--pack --flat", "headers", "families", "floor"]
    print("\n| file | " + " | ".join(cols) + " | floor / zstd -3 |")
    print("|---|" + "---:|" * (len(cols) + 1))
    for name, sizes in rows:
        ratio = sizes["floor"] / sizes["zstd -3"]
        print(f"| {name} | " + " | ".join(f"{sizes[c]:,}" for c in cols) + f" | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
