"""Flat packed files (``compress --pack --flat``): the datasets of many episodes stored as one
dataset per key.

A robomimic or Minari file holds one group per episode, each with the same datasets
(``obs/object``, ``actions``, ...) of a few dozen rows. Packed at their paths, every one costs
an HDF5 object header and its layout twin (together about 0.5 KB), and is compressed alone,
too little for zstd to find much in: 1,000 robomimic low-dim demos packed that way are larger
than ``zstd -3`` of the whole file. A flat packed file holds instead:

- ``/obsdelta/pack/flat/<family>``: the rows of every dataset of one *family* (the same path
  but for the numbers in its groups' names, the same dtype and row shape) one after the
  other, in the inner file's order, chunked along time and filtered like any packed dataset;
  a column repeating another's on every row is stored once (:mod:`.pack_columns`);
- ``/obsdelta/pack/skeleton``: an HDF5 file, as opaque bytes: the inner container without
  its manifest, each of those datasets an empty twin at its path (its creation properties and
  attributes, no values), everything else as it was;
- the manifest's ``pack`` entry: the families (``flat``: path, filter, members in order) and
  each member's values hash (``datasets``), and the skeleton's hash.

Plain h5py reads every dataset of the file. robomimic's and Minari's own readers, which look
for each episode's datasets at their paths, do not; ``open_dataset``, ``verify`` and
``inflate`` read it through the skeleton, which they check against its hash and then as any
input (nothing pointing outside it) before HDF5 parses it.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import re
import tempfile
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..arrays import bfloat16
from ..errors import UsageError
from .base import Key
from .hdf5 import copy_attrs
from .hdf5_create import Groups, write_unstored
from .hdf5_leaves import is_bf16, leaf_dtype, leaves_of
from .hdf5_safety import check_contained, damaged_pack
from .hdf5_walk import OWN, h5_file, object_at, objects_of
from .leaf import LazyLeaf
from .pack_columns import plan_columns, write_virtual
from .pack_io import _absent_chunks, _repacked, _write_kept, copy_structure, filtered_header
from .pack_leaves import PACK, byte_blocks, repacked_leaf
from .pack_writer import Chooser, DatasetWriter, write_bytes

#: The families' datasets.
FLAT = f"{PACK}/flat"
#: The inner container's structure, as the bytes of an HDF5 file.
SKELETON = f"{PACK}/skeleton"
#: Skeletons (by their hash) found to point nowhere outside themselves: a DataLoader worker
#: forked from a process that checked one need not run the check, which forks, again.
_CONTAINED: set[str] = set()
#: Rows read from the inner file at a time while hashing a member.
HASH_BYTES = 8 << 20


def family_of(path: str, ds: Any) -> tuple[str, str, tuple[int, ...]]:
    """The family a dataset's rows join: its path with the numbers of its groups' names
    blanked (not of its own name: ``robot0_eef_pos`` and ``robot1_eef_pos`` stay apart), its
    dtype and its row shape.

    >>> family_of("data/demo_12/obs/robot0_eef_pos", np.zeros((5, 3)))
    ('data/demo_#/obs/robot0_eef_pos', '<f8', (3,))
    """
    return _blanked(path), ds.dtype.str, tuple(int(n) for n in ds.shape[1:])


def _blanked(path: str) -> str:
    """``path`` with the numbers of its groups' names (not its own name's) blanked."""
    *groups, name = path.split("/")
    return "/".join([*(re.sub(r"\d+", "#", g) for g in groups), name])


def largest_family(f: h5py.File) -> int:
    """How many datasets the largest family of ``f`` would gather, counted by path alone (the
    names are walked, no dataset is opened): the number of episodes of a robomimic or Minari
    file, 1 for a D4RL file.

    >>> import io
    >>> with h5py.File(io.BytesIO(), "w") as f:
    ...     for i in range(3):
    ...         _ = f.create_dataset(f"data/demo_{i}/actions", data=[0.0])
    ...     largest_family(f)
    3
    """
    names: list[bytes] = []
    h5py.h5o.visit(f.id, names.append, info=False)
    counts: dict[str, int] = {}
    for raw in names:
        path = raw.decode(errors="replace")
        if "/" in path:  # an object in a group: one that could join a family
            blanked = _blanked(path)
            counts[blanked] = counts.get(blanked, 0) + 1
    return max(counts.values(), default=1)


class Concat:
    """The rows of datasets of one family, one after the other, read like one dataset (what
    :func:`~.pack_columns.plan_columns` and the packing writers read)."""

    def __init__(self, members: list[h5py.Dataset]) -> None:
        self.members = members
        self.starts = [0]
        for ds in members:
            self.starts.append(self.starts[-1] + int(ds.shape[0]))
        first = members[0]
        self.dtype = first.dtype
        self.shape = (self.starts[-1], *(int(n) for n in first.shape[1:]))
        self.ndim = len(self.shape)

    @property
    def id(self) -> Any:
        """The first member's HDF5 identifier: its type is the family's."""
        return self.members[0].id

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(self.shape[0])
        stop = max(start, stop)
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        i = bisect.bisect_right(self.starts, start) - 1
        at = start
        while at < stop:
            first, end = self.starts[i], min(stop, self.starts[i + 1])
            if at == first and end == self.starts[i + 1] and end > at:
                # A whole member, read by HDF5's own call: h5py's selections cost more than
                # the few KB of a short episode's rows.
                self.members[i].id.read(h5py.h5s.ALL, h5py.h5s.ALL, out[at - start : end - start])
            elif end > at:
                self.members[i].read_direct(
                    out, np.s_[at - first : end - first], np.s_[at - start : end - start]
                )
            at, i = end, i + 1
        return out


def _values_hash(ds: h5py.Dataset) -> str:
    """xxh3-64 of a dataset's values in row order."""
    h = xxhash.xxh3_64()
    row = max(1, math.prod(ds.shape[1:]) * ds.dtype.itemsize)
    step = max(1, HASH_BYTES // row)
    for start in range(0, ds.shape[0], step):
        h.update(np.ascontiguousarray(ds[start : start + step]).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _twin(ds: h5py.Dataset, dst: h5py.Group, name: str) -> None:
    """``ds`` without its values: its creation properties, shape and attributes, never
    written, so taking no storage."""
    copy_attrs(ds, write_unstored(dst, name, ds))


def _skeleton(src: h5py.File, members: set[str], own: str) -> bytes:
    """The bytes of an HDF5 file holding ``src`` (whose obsdelta group is ``own``) but its
    manifest, each of ``members`` a twin."""
    f = h5py.File(
        f"skeleton-{os.getpid()}-{id(src)}",
        "w",
        driver="core",
        backing_store=False,
        libver=src.libver,
    )
    try:
        twin = lambda ds, dst, name, _path: _twin(ds, dst, name)  # noqa: E731
        copy_structure(src, f, members, twin, own)
        if own in f and not len(f[own]):
            del f[own]
        f.flush()
        return bytes(f.id.get_file_image())
    finally:
        f.close()


def pack_flat(src: h5py.File, out: h5py.File, chooser: Chooser, own: str = OWN) -> dict[str, Any]:
    """Write the families of the HDF5 inner ``src`` (whose obsdelta group is ``own``) into the
    packed file ``out``, and its skeleton; return the manifest's ``pack`` entry. The families
    and the skeleton are under ``/obsdelta/pack`` whatever ``own`` is: only obsdelta reads a
    flat file."""
    families: dict[tuple[str, str, tuple[int, ...]], list[tuple[str, h5py.Dataset]]] = {}
    for path, obj in objects_of(src):
        if isinstance(obj, h5py.Dataset) and _repacked(obj, path, own, flat=True):
            families.setdefault(family_of(path, obj), []).append((path, obj))
    columns: dict[str, Concat] = {}
    names: dict[str, list[str]] = {}
    for (blanked, _dtype, _row), found in families.items():
        column, n = f"{FLAT}/{blanked}", 1
        while column in columns:  # the same path, another dtype or row shape
            column, n = f"{FLAT}/{blanked}~{n}", n + 1
        columns[column] = Concat([ds for _, ds in found])
        names[column] = [path for path, _ in found]
    datasets: dict[str, Any] = {}
    flat: list[dict[str, Any]] = []
    shared = plan_columns(columns)
    groups = Groups(out)
    for column, concat in columns.items():
        parent, _, leaf = column.rpartition("/")
        group = groups(parent)
        plan = shared.get(column)

        def read(start: int, stop: int, concat: Concat = concat) -> np.ndarray:
            return concat[start:stop]

        if plan is None:
            writer = DatasetWriter(group, leaf, column, read, concat.shape, concat.dtype, chooser)
            entry = writer.fill()
        else:
            entry = _write_kept(concat, read, column, groups, chooser, plan, OWN)
            write_virtual(group, leaf, concat, plan)
        index = len(flat)
        flat.append({**entry, "path": column, "members": names[column]})
        for path, ds in zip(names[column], concat.members, strict=True):
            dcpl = ds.id.get_create_plist()
            member: dict[str, Any] = {
                "flat": index,
                # report --pack (sampling) predicts a size: it checks no values.
                "values": "" if chooser.sample else _values_hash(ds),
                "alloc_time": dcpl.get_alloc_time(),
                **filtered_header(ds, dcpl),
            }
            absent = _absent_chunks(ds)
            if absent is not None:
                member["absent"] = absent
            datasets[path] = member
    image = _skeleton(src, set(datasets), own)
    write_bytes(out, SKELETON, image)
    return {
        "kind": "hdf5",
        "libver": list(src.libver),
        "datasets": datasets,
        "flat": flat,
        "skeleton": xxhash.xxh3_64_hexdigest(image),
    }


# ---------------------------------------------------------------------------------------------
# Reading


class SliceLeaf(LazyLeaf):
    """A member of a family: rows ``start:start + rows`` of its family's dataset."""

    def __init__(
        self, base: LazyLeaf, start: int, shape: tuple[int, ...], dtype: np.dtype, share: float
    ) -> None:
        self.base, self.start, self.shape, self.dtype = base, start, shape, dtype
        self._share = share
        self.chunk_rows = getattr(base, "chunk_rows", 1)

    def _typed(self, a: np.ndarray) -> np.ndarray:
        return a if a.dtype == self.dtype else a.view(self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        stop = max(start, min(stop, self.shape[0]))
        return self._typed(self.base.read(self.start + start, self.start + stop))

    def select(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (sorted, distinct) in one read of the family's dataset."""
        select = getattr(self.base, "select", None)
        if select is None:
            return np.stack([self.read(int(r), int(r) + 1)[0] for r in rows])
        return self._typed(select(np.asarray(rows) + self.start))

    def storage_bytes(self) -> int:
        """Its share of the family's stored bytes, by rows."""
        stored = getattr(self.base, "storage_bytes", lambda: 0)()
        return round(stored * self._share)

    def write(self, start: int, value: np.ndarray) -> None:
        raise UsageError("a packed file is read-only")


class Flat:
    """The families of an opened flat packed file: their datasets (each opened once), the
    skeleton extracted to a private temporary file, and each member's leaf."""

    def __init__(
        self, f: h5py.File, file: Path, info: dict[str, Any], cache_bytes: int, own: str = OWN
    ) -> None:
        """``own``: where the skeleton (the inner file) keeps obsdelta's group."""
        self.f, self.file, self.info, self.own = f, file, info, own
        self.cache_bytes = cache_bytes
        self.skeleton_path = _extract(f, file, info)
        # Deleted when closed, or else when this object goes (open_dataset's users need not
        # close) or its process ends, a DataLoader worker's included (multiprocessing runs
        # these as a worker exits, where atexit does not), by this process only: a worker
        # forked from it holds a copy.
        self._gone = Finalize(self, _unlink, args=(self.skeleton_path, os.getpid()), exitpriority=0)
        self._bases: dict[int, LazyLeaf] = {}
        self.starts: dict[str, int] = {}

    def open_skeleton(self) -> h5py.File:
        """The skeleton, opened read-only and checked to point nowhere outside itself, its
        members' twins checked to tile their families' rows."""
        try:
            s = h5_file(self.skeleton_path)
        except (OSError, ValueError) as exc:
            raise damaged_pack(self.file, f"the skeleton is not an HDF5 file ({exc})") from None
        try:
            digest = self.info["skeleton"]
            if digest not in _CONTAINED:  # the same bytes, checked once in this process
                check_contained(s, self.skeleton_path)
                _CONTAINED.add(digest)
            self._check_members(s)
        except BaseException:
            s.close()
            raise
        return s

    def _check_members(self, s: h5py.File) -> None:
        datasets: dict[str, Any] = self.info["datasets"]
        flat = self.info.get("flat")
        if not isinstance(flat, list):
            raise damaged_pack(self.file, "obsdelta metadata field pack.flat is malformed")
        for index, family in enumerate(flat):
            if not isinstance(family, dict) or not isinstance(family.get("members"), list):
                raise damaged_pack(self.file, "obsdelta metadata field pack.flat is malformed")
            base = self._column(index)
            at = 0
            for path in family["members"]:
                entry = datasets.get(path) if isinstance(path, str) else None
                # From the walk leaves_of makes too: opened once, not reached through links.
                twin = object_at(s, path) if isinstance(entry, dict) else None
                if (
                    not isinstance(twin, h5py.Dataset)
                    or entry.get("flat") != index  # type: ignore[union-attr]
                    or twin.is_virtual
                    or twin.id.get_storage_size()
                    or not twin.ndim
                    or tuple(twin.shape[1:]) != tuple(base.shape[1:])
                    or twin.dtype.itemsize != base.dtype.itemsize
                    or path in self.starts
                ):
                    what = f"member {path!s} of {family.get('path')} is unfit"
                    raise damaged_pack(self.file, what)
                self.starts[path] = at
                at += int(twin.shape[0])
            if at != base.shape[0]:
                what = f"the members of {family.get('path')} do not cover its rows"
                raise damaged_pack(self.file, what)
        if set(self.starts) != set(datasets):
            raise damaged_pack(self.file, "a repacked dataset belongs to no family")

    def _column(self, index: int) -> LazyLeaf:
        base = self._bases.get(index)
        if base is None:
            family = self.info["flat"][index]
            path = family.get("path")
            if not isinstance(path, str) or not path.startswith(f"{FLAT}/"):
                raise damaged_pack(self.file, "obsdelta metadata field pack.flat is malformed")
            base = repacked_leaf(self.f, self.file, path, family, self.cache_bytes)
            self._bases[index] = base
        return base

    def leaf(self, twin: h5py.Dataset, path: str) -> LazyLeaf:
        """Member ``path``'s leaf: its rows of its family's dataset, in its twin's dtype."""
        base = self._column(self.info["datasets"][path]["flat"])
        dtype = bfloat16() if is_bf16(twin) else leaf_dtype(twin.dtype)
        if dtype is None:
            raise damaged_pack(self.file, f"member {path} has a dtype obsdelta does not read")
        rows = int(twin.shape[0])
        share = rows / max(1, base.shape[0])
        return SliceLeaf(base, self.starts[path], tuple(twin.shape), dtype, share)

    def leaves(self, s: h5py.File) -> dict[Key, Any]:
        """The skeleton's leaves, each member read from its family."""
        out = leaves_of(s, self.file, own=self.own)
        for key in list(out):
            path = "/".join(key)
            if path in self.starts:
                out[key] = self.leaf(out[key].ds, path)
        return out

    def close(self) -> None:
        self._gone()


def _unlink(path: Path, pid: int) -> None:
    if os.getpid() == pid:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _extract(f: h5py.File, file: Path, info: dict[str, Any]) -> Path:
    """The skeleton's bytes in a private temporary file, checked against their hash (a block
    at a time: memory stays bounded whatever length the file claims)."""
    fd, name = tempfile.mkstemp(prefix="obsdelta-skeleton-", suffix=".h5")
    h = xxhash.xxh3_64()
    try:
        with os.fdopen(fd, "wb") as fh:
            for block in byte_blocks(f, SKELETON, file):
                h.update(block)
                fh.write(block)
        if h.hexdigest() != info.get("skeleton"):
            raise damaged_pack(file, "the skeleton does not match its hash")
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def is_flat(info: dict[str, Any]) -> bool:
    """Whether a packed file's ``pack`` entry is a flat one."""
    return info.get("kind") == "hdf5" and "flat" in info
