"""Which file a reader opened: its identity when it was opened, checked again when a read
fails, so that a file replaced under a reader (``compress --force`` of the same output) is
reported as changed, never as damaged.

Writers replace an output by renaming a new one over it, so the path's inode changes; a file
truncated or rewritten in place changes its size or modification time.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
>>> _ = path.write_bytes(b"12")
>>> opened = identity(path)
>>> changed(path, opened)
False
>>> _ = path.with_name("g").write_bytes(b"123")
>>> _ = path.with_name("g").replace(path)
>>> changed(path, opened)
True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


class Identity(NamedTuple):
    """What tells one file (or folder) at a path from another, or from itself changed."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def identity(path: str | os.PathLike[str]) -> Identity | None:
    """The identity of what ``path`` names now (through links), ``None`` if nothing."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def changed(path: str | os.PathLike[str], opened: Identity | None) -> bool:
    """Whether ``path`` no longer names the file it named when ``opened`` was taken."""
    return opened is not None and identity(Path(path)) != opened
