"""TED rollouts saved by tensordict as a memmap directory (``td.memmap(prefix)``).

Each (sub-)TensorDict is a folder with a ``meta.json``; each leaf a raw ``<key>.memmap`` buffer.
A compressed directory is still an ordinary tensordict memmap (``TensorDict.load_memmap`` opens
it); the obsdelta metadata is the extra file ``obsdelta.json`` at its root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ..errors import InputError
from .base import Format, Source, read_sidecar, write_sidecar


def load_memmap_dir(path: Path) -> TensorDictBase:
    """Open a tensordict memmap directory lazily, turning its failures into :class:`InputError`."""
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise InputError(
            "not a tensordict memmap directory (no meta.json)",
            file=path,
            hint="pass a folder written by TensorDict.memmap()",
        )
    try:
        td = TensorDict.load_memmap(path)
    except Exception as exc:  # tensordict raises many types for damaged folders
        raise InputError(
            f"cannot open as a tensordict memmap ({type(exc).__name__}: {exc})",
            file=path,
            hint="the folder is damaged or incomplete",
        ) from None
    _check_leaf_files(path, td)
    return _in_file_order(td.apply(_read_only), path)


def _read_only(t: torch.Tensor) -> torch.Tensor:
    """Map a leaf's file privately: a write through it can never reach the input file."""
    filename = getattr(t, "filename", None)
    if filename is None:
        return t
    private = torch.from_file(str(filename), shared=False, size=t.numel(), dtype=t.dtype)
    return private.view(t.shape)


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
        if isinstance(value, TensorDictBase) and (directory / name / "meta.json").is_file():
            value = _in_file_order(value, directory / name)
        out.set(name, value)
    return out


def _check_leaf_files(path: Path, td: TensorDictBase) -> None:
    # torch.from_file maps a short file without complaint and reads past its end as zeros or
    # crashes later, so every leaf's size is checked against what meta.json promises.
    for key, value in td.items(include_nested=True, leaves_only=True):
        filename = getattr(value, "filename", None)
        if filename is None:
            continue
        expected = value.numel() * value.element_size()
        actual = Path(filename).stat().st_size
        if actual < expected:
            name = "/".join(key) if isinstance(key, tuple) else key
            raise InputError(
                f"leaf file holds {actual} bytes but meta.json promises {expected}",
                file=filename,
                key=name,
                hint="the folder is truncated; restore it from the original",
            )


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


class TedMemmap(Format):
    name = "ted-memmap"
    summary = "TensorDict.memmap() directory (meta.json + *.memmap leaves)"

    @classmethod
    def sniff(cls, path: Path) -> bool:
        return is_memmap_dir(path)

    def open(self, path: Path) -> Source:
        return Source(path=path, td=load_memmap_dir(path), meta=read_sidecar(path))

    def create(self, path: Path, template: TensorDictBase, source: Source) -> TensorDictBase:
        return template.memmap_like(path)

    def finish(self, path: Path, out: TensorDictBase, meta: dict[str, Any] | None) -> None:
        write_sidecar(path, meta)
