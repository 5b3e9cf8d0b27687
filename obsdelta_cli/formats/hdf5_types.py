"""HDF5 types and dataspaces built anew, so that HDF5 encodes them as the file they go to asks.

HDF5 encodes a type (enum, compound, array) and a dataspace in the version of the format of
the file that holds it; a copy keeps that version. Built member by member, they take the first
version that can hold them, which is how a file of the earliest format stores them.
"""

from __future__ import annotations

from typing import Any

import h5py


def type_anew(t: Any) -> Any:
    """A new type equal to ``t``, built member by member: HDF5 encodes it in the first
    version of the format that can hold it, whatever version the file of ``t`` used.

    >>> import numpy as np
    >>> bool_type = h5py.h5t.py_create(np.dtype(bool))
    >>> type_anew(bool_type) == bool_type
    True
    """
    kind = t.get_class()
    if kind == h5py.h5t.ENUM:
        new = h5py.h5t.enum_create(type_anew(t.get_super()))
        for i in range(t.get_nmembers()):
            new.enum_insert(t.get_member_name(i), t.get_member_value(i))
        return new
    if kind == h5py.h5t.COMPOUND:
        new = h5py.h5t.create(h5py.h5t.COMPOUND, t.get_size())
        for i in range(t.get_nmembers()):
            new.insert(
                t.get_member_name(i), t.get_member_offset(i), type_anew(t.get_member_type(i))
            )
        return new
    if kind == h5py.h5t.ARRAY:
        return h5py.h5t.array_create(type_anew(t.get_super()), t.get_array_dims())
    if kind == h5py.h5t.VLEN:
        return h5py.h5t.vlen_create(type_anew(t.get_super()))
    return t.copy()


def space_anew(space: Any) -> Any:
    """A new dataspace equal to ``space`` (see :func:`type_anew`)."""
    kind = space.get_simple_extent_type()
    if kind == h5py.h5s.SIMPLE:
        return h5py.h5s.create_simple(space.shape, space.get_simple_extent_dims(True))
    return h5py.h5s.create(kind)
