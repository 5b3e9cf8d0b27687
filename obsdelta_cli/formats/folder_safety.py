"""Checks that keep a folder input self-contained and its metadata bounded.

A memmap folder or replay-buffer dump is read only through files inside it: a symbolic link
anywhere below it (to a leaf, a sub-folder, ``meta.json``, another tool's metadata, a device, or
nowhere) is refused before anything is read through it, as HDF5 inputs refuse external links.
Entries that are neither files nor folders (pipes, sockets, devices) are refused too: reading one
would block or never end. Its JSON metadata is read with bounds on size and nesting, checked
before parsing (Python's parser recurses, and a deep enough file ends it with ``RecursionError``).
A file or folder bearing a name obsdelta writes into its outputs is refused in an input that is
not one (obsdelta would take it for its own, and leave it out of the output).

>>> import json, tempfile, pathlib
>>> f = pathlib.Path(tempfile.mkdtemp()) / "meta.json"
>>> _ = f.write_text(json.dumps({"shape": [3], "note": "[[[["}))
>>> read_json(f)[1]
{'shape': [3], 'note': '[[[['}
>>> json_depth(b'{"a": [[1], {"b": "]]]"}]}')
3
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

#: Levels of folders below a folder input (sub-TensorDicts nest one folder per level).
MAX_DEPTH = 64
#: Entries (files and folders) a folder input may hold, and keys its ``meta.json`` files may
#: name in all: far beyond any dataset's, and small enough to list in memory.
MAX_ENTRIES = 1_000_000
MAX_KEYS = 100_000
#: Bytes of a ``meta.json`` (or another tool's small JSON file) read at most.
MAX_JSON_BYTES = 16 << 20
#: Levels of brackets a JSON file may nest (a ``meta.json`` nests three).
MAX_JSON_DEPTH = 32

LINK_HINT = "obsdelta reads only files inside the folder; replace it with the file it points to"

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def link_error(path: Path) -> InputError:
    """The refusal of the symbolic link ``path``."""
    return InputError("is a symbolic link", file=path, hint=LINK_HINT)


def refuse_links(root: Path) -> None:
    """Refuse anything below the folder ``root`` that is not a plain file or folder (a
    symbolic link first of all), and folders nested or filled beyond the bounds above; nothing
    is followed. ``root`` itself is the path the user named, and may be a link."""
    stack: list[tuple[Path, int]] = [(root, 0)]
    seen = 0
    while stack:
        folder, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(
                f"folders below it nest more than {MAX_DEPTH} levels deep",
                file=root,
                hint="obsdelta reads TensorDicts nested at most that deep",
            )
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise InputError(
                f"cannot list the folder ({exc.strerror})", file=folder, hint="check permissions"
            ) from None
        seen += len(entries)
        if seen > MAX_ENTRIES:
            raise InputError(
                f"holds more than {MAX_ENTRIES:,} files and folders",
                file=root,
                hint="obsdelta reads folders of at most that many entries",
            )
        for entry in reversed(entries):  # popped in name order
            path = Path(entry.path)
            if entry.is_symlink():
                raise link_error(path)
            if entry.is_dir(follow_symlinks=False):
                stack.append((path, depth + 1))
            elif not entry.is_file(follow_symlinks=False):
                raise InputError(
                    "is neither a file nor a folder (a pipe, socket or device)",
                    file=path,
                    hint="obsdelta reads only files inside the folder; remove it",
                )


def refuse_own_names(folder: Path, names: Iterable[str], why: str) -> None:
    """Refuse the first of ``names`` (files or folders obsdelta writes into its outputs) that
    ``folder`` holds: obsdelta would take it for its own, and leave it out of the output."""
    for name in sorted(names):
        if os.path.lexists(folder / name):
            raise InputError(
                f"is a name obsdelta writes itself, {why}",
                file=folder / name,
                hint="rename it: obsdelta would leave it out of its output",
            )


def json_depth(raw: bytes) -> int:
    """How deep ``raw``'s brackets nest, brackets inside strings aside (an unterminated string
    counts its brackets: the text is not JSON anyway)."""
    text = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    opens = (text == ord("[")) | (text == ord("{"))
    brackets = np.flatnonzero(opens | (text == ord("]")) | (text == ord("}")))
    step = np.where(opens[brackets], 1, -1).astype(np.int32)
    return int(np.cumsum(step).max(initial=0))


def read_json(
    file: Path, *, max_bytes: int = MAX_JSON_BYTES, hint: str = "damaged folder"
) -> tuple[bytes, Any]:
    """The bytes of the JSON file ``file`` and what they hold; a link, a file over ``max_bytes``
    or nested over :data:`MAX_JSON_DEPTH` is refused before it is parsed."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_error(file) from None
        raise InputError(f"is unreadable ({exc.strerror})", file=file, hint=hint) from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError("is not a file", file=file, hint=hint)
        if info.st_size > max_bytes:
            raise InputError(
                f"holds {info.st_size:,} bytes; obsdelta reads such a file up to {max_bytes:,}",
                file=file,
                hint=hint,
            )
        raw = fh.read(max_bytes + 1)
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise InputError(
            f"nests JSON {depth:,} levels deep; obsdelta reads at most {MAX_JSON_DEPTH}",
            file=file,
            hint=hint,
        )
    try:
        return raw, json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"is not readable JSON ({exc})", file=file, hint=hint) from None
