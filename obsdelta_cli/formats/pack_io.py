"""Writing a packed file from a compressed container (the layout is described in
:mod:`.packed`; :mod:`.pack_unpack` writes the inner container back).

Packing reads the inner container once: each dataset (an HDF5 dataset, or a folder's memmap
leaf) is hashed as its rows pass and written in chunks along time with the filter measured
smallest for its key (:mod:`.pack_writer`); everything else is kept as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..errors import InputError, UsageError
from ..filters import MIN_PACK_BYTES, chunk_rows, minimal_headers
from ..manifest import Manifest
from .base import SIDECAR, Key, Source, key_str
from .hdf5 import closed_on_failure, copy_attrs, finish_output, new_output
from .hdf5_chunks import row_reader
from .hdf5_copy import Relinks, copy_anew, copy_object
from .hdf5_create import Groups, gcpl_like, write_unstored
from .hdf5_leaves import META_ATTR, leaf_dtype
from .hdf5_meta import manifest_path
from .hdf5_objects import header_hash
from .hdf5_safety import damaged_pack, scale_offset
from .hdf5_walk import OWN, ByPath, file_reads, layout_twins, objects_of
from .leaf import FileLeaf
from .pack_columns import Shared, kept_path, plan_columns, sliced, write_virtual
from .pack_leaves import (
    FILES,
    NAME,
    pack_info,
)
from .pack_props import PropsCheck
from .pack_writer import (
    Chooser,
    DatasetWriter,
    dataset_key,
    other_entry,
    pack_leaf,
    write_bytes,
)

#: Library versions of a packed file: v1.10 object headers and chunk indexes (fixed arrays:
#: one lookup per chunk), readable by any HDF5 from 1.10 on.
LIBVER = ("v110", "v110")
#: A small chunked dataset whose chunk index takes more bytes than this is repacked, not
#: copied (see ``_repackable``).
HEAVY_INDEX = 512
#: A packed file's manifest longer than this is stored compressed, at a quarter to a third of
#: its size (the 4.2 KB of a replay-buffer dump's, 1.2 KB): the dataset that holds it costs an
#: object header of about 110 bytes, which compression gains back from a few hundred bytes on.
PLAIN_MANIFEST_BYTES = 1 << 9


def packed_manifest(manifest: Manifest, inner: str, info: dict[str, Any]) -> Manifest:
    """The packed file's manifest: the inner one, saying where it came from."""
    info = {**info, "inner_hash": manifest.to_json()["manifest_hash"]}
    extra = {**manifest.extra, "pack": info}
    return replace(manifest, container=NAME, source_container=inner, extra=extra)


def inner_manifest(manifest: Manifest, file: Path) -> Manifest:
    """The inner container's manifest back from a packed file's (checked against its hash)."""
    info = pack_info(manifest.to_json(), file)
    extra = {k: v for k, v in manifest.extra.items() if k != "pack"}
    if manifest.source_container is None:
        raise InputError("obsdelta metadata field source_format is missing", file=file)
    inner = replace(manifest, container=manifest.source_container, source_container=None)
    inner = replace(inner, extra=extra)
    if inner.to_json()["manifest_hash"] != info["inner_hash"]:
        what = "obsdelta metadata field pack.inner_hash does not match the manifest"
        raise damaged_pack(file, what)
    return inner


@contextmanager
def packed_output(path: Path) -> Iterator[h5py.File]:
    """A new packed file, to be filled by :func:`~.packing.pack_into`; flushed and closed at
    the end (see :func:`h5_output`)."""
    with h5_output(path, LIBVER) as f:
        minimal_headers(f)
        yield f


@contextmanager
def h5_output(path: Path, libver: Any) -> Iterator[h5py.File]:
    """A new HDF5 file, flushed and closed at the end; a failed write is one
    :class:`OutputError`, and the file is left for the caller to delete."""
    f = new_output(path, libver)
    with closed_on_failure(f, path):
        yield f
        finish_output(f)


def group_like(src: h5py.Group, dst: h5py.Group, name: str) -> h5py.Group:
    """Group ``name`` of ``dst`` with ``src``'s creation properties and attributes (obsdelta's
    own group may exist already: the twins live in it)."""
    if name in dst:
        group = dst[name]
    else:
        group = h5py.Group(h5py.h5g.create(dst.id, name.encode(), gcpl=gcpl_like(src)))
    copy_attrs(src, group)
    return group


def _repackable(ds: h5py.Dataset, flat: bool = False) -> bool:
    """A numeric dataset of rows, stored in the file, worth filtering, or with a heavy chunk
    index: HDF5's copy of a chunked dataset keeps its index, a version-1 B-tree of 2.1-2.6 KB
    in files of HDF5's oldest format however small the dataset (a Minari episode's
    ``rewards``, ``terminations`` and ``truncations``), where a repacked one costs about
    0.4 KB with its layout twin. Not one whose filter is scale-offset: unpacking would encode
    its values again, which need not give back the bytes it stored (they are copied as they
    are). ``flat``: whatever its size, as its rows join others' (:mod:`.pack_flat`)."""
    dcpl = ds.id.get_create_plist()
    layout = dcpl.get_layout()
    return (
        ds.ndim >= 1
        and leaf_dtype(ds.dtype) is not None
        and (flat or ds.nbytes >= MIN_PACK_BYTES or _heavy_index(ds, layout))
        and layout in (h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED)
        and dcpl.get_external_count() == 0
        and 0 not in ds.shape
        and not scale_offset(dcpl)
    )


def _heavy_index(ds: h5py.Dataset, layout: int) -> bool:
    """Whether a chunked dataset's chunk index takes more than :data:`HEAVY_INDEX` bytes."""
    if layout != h5py.h5d.CHUNKED:
        return False
    return h5py.h5o.get_info(ds.id).meta_size.obj.index_size > HEAVY_INDEX


def _absent_chunks(ds: h5py.Dataset) -> list[list[int]] | None:
    """Offsets of the chunks never written (``None``: all are), where some are missing; a
    contiguous dataset never written has none at all."""
    dsid = ds.id
    if ds.chunks is None:
        return None if dsid.get_storage_size() else []
    stored = {tuple(dsid.get_chunk_info(i).chunk_offset) for i in range(dsid.get_num_chunks())}
    grid = np.stack(
        np.meshgrid(*[np.arange(0, n, c) for n, c in zip(ds.shape, ds.chunks, strict=True)]),
        -1,
    ).reshape(-1, ds.ndim)
    if len(stored) == len(grid):
        return None
    return [list(map(int, o)) for o in grid if tuple(int(x) for x in o) not in stored]


def copy_structure(
    src: h5py.File,
    out: h5py.File,
    rewritten: Container[str],
    rewrite: Callable[[h5py.Dataset, h5py.Group, str, str], None],
    own: str = OWN,
) -> None:
    """Copy ``src`` (whose obsdelta group is ``own``) into ``out`` object for object but its
    manifest (the packed one holds it), with its root attributes; each dataset whose path is
    in ``rewritten`` is given to ``rewrite(dataset, parent in out, name, path)`` instead."""
    manifest = manifest_path(own)
    copy_attrs(src, out, exclude=META_ATTR)  # with their stored types, as every other object's
    relinks = Relinks()

    def walk(group: h5py.Group, dst: h5py.Group) -> None:
        # A list, not h5py's view: iterating the view holds h5py's lock, which a chunk encoder
        # thread may need (to free an h5py object) while this thread waits for it.
        for name, obj in list(group.items()):
            path = obj.name.lstrip("/")
            # A second link to an object copied already links to its copy.
            if path == manifest or relinks.relinked(obj, dst, name):
                continue
            if isinstance(obj, h5py.Group):
                if path == own and all(f"{own}/{n}" == manifest for n in obj):
                    # Only the manifest, which the packed one holds: no group left empty,
                    # where libraries take every root object for their own (Minari).
                    continue
                walk(obj, group_like(obj, dst, name))
            elif path in rewritten:
                rewrite(obj, dst, name, path)
            else:
                copy_object(group, obj, dst, name)

    walk(src, out)


def pack_hdf5(src: h5py.File, out: h5py.File, chooser: Chooser, own: str = OWN) -> dict[str, Any]:
    """Pack the compressed HDF5 file ``src``, whose obsdelta group is ``own``, into ``out``;
    return the manifest's ``pack`` entry."""
    datasets: dict[str, Any] = {}
    names: list[str] = []
    arrays: set[str] = set()
    for name, obj in objects_of(src):  # one walk sorts the datasets rewritten either way
        if not isinstance(obj, h5py.Dataset):
            continue
        if _array_rewritten(obj, name, own):
            arrays.add(name)
        elif _repacked(obj, name, own):
            names.append(name)
    repacked = ByPath(src, names)  # by path: a Minari file has 25,000 such datasets
    shared = plan_columns(repacked, own, lambda ds: _rows_of(ds, src))
    groups = Groups(out)
    props = PropsCheck(src.libver)

    def rewrite(ds: h5py.Dataset, dst: h5py.Group, name: str, path: str) -> None:
        read = _rows_of(ds, src)
        if path in arrays:
            _pack_array(ds, read, dst, name, path)
        else:
            dcpl = ds.id.get_create_plist()
            entry = _repack(ds, read, dst, name, path, groups, chooser, shared.get(path), own)
            entry["alloc_time"] = dcpl.get_alloc_time()
            entry.update(filtered_header(ds, dcpl))
            datasets[path] = entry
            props.add(path, ds, dcpl)

    copy_structure(src, out, {*names, *arrays}, rewrite, own)
    recorded = props.run()
    for path, entry in datasets.items():
        if path in recorded:
            entry["props"] = recorded[path]
        else:
            _write_twin(repacked[path], path, groups, own)
    return {"kind": "hdf5", "libver": list(src.libver), "datasets": datasets}


def filtered_header(ds: h5py.Dataset, dcpl: Any) -> dict[str, str]:
    """``{"header": ...}`` for a repacked dataset stored filtered (else nothing): the hash of
    its creation properties, dataspace and stored type (:func:`~.hdf5_objects.header_hash`).
    Unpacking filters its values again, with this machine's filters, which may encode them to
    other bytes than the original's (D4RL's gzip chunks were written years ago, by another
    zlib): its header and values, checked against the pack's record, then stand for the raw
    chunks the inner container recorded (:mod:`.pack_unpack`). Its type and dataspace are
    hashed as HDF5 encodes them new (``headers_anew``): the dataset made again is new, where
    the one copied from the input keeps the encodings of the HDF5 that wrote it."""
    if not dcpl.get_nfilters():
        return {}
    return {"header": header_hash(ds, headers_anew=True).hexdigest()}


def _write_twin(ds: h5py.Dataset, path: str, groups: Groups, own: str) -> None:
    """The twin of a repacked dataset whose creation properties no record gives back
    (:mod:`.pack_props`): an empty dataset with its original creation properties, never
    written, so taking no storage, at its path under :func:`~.hdf5_walk.layout_twins`."""
    parent, _, leaf = f"{layout_twins(own)}/{path}".rpartition("/")
    write_unstored(groups(parent), leaf, ds)


def _array_rewritten(ds: h5py.Dataset, path: str, own: str) -> bool:
    """Whether a dataset of an HDF5 inner is one of obsdelta's exception arrays (index or rows)
    that the packed file writes anew (:func:`_pack_array`): those of at least
    :data:`~obsdelta_cli.filters.MIN_PACK_BYTES`, and those whose chunk index is heavy
    (:func:`_heavy_index`), where HDF5's copy would keep a version-1 B-tree of 2 KB however
    few its rows. Their values are checked by their recorded hashes, whatever their layout:
    unpacking copies them as the packed file has them."""
    if not path.startswith(f"{own}/arrays/"):
        return False
    return _pack_filters(ds) or _heavy_index(ds, ds.id.get_create_plist().get_layout())


def _pack_filters(ds: h5py.Dataset) -> bool:
    """Whether an exception array is stored filtered, as every dataset of data is: its rows
    (each episode's last next observation, often a camera frame) can take a tenth of a packed
    file. Not one of a few rows, whose chunk index would cost more than it saves."""
    return bool(ds.shape) and ds.id.get_storage_size() >= MIN_PACK_BYTES


def _rows_of(ds: h5py.Dataset, src: h5py.File) -> Callable[[int, int], np.ndarray]:
    """Rows ``start:stop`` of ``ds`` (a dataset of ``src``), read as new arrays (what a
    DatasetWriter reads): its chunks decoded on every core where HDF5 would decode them one
    at a time (:func:`~.hdf5_chunks.row_reader`; the file must be open read-only)."""
    if src.mode != "r":
        return sliced(ds)
    return row_reader(ds, Path(src.filename), file_reads(src).descriptor)


def _pack_array(
    ds: h5py.Dataset, read: Callable[[int, int], np.ndarray], dst: h5py.Group, name: str, path: str
) -> None:
    """An exception array written anew: filtered, in chunks along its rows, where its filter
    (measured on its own rows, which no other array's resemble) stores them smaller; else (a
    few rows of noise, or too small) with its creation properties; with its attributes."""
    chooser = Chooser()
    if _pack_filters(ds):
        chooser.pick(path, read, ds.shape, chunk_rows(ds.shape, ds.dtype.itemsize))
    if not any(ratio < 1 for _, ratio in chooser.choices.values()):
        copy_anew(ds, dst, name)
        return
    writer = DatasetWriter(dst, name, path, read, ds.shape, ds.dtype, chooser)
    writer.fill()
    copy_attrs(ds, writer.ds)


def _repacked(ds: h5py.Dataset, path: str, own: str, flat: bool = False) -> bool:
    """Whether a dataset of an HDF5 inner is repacked (filtered, its creation properties
    recorded or kept in a twin: :mod:`.pack_props`); not
    obsdelta's exception rows and layouts, which are copied or written anew as they are
    (:func:`_array_rewritten`)."""
    ours = path.startswith((f"{own}/arrays/", f"{own}/layout/"))
    return _repackable(ds, flat) and not ours


def _repack(
    ds: h5py.Dataset,
    read: Callable[[int, int], np.ndarray],
    dst: h5py.Group,
    name: str,
    path: str,
    groups: Groups,
    chooser: Chooser,
    shared: Shared | None,
    own: str,
) -> dict[str, Any]:
    if shared is None:
        writer = DatasetWriter(dst, name, path, read, ds.shape, ds.dtype, chooser)
        entry, made = writer.fill(), writer.ds
    else:
        entry = _write_kept(ds, read, path, groups, chooser, shared, own)
        made = write_virtual(dst, name, ds, shared)
    copy_attrs(ds, made)  # the dataset as made: looking it up by name opens it again
    absent = _absent_chunks(ds)
    if absent is not None:
        entry["absent"] = absent
    return entry


def _write_kept(
    ds: h5py.Dataset,
    rows: Callable[[int, int], np.ndarray],
    path: str,
    groups: Groups,
    chooser: Chooser,
    shared: Shared,
    own: str,
) -> dict[str, Any]:
    """A dataset whose columns repeat others': the columns it keeps, in their own dataset (the
    dataset itself is virtual, mapping those and the repeated ones)."""
    entry: dict[str, Any] = {"filter": None, "values": shared.values, "columns": shared.blocks}
    if shared.kept:
        kept = shared.kept

        def read(start: int, stop: int) -> np.ndarray:
            return rows(start, stop)[:, kept]

        where = kept_path(path, own)
        parent, _, leaf = where.rpartition("/")
        shape = (ds.shape[0], len(kept))
        writer = DatasetWriter(groups(parent), leaf, where, read, shape, ds.dtype, chooser)
        written = writer.fill()
        entry.update(filter=written["filter"], chunk_rows=written["chunk_rows"])
    return entry


def pack_folder(
    inner: Source, out: h5py.File, chooser: Chooser, early: dict[Key, dict[str, Any]]
) -> dict[str, Any]:
    root = inner.path
    leaf_files: dict[str, Key] = {}
    entries: list[dict[str, Any]] = []
    for key, leaf in inner.leaves.items():
        dataset_key(key, root)
        if isinstance(leaf, FileLeaf) and leaf.shape:
            rel = Path(leaf.path).relative_to(root).as_posix()
            leaf_files[rel] = key
            entries.append({"key": list(key), "kind": "data", "file": rel})
        else:
            entries.append(other_entry(key, leaf))
    files: list[str] = []
    dirs: list[str] = []
    datasets: dict[str, Any] = {}
    for item in sorted(root.rglob("*")):
        rel = item.relative_to(root).as_posix()
        if item.is_symlink():
            raise UsageError("--pack cannot keep a symbolic link", file=item)
        if item.is_dir():
            dirs.append(rel)
        elif rel in leaf_files:
            key = leaf_files[rel]
            if key in early:  # written as the inner container was; its file left empty
                datasets[key_str(key)] = early[key]
            else:
                datasets[key_str(key)] = pack_leaf(inner.leaves[key], key, out, chooser)
        elif rel != SIDECAR:  # the manifest: the packed one holds it
            write_bytes(out, f"{FILES}/f{len(files)}", item.read_bytes())
            files.append(rel)
    return {"kind": "folder", "leaves": entries, "files": files, "dirs": dirs, "datasets": datasets}
