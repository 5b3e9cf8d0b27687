"""Files of many small objects: robomimic low-dim files of hundreds to thousands of demos.

    python benchmarks/objects.py [--demos 200,2000] [--out benchmarks/out]

A robomimic demo holds about 17 HDF5 objects of a few KB each (``tests/realistic.py``'s
``write_robomimic_real``: real Hopper-v5 states, 20-40 steps a demo, no camera keys), so such
a file's time goes to per-object work rather than to its bytes. For each number of demos: the
file's size and objects, then wall time and peak RSS of ``compress`` (verification included),
``verify`` and ``inflate`` of its output, ``report`` of the input and ``compress --pack``,
each run once with the programs and the input warm, and, for reference, HDF5's own copy of
every object (h5py's ``copy`` of each top-level group, in C, nothing checked or hashed),
h5py reading every object (``visititems``, each object's attributes and each dataset's
values read and hashed: the least a check of every object does, in Python) and ``h5repack``
(Debian's ``hdf5-tools``; left out where it is not on ``PATH``). Per object: a command's
time over the input's object count; and each command's time over the copy's and the read's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import h5py
from measure import dataset_bytes, remove, run_timed
from run import PYTHON
from source import compile_bytecode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MB = 10**6
#: HDF5's copy of every object, for reference: ``python -c COPY SRC DST``.
COPY = (
    "import sys, h5py\n"
    "with h5py.File(sys.argv[1], 'r') as s, h5py.File(sys.argv[2], 'w') as d:\n"
    "    for name in s:\n"
    "        s.copy(s[name], d, name=name)\n"
)
#: h5py reading every object, for reference: ``python -c READ SRC``. Each object's attributes
#: and each dataset's values read and hashed, as any check of every object must at least do,
#: written as h5py's documentation walks a file; nothing written.
READ = (
    "import sys, h5py, numpy, xxhash\n"
    "def visit(name, obj):\n"
    "    h = xxhash.xxh3_64()\n"
    "    for value in obj.attrs.values():\n"
    "        h.update(numpy.asarray(value).tobytes())\n"
    "    if isinstance(obj, h5py.Dataset):\n"
    "        h.update(numpy.ascontiguousarray(obj[()]).tobytes())\n"
    "with h5py.File(sys.argv[1], 'r') as f:\n"
    "    f.visititems(visit)\n"
)


def build(root: Path, demos: int, cameras: bool = False) -> Path:
    """The robomimic file of ``demos`` demos (low-dim, or with two 16x16 camera keys), built
    unless cached (written to a temporary name first, so that a cached one is complete)."""
    from tests.realistic import write_robomimic_real

    path = root / f"robomimic-{'cams16' if cameras else 'lowdim'}-{demos}.hdf5"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        image = 16 if cameras else 0
        write_robomimic_real(partial, demos=demos, image=image, steps=(20, 40), cameras=cameras)
        partial.rename(path)
    return path


def objects_in(path: Path) -> int:
    count = 0

    def visit(name: str) -> None:
        nonlocal count
        count += 1

    with h5py.File(path, "r") as f:
        f.visit(visit)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", default="200,2000", help="comma-separated demo counts")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("out"))
    args = parser.parse_args()
    root, scratch = args.out.resolve() / "inputs", args.out.resolve() / "objects"
    remove(scratch)
    scratch.mkdir(parents=True)
    obsdelta = [PYTHON, "-m", "obsdelta_cli"]
    repack = shutil.which("h5repack")
    compile_bytecode(obsdelta)
    rows = []
    try:
        for demos in (int(d) for d in args.demos.split(",") if d.strip()):
            src = build(root, demos)
            small, back, packed = (scratch / n for n in ("small.hdf5", "back.hdf5", "p.h5"))
            commands = {
                "compress": [*obsdelta, "compress", str(src), "-o", str(small), "-f", "-q"],
                "verify": [*obsdelta, "verify", str(small), "-q"],
                "inflate": [*obsdelta, "inflate", str(small), "-o", str(back), "-f", "-q"],
                "compress --pack": [
                    *obsdelta,
                    "compress",
                    str(src),
                    "-o",
                    str(packed),
                    "--pack",
                    "-q",
                ],
                "report": [*obsdelta, "report", str(src)],
                "HDF5's copy": [PYTHON, "-c", COPY, str(src), str(scratch / "copy.hdf5")],
                "h5py's read": [PYTHON, "-c", READ, str(src)],
            }
            if repack is not None:
                commands["h5repack"] = [repack, str(src), str(scratch / "repacked.hdf5")]
            runs = {}
            for name, argv in commands.items():
                run = run_timed(argv)
                if run.returncode:
                    raise SystemExit(f"{name} failed: {run.error_line}")
                runs[name] = run
                print(f"[{demos} demos] {name}: {run.seconds:.2f} s, {run.peak_rss_mb:.0f} MB")
            rows.append((demos, src, objects_in(src), runs))
            for path in (small, back, packed, scratch / "copy.hdf5", scratch / "repacked.hdf5"):
                remove(path)
    finally:
        remove(scratch)
    print()
    ours = ["compress", "verify", "inflate", "report", "compress --pack"]
    names = [*ours, "HDF5's copy", "h5py's read"] + (["h5repack"] if repack is not None else [])
    print("| demos | file | objects | " + " | ".join(f"`{n}`" for n in names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for demos, src, count, runs in rows:
        cells = [
            f"{r.seconds:.1f} s ({r.seconds / count * 1e3:.2f} ms/object), {r.peak_rss_mb:.0f} MB"
            for r in (runs[n] for n in names)
        ]
        size = dataset_bytes(src) / MB
        print(f"| {demos:,} | {size:.1f} MB | {count:,} | " + " | ".join(cells) + " |")
    print()
    for demos, _src, _count, runs in rows:
        for base in ("HDF5's copy", "h5py's read"):
            ratios = ", ".join(f"{n} {runs[n].seconds / runs[base].seconds:.1f}x" for n in ours)
            print(f"{demos:,} demos, over {base}: {ratios}")


if __name__ == "__main__":
    main()
