"""Packing a compressed ``.pt`` (``ted-pt``) into a packed file, and writing it back.

Every tensor leaf becomes a dataset at its key's path, filtered like any packed dataset, and
the ``_obsdelta`` entry's arrays (exception rows, the original file's skeleton) opaque byte
datasets under ``/obsdelta/pack/files/`` in the order ``pack.arrays`` lists them. What is left
of the compressed ``.pt`` itself, its skeleton (:mod:`.zip_skeleton`: the pickle, zip headers
and version records, a few KB), is the opaque dataset ``/obsdelta/pack/skeleton``; the
manifest's ``pack`` entry holds where each tensor's bytes go (``size``, ``holes``) and the
skeleton's hash. Unpacking writes the compressed ``.pt`` back byte for byte, and its own
``inflate`` then gives back the original file, checked by its own hashes.

The pickle is never unpickled here: it is only copied, and only ever loaded by
:func:`.ted_pt.load`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..errors import DataError, UsageError
from .base import Key, MemoryArrays, Sink, Source, key_str
from .hdf5_leaves import read_rows
from .hdf5_safety import PACK_DAMAGED, damaged_pack
from .hdf5_walk import OWN
from .leaf import LazyLeaf
from .pack_leaves import FILES, PACK, file_bytes
from .pack_writer import BLOCK_BYTES, Chooser, dataset_key, other_entry, pack_leaf, write_bytes
from .ted_pt import array_bytes, original_hashes
from .zip_skeleton import Hole, Layout, find, write

KIND = "pt"
#: The compressed ``.pt`` without its tensors' bytes.
SKELETON = f"{PACK}/skeleton"


class _Rows(LazyLeaf):
    """An array in memory, read by rows as the packer reads leaves."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.shape, self.dtype = a, tuple(a.shape), a.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.a[start:stop]

    def write(self, start: int, value: np.ndarray) -> None:
        self.a[start : start + len(value)] = value


def pack_pt(inner: Source, out: h5py.File, chooser: Chooser) -> dict[str, Any]:
    """Write the compressed ``.pt`` ``inner`` into the packed file ``out``; return its
    ``pack`` entry."""
    arrays = inner.arrays.arrays if isinstance(inner.arrays, MemoryArrays) else {}
    names = sorted(arrays)
    tensors: dict[Key, Any] = {**inner.leaves, **{(OWN, "arrays", n): arrays[n] for n in names}}
    found = find(inner.path, tensors)
    if found is None:  # obsdelta saved every tensor with a storage of its own
        raise UsageError("--pack cannot find the records of the file's tensors", file=inner.path)
    layout, skeleton = found
    entries: list[dict[str, Any]] = []
    datasets: dict[str, Any] = {}
    for key, leaf in inner.leaves.items():
        dataset_key(key, inner.path)
        if isinstance(leaf, np.ndarray) and leaf.size:
            entries.append({"key": list(key), "kind": "data"})
            datasets[key_str(key)] = pack_leaf(_Rows(leaf), key, out, chooser)
        else:
            entries.append(other_entry(key, leaf))
    for i, name in enumerate(names):
        write_bytes(out, f"{FILES}/f{i}", bytes(array_bytes(arrays[name])))
    write_bytes(out, SKELETON, skeleton)
    return {
        "kind": KIND,
        "leaves": entries,
        "arrays": names,
        "datasets": datasets,
        "skeleton": xxhash.xxh3_64_hexdigest(skeleton),
        **layout.to_json(),
    }


def _skeleton(f: h5py.File, file: Path, info: dict[str, Any]) -> bytes:
    """The compressed ``.pt``'s skeleton, checked against its recorded hash."""
    ds = f.get(SKELETON)
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
        raise damaged_pack(file, "the skeleton of the packed .pt file is missing")
    skeleton = read_rows(ds, slice(None), file, "the .pt skeleton").tobytes()
    recorded, found = info.get("skeleton"), xxhash.xxh3_64_hexdigest(skeleton)
    if found != recorded:
        raise DataError(
            f"checksum mismatch in the .pt skeleton (recorded {recorded}, found {found})",
            file=file,
            key=SKELETON,
            hint=PACK_DAMAGED,
        )
    return skeleton


def pt_hashes(
    packed: Source | Sink, file: Path, info: dict[str, Any], skip: Callable[[str], bool]
) -> dict[str, str]:
    """The objects of the compressed ``.pt`` as it hashes them (the original file's
    skeleton), once the packed file's own skeleton is found intact."""
    _skeleton(packed.handle, file, info)
    meta = packed.meta if isinstance(packed, Source) else None
    found = original_hashes(meta, packed.arrays, file)
    return {k: v for k, v in found.items() if not skip(k)}


def unpack_pt(packed: Source, info: dict[str, Any], out: Path) -> None:
    """Write the compressed ``.pt`` held by the opened packed file ``packed`` to ``out``, byte
    for byte."""
    f: h5py.File = packed.handle
    skeleton = _skeleton(f, packed.path, info)
    layout = Layout.from_json(info, packed.path)
    index = {name: i for i, name in enumerate(info["arrays"])}

    def fill(hole: Hole) -> Iterator[Any]:
        ref = hole.ref
        if len(ref) == 3 and ref[:2] == (OWN, "arrays") and ref[2] in index:
            yield file_bytes(f, index[ref[2]], packed.path)
            return
        leaf = packed.leaves.get(ref)
        if not isinstance(leaf, LazyLeaf) or not leaf.shape:
            raise damaged_pack(packed.path, f"tensor {key_str(ref)} of the .pt file is missing")
        step = max(1, BLOCK_BYTES // max(1, math.prod(leaf.shape[1:]) * leaf.dtype.itemsize))
        for start in range(0, leaf.shape[0], step):
            yield array_bytes(leaf.read(start, min(leaf.shape[0], start + step)))

    write(out, layout, skeleton, fill)
