"""A packed file: one HDF5 file holding a compressed dataset of any container.

``compress --pack`` writes it (:mod:`obsdelta_cli.formats.pack_io`). It mirrors the compressed
dataset it was packed from, the *inner* container, whose name the manifest keeps as
``source_format``:

- every leaf is a dataset at its key's path (``next/delta/observation``, ``observations``,
  ``data/demo_0/obs/agentview_image``), chunked along time and filtered with what measured
  smallest (:mod:`obsdelta_cli.filters`), holding its own values, so that any reader gets
  them; in a file packed by obsdelta 0.2, a uint8 image dataset may hold frame deltas (the
  attribute ``obsdelta_transform`` says so; :class:`PackedLeaf` undoes them);
- an HDF5 inner keeps its other objects as they were (groups, attributes, small, string and
  obsdelta's own datasets), and the creation properties of every repacked dataset in an empty
  twin under ``/obsdelta/pack/layout/<path>``, so ``inflate`` recreates each object as it was;
  a dataset whose columns repeat another's is a virtual dataset mapping them, its other columns
  kept under ``/obsdelta/pack/columns/<path>`` (:mod:`.pack_columns`; :class:`ColumnsLeaf`
  reads it);
- a folder inner keeps every other file (``meta.json`` files, replay-buffer metadata, pickles,
  exception rows) as an opaque byte dataset under ``/obsdelta/pack/files/``, named by index;
  the manifest's ``pack`` entry lists their paths;
- a ``.pt`` inner (:mod:`.pack_pt`) keeps its exception rows and the original file's skeleton
  as opaque byte datasets under ``/obsdelta/pack/files/``, and what is left of the ``.pt``
  file itself (its pickle and zip headers) as ``/obsdelta/pack/skeleton``.

The manifest is the inner dataset's, with ``format`` ``packed-hdf5`` and a ``pack`` entry, so
``verify``, ``report`` and ``open_dataset`` read a packed file like any compressed dataset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..arrays import DTYPES
from ..errors import UsageError
from ..filters import plugins
from ..heap import give_back
from .base import SIDECAR, ArrayStore, Format, Key, Plan, Sink, Source, key_str
from .hdf5_leaves import H5Arrays, leaf_dtype, leaves_of
from .hdf5_meta import own_of, read_meta
from .hdf5_objects import HashesAhead, attrs_hash, hash_objects_apart, hashes_ahead
from .hdf5_safety import check_contained, damaged_file, damaged_pack
from .hdf5_walk import file_reads, h5_file, object_at, own_key
from .leaf import LazyLeaf
from .pack_flat import Flat
from .pack_leaves import (
    COMMAND_CACHE_BYTES,
    NAME,
    TRANSFORM_ATTR,
    Entry,
    PackedFiles,
    file_bytes,
    is_packed,
    pack_info,
    packed_leaf,
    repacked_leaf,
    virtual_record,
)
from .pack_pt import pt_hashes


class Packed(Format):
    """A packed HDF5 file (``compress --pack``): read like the compressed dataset it holds."""

    name = NAME
    summary = "one packed HDF5 file written by compress --pack"
    #: HDF5 chunk cache per opened dataset; :func:`obsdelta_cli.open_dataset` sets its own.
    cache_bytes = COMMAND_CACHE_BYTES

    @classmethod
    def sniff(cls, path: Path) -> bool:
        return is_packed(path)

    def open(self, path: Path) -> Source:
        plugins()  # the filters must be registered before a dataset is read
        try:
            # The chunk cache asked for (training reads hit the same chunks often); its slots
            # are sized per dataset as the file is walked (hdf5_leaves._cache_slots).
            f = h5_file(path, rdcc_nbytes=self.cache_bytes)
        except (OSError, ValueError) as exc:
            raise damaged_file(path, exc) from None
        # A flat packed file is read through its skeleton, opened apart (.pack_flat).
        handle: h5py.File = f
        memo: dict[str, Any] = {}
        try:
            meta = read_meta(f, path)
            if meta is None:
                raise damaged_pack(path, "the packed file has no obsdelta metadata")
            info = pack_info(meta, path)
            own = memo["own"] = own_of(meta, path)
            # Before anything is read: the file points nowhere outside itself, and its virtual
            # datasets map exactly what the manifest records.
            check_contained(f, path, virtual_record(info, path))
            batch_dims, valid = meta.get("batch_dims"), meta.get("valid_rows")
            if not isinstance(batch_dims, int) or not (valid is None or isinstance(valid, int)):
                raise damaged_pack(path, "obsdelta metadata field batch_dims is malformed")
            if info["kind"] == "hdf5" and "flat" in info:
                flat = memo["flat"] = Flat(f, path, info, self.cache_bytes, own)
                handle = flat.open_skeleton()
                leaves = flat.leaves(handle)
                arrays: ArrayStore = H5Arrays(handle, path, own=own)
            elif info["kind"] == "hdf5":
                if self.hash_ahead is not None:  # beside the walk of the datasets below
                    repacked = list(info["datasets"])  # hashed by their values (object_hashes)
                    memo["ahead"] = hashes_ahead(f, path, meta, own, self.hash_ahead, repacked)
                leaves = self._hdf5_leaves(f, path, info, own)
                arrays = H5Arrays(f, path, own=own)
            else:
                leaves = self._folder_leaves(f, path, info)
                arrays = PackedFiles(f, path, _array_files(info))
        except (RuntimeError, OSError, KeyError, ValueError, TypeError) as exc:
            _close(f, memo, handle)
            raise damaged_pack(path, f"cannot read the file's structure ({exc})") from None
        except BaseException:
            _close(f, memo, handle)
            raise
        source = Source(path, leaves, batch_dims, meta, valid, arrays=arrays, handle=handle)
        source.memo.update(memo)
        return source

    def _leaf(self, f: h5py.File, ds: h5py.Dataset, path: Path) -> LazyLeaf:
        return packed_leaf(ds, path, self.cache_bytes, file_reads(f), owner=f)

    def _hdf5_leaves(
        self, f: h5py.File, path: Path, info: dict[str, Any], own: str
    ) -> dict[Key, Any]:
        repacked: dict[str, Any] = info["datasets"]
        pack = key_str((*own_key(own), "pack"))

        def leaf(name: str, ds: h5py.Dataset) -> LazyLeaf | None:
            if name == pack or name.startswith(f"{pack}/"):
                return None
            if name in repacked:
                return repacked_leaf(f, path, name, repacked[name], self.cache_bytes, ds=ds)
            return self._leaf(f, ds, path)

        return leaves_of(f, path, own=own, leaf=leaf)

    def _folder_leaves(self, f: h5py.File, path: Path, info: dict[str, Any]) -> dict[Key, Any]:
        leaves: dict[Key, Any] = {}
        for entry in info["leaves"]:
            key, kind = tuple(entry["key"]), entry["kind"]
            if kind == "data":
                ds = f.get(key_str(key))
                if not isinstance(ds, h5py.Dataset) or leaf_dtype(ds.dtype) is None:
                    raise damaged_pack(path, f"leaf {key_str(key)} is missing")
                leaves[key] = self._leaf(f, ds, path)
            elif kind == "empty":
                dtype = _named_dtype(str(entry["dtype"]))
                if dtype is None:
                    raise damaged_pack(path, f"leaf {key_str(key)} has an unknown dtype")
                leaves[key] = np.empty([int(d) for d in entry["shape"]], dtype=dtype)
            else:
                leaves[key] = Entry(key)
        return leaves

    def close(self, source: Source) -> None:
        flat = source.memo.get("flat")
        _close(flat.f if flat is not None else source.handle, source.memo, source.handle)

    def object_hashes(
        self,
        opened: Source | Sink,
        skip: Callable[[str], bool],
        known: Mapping[str, str] | None = None,
        recorded: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """The inner container's objects, as the inner would hash them: a folder's files by
        path; an HDF5 inner's objects as stored, where a repacked dataset counts as the one
        recorded when its values hash as they did when it was packed."""
        f: h5py.File = opened.handle
        file = Path(f.filename)
        meta = opened.meta if isinstance(opened, Source) else None
        info = pack_info(meta or {}, file)
        if info["kind"] == "pt":  # its reads report damage themselves
            return pt_hashes(opened, file, info, skip)
        try:
            if info["kind"] == "folder":
                return _folder_hashes(f, file, info, skip)
            flat = opened.memo.get("flat") if isinstance(opened, Source) else None
            if flat is not None:
                return _hdf5_hashes(f, file, info, meta or {}, skip, known or {}, flat.leaf)
            ahead = opened.memo.pop("ahead", None) if isinstance(opened, Source) else None
            return _hdf5_hashes(f, file, info, meta or {}, skip, known or {}, ahead=ahead)
        except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise damaged_pack(file, f"cannot read an object ({exc})") from None

    def value_hashes(self, source: Source) -> dict[str, str]:
        """The repacked datasets of an HDF5 inner: their values hash stands for the object."""
        info = pack_info(source.meta or {}, source.path)
        if info["kind"] != "hdf5":
            return {}
        repacked: dict[str, Any] = info["datasets"]
        return {
            name: entry["values"]
            for name, entry in repacked.items()
            if isinstance(entry, dict) and isinstance(entry.get("values"), str)
        }

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        raise UsageError("a packed file is written by compress --pack", file=path)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        raise UsageError("a packed file is written by compress --pack", file=path)


def _close(f: h5py.File, memo: dict[str, Any] | None, handle: Any) -> None:
    """Close a packed file, and a flat one's skeleton (its temporary file deleted); end the
    object check begun as it was opened."""
    ahead = (memo or {}).pop("ahead", None)
    if ahead is not None:
        ahead.cancel()
    flat = (memo or {}).get("flat")
    if flat is not None:
        if handle is not None and handle is not f:
            handle.close()
        flat.close()
    f.close()
    give_back()


def _named_dtype(name: str) -> np.dtype | None:
    """The dtype an empty leaf's entry names: one obsdelta encodes, or a complex one a
    ``.pt`` file may carry along."""
    if name in ("complex64", "complex128"):
        return np.dtype(name)
    return DTYPES.get(name)


def _array_files(info: dict[str, Any]) -> dict[str, int]:
    """Where each exception array of a folder or ``.pt`` inner is among the packed files."""
    if info["kind"] == "pt":
        return {f"obsdelta.arrays/{name}.bin": i for i, name in enumerate(info["arrays"])}
    return {p: i for i, p in enumerate(info["files"])}


def _folder_hashes(
    f: h5py.File, file: Path, info: dict[str, Any], skip: Callable[[str], bool]
) -> dict[str, str]:
    # The rule of formats.base.folder_hashes: leaves, the manifest and exception rows are
    # checked on their own.
    out: dict[str, str] = {}
    for i, rel in enumerate(info["files"]):
        head = rel.split("/")[0]
        if head in (SIDECAR, "obsdelta.arrays") or rel.endswith(".memmap") or skip(rel):
            continue
        out[rel] = xxhash.xxh3_64_hexdigest(file_bytes(f, i, file))
    return out


def values_hash(ds: Any, rows: int, step: int) -> str:
    """xxh3-64 of a dataset's values in row order, read ``step`` rows at a time."""
    h = xxhash.xxh3_64()
    for start in range(0, rows, step):
        block = ds.read(start, min(rows, start + step))
        h.update(np.ascontiguousarray(block).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _hdf5_hashes(
    f: h5py.File,
    file: Path,
    info: dict[str, Any],
    meta: dict[str, Any],
    skip: Callable[[str], bool],
    known: Mapping[str, str],
    member: Callable[[h5py.Dataset, str], LazyLeaf] | None = None,
    ahead: HashesAhead | None = None,
) -> dict[str, str]:
    """An HDF5 inner's objects; a repacked dataset in ``known`` is taken as recorded there
    (its values are checked as a leaf), the others are read and hashed (a flat file's
    members, ``member``, from their families); ``ahead``: the hashes of the objects kept as
    they are, begun as the file was opened."""
    repacked: dict[str, Any] = info["datasets"]
    recorded = meta.get("objects") or {}
    own = own_of(meta, file)
    # Every object, in a child: a damaged attribute can crash HDF5 (.apart). The values of
    # the repacked datasets are not read there (taken as recorded): they are checked below.
    unread = {n: recorded[n] for n in repacked if isinstance(recorded.get(n), str)}
    out = hash_objects_apart(f, file, skip, unread, copied_from=recorded, own=own, ahead=ahead)
    for name, entry in repacked.items():
        if skip(name):
            continue
        ds = object_at(f, name)
        if not isinstance(ds, h5py.Dataset):
            continue  # missing: the caller reports it
        # The transform mark is the pack's own; obsdelta's own datasets are not in the walk.
        if TRANSFORM_ATTR in ds.attrs or f"@{name}" not in out:
            out.pop(f"@{name}", None)
            if any(a != TRANSFORM_ATTR for a in ds.attrs):
                out[f"@{name}"] = attrs_hash(ds, exclude=TRANSFORM_ATTR)
        if name in known:
            out[name] = known[name]
            continue
        leaf = member(ds, name) if member else repacked_leaf(f, file, name, entry, 0, ds=ds)
        rows = ds.shape[0] if ds.ndim else 0
        step = max(1, (4 << 20) // max(1, math.prod(ds.shape[1:]) * ds.dtype.itemsize))
        found = values_hash(leaf, rows, step)
        ok = found == entry.get("values")
        out[name] = str(recorded.get(name)) if ok else f"values {found}"
    return out
