"""TED rollouts saved by tensordict as a memmap directory (``td.memmap(prefix)``).

Each (sub-)TensorDict is a folder with a ``meta.json``; each leaf a raw ``<key>.memmap`` buffer.
A compressed directory is still an ordinary tensordict memmap (``TensorDict.load_memmap`` opens
it); the obsdelta metadata is the extra file ``obsdelta.json`` at its root and exception rows, if
any, are raw files in the extra folder ``obsdelta.arrays/``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import InputError
from .base import ARRAYS_DIR, ArrayStore, Sink, Source, read_sidecar, write_sidecar
from .ted import TensorDictFormat, tensordict_module

if TYPE_CHECKING:  # tensordict costs seconds to import; HDF5 work never needs it
    from tensordict import TensorDictBase


def load_memmap_dir(path: Path) -> TensorDictBase:
    """Open a tensordict memmap directory lazily, turning its failures into :class:`InputError`."""
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise InputError(
            "not a tensordict memmap directory (no meta.json)",
            file=path,
            hint="pass a folder written by TensorDict.memmap()",
        )
    # Before tensordict maps anything: it would silently grow a short leaf file with zeros.
    _check_leaf_files(path)
    try:
        td = tensordict_module().TensorDict.load_memmap(path)
    except Exception as exc:  # tensordict raises many types for damaged folders
        raise InputError(
            f"cannot open as a tensordict memmap ({type(exc).__name__}: {exc})",
            file=path,
            hint="the folder is damaged or incomplete",
        ) from None
    return _in_file_order(td.apply(_read_only), path)


def _check_leaf_files(directory: Path, prefix: str = "") -> None:
    """Every leaf file listed in ``meta.json`` exists and holds at least the promised bytes."""
    try:
        entries = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise InputError(
            f"meta.json is unreadable ({exc})", file=directory / "meta.json", hint="damaged folder"
        ) from None
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            continue
        key = f"{prefix}{name}"
        if entry.get("type") == "TensorDict" and (directory / name / "meta.json").is_file():
            _check_leaf_files(directory / name, f"{key}/")
            continue
        dtype = getattr(torch, str(entry.get("dtype", "")).removeprefix("torch."), None)
        shape = entry.get("shape")
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, list):
            continue
        if entry.get("is_nested"):
            continue
        file = directory / f"{name}.memmap"
        expected = math.prod(shape) * dtype.itemsize
        actual = file.stat().st_size if file.is_file() else None
        if expected and (actual is None or actual < expected):
            found = "is missing" if actual is None else f"holds {actual} bytes"
            raise InputError(
                f"leaf file {found} but meta.json promises {expected}",
                file=file,
                key=key,
                hint="the folder is truncated or incomplete; restore it from the original",
            )


def _read_only(t: torch.Tensor) -> torch.Tensor:
    """Map a leaf's file privately: a write through it can never reach the input file."""
    filename = getattr(t, "filename", None)
    if filename is None:
        return t
    private = torch.from_file(str(filename), shared=False, size=t.numel(), dtype=t.dtype)
    out = private.view(t.shape)
    out.filename = filename  # type: ignore[attr-defined]  # read through FileLeaf, by name
    return out


def _in_file_order(td: TensorDictBase, directory: Path) -> TensorDictBase:
    """``td`` with its keys in the order ``meta.json`` lists them.

    ``load_memmap`` puts a level's leaves before its sub-TensorDicts; restoring the written order
    lets a round trip reproduce ``meta.json`` byte for byte.
    """
    try:
        entries = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return td
    names = [k for k, v in entries.items() if isinstance(v, dict) and k in td.keys()]
    if sorted(names) != sorted(td.keys()):
        return td
    out = td.empty()
    for name in names:
        value = td.get(name)
        if (
            isinstance(value, tensordict_module().TensorDictBase)
            and (directory / name / "meta.json").is_file()
        ):
            value = _in_file_order(value, directory / name)
        out.set(name, value)
    return out


def is_memmap_dir(path: Path) -> bool:
    """Whether ``path`` is a folder with a tensordict ``meta.json`` at its root."""
    meta = path / "meta.json"
    if not (path.is_dir() and meta.is_file()):
        return False
    try:
        content = json.loads(meta.read_text())
    except (OSError, ValueError):
        return True  # claims to be one; open() reports the damage precisely
    return isinstance(content, dict) and "shape" in content


class TedMemmap(TensorDictFormat):
    name = "ted-memmap"
    summary = "TensorDict.memmap() directory (meta.json + *.memmap leaves)"

    @classmethod
    def sniff(cls, path: Path) -> bool:
        return is_memmap_dir(path)

    def open(self, path: Path) -> Source:
        meta = read_sidecar(path)
        return self.source(path, load_memmap_dir(path), meta, arrays=ArrayStore(path / ARRAYS_DIR))

    def materialise(
        self, path: Path, template: TensorDictBase, source: Source
    ) -> tuple[TensorDictBase, ArrayStore]:
        return template.memmap_like(path), ArrayStore(path / ARRAYS_DIR)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        write_sidecar(path, meta)
