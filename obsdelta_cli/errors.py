"""The one exception family of obsdelta.

Every expected failure raises a subclass of :class:`ObsdeltaError`. The CLI catches the base class
in one place and turns it into one line on stderr and an exit code, so library users get ordinary
exceptions and terminal users never see a traceback for a problem with their data.

>>> err = DataError("overflow", file="run.pt", key="next/observation", hint="use --codec fp32")
>>> str(err)
'run.pt: key next/observation: overflow; use --codec fp32'
>>> err.exit_code
1
"""

from __future__ import annotations

from pathlib import Path


class ObsdeltaError(Exception):
    """Base class: a problem obsdelta can explain in one line."""

    exit_code: int = 1

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.file = None if file is None else str(file)
        self.key = key
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(self.file)
        if self.key is not None:
            parts.append(f"key {self.key}")
        parts.append(self.message)
        text = ": ".join(parts)
        return f"{text}; {self.hint}" if self.hint else text


class UsageError(ObsdeltaError, ValueError):
    """The command line asks for something that cannot be done (exit code 2)."""

    exit_code = 2


class InputError(ObsdeltaError):
    """The input is missing, unreadable, or in no layout obsdelta knows."""


class DataError(ObsdeltaError, ValueError):
    """The data itself cannot be encoded as asked (overflow, NaN/inf, shape mismatch)."""


class OutputError(ObsdeltaError):
    """The output cannot be written (exists, overlaps the input, disk full, no permission)."""


class FormatVersionError(InputError):
    """A compressed file written by a newer, unknown obsdelta format version."""
