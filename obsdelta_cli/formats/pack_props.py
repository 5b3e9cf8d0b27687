"""The creation properties of a repacked dataset (layout, chunks, filters, fill value, ...),
recorded in the packed file's manifest, from which unpacking creates the dataset again.

A record replaces the empty *twin* a repacked dataset of an HDF5 input otherwise keeps under
:data:`~.hdf5_walk.LAYOUT_TWINS` (an object header of about 120 bytes, and a group for each
group of the original: 1.1 MB of a robomimic file of 1,000 low-dim demos packed in 12.7 MB,
thousands of objects more for every walk of the packed file). It is kept only where it
gives back what the twin would: when packing, each record and each twin's properties make a
dataset in a scratch file in memory, of the input's format version, which is closed and
opened again, and the two datasets' creation properties must be equal (HDF5's
``H5Pequal``, on properties read back from a file). A dataset whose record does not pass
keeps its twin.

>>> import h5py, numpy as np
>>> with h5py.File("doc.h5", "w", driver="core", backing_store=False) as f:
...     ds = f.create_dataset("x", (10, 3), np.float32, chunks=(5, 3), compression="gzip")
...     check = PropsCheck(f.libver)
...     check.add("x", ds)
...     kept = check.run()
>>> record = kept["x"]
>>> record["chunks"], record["filters"], record["maxshape"]
([5, 3], [[1, 1, [4]]], [10, 3])
"""

from __future__ import annotations

import io
import json
from typing import Any

import h5py
import numpy as np

from .hdf5_create import ALLOC_TIMES, create_dataset, dcpl_like, unstored


def record_of(ds: h5py.Dataset, dcpl: h5py.h5p.PropDCID | None = None) -> dict[str, Any]:
    """The creation properties of ``ds`` (``dcpl`` when given) as JSON values. Its shape and
    dtype are the packed dataset's, and its allocation time is the manifest entry's: not
    recorded."""
    dcpl = ds.id.get_create_plist() if dcpl is None else dcpl
    out: dict[str, Any] = {"layout": dcpl.get_layout()}
    if out["layout"] == h5py.h5d.CHUNKED:
        out["chunks"] = list(dcpl.get_chunk())
    out["filters"] = [
        [int(code), int(flags), [int(v) for v in values]]
        for code, flags, values, _name in (dcpl.get_filter(i) for i in range(dcpl.get_nfilters()))
    ]
    out["fill"] = dcpl.fill_value_defined()
    if out["fill"] == h5py.h5d.FILL_VALUE_USER_DEFINED:
        value = np.zeros(1, dtype=ds.dtype)
        dcpl.get_fill_value(value)
        out["fill_value"] = value.tobytes().hex()
    out["fill_time"] = dcpl.get_fill_time()
    out["attr_order"] = dcpl.get_attr_creation_order()
    out["attr_phase"] = list(dcpl.get_attr_phase_change())
    out["maxshape"] = [None if m is None else int(m) for m in ds.maxshape]
    return out


def props_of(record: dict[str, Any], dtype: np.dtype) -> h5py.h5p.PropDCID:
    """The creation properties a record gives (raises ``KeyError``, ``TypeError`` or
    ``ValueError`` on a record that is not one, which the caller reports as damage)."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if record["layout"] == h5py.h5d.CHUNKED:
        dcpl.set_chunk(tuple(int(c) for c in record["chunks"]))
    else:
        dcpl.set_layout(int(record["layout"]))
    for code, flags, values in record["filters"]:
        dcpl.set_filter(int(code), int(flags), tuple(int(v) for v in values))
    if record["fill"] == h5py.h5d.FILL_VALUE_USER_DEFINED:
        value = np.frombuffer(bytes.fromhex(record["fill_value"]), dtype=dtype)
        dcpl.set_fill_value(value.copy())
    dcpl.set_fill_time(int(record["fill_time"]))
    if record.get("alloc_time") in ALLOC_TIMES:  # files packed before it moved to the entry
        dcpl.set_alloc_time(int(record["alloc_time"]))
    dcpl.set_attr_creation_order(int(record["attr_order"]))
    dcpl.set_attr_phase_change(*(int(v) for v in record["attr_phase"]))
    return dcpl


def maxshape_of(record: dict[str, Any]) -> tuple[int | None, ...]:
    return tuple(None if m is None else int(m) for m in record["maxshape"])


def twin_props(dcpl: h5py.h5p.PropDCID) -> h5py.h5p.PropDCID:
    """The creation properties unpacking gives a dataset from its twin's (``dcpl``)."""
    props = dcpl_like(dcpl, True)
    if dcpl.get_alloc_time() in ALLOC_TIMES:
        props.set_alloc_time(dcpl.get_alloc_time())
    return props


class PropsCheck:
    """Records of repacked datasets, each checked against its twin (see the module). Datasets
    with the same record and equal creation properties (a robomimic file's thousands of
    contiguous datasets: a handful of kinds) are checked once, on the first of them."""

    def __init__(self, libver: Any) -> None:
        self.libver = tuple(libver)
        #: Per kind (record without its maximum shape, dtype, rank): the datasets checked,
        #: as (creation properties, dtype, shape, maximum shape, record).
        self._kinds: dict[tuple[str, str, int], list[Any]] = {}
        #: Per path: its record and the dataset checked for it (kind, index).
        self._asked: dict[str, tuple[dict[str, Any], tuple[str, str, int], int]] = {}

    def add(self, path: str, ds: h5py.Dataset, dcpl: h5py.h5p.PropDCID | None = None) -> None:
        """Ask for the record of ``ds``, a dataset of the input at ``path`` (``dcpl``: its
        creation properties, when the caller has them)."""
        dcpl = ds.id.get_create_plist() if dcpl is None else dcpl
        record = record_of(ds, dcpl)
        kind = (json.dumps({**record, "maxshape": None}), ds.dtype.str, ds.ndim)
        checked = self._kinds.setdefault(kind, [])
        found = next((i for i, seen in enumerate(checked) if seen[0].equal(dcpl)), None)
        if found is None:
            found = len(checked)
            checked.append((dcpl, ds.dtype, ds.shape, ds.maxshape, record))
        self._asked[path] = (record, kind, found)

    def run(self) -> dict[str, dict[str, Any]]:
        """The records that give back what their twin would, by path."""
        if not self._asked:
            return {}
        scratch = io.BytesIO()
        names: dict[tuple[tuple[str, str, int], int], int] = {}
        with h5py.File(scratch, "w", libver=self.libver) as f:
            for kind, checked in self._kinds.items():
                for i, (dcpl, dtype, shape, maxshape, record) in enumerate(checked):
                    n = names[kind, i] = len(names)
                    # No storage: unpacking sets the time from the manifest.
                    made = unstored(props_of(record, dtype)), unstored(twin_props(dcpl))
                    create_dataset(f, f"r{n}", dtype, shape, maxshape_of(record), made[0])
                    create_dataset(f, f"t{n}", dtype, shape, maxshape, made[1])
        passed = set()
        with h5py.File(scratch, "r") as f:
            for key, n in names.items():
                got, want = f[f"r{n}"], f[f"t{n}"]
                if got.maxshape == want.maxshape and got.id.get_create_plist().equal(
                    want.id.get_create_plist()
                ):
                    passed.add(key)
        return {
            path: record for path, (record, kind, i) in self._asked.items() if (kind, i) in passed
        }
