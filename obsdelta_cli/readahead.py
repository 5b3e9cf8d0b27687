"""Ask the kernel to read an input ahead, while Python imports torch and the command starts.

A command spends its first second or more importing torch, with the disk idle; then it reads
its input chunk by chunk, waiting for each read of a cold file. :func:`start` hands the kernel
the whole input (up to a budget) with ``posix_fadvise(WILLNEED)`` from a background thread, so
the disk works while the CPU imports and encodes. The pages go to the page cache, which the
kernel reclaims at will: the process's own memory does not grow.

>>> import tempfile, pathlib
>>> with tempfile.TemporaryDirectory() as d:
...     _ = (pathlib.Path(d) / "leaf.memmap").write_bytes(b"x" * 4096)
...     start([pathlib.Path(d)]).join()
...     [(p.name, size) for p, size in files(pathlib.Path(d))]
[('leaf.memmap', 4096)]
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

#: Never ask for more than this share of the memory the kernel reports available: a larger
#: input is read ahead only in part, and the rest as the command reaches it.
MEMORY_SHARE = 4
#: Files read ahead per input at most (a folder of many small files gains nothing).
MAX_FILES = 4096
#: Bytes per advice, so that a later file is not held up behind one huge request.
STEP = 64 << 20


def available_memory() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; 0 where it is not known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def files(path: Path) -> list[tuple[Path, int]]:
    """Regular files of ``path`` (itself, or those under a folder) with their sizes, in the
    order the formats read them (sorted paths); links are not followed."""
    if path.is_symlink():
        return []
    if path.is_file():
        return [(path, path.stat().st_size)]
    found: list[tuple[Path, int]] = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            p = Path(root, name)
            if not p.is_symlink() and p.is_file():
                found.append((p, p.stat().st_size))
                if len(found) >= MAX_FILES:
                    return found
    return found


def _advise(paths: list[Path], budget: int) -> None:
    if not hasattr(os, "posix_fadvise"):
        return
    for path in paths:
        try:
            for p, size in files(path):
                fd = os.open(p, os.O_RDONLY)
                try:
                    limit = min(size, budget)
                    for offset in range(0, limit, STEP):
                        length = min(STEP, limit - offset)
                        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
                budget -= size
                if budget <= 0:
                    return
        except OSError:
            continue  # advice only: the command itself reports what is wrong with the input


def start(paths: list[Path], budget: int | None = None) -> threading.Thread:
    """Start reading ``paths`` ahead in a daemon thread (returned; nobody needs to wait for it)."""
    if budget is None:
        budget = available_memory() // MEMORY_SHARE
    thread = threading.Thread(
        target=_advise, args=(list(paths), budget), name="obsdelta-readahead", daemon=True
    )
    thread.start()
    return thread
