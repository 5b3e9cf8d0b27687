"""The container interface: adapters that only do I/O.

A format adapter knows how one kind of container is laid out on disk: how to recognise it, how to
open it as a lazily readable TensorDict, how to create an empty output of a given structure, and
where the obsdelta metadata lives. Everything about deltas, codecs and errors lives in
:mod:`obsdelta_cli.pipeline`, above the adapters.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tensordict import TensorDictBase

from ..errors import InputError

#: File name of the metadata written beside the data in directory containers.
SIDECAR = "obsdelta.json"


@dataclass
class Source:
    """An opened input: its data, its obsdelta metadata (``None`` if plain) and valid rows."""

    path: Path
    td: TensorDictBase
    meta: dict[str, Any] | None
    #: Rows along the first batch dimension that hold data (a replay buffer's ``len``);
    #: ``None`` means all of them.
    valid_rows: int | None = None


class Format(ABC):
    """One container layout, registered in :data:`obsdelta_cli.formats.FORMATS`."""

    name: ClassVar[str]
    #: One line for the README table and error messages.
    summary: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def sniff(cls, path: Path) -> bool:
        """Whether ``path`` looks like this container (cheap: reads headers only)."""

    @abstractmethod
    def open(self, path: Path) -> Source:
        """Open ``path`` for reading without loading it whole."""

    @abstractmethod
    def create(self, path: Path, template: TensorDictBase, source: Source) -> TensorDictBase:
        """Create an empty, writable output at ``path`` with ``template``'s keys, shapes and dtypes.

        ``source`` is the opened input, for containers that carry more than the TensorDict.
        """

    @abstractmethod
    def finish(self, path: Path, out: TensorDictBase, meta: dict[str, Any] | None) -> None:
        """Write ``meta`` (``None`` for a plain, inflated dataset) and flush ``out`` to ``path``."""


def disk_size(path: Path) -> int:
    """Bytes on disk of a file, or of every file below a directory.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a").write_bytes(b"12345")
    >>> disk_size(d)
    5
    """
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += (Path(root) / name).lstat().st_size
    return total


def read_sidecar(directory: Path) -> dict[str, Any] | None:
    """The metadata stored in ``directory``, or ``None`` for a plain dataset."""
    file = directory / SIDECAR
    if not file.exists():
        return None
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{SIDECAR} is unreadable ({exc})", file=file, hint="the file is damaged"
        ) from None
    if not isinstance(meta, dict):
        raise InputError(f"{SIDECAR} is not a JSON object", file=file, hint="the file is damaged")
    return meta


def write_sidecar(directory: Path, meta: dict[str, Any] | None) -> None:
    """Store ``meta`` in ``directory`` (nothing for a plain dataset)."""
    if meta is not None:
        (directory / SIDECAR).write_text(json.dumps(meta, indent=1) + "\n")
