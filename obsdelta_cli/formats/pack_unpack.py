"""Unpacking a packed file back to its inner container: a folder file for file, an HDF5 file
object for object with each dataset's original creation properties, so that its own checks
(raw chunks and attributes, as recorded at compress time) pass again.

A dataset stored filtered is filtered again here, by this machine's HDF5, whose zlib may
encode the same values to other bytes than the one that wrote the original: where the pack
recorded its header (:func:`~.pack_io.filtered_header`), its values and header are checked
against the pack's record, and the inner container's record of its raw chunks is replaced by
what was written."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..manifest import Manifest
from .base import Source, write_sidecar
from .hdf5 import copy_attrs
from .hdf5_chunks import DirectWrites
from .hdf5_copy import Relinks, copy_object, copy_values
from .hdf5_create import ALLOC_TIMES, create_dataset, dcpl_like
from .hdf5_leaves import META_ATTR
from .hdf5_meta import manifest_path, own_of_source, write_meta
from .hdf5_objects import chunked_hash, hash_objects_apart, header_hash
from .hdf5_safety import damaged_pack, output_libver, reading_pack
from .hdf5_walk import held_at, layout_twins
from .pack_io import group_like, h5_output
from .pack_leaves import (
    COMMAND_CACHE_BYTES,
    TRANSFORM_ATTR,
    file_bytes,
    repacked_leaf,
)
from .pack_props import maxshape_of, props_of
from .pack_writer import BLOCK_BYTES, stored_rows


def _safe_rel(rel: Any, file: Path) -> Path:
    """A relative path from the manifest, refused if it would leave the output folder."""
    parts = str(rel).split("/") if isinstance(rel, str) else []
    if not parts or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise damaged_pack(file, f"the packed file names an unsafe path ({rel!r})")
    return Path(*parts)


def _copy_rows(leaf: Any, rows: int, write: Callable[[int, np.ndarray], None], step: int) -> None:
    for start in range(0, rows, step):
        write(start, stored_rows(leaf.read(start, min(rows, start + step))))


def unpack_folder(packed: Source, info: dict[str, Any], inner: Manifest, out: Path) -> None:
    f: h5py.File = packed.handle
    out.mkdir()
    for rel in info["dirs"]:
        (out / _safe_rel(rel, packed.path)).mkdir(parents=True, exist_ok=True)
    for i, rel in enumerate(info["files"]):
        (out / _safe_rel(rel, packed.path)).write_bytes(file_bytes(f, i, packed.path))
    for entry in info["leaves"]:
        if entry.get("kind") != "data":
            continue
        leaf = packed.leaves[tuple(entry["key"])]
        target = out / _safe_rel(entry.get("file"), packed.path)
        row_bytes = max(1, math.prod(leaf.shape[1:]) * leaf.dtype.itemsize)
        with target.open("wb") as fh:

            def put(start: int, block: np.ndarray, fh: Any = fh) -> None:
                fh.write(np.ascontiguousarray(block).tobytes())

            _copy_rows(leaf, leaf.shape[0], put, max(1, BLOCK_BYTES // row_bytes))
    write_sidecar(out, inner.to_json())


def _check_kept(packed: Source, datasets: dict[str, Any], inner: Manifest) -> None:
    """The objects unpacking copies whole (those not repacked), checked against the inner
    container's record before HDF5 is asked to copy them, as inflate checks what it copies:
    HDF5 can crash on a damaged object it copies."""
    # Read from the file the objects are in: a flat packed file's skeleton is apart. Begun as
    # the file was opened, where the command asked for that (see Packed.hash_ahead).
    ahead = packed.memo.pop("ahead", None)
    with reading_pack(packed.path):
        held = Path(packed.handle.filename)
        found = hash_objects_apart(
            packed.handle,
            held,
            lambda name: name in datasets,
            copied_from=inner.objects,
            own=own_of_source(packed),
            ahead=ahead,
        )
    differing = inner.object_differing(found, all_recorded=False)
    if differing is not None:
        name, recorded, _ = differing
        what = "is not in its record" if recorded is None else "does not match its hash"
        raise damaged_pack(packed.path, f"object {name or '/'} {what}")
    # And every recorded object that is kept was found: damage can turn a dataset's header
    # into one of another kind (a named datatype), which the hashing passes over and whose
    # object copy crashed HDF5.
    missing = [n for n in sorted(inner.objects) if n not in found and n.lstrip("@") not in datasets]
    if missing:
        raise damaged_pack(packed.path, f"object {missing[0] or '/'} is missing")


def unpack_hdf5(packed: Source, info: dict[str, Any], inner: Manifest, out: Path) -> None:
    src: h5py.File = packed.handle
    if inner.objects:  # recorded by format 2 on
        _check_kept(packed, info["datasets"], inner)
    stored = info.get("libver")
    libver = output_libver(tuple(stored) if isinstance(stored, list) else None, packed.path)
    with (
        h5_output(out, libver) as f,
        reading_pack(packed.path),
    ):
        copy_attrs(src, f, exclude=META_ATTR)
        encoded: dict[str, str] = {}
        _unpack_group(packed, src, f, info["datasets"], encoded)
        own = own_of_source(packed)
        if own in f and not len(f[own]):
            del f[own]
        if encoded:
            objects = {n: encoded.get(n, h) for n, h in inner.objects.items()}
            inner = replace(inner, objects=objects)
        write_meta(f, inner.to_json())


def _unpack_group(
    packed: Source,
    group: h5py.Group,
    dst: h5py.Group,
    datasets: dict[str, Any],
    encoded: dict[str, str],
    relinks: Relinks | None = None,
) -> None:
    """Unpack ``group`` into ``dst``; ``encoded`` gets the hash of each dataset filtered again
    whose values and header were checked (see the module)."""
    relinks = Relinks() if relinks is None else relinks
    own = own_of_source(packed)
    prefix = group.name.strip("/")
    for name in group:
        # The objects as the file's walk holds them open: items() would open each again.
        path = f"{prefix}/{name}" if prefix else name
        obj = held_at(packed.handle, path)
        if path in (f"{own}/pack", manifest_path(own)) or relinks.relinked(obj, dst, name):
            continue
        if isinstance(obj, h5py.Group):
            _unpack_group(packed, obj, group_like(obj, dst, name), datasets, encoded, relinks)
        elif path in datasets:
            found = _restore(packed, obj, dst, name, path, datasets[path])
            if found is not None:
                encoded[path] = found
        elif path.startswith(f"{own}/") and not isinstance(obj, h5py.Dataset):
            # obsdelta's own objects are groups and datasets: anything else is a damaged
            # header, which HDF5's object copy met with a crash.
            raise damaged_pack(packed.path, f"obsdelta's object {path} is not a dataset")
        elif path.startswith(f"{own}/arrays/"):
            # Not an object copy: HDF5 reads the attribute's string through a heap address,
            # which damage turned into a crash; the values are checked against the rows'
            # hashes as inflate reads them, and the manifest gives the dtype.
            copy_values(obj, dst, name)
        else:
            copy_object(group, obj, dst, name)


def _restore(
    packed: Source, ds: h5py.Dataset, dst: h5py.Group, name: str, path: str, entry: Any
) -> str | None:
    """Recreate a repacked dataset with its original creation properties (recorded in the
    manifest, or those of its twin) and values (those of a flat packed file's member: its
    twin in the skeleton, and its rows of its family); its hash where it was filtered again
    and checked (:func:`_filtered_again`)."""
    flat = packed.memo.get("flat")
    record = entry.get("props") if flat is None else None
    if record is not None:
        try:
            dcpl, maxshape = props_of(record, ds.dtype), maxshape_of(record)
        except (KeyError, TypeError, ValueError, RuntimeError, OverflowError):
            raise damaged_pack(packed.path, f"the recorded layout of {path} is not one") from None
    else:
        own = own_of_source(packed)
        twin = ds if flat is not None else packed.handle.get(f"{layout_twins(own)}/{path}")
        if not isinstance(twin, h5py.Dataset) or twin.shape != ds.shape or twin.dtype != ds.dtype:
            raise damaged_pack(packed.path, f"the original layout of {path} is missing")
        dcpl, maxshape = dcpl_like(twin.id.get_create_plist(), True), twin.maxshape
    if entry.get("alloc_time") in ALLOC_TIMES:
        dcpl.set_alloc_time(entry["alloc_time"])
    try:
        new = create_dataset(dst, name, ds.dtype, ds.shape, maxshape, dcpl)
    except (ValueError, RuntimeError) as exc:
        if record is None:
            raise
        what = f"the recorded layout of {path} does not fit it ({' '.join(str(exc).split())})"
        raise damaged_pack(packed.path, what) from None
    for attr in ds.attrs:
        if attr != TRANSFORM_ATTR:
            new.attrs.create(attr, ds.attrs[attr], dtype=ds.attrs.get_id(attr).dtype)
    if flat is not None:
        leaf = flat.leaf(ds, path)
    else:
        leaf = repacked_leaf(packed.handle, packed.path, path, entry, COMMAND_CACHE_BYTES, ds=ds)
    absent = entry.get("absent")
    if absent == []:
        return None  # never written: no storage, as the original
    if absent:
        # Only the chunks the original had: a chunk never written stays unallocated.
        skip = {tuple(o) for o in absent}
        chunks = new.chunks or ()
        grid = np.stack(
            np.meshgrid(*[np.arange(0, n, c) for n, c in zip(new.shape, chunks, strict=True)]),
            -1,
        ).reshape(-1, new.ndim)
        for o in grid:
            if tuple(int(x) for x in o) in skip:
                continue
            sel = tuple(
                slice(int(a), min(n, int(a) + c))
                for a, n, c in zip(o, new.shape, chunks, strict=True)
            )
            new[sel] = stored_rows(leaf.read(sel[0].start, sel[0].stop))[(slice(None), *sel[1:])]
        return None
    per = new.chunks[0] if new.chunks else 1
    row_bytes = max(1, math.prod(new.shape[1:]) * new.dtype.itemsize)
    step = per * max(1, BLOCK_BYTES // max(1, per * row_bytes))

    # Where the pack recorded the header, the values are checked, not the stored bytes (see
    # the module): they are hashed as written, and the chunks filtered on every core.
    checked = isinstance(entry.get("header"), str)
    written = xxhash.xxh3_64() if checked else None  # the values in row order, as packed
    direct = DirectWrites.of(new) if checked else None

    def put(start: int, block: np.ndarray) -> None:
        values = block.view(new.dtype)
        if written is not None:
            written.update(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data)
        if direct is not None:
            direct.write(start, values)
        elif start == 0 and len(values) == new.shape[0] and values.flags.c_contiguous:
            # The whole dataset in one write without h5py's selection: a file of 1,000
            # episodes has thousands of datasets of a few rows.
            new.id.write(h5py.h5s.ALL, h5py.h5s.ALL, values)
        else:
            new[start : start + len(values)] = values

    _copy_rows(leaf, new.shape[0], put, step)
    if direct is not None:
        direct.finish()
    if written is None:
        # No header recorded (not stored filtered, or packed by an earlier obsdelta): the
        # inner container's record of its raw chunks is the check.
        return None
    return _filtered_again(packed.path, path, new, entry, written.hexdigest())


def _filtered_again(file: Path, path: str, new: h5py.Dataset, entry: Any, values: str) -> str:
    """The hash of a restored dataset whose values were filtered again, checked first: its
    values (``values``) and header against the pack's record."""
    if values != entry.get("values"):
        raise damaged_pack(file, f"the values of {path} do not match their hash")
    if header_hash(new, headers_anew=True).hexdigest() != entry["header"]:
        raise damaged_pack(file, f"the creation properties of {path} do not match their record")
    return chunked_hash(new)
