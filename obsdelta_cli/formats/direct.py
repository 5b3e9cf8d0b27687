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

A run of reads that follow one another (a stream's chunks of a dataset) is read a
:data:`WINDOW` at a time into buffers reused for the whole process, and served from them: one
``O_DIRECT`` read of 1 MiB at a time ran at 0.97 GB/s on the README's benchmark machine, of 16
MiB at 2.1 GB/s, the disk's speed (more reads in flight at once did not help; reading into
memory not touched before ran at 0.45 GB/s, its pages faulted in one by one). A read that
follows none is made as asked.

>>> import tempfile
>>> with tempfile.NamedTemporaryFile() as f:
...     _ = f.write(bytes(range(256)) * 4096); f.flush()
...     reads = ColdReads(os.open(f.name, os.O_RDONLY))
...     bytes(reads.read_direct(5000, 3)) if reads.usable else bytes([136, 137, 138])
b'\\x88\\x89\\x8a'
"""

from __future__ import annotations

import collections
import ctypes
import errno
import itertools
import mmap
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

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
#: Bytes read at once past the page cache for a read that continues an earlier one.
WINDOW = 8 << 20
#: Windows kept in the process (the most recently read): two for each stream of reads (the one
#: read from, the next one read ahead), such as a dataset and its next observations read side
#: by side. Their buffers take ``WINDOW * WINDOWS`` bytes at most, allocated as needed and kept.
WINDOWS = 8

_PAGE = mmap.PAGESIZE
_libc: ctypes.CDLL | None = None


def mapped_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` of memory mapped for the purpose, so page-aligned, as ``O_DIRECT`` needs; its
    pages are faulted in once, by the first read into it, so it pays to keep it."""
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


class _Window:
    """A buffer for ``length`` bytes of one file from ``offset`` (``data``, once read), of the
    :class:`ColdReads` numbered ``owner`` (0: none); ``filling`` while read in the background."""

    def __init__(self) -> None:
        self.buffer = mapped_buffer(WINDOW + ALIGN)
        self.data: np.ndarray | None = None
        self.owner = self.offset = self.length = 0
        self.filling: Future[None] | None = None

    @property
    def end(self) -> int:
        return self.offset + self.length


class _Windows:
    """The process's windows, least recently used first, and the thread that reads ahead."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: list[_Window] = []
        self.made = 0
        self._reader: ThreadPoolExecutor | None = None

    def copy(self, owner: int, offset: int, nbytes: int) -> np.ndarray | bool:
        """A copy of ``nbytes`` at ``offset`` from windows of ``owner``'s that follow one
        another (waiting for one being read); else whether the read starts in one of them (and
        so continues it)."""
        end = offset + nbytes
        while True:
            with self.lock:
                parts: list[tuple[_Window, np.ndarray]] = []
                at, filling = offset, None
                while at < end:
                    w = self._holding(owner, at)
                    if w is None or w.filling is not None or w.data is None:
                        filling = None if w is None else w.filling
                        break
                    parts.append((w, w.data))
                    at = w.end
                if filling is None:
                    if at < end or not parts:
                        return bool(parts) or self._holding(owner, offset) is not None
                    out = np.empty(nbytes, dtype=np.uint8)
                    for w, data in parts:
                        lo, hi = max(offset, w.offset), min(end, w.end)
                        out[lo - offset : hi - offset] = data[lo - w.offset : hi - w.offset]
                        self.kept.remove(w)
                        self.kept.append(w)
                    return out
            filling.result()  # outside the lock; then copy under it (the window may go)

    def next_start(self, owner: int, offset: int) -> int | None:
        """Where the window after ``owner``'s one holding the byte before ``offset`` (the end
        of a read) would start; ``None`` if there is no such window, or the next one is
        there already."""
        with self.lock:
            here = self._holding(owner, offset - 1)
            if here is None or self._holding(owner, here.end) is not None:
                return None
            return here.end

    def _holding(self, owner: int, offset: int) -> _Window | None:
        """``owner``'s window holding the byte at ``offset`` (being read or not)."""
        return next((w for w in self.kept if w.owner == owner and w.offset <= offset < w.end), None)

    def take(self, owner: int, offset: int, length: int) -> _Window | None:
        """A window reserved for ``length`` bytes at ``offset``, to be given to :meth:`fill`: a
        new one while fewer than :data:`WINDOWS` exist, else the least recently used not being
        read; ``None`` if one holds ``offset`` already, or every one is being read."""
        with self.lock:
            if self._holding(owner, offset) is not None:
                return None
            w: _Window | None = None
            if self.made < WINDOWS:
                self.made += 1
                w = _Window()
            else:
                w = next((k for k in self.kept if k.filling is None), None)
                if w is None:
                    return None
                self.kept.remove(w)
            # Being read from now on: no other thread may take it, or read from it, until
            # :meth:`fill` has run.
            w.owner, w.offset, w.length, w.data = owner, offset, length, None
            w.filling = Future()
            self.kept.append(w)
            return w

    def ahead(self, w: _Window, fill: Callable[[], np.ndarray | None]) -> None:
        """:meth:`fill` ``w`` in the background."""
        with self.lock:
            if self._reader is None:
                self._reader = ThreadPoolExecutor(1, thread_name_prefix="obsdelta-read-ahead")
            reader = self._reader
        reader.submit(self.fill, w, fill)

    def fill(self, w: _Window, fill: Callable[[], np.ndarray | None]) -> None:
        """Read a window :meth:`take` reserved with ``fill`` (into its buffer), then let the
        threads waiting for it go on; a failed read leaves it empty."""
        data = None
        try:
            data = fill()
        except OSError:
            pass  # the caller's own read then meets the error and reports it
        finally:
            with self.lock:
                w.data, filling, w.filling = data, w.filling, None
                if data is None:
                    w.owner = 0
            if filling is not None:
                filling.set_result(None)


_windows = _Windows()


def _fresh_windows() -> None:
    """A forked child has none of the parent's threads, and maybe a lock taken at the fork."""
    global _windows
    _windows = _Windows()


os.register_at_fork(after_in_child=_fresh_windows)
_numbers = itertools.count(1)


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

    # Set before ``__init__`` runs: a signal raised inside it (SIGTERM, Ctrl-C) leaves a
    # half-made object, which :meth:`__del__` closes all the same.
    direct_fd: int = -1
    base: int | None = None

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.direct_fd = -1
        self.base: int | None = None
        #: ``(start, end)`` of recent direct reads: a read starting in one continues it.
        self._spans: collections.deque[tuple[int, int]] = collections.deque(maxlen=8)
        self._number = next(_numbers)  # its windows' owner (a reference would keep it alive)
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

    def read(self, offset: int, nbytes: int, end: int | None = None) -> np.ndarray | None:
        """``nbytes`` at ``offset`` read with ``O_DIRECT`` if the read is large and not all its
        pages are cached (through a window, where it continues earlier reads; the window after
        it is then read in the background); ``None`` if it should be buffered. ``end``: where
        the run of reads this one belongs to ends (a dataset's last byte), which no window
        passes by more than its alignment.

        Without it, the last window of one dataset ran on into the next, which its own reads,
        or a copy of its raw chunks, then read a second time: 30 MB of the 280 MB read from
        the disk to compress a D4RL file of 250 MB."""
        if not self.usable or nbytes < MIN_DIRECT:
            return None
        limit = self.size if end is None else self._limit(max(end, offset + nbytes))
        got = _windows.copy(self._number, offset, nbytes)
        if isinstance(got, np.ndarray):
            self._read_ahead(offset + nbytes, limit)
            return got
        follows = got or any(a < offset <= b for a, b in list(self._spans))
        if self.cached(offset, nbytes):
            return None
        self._spans.append((offset, offset + nbytes))
        size = min(WINDOW, limit - offset)
        w = _windows.take(self._number, offset, size) if follows and size > nbytes else None
        if w is None:
            return self.read_direct(offset, nbytes)
        _windows.fill(w, lambda: self.read_direct(offset, size, into=w.buffer))
        got = _windows.copy(self._number, offset, nbytes)
        if not isinstance(got, np.ndarray):
            return None  # not read (refused, or the file ended early), or taken since: buffered
        self._read_ahead(offset + nbytes, limit)
        return got

    def _limit(self, end: int) -> int:
        """Where windows for a run of reads ending at ``end`` stop: there, aligned up, within
        the file (an unaligned end is read to its page's end all the same)."""
        return min(self.size, -(-end // ALIGN) * ALIGN)

    def _read_ahead(self, offset: int, limit: int) -> None:
        """Read the window after the one ``offset`` (just past a read) ends, up to ``limit`` at
        most, in the background, unless it is read already, or cached."""
        start = _windows.next_start(self._number, offset)
        if start is None or start >= limit:
            return
        size = min(WINDOW, limit - start)
        if self.cached(start, size):
            return
        w = _windows.take(self._number, start, size)
        if w is not None:
            _windows.ahead(w, lambda: self.read_direct(start, size, into=w.buffer))

    def read_direct(
        self, offset: int, nbytes: int, into: np.ndarray | None = None
    ) -> np.ndarray | None:
        """``nbytes`` at ``offset`` with ``O_DIRECT``, as a uint8 view into an aligned buffer
        (``into``, page-aligned and large enough, if given); ``None`` (and
        buffered reads from now on) if the file system refuses it."""
        if self.direct_fd < 0:
            return None
        head = offset % ALIGN
        start = offset - head
        span = -(-(head + nbytes) // ALIGN) * ALIGN
        if into is None:
            storage = np.empty(span + ALIGN, dtype=np.uint8)
            skip = -storage.ctypes.data % ALIGN
            buffer = storage[skip : skip + span]
        else:
            buffer = into[:span]
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
        # Its windows are left to be reused: none can serve another file (the numbers are
        # never reused), and taking the lock here could deadlock (a collection run while the
        # lock is held calls this). A read of them in the background ends with an error, kept
        # to itself, once the descriptor is closed.
        self._stop_direct()
        base, self.base = self.base, None
        libc = _c()
        if base is not None and libc is not None:
            libc.munmap(base, self.size)

    def __del__(self) -> None:
        self.close()
