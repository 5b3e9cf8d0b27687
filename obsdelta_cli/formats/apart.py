"""Reading a possibly damaged HDF5 file in a forked child, so that HDF5 crashing or looping
forever on damage ends only the child.

Bit flips and zeroed pages found both: a string attribute turned by one bit into a sequence of
another type crashed HDF5 as it was read (a segmentation fault), and a zeroed page of the heap
that holds variable-length strings made HDF5 read obsdelta's own metadata forever. Here such
a read is one :class:`ValueError` naming what happened, which the caller reports as damage.

A time limit is on silence, not on the whole read: work that takes long (hashing every object
of a large file) calls :func:`beat` as it goes, and is stopped only once it has said nothing
for that long. A zeroed heap made HDF5 loop in one attribute read of a robomimic file's objects.

h5py's lock is held while forking, so no other thread is inside h5py when the child starts;
HDF5 reads with ``pread``, so the child moves no file offset the parent relies on; the child
leaves with ``os._exit``, running no clean-up of files it shares with the parent, and on Linux
it is killed if its parent dies (a command killed outright leaves no child looping). Where the
system has no ``fork``, or refuses one (memory short under strict overcommit), the work runs in
the process.

>>> apart(lambda: {"answer": 42})
{'answer': 42}
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
#: Errors of a damaged file, as h5py and obsdelta's readers raise them.
DAMAGE = (OSError, ValueError, KeyError, RuntimeError, TypeError)
#: Longest silence of a child that reads a whole file (:func:`beat` resets it): generous, as a
#: network file system may stall for a while.
SILENCE_SECONDS = 120.0
#: A child says it is alive at most this often.
BEAT_SECONDS = 1.0
#: In a child: the pipe to its parent, and when it last wrote to it.
_beats: list[Any] = [None, 0.0]
_BEAT = b"."


def beat() -> None:
    """Tell the parent this child is making progress (nothing outside a child)."""
    fd = _beats[0]
    if fd is not None and time.monotonic() - _beats[1] >= BEAT_SECONDS:
        _beats[1] = time.monotonic()
        os.write(fd, _BEAT)


class ChildFault(Exception):
    """A fault of obsdelta's own in the child (not damage to the file): raised as such."""


def apart(work: Callable[[], T], *, timeout: float | None = None) -> T:
    """``work()`` (whose result is JSON) run in a forked child; HDF5 crashing there, or saying
    nothing for ``timeout`` seconds (see :func:`beat`), is a ValueError, as are the errors of
    damage."""
    return begin(work, timeout=timeout).result()


def begin(work: Callable[[], T], *, timeout: float | None = None) -> Pending[T]:
    """:func:`apart`, its child started now and its result collected by
    :meth:`Pending.result`, so that the parent does other work meanwhile (on another core).
    ``timeout`` counts silence from when the result is asked for.

    >>> pending = begin(lambda: [1, 2])
    >>> pending.result()
    [1, 2]
    """
    if not hasattr(os, "fork"):
        return Pending(work, None, timeout)
    from h5py._objects import phil

    read, write = os.pipe()
    parent = os.getpid()
    try:
        with phil:
            pid = os.fork()
    except OSError:  # no memory or processes left for a child (strict overcommit): not damage
        os.close(read)
        os.close(write)
        return Pending(work, None, timeout)
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        try:
            os.close(read)
            _die_with(parent)
            _beats[:] = [write, time.monotonic()]
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
    return Pending(work, (pid, read), timeout)


class Pending(Generic[T]):
    """The result of work :func:`begin` started: asked for once with :meth:`result`, or given
    up with :meth:`cancel` (which a parent that fails before it needs the result calls)."""

    def __init__(
        self, work: Callable[[], T], child: tuple[int, int] | None, timeout: float | None
    ) -> None:
        self._work, self._child, self._timeout = work, child, timeout
        self._done = False

    def result(self) -> T:
        """The work's result; where no child could be forked, the work is done now, here."""
        if self._done:
            raise RuntimeError("the result of work done apart is asked for once")
        self._done = True
        if self._child is None:
            return self._work()
        (pid, read), self._child = self._child, None
        try:
            data, late = _collect(read, self._timeout)
            if late:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        except BaseException:  # interrupted: the child goes too
            _end(pid)
            raise
        finally:
            os.close(read)
        if late:
            raise ValueError(f"HDF5 did not return from reading it in {self._timeout:.0f} s")
        data = data.lstrip(_BEAT)
        if os.WIFSIGNALED(status):
            raise ValueError(f"HDF5 crashed on it: {_signal_name(os.WTERMSIG(status))}")
        payload: dict[str, Any] = (
            json.loads(data) if data else {"fault": "the child gave no result"}
        )
        if "damage" in payload:
            raise ValueError(payload["damage"])
        if "fault" in payload:
            raise ChildFault(payload["fault"])
        value: T = payload["value"]
        return value

    def cancel(self) -> None:
        """End the work unheard; nothing if its result was taken."""
        self._done = True
        if self._child is not None:
            (pid, read), self._child = self._child, None
            _end(pid)
            os.close(read)

    def __del__(self) -> None:  # a parent that lost it (an error between) leaves no child
        self.cancel()


def _end(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _collect(fd: int, timeout: float | None) -> tuple[bytes, bool]:
    """Everything the child writes to ``fd``, and whether it was silent for ``timeout``
    seconds first."""
    parts: list[bytes] = []
    while True:
        if timeout is not None and not select.select([fd], [], [], timeout)[0]:
            return b"".join(parts), True
        part = os.read(fd, 1 << 16)
        if not part:
            return b"".join(parts), False
        parts.append(part)


def _die_with(parent: int) -> None:  # pragma: no cover - runs in the child
    """Have the kernel kill this child when its parent dies (Linux); a parent already gone
    (killed while forking) ends it at once."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
