"""Creating HDF5 datasets with given creation properties: like another's (:func:`dcpl_like`),
never written (:func:`write_unstored`), into groups made as a walk asks for them
(:class:`Groups`)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import h5py
import numpy as np
from h5py._objects import phil

from ..filters import hdf5_library


def dcpl_like(src: h5py.h5p.PropDCID, same_dtype: bool) -> h5py.h5p.PropDCID:
    """Creation properties (layout, chunks, filters, fill value) following ``src``'s; for another
    dtype, the chunks and lossless filters only (a fill value or scale-offset is dtype-bound)."""
    if same_dtype:
        return src.copy()
    new = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if src.get_layout() == h5py.h5d.CHUNKED:
        new.set_chunk(src.get_chunk())
        for i in range(src.get_nfilters()):
            code, flags, values, _name = src.get_filter(i)
            if code not in (h5py.h5z.FILTER_SCALEOFFSET, h5py.h5z.FILTER_NBIT):
                new.set_filter(code, flags, values)
    return new


class Groups:
    """``f.require_group(path)`` for a walk that writes dataset after dataset into a few
    groups: the most recent :data:`KEPT` are kept, as h5py checks every part of the path each
    time (200-260 µs a call: 7,000 calls packing a robomimic file of 1,000 demos).

    >>> import tempfile
    >>> with tempfile.TemporaryFile() as tmp, h5py.File(tmp, "w") as f:
    ...     groups = Groups(f)
    ...     groups("a/b/c") == f["a/b/c"], groups("a/b") is groups("a/b"), groups("") == f
    (True, True, True)
    """

    #: Groups kept open at once.
    KEPT = 16

    def __init__(self, f: h5py.File) -> None:
        self.f = f
        self._kept: dict[str, h5py.Group] = {}

    def __call__(self, path: str) -> h5py.Group:
        group = self._kept.pop(path, None)
        if group is None:
            # A new group's parent was usually asked for just before (a demo's, then its
            # observations'): one part of the path is checked, not all of them.
            head, _, tail = path.rpartition("/")
            group = self(head).require_group(tail) if path else self.f
            if len(self._kept) >= self.KEPT:
                del self._kept[next(iter(self._kept))]  # the least recently asked
        self._kept[path] = group
        return group


def create_dataset(
    group: h5py.Group,
    name: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    maxshape: tuple[int | None, ...],
    dcpl: h5py.h5p.PropDCID,
) -> h5py.Dataset:
    # No modification times: the same input and flags give the same bytes.
    dcpl.set_obj_track_times(False)
    unlimited = tuple(h5py.h5s.UNLIMITED if m is None else m for m in maxshape)
    space = h5py.h5s.create_simple(shape, unlimited)
    tid = h5py.h5t.py_create(dtype, logical=True)
    return h5py.Dataset(h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl))


def unstored(dcpl: h5py.h5p.PropDCID) -> h5py.h5p.PropDCID:
    """``dcpl`` with the allocation time of a dataset never written (incremental when chunked,
    late otherwise), so the dataset takes no storage."""
    chunked = dcpl.get_layout() == h5py.h5d.CHUNKED
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_INCR if chunked else h5py.h5d.ALLOC_TIME_LATE)
    return dcpl


def write_unstored(group: h5py.Group, name: str, ds: h5py.Dataset) -> h5py.Dataset:
    """A *twin* of ``ds``: its shape, dtype and creation properties, never written (no
    storage); attributes are the caller's to copy."""
    dcpl = unstored(dcpl_like(ds.id.get_create_plist(), True))
    return create_dataset(group, name, ds.dtype, ds.shape, ds.maxshape, dcpl)


#: Allocation times HDF5 knows (a recorded one is restored on inflate).
ALLOC_TIMES = (h5py.h5d.ALLOC_TIME_EARLY, h5py.h5d.ALLOC_TIME_LATE, h5py.h5d.ALLOC_TIME_INCR)


@functools.cache
def _library() -> Any:
    return hdf5_library()


def gcpl_like(group: h5py.Group) -> h5py.h5p.PropGCID:
    """New group creation properties with ``group``'s settings: link and attribute creation
    order, attribute and link storage thresholds, estimated link sizes, local heap size; no
    modification times. Not ``group``'s own property list: HDF5 puts the group's link info in
    it, addresses in its file included, and a group created from it in another file pointed at
    them (copying an object into it failed: "wrong fractal heap header signature")."""
    src = group.id.get_create_plist()
    new = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
    new.set_link_creation_order(src.get_link_creation_order())
    new.set_attr_creation_order(src.get_attr_creation_order())
    new.set_attr_phase_change(*src.get_attr_phase_change())
    # No times, whatever ``group`` asks: an output is the same bytes whenever it is written
    # (a packed file's newer object headers store them where its inner's did not).
    new.set_obj_track_times(False)
    lib = _library()
    if lib is not None:  # the settings h5py does not wrap
        a, b, size = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_size_t()
        have, made = ctypes.c_int64(src.id), ctypes.c_int64(new.id)
        with phil:  # as h5py calls HDF5, which is not thread-safe
            if lib.H5Pget_link_phase_change(have, ctypes.byref(a), ctypes.byref(b)) >= 0:
                lib.H5Pset_link_phase_change(made, a, b)
            if lib.H5Pget_est_link_info(have, ctypes.byref(a), ctypes.byref(b)) >= 0:
                lib.H5Pset_est_link_info(made, a, b)
            if lib.H5Pget_local_heap_size_hint(have, ctypes.byref(size)) >= 0:
                lib.H5Pset_local_heap_size_hint(made, size)
    return new
