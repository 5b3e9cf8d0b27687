"""Run a command and write its wall time and memory use to a file.

    python -I -S benchmarks/launcher.py STATS PROGRAM [ARG...]

Writes one line to STATS: wall seconds, ``ru_maxrss`` in KiB (the peak RSS of the command's
largest process, file-backed pages of memory-mapped files included), the exit code, and the
peak ``RssAnon`` in KiB of the command's own process (not its children), sampled every 20 ms.
This launcher stays small (no third-party imports) because a process inherits the peak RSS of
the process that forked it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

SAMPLE_SECONDS = 0.02


def rss_anon_kib(pid: int) -> int:
    """Anonymous resident memory of a process (heap, not mapped files); 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample_anon(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while True:
        peak[0] = max(peak[0], rss_anon_kib(pid))
        if stop.wait(SAMPLE_SECONDS):
            return


def main(stats: str, argv: list[str]) -> None:
    start = time.perf_counter()
    pid = os.posix_spawnp(argv[0], argv, os.environ)
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=sample_anon, args=(pid, stop, peak), daemon=True)
    sampler.start()
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    code = os.waitstatus_to_exitcode(status)
    with open(stats, "w") as out:
        out.write(f"{seconds} {usage.ru_maxrss} {code} {peak[0]}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
