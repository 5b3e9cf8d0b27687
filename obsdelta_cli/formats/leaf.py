"""Leaves the pipeline can stream: numpy arrays, or lazy datasets read and written by rows.

Containers that hold their data in memory (``.pt`` files) hand the pipeline plain arrays.
Containers that must be read explicitly (memmap folders, HDF5) hand it a :class:`LazyLeaf`, which
reads and writes slices along the first dimension only. :func:`as_rows` gives both the same face:
a leaf flattened over its batch dimensions, ``[rows, *features]``, indexable by row slices.

>>> as_rows(np.zeros((2, 3, 4)), batch_dims=2).shape
(6, 4)
"""

from __future__ import annotations

import math
import mmap
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from .direct import ColdReads


class LazyLeaf(ABC):
    """A dataset read and written by slices of its first dimension."""

    shape: tuple[int, ...]
    dtype: np.dtype
    #: Whether its rows can be read back (a leaf whose rows go straight into a packed file
    #: cannot).
    readable: bool = True

    @property
    def changes_values(self) -> str | None:
        """Why values written to this leaf may not read back as written (a lossy HDF5 filter),
        so that it cannot be rebuilt exactly; ``None`` for a leaf that keeps what it is given."""
        return None

    @abstractmethod
    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the first dimension, as an array."""

    @abstractmethod
    def write(self, start: int, value: np.ndarray) -> None:
        """Store ``value`` at rows ``start:start + len(value)`` of the first dimension."""


class FlatRows:
    """A :class:`LazyLeaf` seen as ``[rows, *features]`` over its first ``batch_dims`` dims."""

    def __init__(self, leaf: LazyLeaf, batch_dims: int) -> None:
        self.leaf = leaf
        self.per_first = math.prod(leaf.shape[1:batch_dims])
        self.features = tuple(leaf.shape[batch_dims:])
        self.shape = (math.prod(leaf.shape[:batch_dims]), *self.features)
        self.dtype = leaf.dtype

    def _span(self, key: slice) -> tuple[int, int]:
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise ValueError("only contiguous row slices are supported")
        return start, max(start, stop)

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop = self._span(key)
        first, last = start // self.per_first, -(-stop // self.per_first)
        block = self.leaf.read(first, last)
        # Counted, not -1: a row may hold no values (a 0x0 camera), where -1 is ambiguous.
        block = block.reshape(len(block) * self.per_first, *self.features)
        offset = first * self.per_first
        return block[start - offset : stop - offset]

    def gather(self, idx: np.ndarray) -> np.ndarray | None:
        """Rows ``idx`` in one gather where the leaf can (a mapped file, or one read of the
        sorted distinct rows); else ``None``."""
        mapped = getattr(self.leaf, "mapped", None)
        table = None if mapped is None else mapped()
        if table is not None:
            return table.reshape(self.shape[0], *self.features)[idx]
        select = getattr(self.leaf, "select", None)
        if select is None or self.per_first != 1:
            return None
        rows, inverse = np.unique(idx, return_inverse=True)
        return select(rows)[inverse.reshape(-1)]

    def __setitem__(self, key: slice, value: Any) -> None:
        start, stop = self._span(key)
        if start % self.per_first or (stop % self.per_first and stop != self.shape[0]):
            raise ValueError("writes must cover whole rows of the first dimension")
        rows = np.broadcast_to(np.asarray(value, dtype=self.dtype), (stop - start, *self.features))
        count = (stop - start) // self.per_first if self.per_first else 0
        self.leaf.write(start // self.per_first, rows.reshape(count, *self.leaf.shape[1:]))


Rows = np.ndarray | FlatRows


def as_rows(leaf: np.ndarray | LazyLeaf, batch_dims: int) -> Rows:
    """``leaf`` as ``[rows, *features]``: a free view for arrays, a wrapper for lazy leaves."""
    if isinstance(leaf, LazyLeaf):
        return FlatRows(leaf, batch_dims)
    return leaf.reshape(math.prod(leaf.shape[:batch_dims]), *leaf.shape[batch_dims:])


def nbytes(leaf: np.ndarray | LazyLeaf) -> int:
    """Bytes of a leaf's values."""
    return math.prod(leaf.shape) * leaf.dtype.itemsize


def is_data(leaf: object) -> bool:
    """Whether ``leaf`` holds array data (not a tensordict ``NonTensorData`` or similar)."""
    return isinstance(leaf, np.ndarray | LazyLeaf)


#: Bytes mapped at a time by :meth:`FileLeaf.feed` (a multiple of the page size): mapped pages
#: count in the process's memory while mapped.
_WINDOW = 1 << 26


def read_exact(
    fd: int,
    offset: int,
    nbytes: int,
    name: str,
    cold: ColdReads | None = None,
    end: int | None = None,
) -> np.ndarray:
    """``nbytes`` bytes of ``fd`` at ``offset`` into a new uint8 buffer, with ``preadv`` (which may
    return less than asked, and releases the interpreter lock); a short file is an ``OSError``
    naming ``name``. With ``cold`` (for ``fd``), data not in memory is read past the page
    cache, read ahead no further than ``end`` (the data's end, if known)."""
    if cold is not None:
        direct = cold.read(offset, nbytes, end)
        if direct is not None:
            return direct
    out = np.empty(nbytes, dtype=np.uint8)
    view = out.data
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"{name}: unexpected end of file")
        done += n
    return out


def write_exact(fd: int, offset: int, value: np.ndarray) -> None:
    """Write ``value``'s raw bytes to ``fd`` at ``offset``, with ``pwrite`` until all are
    written (it may write less than asked, and releases the interpreter lock)."""
    raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8).data
    done = 0
    while done < len(raw):
        done += os.pwrite(fd, raw[done:], offset + done)


def map_private(fd: int, dtype: np.dtype, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
    """``shape`` values of ``dtype`` at ``offset`` of the file open as ``fd``, mapped
    privately (copy on write: nothing written to the array reaches the file). The mapping
    lives as long as the array, whatever becomes of ``fd`` or of the file's name.

    >>> import tempfile
    >>> with tempfile.TemporaryFile() as fh:
    ...     _ = fh.write(np.arange(6, dtype=np.int16).tobytes()); fh.flush()
    ...     map_private(fh.fileno(), np.dtype(np.int16), (2, 2), offset=4).tolist()
    [[2, 3], [4, 5]]
    """
    count = math.prod(shape)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    window = mmap.mmap(
        fd, offset - start + count * dtype.itemsize, access=mmap.ACCESS_COPY, offset=start
    )
    return np.frombuffer(window, dtype, count, offset - start).reshape(shape)


class FileLeaf(LazyLeaf):
    """A raw C-order array in a file (a tensordict ``.memmap`` leaf), read and written with
    ``pread``/``pwrite`` rather than mapped.

    Mapped pages count in the process's memory until they are unmapped; explicit reads keep
    memory at one chunk whatever the file size, and a read-only descriptor means a bug can never
    write to an input.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        dtype: np.dtype,
        shape: tuple[int, ...],
        *,
        writable: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.dtype = dtype
        self.shape = tuple(shape)
        self.row_bytes = math.prod(shape[1:]) * dtype.itemsize
        self._mapped: np.ndarray | None = None
        # Never through a link: a folder's files are its own (links are refused on opening).
        self.fd = os.open(self.path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW)
        self._cold: ColdReads | None = None

    def read(self, start: int, stop: int) -> np.ndarray:
        count = max(0, min(stop, self.shape[0]) - start)
        at, nbytes = start * self.row_bytes, count * self.row_bytes
        end = self.shape[0] * self.row_bytes
        out = read_exact(self.fd, at, nbytes, self.path, self._reads(), end)
        return out.view(self.dtype).reshape(count, *self.shape[1:])

    def _reads(self) -> ColdReads:
        """The reads of this leaf's file past the page cache, made on first use."""
        if self._cold is None:
            self._cold = ColdReads(self.fd)
        return self._cold

    def in_memory(self) -> bool:
        """Whether every page of the leaf is in the page cache."""
        return self._reads().cached(0, math.prod(self.shape) * self.dtype.itemsize)

    def feed(self, update: Callable[[memoryview], None]) -> bool:
        """Pass the leaf's bytes to ``update`` in order, through read-only mapped windows (no
        copy: hashing a file already in the page cache runs at memory speed); ``False``, having
        passed nothing, when the file is shorter than the leaf (the caller's reads then fail
        with a clear error instead of a bus error) or not all in memory (mapped pages would
        fill the page cache, and :meth:`read` reads past it at the disk's speed)."""
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        if os.fstat(self.fd).st_size < nbytes or not self.in_memory():
            return False
        for offset in range(0, nbytes, _WINDOW):
            with mmap.mmap(
                self.fd, min(_WINDOW, nbytes - offset), access=mmap.ACCESS_READ, offset=offset
            ) as window:
                window.madvise(mmap.MADV_SEQUENTIAL)
                with memoryview(window) as view:
                    update(view)
        return True

    def mapped(self) -> np.ndarray:
        """The whole leaf mapped privately (copy on write), for random access (training
        reads): pages come from the page cache as rows are touched, and nothing written to the
        array reaches the file."""
        if self._mapped is None:
            if math.prod(self.shape) == 0:
                self._mapped = np.empty(self.shape, dtype=self.dtype)  # mmap refuses 0 bytes
            else:
                # From the descriptor opened with the leaf, not the path: a file replaced
                # since (an output written again) is not the one the leaf describes.
                self._mapped = map_private(self.fd, self.dtype, self.shape)
        return self._mapped

    def write(self, start: int, value: np.ndarray) -> None:
        write_exact(self.fd, start * self.row_bytes, value)

    def close(self) -> None:
        cold, self._cold = getattr(self, "_cold", None), None
        if cold is not None:
            cold.close()
        fd = getattr(self, "fd", -1)  # unset if a signal cut __init__ short
        if fd >= 0:
            self.fd = -1  # never close a number the system may have reused
            os.close(fd)

    def __del__(self) -> None:
        self.close()
