"""``obsdelta`` and ``python -m obsdelta_cli``: signal handlers first, then the command line.

Ctrl-C and SIGTERM are handled before anything is imported, so that even an interrupt during
start-up ends with one line and exit 130 (143), not a traceback.
"""

from __future__ import annotations

import sys

from . import interrupts


def _stopped(exc: KeyboardInterrupt) -> None:
    if not interrupts.reported:
        print(f"obsdelta: {interrupts.describe(exc)}; no partial output was left", file=sys.stderr)
    interrupts.handled()
    sys.exit(interrupts.exit_code(exc))


def main() -> None:
    """Console-script entry point."""
    interrupts.install()
    try:
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
        raise


if __name__ == "__main__":
    main()
