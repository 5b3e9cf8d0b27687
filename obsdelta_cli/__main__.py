"""``obsdelta`` and ``python -m obsdelta_cli``: signal handlers first, then the command line.

Ctrl-C and SIGTERM are handled before anything is imported, so that even an interrupt during
start-up ends with one line and exit 130 (143), not a traceback.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import NoReturn

from . import interrupts


def _release_locks() -> None:
    # A signal that came just as an output's lock was taken leaves no ``with`` to let go of it.
    atomic = sys.modules.get("obsdelta_cli.atomic")
    if atomic is not None:
        atomic.release_locks()


def _stopped(exc: KeyboardInterrupt) -> None:
    _release_locks()
    if not interrupts.reported:
        print(f"obsdelta: {interrupts.describe(exc)}; no partial output was left", file=sys.stderr)
    interrupts.handled()
    sys.exit(interrupts.exit_code(exc))


def main() -> None:
    """Console-script entry point."""
    # numpy's OpenBLAS starts a thread per core at import, and numpy's import self-test sets
    # them spinning: ~0.05 s of CPU per process, taken from the other worker under --jobs.
    # obsdelta's one BLAS call, a matrix-vector product of narrow rows, is too small to share.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        # Inside the ``try``: a signal can arrive between the two handlers' installation.
        interrupts.install()
        from .cli import app

        app(prog_name="obsdelta")
    except KeyboardInterrupt as exc:
        _stopped(exc)
    except SystemExit as done:
        interrupts.finished()
        # Typer turns an interrupt outside a command's own handling into a silent exit 130. A
        # signal after a command succeeded changes nothing: its output is complete.
        stopped = interrupts.last()
        if stopped is not None and done.code not in (0, None):
            _stopped(stopped)
        _leave(done)


def _leave(done: SystemExit) -> NoReturn:
    """End the process once a command is complete (its output renamed and synced to disk,
    its report written), skipping the interpreter's teardown: after ``import torch`` that
    alone takes a quarter of a second. Anything still running (worker processes, threads that
    are not daemons) gets the ordinary exit instead."""
    _release_locks()
    code = 0 if done.code is None else done.code
    multiprocessing = sys.modules.get("multiprocessing")
    busy = multiprocessing is not None and multiprocessing.active_children()
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if not isinstance(code, int) or busy or others:
        raise done
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise done from None  # the ordinary exit reports it
    os._exit(code)


if __name__ == "__main__":
    main()
