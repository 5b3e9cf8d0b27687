"""What writing into memory the system has not used lately costs, against memory it just freed.

    python benchmarks/fresh_pages.py [--mb 2000] [--rounds 3]

Writes ``--mb`` MB to a new file in the page cache three ways, one ``write`` of 1 MiB at a time
(nothing reaches the disk: the file is deleted unflushed):

- *fresh*: a new file, after the page cache was dropped (needs root; skipped otherwise), so
  that most of its pages are memory the system has not used lately;
- *cached*: the same file again, its pages already in the cache;
- *reused*: a new file right after the first was deleted, in the pages it freed.

On a virtual machine whose host takes back memory its guest leaves unused (free page
reporting, a balloon, reclaim of cold pages), the guest's first write to such a page waits for
the host to provide it again: *fresh* is then several times slower than *reused*, by how much
depending on what the host has taken back. Every byte a command writes to a new file, and
every new buffer it fills, may pay that, which makes timings on such a machine vary with the
memory the runs before left behind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

MIB = 1 << 20


def _write(path: Path, mb: int, flags: int, block: bytes) -> float:
    fd = os.open(path, flags, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(mb):
            os.write(fd, block)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")))
    parser.add_argument("--pause", type=float, default=0.0, help="seconds before the fresh write")
    args = parser.parse_args()
    block = os.urandom(MIB)
    path = args.dir / f"obsdelta-fresh-pages-{os.getpid()}"
    new = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    speeds: dict[str, list[float]] = {"fresh": [], "cached": [], "reused": []}
    try:
        for _ in range(args.rounds):
            if _drop_caches():
                time.sleep(args.pause)
                speeds["fresh"].append(args.mb / _write(path, args.mb, new, block))
            else:
                _write(path, args.mb, new, block)
            speeds["cached"].append(args.mb / _write(path, args.mb, os.O_WRONLY, block))
            path.unlink()
            speeds["reused"].append(args.mb / _write(path, args.mb, new, block))
            path.unlink()
    finally:
        path.unlink(missing_ok=True)
    for name, values in speeds.items():
        if values:
            runs = ", ".join(f"{v:,.0f}" for v in values)
            print(f"{name:>7}: median {statistics.median(values):,.0f} MB/s ({runs})")
        else:
            print(f"{name:>7}: not measured (dropping the page cache needs root)")


if __name__ == "__main__":
    main()
