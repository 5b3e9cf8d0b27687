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

import errno
import os
import re
from pathlib import Path


class ObsdeltaError(Exception):
    """Base class: a problem obsdelta can explain in one line."""

    exit_code: int = 1
    #: Where the command's output was to go, when not where it was asked to (the original
    #: container of a packed file, in a folder of inflated outputs).
    output: Path | None = None

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


class DamagedError(InputError):
    """Stored values do not match the checksum recorded for them: the file was damaged after
    it was written."""


class FileChangedError(InputError):
    """The file (or folder) was replaced, truncated or removed while it was open for reading:
    what was read may mix the old file and the new one, so nothing more is returned from it."""

    def __init__(self, file: str | Path, *, what: str = "the file") -> None:
        super().__init__(
            f"{what} changed while it was read (replaced, truncated or removed)",
            file=file,
            hint="open it again to read the new one",
        )


class NoSpaceError(OutputError):
    """The output's file system filled up while it was written (or a disk quota was met)."""


def size_text(n: float) -> str:
    """Bytes as people read them.

    >>> size_text(512), size_text(830_000), size_text(2**40 * 44)
    ('512 B', '810.5 KB', '44.0 TB')
    """
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


_ERRNO = re.compile(r"errno = (\d+)")
_MESSAGE = re.compile(r"error message = '([^']*)'")
_TEMPORARY = ".obsdelta-tmp-"


def failed_write(exc: BaseException) -> bool:
    """Whether HDF5's error ``exc`` is a write that failed (its message says so; HDF5 raises
    ``RuntimeError`` or ``OSError`` for reads and writes alike)."""
    return "write failed" in " ".join(str(exc).split())


_FULL = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a write that failed for want of space: the system's error code, or
    the message of HDF5 (which gives the code in its text) saying so. The exception it was
    raised in the handling of counts too: ``torch.save``, its write failed, raises its own
    error as it closes the file."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, NoSpaceError) or (isinstance(exc, OSError) and exc.errno in _FULL):
            return True
        text = " ".join(str(exc).split())
        code = _ERRNO.search(text)
        if (code and int(code.group(1)) in _FULL) or any(os.strerror(e) in text for e in _FULL):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def write_error(path: str | Path, exc: BaseException) -> OutputError:
    """One line for a write that failed. HDF5's messages span lines and name the temporary
    file: the system's reason where the message gives it, else its first words; the file named
    is the output the user asked for."""
    text = " ".join(str(exc).split())
    found, code = _MESSAGE.search(text), _ERRNO.search(text)
    strerror = exc.strerror if isinstance(exc, OSError) else None
    if found:
        reason = found.group(1)
    elif code and int(code.group(1)) in errno.errorcode:
        reason = os.strerror(int(code.group(1)))
    elif failed_write(exc):
        reason = "file write failed"
    elif strerror and "(" not in strerror:
        reason = strerror
    else:
        reason = text.split(" (", 1)[0] or type(exc).__name__
    path = Path(path)
    name = path.name.split(_TEMPORARY)[0]
    if _TEMPORARY in path.name:
        name = name.lstrip(".")
    if out_of_space(exc):  # the command restates it with how much to free (atomic.no_space)
        return NoSpaceError(
            "no space left on device",
            file=path.parent / name,
            hint="free some space or choose another output",
        )
    return OutputError(
        f"cannot write ({reason})",
        file=path.parent / name,
        hint="check free space and permissions; nothing was written",
    )
