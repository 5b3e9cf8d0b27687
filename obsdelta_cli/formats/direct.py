"""Large reads of data that is not in memory go straight from the disk (``O_DIRECT``).

A buffered read of data not in the page cache costs the kernel more than the disk: every page
is allocated, charged, filled, then copied out (on the machine of the README's benchmark, 1.1-3.2
s of CPU for 1.7 GB, against 0.05 s for the same bytes read with ``O_DIRECT`` in half the wall
time), and the pages then push other files out of memory. So a large read whose pages are not
all cached is made with ``O_DIRECT`` into an aligned buffer; one whose pages are cached (a file
just written and read back to verify it, or read twice) is copied from memory as before. Which
pages are cached is asked of the kernel (``mincore`` on a mapping that is never touched, so it
costs no memory). Where ``O_DIRECT`` is refused (tmpfs, some network file systems), every read
is buffered.

>>> import tempfile
>>> with tempfile.NamedTemporaryFile() as f:
...     _ = f.write(bytes(range(256)) * 4096); f.flush()
...     reads = ColdReads(os.open(f.name, os.O_RDONLY))
...     bytes(reads.read_direct(5000, 3)) if reads.usable else bytes([136, 137, 138])
b'\\x88\\x89\\x8a'
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys

import numpy as np

#: Alignment of offsets, lengths and buffers for ``O_DIRECT`` (4 KiB suits every device with
#: 512-byte or 4 KiB sectors).
ALIGN = 4096
#: The largest read past the page cache worth making for a caller that consumes the bytes at
#: once (a hash): larger buffers from the heap are kept by the allocator once freed (a 2 GB pass
#: in 4 MiB reads took 60-100 MB more peak memory), and mapping a fresh buffer per read costs
#: more than the read.
PIECE = 1 << 20
#: Reads smaller than this are buffered: the kernel's read-ahead already serves them well.
MIN_DIRECT = 1 << 18

_PAGE = mmap.PAGESIZE
_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_long,
        ]  # fmt: skip
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = libc
    return _libc


class ColdReads:
    """Reads of one file opened read-only at ``fd``: :meth:`read` returns ``None`` where a
    buffered read is the better one (or the only one possible)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.direct_fd = -1
        self.base: int | None = None
        libc = _c()
        if libc is None or self.size < MIN_DIRECT or not hasattr(os, "O_DIRECT"):
            return
        try:
            # The same file again, through the descriptor: no path to resolve a second time.
            self.direct_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECT)
        except OSError:
            return
        # A shared read-only mapping of the whole file, never touched: mincore asks the kernel
        # which of its pages are cached; none of them count in this process's memory.
        base = libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            self.close()
            return
        self.base = base

    @property
    def usable(self) -> bool:
        """Whether reads past the page cache can still be made (none once refused)."""
        return self.base is not None and self.direct_fd >= 0

    def cached(self, offset: int, nbytes: int) -> bool:
        """Whether every page of ``nbytes`` at ``offset`` is in the page cache.

        Every page, not most: a buffered read of pages partly cached runs into the marks the
        kernel's read-ahead leaves, which start reading the next window (up to read_ahead_kb,
        8 MiB here) into the cache; the next large read then finds its pages cached and is
        buffered too, and so on to the end of the file. A one-value HDF5 read at the start of
        a dataset set that off, and 830 MB of a 2 GB input went through the page cache."""
        libc = _c()
        if self.base is None or libc is None:
            return True
        first = offset // _PAGE * _PAGE
        end = min(self.size, offset + nbytes)
        pages = -(-(end - first) // _PAGE)
        if pages <= 0:
            return True
        vec = np.empty(pages, dtype=np.uint8)
        if libc.mincore(self.base + first, end - first, vec.ctypes.data) != 0:
            return True
        # Bit 0 of each byte says whether the page is cached (the others are reserved, zero).
        return bool(vec.all())

    def read(self, offset: int, nbytes: int) -> np.ndarray | None:
        """``nbytes`` at ``offset`` read with ``O_DIRECT`` if the read is large and not all its
        pages are cached; ``None`` if it should be buffered."""
        if not self.usable or nbytes < MIN_DIRECT or self.cached(offset, nbytes):
            return None
        return self.read_direct(offset, nbytes)

    def read_direct(self, offset: int, nbytes: int) -> np.ndarray | None:
        """``nbytes`` at ``offset`` with ``O_DIRECT``, as a uint8 view into an aligned buffer;
        ``None`` (and buffered reads from now on) if the file system refuses it."""
        if self.direct_fd < 0:
            return None
        head = offset % ALIGN
        start = offset - head
        span = -(-(head + nbytes) // ALIGN) * ALIGN
        storage = np.empty(span + ALIGN, dtype=np.uint8)
        skip = -storage.ctypes.data % ALIGN
        buffer = storage[skip : skip + span]
        view = buffer.data
        done = 0
        try:
            while done < head + nbytes:
                n = os.preadv(self.direct_fd, [view[done:]], start + done)
                done += n
                if done < head + nbytes and (n <= 0 or done % ALIGN):
                    return None  # the file ends early: the buffered read reports it
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._stop_direct()
            return None
        return buffer[head : head + nbytes]

    def _stop_direct(self) -> None:
        fd, self.direct_fd = self.direct_fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        """Close the second descriptor and unmap (the caller's descriptor stays open)."""
        self._stop_direct()
        base, self.base = self.base, None
        libc = _c()
        if base is not None and libc is not None:
            libc.munmap(base, self.size)

    def __del__(self) -> None:
        self.close()
