"""The disk alone: what a batch compress reads and writes, with nothing computed.

    python benchmarks/disk_alone.py --procs 2 --out-per-in 0.6 --out DIR INPUT...

Each input is read whole past the page cache (``O_DIRECT``, 8 MiB at a time, as obsdelta reads
a cold input) while ``--out-per-in`` times the bytes read are written to a file of its own in
DIR; each file is flushed (``fsync``) when done and then dropped from the page cache, as
obsdelta's outputs are. The writes go to the page cache as the input is read and to the disk at
the ``fsync`` (far below the kernel's background write-back threshold), which is obsdelta's
order too. ``--procs`` processes share the inputs, largest first. No interpreter start-up,
import or computation is in it: what the disk alone takes to move a batch's bytes.
"""

from __future__ import annotations

import argparse
import mmap
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

BLOCK = 8 << 20


def one(job: tuple[Path, Path, float]) -> int:
    """Read ``src`` directly, write ``ratio`` of it to ``dst`` as it goes, flush; bytes read."""
    src, dst, ratio = job
    buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
    fd = os.open(src, os.O_RDONLY | os.O_DIRECT)
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    total = 0
    try:
        while (n := os.readv(fd, [buffer])) > 0:
            total += n
            os.write(out, memoryview(buffer)[: int(n * ratio)])
        os.fsync(out)
        os.posix_fadvise(out, 0, 0, os.POSIX_FADV_DONTNEED)  # as obsdelta does once on disk
    finally:
        os.close(out)
        os.close(fd)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--out-per-in", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    inputs = sorted(args.inputs, key=lambda p: p.stat().st_size, reverse=True)
    jobs = [(p, args.out / f"{i}.out", args.out_per_in) for i, p in enumerate(inputs)]
    with ProcessPoolExecutor(args.procs) as pool:
        read = sum(pool.map(one, jobs))
    print(f"{read} bytes read, {len(jobs)} files")


if __name__ == "__main__":
    main()
