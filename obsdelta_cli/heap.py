"""Memory a finished pass over an HDF5 file freed, given back to the system before the next.

HDF5 keeps the memory of the objects it frees in lists of its own, for reuse, and the C
allocator keeps freed pages in its heap: neither goes back to the system by itself. A command
that walks a file of thousands of objects several times (``compress --pack`` writes a
working copy, packs it, then verifies the packed file) would otherwise add each pass's memory
to the last one's.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

from h5py._objects import phil

from .filters import hdf5_library


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``; ``None`` on other C libraries."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except AttributeError:  # musl and others have none
        return None


def give_back() -> None:
    """Free HDF5's lists of freed objects, then return the allocator's free pages to the
    system. Called once a file is closed (an input, or an output written): objects still open
    keep their memory.

    >>> give_back()
    """
    lib = hdf5_library()
    if lib is not None:
        with phil:  # as h5py calls HDF5, which is not thread-safe
            lib.H5garbage_collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
