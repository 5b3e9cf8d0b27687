"""Ctrl-C and SIGTERM: one line, exit 130 or 143, no traceback and no partial output.

:func:`install` runs first thing in ``main()``, before anything heavy is imported. SIGTERM is
raised as :class:`Terminated`, a :class:`KeyboardInterrupt`, so that every ``finally`` and
``except BaseException`` that removes a temporary output runs for it as for Ctrl-C.

>>> exit_code(KeyboardInterrupt()), exit_code(Terminated())
(130, 143)
"""

from __future__ import annotations

import signal


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


def _on_signal(signum: int, frame: object) -> None:
    received.append(signum)
    raise _error(signum)


def install() -> None:
    """Ctrl-C raises KeyboardInterrupt and SIGTERM raises Terminated, both remembered for
    :func:`check`. A SIGINT ignored at start (``nohup``, a background job) stays ignored."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def check() -> None:
    """Raise again a signal whose exception a library swallowed (a no-op otherwise)."""
    if received:
        raise _error(received[-1])


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the signal number, as a shell reports it."""
    return 143 if isinstance(exc, Terminated) else 130


def describe(exc: KeyboardInterrupt) -> str:
    """``terminated`` or ``interrupted``."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"
