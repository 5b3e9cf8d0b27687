"""HDF5 types and dataspaces built anew, so that HDF5 encodes them as the file they go to asks.

HDF5 encodes a type (enum, compound, array) and a dataspace in the version of the format of
the file that holds it; a copy keeps that version. Built member by member, they take the first
version that can hold them, which is how a file of the earliest format stores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np


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


@dataclass(frozen=True)
class StoredType:
    """What reading and copying values of one stored type needs, worked out once per type:
    a file's attributes have a handful of types between them (an object may hold 100,000
    attributes), and building a type costs more than moving a value."""

    #: The stored type's encoding: how its stored bytes read.
    encoded: bytes
    #: The dtype h5py reads it as, and the memory type h5py reads it through.
    dtype: np.dtype
    read_as: Any
    #: The type built anew (:func:`type_anew`), and its encoding.
    anew: Any
    anew_encoded: bytes
    #: The memory type a copy moves values through: an array type reads as numbers with more
    #: dimensions, which HDF5 does not convert to, so its values move as they are stored;
    #: ``None`` for HDF5's conversion of :attr:`dtype`.
    raw: Any


#: :func:`stored_type` of each type seen, by its encoding.
_STORED: dict[bytes, StoredType] = {}


def stored_type(t: Any) -> StoredType:
    """:class:`StoredType` of HDF5 type ``t`` (kept for the next of the same encoding)."""
    encoded = t.encode()
    found = _STORED.get(encoded)
    if found is None:
        dtype, anew = t.dtype, type_anew(t)
        raw = t if t.get_class() == h5py.h5t.ARRAY else None
        found = StoredType(encoded, dtype, h5py.h5t.py_create(dtype), anew, anew.encode(), raw)
        if len(_STORED) >= 256:  # a file of a type per attribute gains nothing from keeping them
            _STORED.clear()
        _STORED[encoded] = found
    return found
