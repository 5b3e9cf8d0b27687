"""Reading a possibly damaged HDF5 file in a forked child, so that HDF5 crashing or looping
forever on damage ends only the child.

Bit flips and zeroed pages found both: a string attribute turned by one bit into a sequence of
another type crashed HDF5 as it was read (a segmentation fault), and a zeroed page of the heap
that holds variable-length strings made HDF5 read obsdelta's own metadata forever. Here such
a read is one :class:`ValueError` naming what happened, which the caller reports as damage.

h5py's lock is held while forking, so no other thread is inside h5py when the child starts;
HDF5 reads with ``pread``, so the child moves no file offset the parent relies on; the child
leaves with ``os._exit``, running no clean-up of files it shares with the parent. Where the
system has no ``fork``, or refuses one (memory short under strict overcommit), the work runs in
the process.

>>> apart(lambda: {"answer": 42})
{'answer': 42}
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
#: Errors of a damaged file, as h5py and obsdelta's readers raise them.
DAMAGE = (OSError, ValueError, KeyError, RuntimeError, TypeError)


class ChildFault(Exception):
    """A fault of obsdelta's own in the child (not damage to the file): raised as such."""


def apart(work: Callable[[], T], *, timeout: float | None = None) -> T:
    """``work()`` (whose result is JSON) run in a forked child; HDF5 crashing there, or not
    returning within ``timeout`` seconds, is a ValueError, as are the errors of damage."""
    if not hasattr(os, "fork"):
        return work()
    from h5py._objects import phil

    read, write = os.pipe()
    try:
        with phil:
            pid = os.fork()
    except OSError:  # no memory or processes left for a child (strict overcommit): not damage
        os.close(read)
        os.close(write)
        return work()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        try:
            os.close(read)
            faulthandler.disable()  # a crash is the parent's one line, not a dump of frames
            # The forking thread is the child's main thread, whichever it was (a Dask task's).
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                payload: dict[str, Any] = {"value": work()}
            except DAMAGE as exc:
                payload = {"damage": " ".join(str(exc).split())}
            except BaseException as exc:  # reported to the parent, which raises
                payload = {"fault": f"{type(exc).__name__}: {exc}"}
            view = memoryview(json.dumps(payload).encode())
            while view:
                view = view[os.write(write, view) :]
        finally:
            os._exit(0)
    os.close(write)
    try:
        data, late = _collect(read, timeout)
        if late:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    except BaseException:  # interrupted: the child goes too
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(read)
    if late:
        raise ValueError(f"HDF5 did not return from reading it in {timeout:.0f} s")
    if os.WIFSIGNALED(status):
        raise ValueError(f"HDF5 crashed on it: {_signal_name(os.WTERMSIG(status))}")
    payload = json.loads(data) if data else {"fault": "the child gave no result"}
    if "damage" in payload:
        raise ValueError(payload["damage"])
    if "fault" in payload:
        raise ChildFault(payload["fault"])
    value: T = payload["value"]
    return value


def _collect(fd: int, timeout: float | None) -> tuple[bytes, bool]:
    """Everything the child writes to ``fd``, and whether ``timeout`` ran out first."""
    parts: list[bytes] = []
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        if end is not None:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return b"".join(parts), True
        part = os.read(fd, 1 << 16)
        if not part:
            return b"".join(parts), False
        parts.append(part)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
