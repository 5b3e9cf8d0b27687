"""Rows, their successors along time, and the chunks of rows that move between containers.

Every leaf is seen flat, ``[rows, *features]`` over its batch dimensions. Chunk boundaries depend
only on the data (row size, the first batch dimension, HDF5 chunking) and on ``--chunk-mb``
through a whole number of fixed *blocks*, so that every block lies inside one chunk: error sums
are taken per block, and outputs and figures come out the same whatever the chunk size.

>>> import numpy as np
>>> g = Geometry.of([2, 3], time_dim=1, valid_rows=None)
>>> g.has_successor(np.arange(6)).tolist()
[True, True, False, True, True, False]
"""

from __future__ import annotations

import contextvars
import math
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any, TypeVar

import numpy as np

from . import interrupts
from .arrays import sorted_distinct
from .checksum import Hasher
from .formats.leaf import FlatRows, as_rows, is_data
from .progress import current

T = TypeVar("T")
R = TypeVar("R")

#: Writes waiting at most in :class:`Behind`: with 2, the encoder waited for the writer whenever
#: one chunk's writes (and error figures) took longer than the next chunk's encoding; 6 took
#: fp16 compress of 2 GB from 5.6 s to 5.3 s (D4RL) and 4.9 s to 4.5 s (TED), for a few MB.
BEHIND = 6
#: Bytes of one block of rows (at least one row): the unit error sums and chunks are cut in.
BLOCK_BYTES = 1 << 12


@dataclass(frozen=True)
class Geometry:
    """Where rows and time are: rows flattened over the batch dims and their successors.

    The successor of row ``r`` is the row one step later along the time dimension,
    ``r + step``; the last step of each trajectory, and rows past ``valid``, have none.
    """

    total: int
    valid: int
    step: int
    length: int
    #: Rows per index of the first batch dimension: chunks of lazy leaves align to it.
    align: int

    @classmethod
    def of(cls, batch: Sequence[int], time_dim: int, valid_rows: int | None) -> Geometry:
        per_first = math.prod(batch[1:])
        valid = batch[0] if valid_rows is None else valid_rows
        return cls(
            total=math.prod(batch),
            valid=valid * per_first,
            step=math.prod(batch[time_dim + 1 :]),
            length=batch[time_dim],
            align=per_first,
        )

    def has_successor(self, rows: np.ndarray) -> np.ndarray:
        """Per row number in ``rows``: whether it has a successor."""
        if self.step == 1 and self.length == self.total:  # one trajectory axis (TED, D4RL)
            return rows + 1 < min(self.valid, self.total)
        last_step = (rows // self.step) % self.length == self.length - 1
        return ~last_step & (rows + self.step < self.valid)

    def without_successor(self, start: int, stop: int) -> np.ndarray:
        """Rows of ``start:stop`` without a successor, sorted, counted from ``start``: the same
        rows as ``~has_successor``, found without looking at every row.

        >>> Geometry.of([2, 3], time_dim=1, valid_rows=None).without_successor(1, 6).tolist()
        [1, 4]
        """
        if stop <= start:
            return np.zeros(0, dtype=np.int64)
        period = self.step * self.length
        bases = np.arange(start // period, (stop - 1) // period + 1, dtype=np.int64) * period
        last = (bases + (self.length - 1) * self.step)[:, None] + np.arange(self.step)
        rows = last.flatten()
        rows = rows[(rows >= start) & (rows < stop)]
        tail = np.arange(max(start, min(stop, self.valid - self.step)), stop, dtype=np.int64)
        if tail.size:
            rows = sorted_distinct(np.concatenate([rows, tail]))
        return rows - start


def block_rows(leaves: Sequence[Any], align: int) -> int:
    """Rows per block for ``leaves`` (flat views of one pair): a whole number of first-dim
    indices and of HDF5 chunks, about :data:`BLOCK_BYTES` long. Independent of ``--chunk-mb``."""
    unit = align
    for leaf in leaves:
        if isinstance(leaf, FlatRows):
            unit = math.lcm(unit, align * getattr(leaf.leaf, "chunk_rows", 1))
    row_bytes = max((_row_bytes(leaf) for leaf in leaves), default=1)
    return unit * max(1, BLOCK_BYTES // max(1, unit * row_bytes))


def _row_bytes(rows: Any) -> int:
    return max(1, math.prod(rows.shape[1:]) * rows.dtype.itemsize)


def slices(stop: int, block: int, chunk_bytes: int, row_bytes: int) -> Iterator[slice]:
    """Row slices up to ``stop`` of about ``chunk_bytes``, each a whole number of blocks."""
    blocks = max(1, chunk_bytes // max(1, block * row_bytes))
    step = blocks * block
    for start in range(0, stop, step):
        yield slice(start, min(stop, start + step))


def window(obs: Any, sl: slice, geometry: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``sl`` of ``obs`` and their successors, read once with the overlap they need; a row
    without a successor gets its own observation (the rebuild makes the same choice)."""
    n = sl.stop - sl.start
    block = obs[sl.start : min(geometry.total, sl.stop + geometry.step)]
    chunk = block[:n]
    successor = np.empty_like(chunk)
    reach = max(0, min(n, block.shape[0] - geometry.step))
    successor[:reach] = block[geometry.step : geometry.step + reach]
    successor[reach:] = chunk[reach:]
    missing = geometry.without_successor(sl.start, sl.stop)
    if missing.size:
        successor[missing] = chunk[missing]
    return chunk, successor


def _one_worker(name: str) -> ThreadPoolExecutor:
    torch = sys.modules.get("torch")  # imported by a codec that casts, or by the caller
    if torch is None or getattr(torch.__spec__, "_initializing", False):
        # Not imported, or still being imported by another thread (a codec's first chunk,
        # while leaves are copied beside it): its functions may not be there yet.
        return ThreadPoolExecutor(1, name)
    # torch's thread count is per OS thread: the worker works with the caller's.
    threads = torch.get_num_threads()
    return ThreadPoolExecutor(1, name, initializer=torch.set_num_threads, initargs=(threads,))


def ahead(items: Iterable[T], load: Callable[[T], R]) -> Iterator[tuple[T, R]]:
    """``(item, load(item))`` in order, the next item loading in a thread while the caller
    works on this one: reads (``preadv`` and numpy release the GIL) overlap encoding, hashing
    and writing instead of waiting for them. At most two loads are held at once.

    >>> [r for _, r in ahead(range(3), lambda i: i * i)]
    [0, 1, 4]
    """
    items = iter(items)
    first = list(islice(items, 2))
    if len(first) < 2:
        # One item, nothing to overlap: no thread is started (a pass over each of the
        # hundreds of short demos of a robomimic file is one chunk).
        for item in first:
            interrupts.check()
            yield item, load(item)
        return
    pool = _one_worker("obsdelta-read")
    try:
        pending: tuple[T, Future[R]] | None = None
        for item in chain(first, items):
            # A signal whose exception something swallowed stops the pass here, each chunk.
            interrupts.check()
            submitted = (item, pool.submit(load, item))
            if pending is not None:
                yield pending[0], pending[1].result()
            pending = submitted
        if pending is not None:
            yield pending[0], pending[1].result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def beside(tasks: Iterable[Callable[[], None]]) -> Iterator[None]:
    """Run ``tasks`` in turn in a thread while the ``with`` block runs, and wait for them on
    leaving: copies of leaves beside the pass over observations, which reads and writes other
    files (compress of a 500 MB TED folder spent 0.3 s copying its 8 other leaves before that
    pass, while the disk and the second core were half idle).

    The tasks were listed first: an error one of them meets is raised before the block's. If
    the block fails, the tasks not yet started are dropped.

    >>> done = []
    >>> with beside([lambda: done.append("copied")]):
    ...     done.append("encoded")
    >>> sorted(done)
    ['copied', 'encoded']
    """
    stop = threading.Event()

    def run() -> None:
        for task in tasks:
            if stop.is_set():
                return
            task()

    pool = ThreadPoolExecutor(1, "obsdelta-beside")
    # The thread reports progress where the caller does (a context variable).
    future = pool.submit(contextvars.copy_context().run, run)
    try:
        yield
    except BaseException as exc:
        stop.set()
        pool.shutdown(wait=True)
        first = future.exception()
        if isinstance(exc, Exception) and isinstance(first, Exception):
            raise first from None
        raise
    pool.shutdown(wait=True)
    future.result()


class Behind:
    """Writes run in order in one thread while the caller goes on to the next chunk, at most
    ``depth`` waiting; :meth:`wait` (or leaving the ``with`` block) waits for all of them and
    raises the first error. One thread, so the container sees the writes in program order
    and writes the same file.

    >>> out = []
    >>> with Behind() as later:
    ...     later(out.append, 1); later(out.append, 2)
    >>> out
    [1, 2]
    """

    def __init__(self, depth: int = BEHIND) -> None:
        self.depth = depth
        self.pending: list[Future[Any]] = []
        self.pool = _one_worker("obsdelta-write")

    def __call__(self, write: Callable[..., Any], *args: Any) -> None:
        self.pending.append(self.pool.submit(write, *args))
        while len(self.pending) > self.depth:
            self.pending.pop(0).result()

    def wait(self) -> None:
        while self.pending:
            self.pending.pop(0).result()

    def __enter__(self) -> Behind:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        try:
            if kind is None:
                self.wait()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Stream:
    """How one command moves rows: batch dims, time, valid rows and the chunk budget."""

    batch_dims: int
    time_dim: int
    valid_rows: int | None
    chunk_bytes: int

    def flat(self, leaf: Any) -> Any:
        return as_rows(leaf, self.batch_dims)

    def geometry(self, leaf: Any) -> Geometry:
        return Geometry.of(leaf.shape[: self.batch_dims], self.time_dim, self.valid_rows)

    def chunks(self, leaves: Sequence[Any], stop: int, align: int) -> Iterator[slice]:
        """Row slices over flat ``leaves`` (read or written together) up to ``stop``."""
        block = block_rows(leaves, align)
        return slices(stop, block, self.chunk_bytes, max(_row_bytes(x) for x in leaves))

    def copy(self, src: Any, dst: Any, algorithm: str, blocks: Any | None = None) -> str | None:
        """Copy a leaf chunk by chunk (``dst=None``: only read it); return the hash of its bytes.
        Non-array leaves are carried by the container and give ``None``. ``blocks`` is fed
        every chunk read, before it is written: a :class:`~obsdelta_cli.checksum.BlockCheck`
        checks it, a :class:`~obsdelta_cli.checksum.BlockFeed` takes its block digests."""
        if not is_data(src):
            return None
        hasher = Hasher(algorithm)
        feed = getattr(src, "feed", None)
        if dst is None and feed is not None and feed(hasher.update):
            return hasher.hex
        src = self.flat(src)
        dst = None if dst is None else self.flat(dst)
        align = src.per_first if isinstance(src, FlatRows) else 1
        leaves = [src] if dst is None else [src, dst]
        with Behind() as later:
            for sl, chunk in ahead(self.chunks(leaves, src.shape[0], align), src.__getitem__):
                hasher.update(chunk)
                if blocks is not None:
                    blocks.update(chunk)
                if dst is not None:
                    later(dst.__setitem__, sl, chunk)
        return hasher.hex


@contextmanager
def reporting(name: str, rows: int, row_bytes: int) -> Iterator[Callable[[slice], None]]:
    """A progress task over ``rows`` rows, counted in bytes of next observations."""
    progress = current()
    task = progress.task(name, rows * row_bytes)
    try:
        yield lambda sl: progress.advance(task, (sl.stop - sl.start) * row_bytes)
    finally:
        progress.finish(task)
