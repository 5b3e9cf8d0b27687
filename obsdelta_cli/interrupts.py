"""Ctrl-C and SIGTERM: one line, exit 130 or 143, no traceback and no partial output.

:func:`install` runs first thing in ``main()``, before anything heavy is imported. SIGTERM is
raised as :class:`Terminated`, a :class:`KeyboardInterrupt`, so that every ``finally`` and
``except BaseException`` that removes a temporary output runs for it as for Ctrl-C.

>>> exit_code(KeyboardInterrupt()), exit_code(Terminated())
(130, 143)
"""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from types import ModuleType


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that partial output is cleaned up the same way."""


#: Signals received. Some imports (torch, h5py) run code that swallows the exception a handler
#: raises, so the signal is also remembered here and :func:`check` raises it again.
received: list[int] = []
#: Set once the line saying what was interrupted has been printed.
reported: list[str] = []


def last() -> KeyboardInterrupt | None:
    """The exception of the last signal received, if any."""
    return _error(received[-1]) if received else None


def _error(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


#: Depth of :func:`deferred` blocks: while above 0 a signal is remembered, not raised.
_deferring = [0]


def on_signal(signum: int, frame: object) -> None:
    """The handler :func:`install` sets: the first signal raises (unless deferred)."""
    first = not received
    received.append(signum)
    # A second signal while the first one's exception unwinds is only remembered: raised
    # there, it would cut short the clean-up that removes the temporary output.
    if first and not _deferring[0]:
        raise _error(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold a signal back until the block ends, then raise it.

    For importing torch and tensordict: an exception raised while their start-up runs Python
    code from C++ ends in ``std::terminate`` (a core dump instead of exit 130).

    >>> with deferred():
    ...     pass
    """
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
    if not _deferring[0]:
        check()


def import_heavy(name: str) -> ModuleType:
    """Import ``name`` (torch, or obsdelta's commands) as start-up should.

    Signals are held back, as torch's start-up must not be cut (see :func:`deferred`). The
    collector is paused: the import makes hundreds of thousands of objects and frees almost
    none, so each pass it would start walks them for nothing (``import torch`` 0.91 -> 0.84 s
    on the README's machine). Those objects then live as long as the process, so they are
    kept out of later full passes, which would otherwise walk them again and again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with deferred():
            module = import_module(name)
    finally:
        if was_enabled:
            gc.enable()
    gc.freeze()
    return module


def install() -> None:
    """Ctrl-C raises KeyboardInterrupt and SIGTERM raises Terminated, both remembered for
    :func:`check`. A SIGINT ignored at start (``nohup``, a background job) stays ignored."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    quiet_in_finalizers()


def quiet_in_finalizers() -> None:
    """A signal whose exception is raised inside a finalizer (``__del__``, a weakref callback)
    cannot propagate: the interpreter prints it with a traceback and goes on. Such an exception
    is dropped silently instead; the signal is in :data:`received`, and the next :func:`check`
    (one per chunk read) raises it where the command can clean up."""
    if getattr(sys.unraisablehook, "obsdelta", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if not (received and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            previous(unraisable)

    hook.obsdelta = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def finished() -> None:
    """The command is over and its output complete or removed: a signal while the interpreter
    shuts down is ignored rather than printing a traceback from some library's clean-up, or
    killing the process after it has succeeded."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is on_signal:
            signal.signal(signum, signal.SIG_IGN)


def check() -> None:
    """Raise again a signal whose exception a library swallowed (a no-op otherwise)."""
    if received:
        raise _error(received[-1])


def handled() -> None:
    """Tell the interpreter the interrupt was handled, so that ``python -m`` exits with our code.

    CPython sets a process-wide flag when a KeyboardInterrupt leaves code run by ``exec`` or
    ``eval`` of a string (dataclasses and torch generate functions that way), even if the
    exception is handled further up; under ``python -m`` that flag turns ``sys.exit(130)`` into
    death by SIGINT. The console script takes another exit path and is not affected.
    """
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ImportError, ValueError, AttributeError, OSError):  # not CPython, or not exported
        pass


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal number, as a shell reports it."""
    return 143 if isinstance(exc, Terminated) else 130


def describe(exc: KeyboardInterrupt) -> str:
    """``terminated`` or ``interrupted``."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"
