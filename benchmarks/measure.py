"""Run one command in a child process and measure its wall time and memory.

A process inherits the peak RSS of the process that forked it (Linux keeps the larger of the
two when it execs), so the harness, which has torch loaded, cannot spawn the command itself:
``launcher.py``, run by a bare interpreter (``python -I -S``, about 10 MB), spawns it, reaps it
with ``os.wait4`` and writes what it measured to a file. See ``launcher.py`` for the figures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MB = 10**6
KIB = 1024
READ_BLOCK = 8 * 2**20


@dataclass(frozen=True)
class Run:
    """What one execution of a command gave."""

    seconds: float
    peak_rss_mb: float  # ru_maxrss: largest process, mapped file pages included
    peak_anon_mb: float  # sampled RssAnon of the command's own process
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"exit code {self.returncode}"


def files_under(path: Path) -> Iterator[Path]:
    """Every regular file of a dataset: the file itself, or the files below a folder."""
    if path.is_file():
        yield path
        return
    for root, _, names in os.walk(path):
        yield from (Path(root) / name for name in names)


def dataset_bytes(path: Path) -> int:
    """Bytes of a dataset on disk: the sum of its files' sizes."""
    return sum(file.stat().st_size for file in files_under(path))


def remove(path: Path) -> None:
    """Delete a file or folder if it exists."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def evict(path: Path) -> None:
    """Drop a dataset's clean pages from the page cache (no root needed)."""
    for file in files_under(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_up(path: Path) -> None:
    """Read a dataset once so that it sits in the page cache."""
    for file in files_under(path):
        with file.open("rb", buffering=0) as handle:
            while handle.read(READ_BLOCK):
                pass


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def can_drop_caches() -> bool:
    """Whether this process may write to /proc/sys/vm/drop_caches (root, writable /proc)."""
    return os.access(DROP_CACHES, os.W_OK)


def cold_cache(paths: list[Path], drop_all: bool) -> None:
    """Flush pending writes, then evict ``paths`` from the page cache: with ``drop_all``,
    every clean page of the machine (``echo 3 > /proc/sys/vm/drop_caches``); otherwise the
    files of ``paths`` only (``posix_fadvise(POSIX_FADV_DONTNEED)``, no root needed)."""
    os.sync()
    if drop_all:
        DROP_CACHES.write_text("3\n")
    else:
        for path in paths:
            evict(path)


LAUNCHER = Path(__file__).resolve().with_name("launcher.py")


def run_timed(argv: list[str]) -> Run:
    """Run ``argv`` through the launcher; wall seconds exclude the launcher's own start-up.

    If the launcher itself fails (the program does not exist), the run has its exit code.
    """
    with (
        tempfile.TemporaryDirectory() as scratch,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        stats = Path(scratch) / "stats"
        launcher = [sys.executable, "-I", "-S", str(LAUNCHER), str(stats), *argv]
        done = subprocess.run(launcher, stdout=out, stderr=err, check=False)
        measured = stats.read_text().split() if stats.exists() else []
        seconds, max_rss_kib, code, anon_kib = measured or ["nan", "0", str(done.returncode), "0"]
        out.seek(0)
        err.seek(0)
        return Run(
            seconds=float(seconds),
            peak_rss_mb=int(max_rss_kib) * KIB / MB,
            peak_anon_mb=int(anon_kib) * KIB / MB,
            returncode=int(code),
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
        )
