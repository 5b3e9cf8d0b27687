"""Columns stored once in a packed file: a dataset whose columns repeat another's, bit for bit.

D4RL files keep the simulator state beside the observations built from it: in the Gym-MuJoCo
datasets, ``observations`` is ``concat(qpos[1:], qvel)`` in float32, and ``infos/qpos`` and
``infos/qvel`` hold the same numbers again. When packing an HDF5 inner, each dataset of 2-D rows
whose columns equal, on every row, columns of another dataset of the same dtype and row count
stores only its other columns, in ``pack/columns/<path>`` of obsdelta's group; the dataset
itself becomes an HDF5 virtual dataset whose mapped blocks point at those columns and at the
repeated ones, all in the same file (source file ``"."``). Plain h5py reads it like any dataset.

The manifest's ``pack`` entry of such a dataset lists its blocks (``columns``: ``[start, stop,
source, source_start]``, the source a dataset path); obsdelta's own reader
(:class:`obsdelta_cli.formats.pack_leaves.ColumnsLeaf`) rebuilds the values from those sources as
recorded and never follows the file's mappings, and opening a packed file refuses a virtual
dataset whose mappings are not exactly the recorded ones (:func:`expected_maps`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash

from ..filters import MIN_PACK_BYTES, sample_rows
from .hdf5_safety import VirtualMap, damaged_pack
from .hdf5_walk import OWN, OWN_PLACES


def columns_root(own: str = OWN) -> str:
    """Where the columns deduplicated datasets keep of their own are, at ``<root>/<path>``, in
    a file whose obsdelta group is ``own``."""
    return f"{own}/pack/columns"


#: Where kept columns may be: under :func:`columns_root` of each place obsdelta's group may be.
KEPT_ROOTS = tuple(f"{columns_root(own)}/" for own in OWN_PLACES)
#: A virtual dataset's source file name meaning "this file".
SAME_FILE = "."
#: Rows of each sampled stretch the first, cheap comparison looks at (up to four stretches).
SAMPLE_ROWS = 256
#: Rows are compared in blocks of about this many bytes (all the datasets compared together).
BLOCK_BYTES = 8 << 20

#: One block of a dataset's columns: ``[start, stop, source, source_start]``, the columns
#: ``start:stop`` being the source dataset's from ``source_start`` on.
Block = list[Any]


@dataclass
class Shared:
    """How a dataset is stored: its blocks of columns (those it keeps mapped to its own dataset
    under :func:`columns_root`), the columns of each source, and the hash of its values."""

    blocks: list[Block]
    kept: list[int]
    widths: dict[str, int]
    values: str


def kept_path(path: str, own: str = OWN) -> str:
    """Where the columns a deduplicated dataset keeps are stored."""
    return f"{columns_root(own)}/{path}"


def _unsigned(a: np.ndarray) -> np.ndarray:
    """The values as unsigned integers of their item size: compared bit for bit (NaN equals
    the same NaN, -0.0 differs from 0.0)."""
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


#: ``read(start, stop)``: rows of one dataset as a new array.
Rows = Callable[[int, int], np.ndarray]


def sliced(ds: Any) -> Rows:
    """Rows of ``ds`` read by slicing it (an h5py dataset, a family of them)."""
    return lambda start, stop: np.asarray(ds[start:stop])


def plan_columns(
    datasets: Mapping[str, h5py.Dataset],
    own: str = OWN,
    rows_of: Callable[[h5py.Dataset], Rows] = sliced,
) -> dict[str, Shared]:
    """The datasets among ``datasets`` (about to be repacked) that repeat columns of others,
    with their blocks; the others are stored as they are. ``rows_of(dataset)`` reads a
    dataset's rows where every row is compared."""
    groups: dict[tuple[str, int], list[str]] = {}
    for path, ds in datasets.items():
        if ds.ndim == 2 and ds.dtype.kind in "fiu" and ds.shape[1]:
            groups.setdefault((ds.dtype.str, ds.shape[0]), []).append(path)
    plans: dict[str, Shared] = {}
    for paths in groups.values():
        if len(paths) > 1:
            plans.update(_plan_group({p: datasets[p] for p in paths}, own, rows_of))
    return plans


def _plan_group(
    datasets: dict[str, h5py.Dataset], own: str, rows_of: Callable[[h5py.Dataset], Rows]
) -> dict[str, Shared]:
    """Datasets of one dtype and row count: a cheap comparison of sampled rows first, then of
    every row for the columns that matched."""
    first = next(iter(datasets.values()))
    rows, itemsize = first.shape[0], first.dtype.itemsize
    picks = sample_rows(rows, min(rows, SAMPLE_ROWS))
    # The widest first: observations hold the state's columns, not the other way round, and a
    # dataset that keeps all its columns can be a source for the narrower ones.
    order = sorted(datasets, key=lambda p: (-datasets[p].shape[1], p))
    # Sampled columns of the datasets stored as they are, by a digest of their values (the
    # comparison of every row settles it).
    stored: dict[bytes, list[tuple[str, int]]] = {}
    wanted: dict[str, dict[int, list[tuple[str, int]]]] = {}
    for path in order:
        sample = _unsigned(np.concatenate([datasets[path][sl] for sl in picks])).T.copy()
        # A constant column costs next to nothing compressed: not worth a mapping.
        varied = np.flatnonzero((sample != sample[:, :1]).any(1)).tolist()
        digests = {j: xxhash.xxh3_128_digest(sample[j].data) for j in varied}
        found = {j: list(stored[d]) for j, d in digests.items() if d in stored}
        if len(found) * rows * itemsize >= MIN_PACK_BYTES:
            wanted[path] = found
            continue
        for j, d in digests.items():
            stored.setdefault(d, []).append((path, j))
    if not wanted:
        return {}
    hashes = _confirm(datasets, wanted, rows, rows_of)
    plans: dict[str, Shared] = {}
    for path, found in wanted.items():
        if len(found) * rows * itemsize >= MIN_PACK_BYTES:
            blocks, kept = _blocks(path, found, datasets[path].shape[1], own)
            widths = {b[2]: datasets[b[2]].shape[1] for b in blocks if b[2] in datasets}
            widths[kept_path(path, own)] = len(kept)
            plans[path] = Shared(blocks, kept, widths, hashes[path])
    return plans


def _confirm(
    datasets: dict[str, h5py.Dataset],
    wanted: dict[str, dict[int, list[tuple[str, int]]]],
    rows: int,
    rows_of: Callable[[h5py.Dataset], Rows],
) -> dict[str, str]:
    """Compare the matched columns on every row, dropping those that differ anywhere (in
    place), and hash the values of the datasets still sharing columns, as rows pass."""
    row_bytes = sum(math.prod(ds.shape[1:]) * ds.dtype.itemsize for ds in datasets.values())
    step = max(1, BLOCK_BYTES // max(1, row_bytes))
    hashes = {path: xxhash.xxh3_64() for path in wanted}
    readers: dict[str, Rows] = {}
    for start in range(0, rows, step):
        live = [p for p, found in wanted.items() if found]
        if not live:
            break
        needed = set(live) | {s for p in live for opts in wanted[p].values() for s, _ in opts}
        block = {}
        for p in sorted(needed):
            if p not in readers:
                readers[p] = rows_of(datasets[p])
            block[p] = _unsigned(readers[p](start, start + step))
        for path in live:
            hashes[path].update(block[path].reshape(-1).view(np.uint8).data)
            found = wanted[path]
            for j in list(found):
                mine = block[path][:, j]
                found[j] = [(s, c) for s, c in found[j] if np.array_equal(mine, block[s][:, c])]
                if not found[j]:
                    del found[j]
    return {path: h.hexdigest() for path, h in hashes.items()}


def _blocks(
    path: str, found: dict[int, list[tuple[str, int]]], width: int, own: str
) -> tuple[list[Block], list[int]]:
    """Adjacent columns from consecutive columns of one source merged into one block; the
    columns found nowhere else map to the dataset's own kept columns."""
    blocks: list[Block] = []
    kept: list[int] = []
    for j in range(width):
        options = found.get(j)
        last = blocks[-1] if blocks else None
        if not options:
            source, col = kept_path(path, own), len(kept)
            kept.append(j)
        else:
            source, col = options[0]
            for s, c in options:  # the source continuing the previous block, where one does
                if last is not None and last[2] == s and last[3] + j - last[0] == c:
                    source, col = s, c
                    break
        if last is not None and last[2] == source and last[3] + j - last[0] == col:
            last[1] = j + 1
        else:
            blocks.append([j, j + 1, source, col])
    return blocks, kept


def write_virtual(group: h5py.Group, name: str, like: h5py.Dataset, shared: Shared) -> h5py.Dataset:
    """The virtual dataset ``name`` of ``group``, of ``like``'s shape and type, whose blocks
    map columns of datasets of the same file; returned as made."""
    rows, width = like.shape
    widths = shared.widths
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)
    for start, stop, source, at in shared.blocks:
        vspace = h5py.h5s.create_simple((rows, width))
        vspace.select_hyperslab((0, start), (rows, stop - start))
        sspace = h5py.h5s.create_simple((rows, widths[source]))
        sspace.select_hyperslab((0, at), (rows, stop - start))
        dcpl.set_virtual(vspace, SAME_FILE.encode(), f"/{source}".encode(), sspace)
    space = h5py.h5s.create_simple((rows, width))
    made = h5py.h5d.create(group.id, name.encode(), like.id.get_type(), space, dcpl=dcpl)
    return h5py.Dataset(made)


# ---------------------------------------------------------------------------------------------
# Reading


def parse_blocks(value: Any, file: Path, path: str) -> list[Block]:
    """A dataset's recorded blocks, their shape checked."""
    ok = isinstance(value, list) and bool(value)
    for block in value if ok else []:
        ok = ok and (
            isinstance(block, list)
            and len(block) == 4
            and all(isinstance(block[i], int) and block[i] >= 0 for i in (0, 1, 3))
            and isinstance(block[2], str)
            and bool(block[2])
            and "%" not in block[2]  # HDF5 reads "%b" in a source name as a pattern
        )
    if not ok:
        what = f"obsdelta metadata field pack.datasets.{path}.columns is malformed"
        raise damaged_pack(file, what)
    return value


def expected_maps(blocks: list[Block], shape: tuple[int, ...]) -> list[VirtualMap]:
    """The mappings a virtual dataset of ``shape`` must have for ``blocks``, in the form
    :func:`obsdelta_cli.formats.hdf5_safety.virtual_maps` reads them."""
    rows = shape[0] if shape else 0
    return [
        (((0, a), (rows, b)), SAME_FILE, f"/{src}", ((0, at), (rows, at + b - a)))
        for a, b, src, at in blocks
    ]
