"""A tensordict memmap folder read and written with plain file I/O: no tensordict, no pickle.

Each (sub-)TensorDict is a folder with a ``meta.json`` listing its entries in order: a tensor leaf
(``{"device", "shape", "dtype", "is_nested"}``, stored raw in ``<key>.memmap``), a sub-TensorDict
(``{"type": "TensorDict"}``, a sub-folder with its own ``meta.json``) or anything else (a
``NonTensorData``/``NonTensorStack`` folder, which may hold a pickle). After the entries come the
level's own fields (``shape``, ``device``, ``_type``; tensordict 0.15 adds ``_format_version`` and
``_class`` and writes with spaces after separators).

Tensor leaves become :class:`FileLeaf`\\ s; every other entry is an :class:`OpaqueEntry`, whose
files are copied byte for byte and never interpreted. An output folder gets every file of the input
that is not a rewritten leaf, byte for byte; the ``meta.json`` of a level whose entries change is
regenerated in the style of the input, and its original bytes are kept under ``obsdelta.meta/``
so that inflating restores them exactly.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import DTYPES, dtype_name
from ..errors import InputError
from .base import ARRAYS_DIR, SIDECAR, Key, Plan
from .folder_safety import MAX_DEPTH, MAX_KEYS, read_json
from .leaf import FileLeaf

#: Folder, at the root of a compressed output, holding the original bytes of every meta.json that
#: compress regenerated (by relative folder path); inflate puts them back.
ORIGINAL_META_DIR = "obsdelta.meta"
META = "meta.json"
#: Folders and files of obsdelta's own, never copied from an input to an output.
OWN = frozenset({SIDECAR, ARRAYS_DIR, ORIGINAL_META_DIR})

#: Dimensions of a leaf, and bytes it may describe, at most (numpy's own bounds are near).
MAX_DIMS = 32
MAX_BYTES = 1 << 62

_UNSAFE = set('/<>:"|?*\\ \0%') | {chr(i) for i in range(32)} | {chr(127)}


def encode_key(key: str) -> str:
    """tensordict's file name for a key (``robust_key``: percent-encoding of unsafe characters).

    >>> encode_key("a b/c")
    'a%20b%2Fc'
    """
    if not key:
        return "%"
    if key in (".", ".."):
        return "%2E" * len(key)
    return "".join(f"%{ord(c):02X}" if c in _UNSAFE else c for c in key)


def _legacy_ok(key: str) -> bool:
    return bool(key) and key not in (".", "..") and "/" not in key and "\\" not in key


@dataclass
class OpaqueEntry:
    """A non-tensor entry (e.g. ``NonTensorData``): its folder and/or files, never loaded."""

    paths: list[Path]


@dataclass
class Level:
    """One folder of the tree: its parsed ``meta.json`` and its entries' file names."""

    folder: Path
    raw: bytes
    entries: dict[str, dict[str, Any]]
    fields: dict[str, Any]
    names: dict[str, str] = field(default_factory=dict)  # key -> file/folder stem
    children: dict[str, Level] = field(default_factory=dict)

    @property
    def style_015(self) -> bool:
        return "_format_version" in self.fields or b'": ' in self.raw


@dataclass
class Tree:
    """A memmap folder: its levels by key prefix, and its leaves in ``meta.json`` order."""

    root: Path
    levels: dict[Key, Level]
    leaves: dict[Key, Any]
    batch_dims: int

    def __getitem__(self, key: str | Key) -> Any:
        """A leaf as an array, mapped privately (nothing written through it reaches the file)."""
        leaf = self.leaves[(key,) if isinstance(key, str) else tuple(key)]
        return leaf.mapped() if isinstance(leaf, FileLeaf) else leaf


#: Dtypes torch has besides those of :data:`~obsdelta_cli.arrays.DTYPES` whose leaves are still
#: copied (their bytes mean the same to numpy); the float8 ones are ``ml_dtypes``', imported
#: only for a leaf of one (see :mod:`obsdelta_cli.arrays`).
_OTHER_DTYPES = ("complex64", "complex128", "float8_e4m3fn", "float8_e5m2")


def _other_dtype(name: str) -> np.dtype | None:
    if name not in _OTHER_DTYPES:
        return None
    if name.startswith("float8"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def leaf_dtype(name: object) -> np.dtype | None:
    """The dtype of a leaf's ``meta.json`` entry, named as torch prints it (``torch.float32``);
    ``None`` for a name numpy has no dtype for.

    >>> leaf_dtype("torch.bfloat16"), leaf_dtype("torch.float32"), leaf_dtype("torch.qint8")
    (dtype(bfloat16), dtype('float32'), None)
    """
    bare = str(name).removeprefix("torch.")
    return DTYPES.get(bare) or _other_dtype(bare)


def _fail(msg: str, file: Path, key: str | None = None, hint: str = "damaged folder") -> InputError:
    return InputError(msg, file=file, key=key, hint=hint)


def _child(folder: Path, key: str, suffix: str, exists: Any) -> str:
    name = encode_key(key)
    if exists(folder / f"{name}{suffix}"):
        return name
    if _legacy_ok(key) and exists(folder / f"{key}{suffix}"):
        return key
    return name


def _shape_problem(value: object, batch: list[int] | None = None) -> str | None:
    """What is wrong with ``value`` as a shape (a leaf's, starting with ``batch``), or
    ``None``."""
    if not (isinstance(value, list) and all(type(d) is int and d >= 0 for d in value)):
        return "is not a list of sizes"  # bools are ints to Python, not sizes
    if len(value) > MAX_DIMS:
        return f"has more than {MAX_DIMS} dimensions"
    if math.prod(d for d in value if d) > MAX_BYTES:
        return "describes more values than a file can hold"
    if batch is not None and value[: len(batch)] != batch:
        return f"does not start with the batch shape {batch}"
    return None


def _shown(value: object) -> str:
    """``value`` as its JSON, cut short for a one-line message."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _file_leaf(file: Path, dtype: np.dtype, shape: list[int], shown: str) -> FileLeaf | np.ndarray:
    """The leaf ``file`` holds, once its size is the one its ``meta.json`` entry describes:
    every byte of a folder is one of a leaf, or it would not come back from an output."""
    expected = math.prod(shape) * dtype.itemsize
    actual = file.lstat().st_size if os.path.lexists(file) else None
    if expected == 0 and actual is None:
        return np.empty(shape, dtype=dtype)  # tensordict writes no file for an empty leaf
    if actual != expected:
        found = "is missing" if actual is None else f"holds {actual} bytes"
        unit = " bytes" if actual is None else ""
        if actual is not None and actual > expected:
            hint = "the file and its meta.json disagree; restore the folder from the original"
        else:
            hint = "the folder is truncated or incomplete; restore it from the original"
        message = f"leaf file {found} where meta.json describes {expected}{unit}"
        raise _fail(message, file, shown, hint)
    return FileLeaf(file, dtype, tuple(shape))


def read_tree(root: Path) -> Tree:
    """Parse the memmap folder ``root`` (no tensordict, no unpickling); check leaf sizes."""
    if not (root / META).is_file():
        raise _fail(
            "not a tensordict memmap directory (no meta.json)",
            root,
            hint="pass a folder written by TensorDict.memmap()",
        )
    levels: dict[Key, Level] = {}
    leaves: dict[Key, Any] = {}
    keys = 0

    def walk(folder: Path, prefix: Key) -> Level:
        nonlocal keys
        meta_file = folder / META
        raw, content = read_json(meta_file)
        if not isinstance(content, dict):
            raise _fail("meta.json is not a JSON object", meta_file)
        keys += len(content)
        if keys > MAX_KEYS:
            raise _fail(
                f"the folder's meta.json files name more than {MAX_KEYS:,} keys",
                meta_file,
                hint=f"obsdelta reads TensorDicts of at most {MAX_KEYS:,} keys",
            )
        entries = {k: v for k, v in content.items() if isinstance(v, dict)}
        fields = {k: v for k, v in content.items() if not isinstance(v, dict)}
        batch = fields.get("shape")
        if batch is None and not prefix:
            raise _fail("meta.json has no batch shape", meta_file)
        problem = None if batch is None else _shape_problem(batch)  # a sub-level's is optional
        if problem is not None:
            raise _fail(f"meta.json's batch shape {_shown(batch)} {problem}", meta_file)
        level = Level(folder, raw, entries, fields)
        levels[prefix] = level
        for name, entry in entries.items():
            key = (*prefix, name)
            shown = "/".join(key)
            if entry.get("type") == "TensorDict":
                stem = _child(folder, name, "", Path.is_dir)
                if not (folder / stem / META).is_file():
                    raise _fail("sub-TensorDict folder has no meta.json", folder / stem, shown)
                if len(key) > MAX_DEPTH:
                    raise _fail(
                        f"sub-TensorDicts nest more than {MAX_DEPTH} levels deep",
                        folder / stem,
                        shown,
                        hint=f"obsdelta reads TensorDicts nested at most {MAX_DEPTH} deep",
                    )
                level.names[name] = stem
                level.children[name] = walk(folder / stem, key)
                continue
            if "dtype" in entry and "shape" in entry:
                dtype = leaf_dtype(entry["dtype"])
                shape = entry["shape"]
                if dtype is None:
                    raise _fail(f"leaf entry is not understood: {_shown(entry)}", meta_file, shown)
                problem = _shape_problem(shape, batch)
                if problem is not None:
                    raise _fail(f"leaf shape {_shown(shape)} {problem}", meta_file, shown)
                if entry.get("is_nested"):
                    raise _fail(
                        "nested (jagged) tensors are not supported",
                        meta_file,
                        shown,
                        hint="store the leaf as a dense tensor",
                    )
                stem = _child(folder, name, ".memmap", Path.is_file)
                level.names[name] = stem
                leaves[key] = _file_leaf(folder / f"{stem}.memmap", dtype, shape, shown)
                continue
            stem = _child(folder, name, "", os.path.lexists)
            paths = [p for p in (folder / stem, folder / f"{stem}.memmap") if os.path.lexists(p)]
            level.names[name] = stem
            leaves[key] = OpaqueEntry(paths)
        return level

    top = walk(root, ())
    return Tree(root, levels, leaves, len(top.fields["shape"]))


def _claimed(tree: Tree) -> set[Path]:
    """Files that belong to entries (leaves, opaque entries, sub-folders' meta.json)."""
    out: set[Path] = set()
    for level in tree.levels.values():
        out.add(level.folder / META)
    for leaf in tree.leaves.values():
        if isinstance(leaf, FileLeaf):
            out.add(Path(leaf.path))
    return out


def _leaf_entry(spec_shape: tuple[int, ...], dtype: np.dtype) -> dict[str, Any]:
    return {
        "device": "cpu",
        "shape": list(spec_shape),
        "dtype": f"torch.{dtype_name(dtype)}",  # as tensordict writes it
        "is_nested": False,
    }


def _dump(content: dict[str, Any], style_015: bool) -> bytes:
    if style_015:
        return json.dumps(content).encode()
    return json.dumps(content, separators=(",", ":")).encode()


def write_tree(
    tree: Tree, out_root: Path, plan: Plan, *, own_root: Path, restore: bool
) -> dict[Key, Any]:
    """Build the output folder ``out_root`` for ``plan``; return its leaves (writable FileLeafs
    for array keys, the input's :class:`OpaqueEntry` for others, already copied).

    ``own_root`` is where ``obsdelta.meta/`` lives (the container's root); with ``restore``,
    regenerated ``meta.json`` files are replaced by the originals kept there.
    """
    keep = {k for k in plan.order if k not in plan.new and k in tree.leaves}
    claimed = _claimed(tree)
    out_root.mkdir(parents=True, exist_ok=True)

    # 1. Every level that is kept: copy its unclaimed files byte for byte, and carry kept opaque
    # entries and leaf-less extras (e.g. env_metadata.json).
    for prefix, level in tree.levels.items():
        dst = out_root.joinpath(*[_stem(tree, prefix[: i + 1]) for i in range(len(prefix))])
        if prefix and not any(k[: len(prefix)] == prefix for k in plan.order):
            continue  # a level that disappears (next/delta on inflate)
        dst.mkdir(parents=True, exist_ok=True)
        entry_paths = set()
        for stem in level.names.values():
            entry_paths.add(stem)
            entry_paths.add(f"{stem}.memmap")
        for item in sorted(os.listdir(level.folder)):
            src = level.folder / item
            if not prefix and item in OWN:
                continue
            if item in entry_paths:
                continue
            if src in claimed and item != META:
                continue
            if src.is_dir() and not src.is_symlink():
                shutil.copytree(src, dst / item, symlinks=True)
            else:
                shutil.copy2(src, dst / item, follow_symlinks=False)
        for name in level.names:
            key = (*prefix, name)
            leaf = tree.leaves.get(key)
            if isinstance(leaf, OpaqueEntry) and key in keep:
                for p in leaf.paths:
                    if p.is_dir() and not p.is_symlink():
                        shutil.copytree(p, dst / p.name, symlinks=True)
                    else:
                        shutil.copy2(p, dst / p.name, follow_symlinks=False)

    # 2. The output's levels and their entries, in plan order.
    out_levels: dict[Key, list[str]] = {(): []}
    for key in plan.order:
        for i in range(len(key)):
            parent, name = key[:i], key[i]
            names = out_levels.setdefault(parent, [])
            if name not in names:
                names.append(name)
            if i < len(key) - 1:
                out_levels.setdefault(key[: i + 1], [])

    leaves: dict[Key, Any] = {}
    originals = own_root
    for prefix, names in out_levels.items():
        src_level = tree.levels.get(prefix)
        folder = out_root.joinpath(*[_out_stem(tree, prefix[: i + 1]) for i in range(len(prefix))])
        folder.mkdir(parents=True, exist_ok=True)
        entries: dict[str, Any] = {}
        for name in names:
            key = (*prefix, name)
            if key in plan.new:
                spec = plan.new[key]
                entries[name] = _leaf_entry(spec.shape, spec.dtype)
            elif src_level is not None and name in src_level.entries:
                entries[name] = src_level.entries[name]
            else:
                entries[name] = {"type": "TensorDict"}
        if src_level is not None:
            fields = src_level.fields
            style = src_level.style_015
        else:
            above = tree.levels.get(prefix[:-1]) or tree.levels[()]
            fields = above.fields
            style = above.style_015
        content = {**entries, **fields}
        same = (
            src_level is not None
            and list(src_level.entries) == names
            and all((*prefix, n) not in plan.new for n in names)
        )
        meta_file = folder / META
        if not same:
            data = _dump(content, style)
            rel = Path(*[_out_stem(tree, prefix[: i + 1]) for i in range(len(prefix))])
            kept = originals / ORIGINAL_META_DIR / rel / META
            if restore and kept.is_file():
                data = kept.read_bytes()
            elif not restore and src_level is not None:
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_bytes(src_level.raw)
            meta_file.write_bytes(data)
        # Leaves of this level.
        for name in names:
            key = (*prefix, name)
            if key not in plan.new and isinstance(tree.leaves.get(key), np.ndarray):
                leaves[key] = np.empty_like(tree.leaves[key])  # empty: no file, as tensordict
            elif key in plan.new or isinstance(tree.leaves.get(key), FileLeaf):
                if key in plan.new:
                    shape, dtype = plan.new[key].shape, plan.new[key].dtype
                else:
                    src = tree.leaves[key]
                    shape, dtype = src.shape, src.dtype
                known = src_level.names.get(name) if src_level else None
                file = folder / f"{known or encode_key(name)}.memmap"
                size = math.prod(shape) * dtype.itemsize
                if size == 0 and key in plan.new:
                    leaves[key] = np.empty(shape, dtype=dtype)
                    continue
                with open(file, "wb") as fh:
                    fh.truncate(size)
                elsewhere = None
                if plan.divert is not None and key not in plan.new:
                    elsewhere = plan.divert(key, tree.leaves[key])  # the file stays empty
                if elsewhere is not None:
                    leaves[key] = elsewhere
                    continue
                leaves[key] = FileLeaf(file, dtype, tuple(shape), writable=True)
            elif key in tree.leaves:
                leaves[key] = tree.leaves[key]
    return leaves


def _stem(tree: Tree, key: Key) -> str:
    level = tree.levels[key[:-1]]
    return level.names.get(key[-1], encode_key(key[-1]))


def _out_stem(tree: Tree, key: Key) -> str:
    level = tree.levels.get(key[:-1])
    if level is not None and key[-1] in level.names:
        return level.names[key[-1]]
    return encode_key(key[-1])
