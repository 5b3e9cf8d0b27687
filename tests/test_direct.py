"""Reads past the page cache (``formats/direct.py``): the same bytes as a buffered read at any
offset and length, made only where the pages are not cached, and buffered reads wherever the
file system refuses ``O_DIRECT``; compressing from an input out of memory gives the same output
as from one in memory."""

from __future__ import annotations

import ctypes
import errno
import gc
import mmap
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from obsdelta_cli import compress, verify
from obsdelta_cli.formats import direct
from obsdelta_cli.formats.direct import ALIGN, ColdReads
from obsdelta_cli.formats.hdf5_copy import RawCopies
from obsdelta_cli.formats.hdf5_leaves import H5Leaf
from obsdelta_cli.formats.hdf5_objects import hash_objects
from obsdelta_cli.formats.leaf import read_exact

from .conftest import SAMPLE
from .test_hdf5_copy import _d4rl_with_odd_objects

SIZE = 3 * (1 << 20) + 1234  # not a whole number of pages


def _direct_works(folder: Path) -> bool:
    probe = folder / "probe"
    probe.write_bytes(bytes(ALIGN))
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    finally:
        probe.unlink()
    return True


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    if not _direct_works(tmp_path):
        pytest.skip("the file system of the test folder refuses O_DIRECT (tmpfs)")
    return path


def evict(path: Path) -> None:
    """Drop the file's clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@contextmanager
def _opened(path: Path) -> Iterator[tuple[int, ColdReads]]:
    """A read-only descriptor of ``path`` and its :class:`ColdReads`, both closed after."""
    fd = os.open(path, os.O_RDONLY)
    reads = ColdReads(fd)
    try:
        yield fd, reads
    finally:
        reads.close()
        os.close(fd)


def _refuse(monkeypatch: pytest.MonkeyPatch, name: str, when: Callable[..., bool]) -> None:
    """``direct.os.<name>`` fails with EINVAL for the calls ``when`` picks, as a file system
    refusing ``O_DIRECT`` does."""
    original = getattr(os, name)

    def refused(*args: Any) -> Any:
        if when(*args):
            raise OSError(errno.EINVAL, "Invalid argument")
        return original(*args)

    monkeypatch.setattr(direct.os, name, refused)


@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [(0, 1 << 20), (1, 1 << 20), (4095, 300_001), (ALIGN, 2 * ALIGN), (SIZE - 5000, 5000)],
)
def test_direct_reads_give_the_bytes_a_buffered_read_gives(
    data: Path, offset: int, nbytes: int
) -> None:
    with _opened(data) as (fd, reads):
        got = reads.read_direct(offset, nbytes)
        assert got is not None
        assert (got.ctypes.data - offset % ALIGN) % ALIGN == 0  # read into an aligned buffer
        assert got.size == nbytes
        assert bytes(got) == os.pread(fd, nbytes, offset)


def test_a_read_past_the_end_is_left_to_the_buffered_read(data: Path) -> None:
    with _opened(data) as (fd, reads):
        assert reads.read_direct(SIZE - 100, 1 << 20) is None
        with pytest.raises(OSError, match=r"data\.bin: unexpected end of file"):
            read_exact(fd, SIZE - 100, 1 << 20, str(data), reads)


def test_only_pages_not_in_memory_are_read_directly(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _direct_reads(monkeypatch)
    with _opened(data) as (fd, reads):
        evict(data)
        assert not reads.cached(0, SIZE)
        first = read_exact(fd, 0, 1 << 20, str(data), reads)
        assert made == [1 << 20]
        assert not reads.cached(0, 1 << 20)  # a direct read leaves nothing in the page cache
        os.pread(fd, 1 << 20, 1 << 20)  # a buffered read caches its pages
        assert reads.cached(1 << 20, 1 << 20)
        second = read_exact(fd, 1 << 20, 1 << 20, str(data), reads)
        assert made == [1 << 20]  # served from memory
        small = read_exact(fd, 2 << 20, 4096, str(data), reads)
        assert made == [1 << 20]  # too small to bypass the cache
        whole = data.read_bytes()
        assert bytes(first) == whole[: 1 << 20]
        assert bytes(second) == whole[1 << 20 : 2 << 20]
        assert bytes(small) == whole[2 << 20 : (2 << 20) + 4096]


def _cache_exactly(path: Path, nbytes: int) -> None:
    """Bring the first ``nbytes`` of ``path`` into the page cache, and nothing past them (no
    read-ahead on this descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, nbytes, 0)
    finally:
        os.close(fd)


def test_a_range_partly_in_memory_is_read_directly(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffered read of a range partly cached would run into the kernel's read-ahead marks
    and pull the next ranges into the cache, so that every later read looks cached: only a
    range cached whole is read from memory."""
    made = _direct_reads(monkeypatch)
    with _opened(data) as (fd, reads):
        evict(data)
        _cache_exactly(data, 3 << 18)  # three quarters of the first MiB
        assert not reads.cached(0, 1 << 20)
        got = read_exact(fd, 0, 1 << 20, str(data), reads)
        assert made == [1 << 20]
        _cache_exactly(data, 1 << 20)
        assert reads.cached(0, 1 << 20)
        again = read_exact(fd, 0, 1 << 20, str(data), reads)
        assert made == [1 << 20]
        assert bytes(got) == bytes(again) == data.read_bytes()[: 1 << 20]


def _hopper_like(folder: Path, rows: int) -> Path:
    """A D4RL file of contiguous datasets, ``rows`` long, episodes of 1,000 steps."""
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((rows + 1, 17), dtype=np.float32)
    src = folder / "in.hdf5"
    with h5py.File(src, "w") as f:
        f["observations"] = obs[:-1]
        f["next_observations"] = obs[1:]
        f["actions"] = rng.standard_normal((rows, 3), dtype=np.float32)
        f["rewards"] = rng.standard_normal(rows, dtype=np.float32)
        f["terminals"] = np.zeros(rows, dtype=bool)
        f["timeouts"] = np.arange(rows) % 1000 == 999
    return src


def test_every_large_read_of_an_hdf5_input_out_of_memory_is_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing the compressor does before its pass (creating the output's copies of the
    datasets) reads the input's data through the page cache: the pass's reads of a cold
    input then all bypass it, from the first to the last."""
    if not _direct_works(tmp_path):
        pytest.skip("the file system of the test folder refuses O_DIRECT (tmpfs)")
    rows = 400_000  # 27 MB per dataset: more than the kernel reads ahead
    src = _hopper_like(tmp_path, rows)
    with h5py.File(src) as f:
        obs = f["observations"][:]
    evict(src)
    buffered: list[tuple[int, int]] = []
    original = ColdReads.read

    def spy(self: ColdReads, offset: int, nbytes: int, end: int | None = None) -> Any:
        # A read of pages already in memory (the kernel's copy of a small dataset put them
        # there, and the block checksums read them after the pass) is buffered by design;
        # a read of pages not in memory must never be.
        cold = self.usable and not self.cached(offset, nbytes)
        got = original(self, offset, nbytes, end)
        if cold and got is None and nbytes >= direct.MIN_DIRECT and self.size == src.stat().st_size:
            buffered.append((offset, nbytes))
        return got

    monkeypatch.setattr(ColdReads, "read", spy)
    made = _direct_reads(monkeypatch)
    compress(src, tmp_path / "out.hdf5", codec="fp16", verify=False)
    assert buffered == []
    assert sum(made) >= 2 * obs.nbytes  # observations and next observations, once each
    # And no more: no window of one dataset runs on into the next (75 MB of this 62 MB file
    # were read when one did).
    assert sum(made) <= src.stat().st_size
    verify(tmp_path / "out.hdf5")


def test_where_o_direct_is_refused_every_read_is_buffered(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse(monkeypatch, "open", lambda path, flags, *rest: bool(flags & os.O_DIRECT))
    with _opened(data) as (fd, reads):
        assert not reads.usable
        evict(data)
        assert reads.read(0, 1 << 20) is None
        assert bytes(read_exact(fd, 3, 1 << 20, str(data), reads)) == os.pread(fd, 1 << 20, 3)


def test_a_refused_direct_read_turns_direct_reads_off(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some file systems open with O_DIRECT and refuse the reads (EINVAL)."""
    with _opened(data) as (fd, reads):
        direct_fd = reads.direct_fd
        _refuse(monkeypatch, "preadv", lambda f, *rest: f == direct_fd)
        evict(data)
        assert reads.read(0, 1 << 20) is None
        assert reads.direct_fd == -1 and not reads.usable
        got = read_exact(fd, 0, 1 << 20, str(data), reads)
        assert bytes(got) == data.read_bytes()[: 1 << 20]


def test_a_memmap_input_out_of_memory_compresses_to_the_same_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _direct_works(tmp_path):
        pytest.skip("the file system of the test folder refuses O_DIRECT (tmpfs)")
    monkeypatch.setattr(direct, "MIN_DIRECT", ALIGN)  # the sample's reads are small
    src = tmp_path / "hopper_ted"
    shutil.copytree(SAMPLE / "hopper_ted", src)
    made = _direct_reads(monkeypatch)
    compress(src, tmp_path / "warm", codec="exact")
    assert not any(made)  # the copy just made is in memory
    for path in _files(src):
        evict(path)
    compress(src, tmp_path / "cold", codec="exact")
    assert sum(made) > 0
    verify(tmp_path / "cold")
    assert _contents(tmp_path / "cold") == _contents(tmp_path / "warm")


def test_hdf5_rows_out_of_memory_are_read_directly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _direct_works(tmp_path):
        pytest.skip("the file system of the test folder refuses O_DIRECT (tmpfs)")
    monkeypatch.setattr(direct, "MIN_DIRECT", ALIGN)
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")  # contiguous datasets
    made = _direct_reads(monkeypatch)
    with h5py.File(src, "r") as f:
        leaf = H5Leaf(f["observations"], src)
        want = f["observations"][()]
        evict(src)  # after HDF5 read its metadata (and, reading ahead, the whole small file)
        got = leaf.read(7, 4000)
        assert sum(made) == got.size * 4
        assert np.array_equal(got, want[7:4000])
        again = leaf.read(7, 4000)  # a direct read caches nothing: direct again
        assert sum(made) == 2 * got.size * 4
        assert np.array_equal(again, want[7:4000])


def _direct_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes of each direct read made from now on (0 for one left to a buffered read)."""
    made: list[int] = []
    original = ColdReads.read_direct

    def spy(self: ColdReads, offset: int, nbytes: int, into: Any = None) -> Any:
        got = original(self, offset, nbytes, into)
        made.append(0 if got is None else nbytes)
        return got

    monkeypatch.setattr(ColdReads, "read_direct", spy)
    return made


def cached_pages(path: Path) -> int:
    """Pages of the file ``path`` in the page cache (``mincore`` on a mapping never touched)."""
    libc = direct._c()
    assert libc is not None
    size = path.stat().st_size
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert base not in (None, ctypes.c_void_p(-1).value)
        try:
            vec = np.zeros(-(-size // mmap.PAGESIZE), dtype=np.uint8)
            assert libc.mincore(base, size, vec.ctypes.data) == 0
            return int((vec & 1).sum())
        finally:
            libc.munmap(base, size)
    finally:
        os.close(fd)


def _contents(path: Path) -> list[tuple[Path, bytes]]:
    return sorted((p.relative_to(path), p.read_bytes()) for p in _files(path))


def _files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]


def test_hdf5_objects_out_of_memory_hash_as_they_do_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``inflate`` checks the objects it copies before copying them: an input usually not in
    memory, read past the page cache."""
    if not _direct_works(tmp_path):
        pytest.skip("the file system of the test folder refuses O_DIRECT (tmpfs)")
    monkeypatch.setattr(direct, "MIN_DIRECT", ALIGN)
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    made = _direct_reads(monkeypatch)
    with h5py.File(src, "r") as f:
        warm = hash_objects(f, src, lambda name: False)
        assert not any(made)
        evict(src)
        cold = hash_objects(f, src, lambda name: False)
    assert sum(made) > 0
    assert cold == warm


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of 1 MiB (the test file is 3 MiB), in a set of their own."""
    monkeypatch.setattr(direct, "WINDOW", 1 << 20)
    monkeypatch.setattr(direct, "_windows", direct._Windows())


@pytest.mark.usefixtures("windows")
def test_reads_in_order_are_read_a_window_at_a_time(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's reads (each overlapping the last by a row, none a divisor of the window) are
    served from windows read whole, the next one read ahead: every byte read from the disk
    once, apart from the first read, made as asked."""
    whole = data.read_bytes()
    made = _direct_reads(monkeypatch)
    step, overlap = 300_001, 44
    with _opened(data) as (fd, reads):
        evict(data)
        offset, got = 0, []
        while offset < SIZE:
            nbytes = min(step, SIZE - offset)
            got.append((offset, read_exact(fd, offset, nbytes, str(data), reads)))
            offset += nbytes - overlap if offset + nbytes < SIZE else nbytes
    for offset, array in got:
        assert bytes(array) == whole[offset : offset + len(array)]
    assert made[0] == step  # the first read follows none
    assert len(made) <= 2 + -(-SIZE // direct.WINDOW)  # not one read per read asked (11)
    assert sum(made) <= SIZE + step  # nothing read twice but the first read


@pytest.mark.usefixtures("windows")
def test_windows_stop_at_the_end_of_the_data_they_are_read_for(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two datasets one after the other, each read in order to its end: no window of the first
    runs on into the second (which its own reads would read again), so every byte is read from
    the disk once, apart from each dataset's first read and a page where they meet."""
    whole = data.read_bytes()
    made = _direct_reads(monkeypatch)
    step, overlap, middle = 300_001, 44, (3 << 19) + 100
    with _opened(data) as (fd, reads):
        evict(data)
        for start, end in ((0, middle), (middle, SIZE)):
            offset = start
            while offset < end:
                nbytes = min(step, end - offset)
                got = read_exact(fd, offset, nbytes, str(data), reads, end)
                assert bytes(got) == whole[offset : offset + nbytes]
                offset += nbytes - overlap if offset + nbytes < end else nbytes
    assert sum(made) <= SIZE + 2 * step + ALIGN


@pytest.mark.usefixtures("windows")
def test_a_read_that_follows_none_is_made_as_asked(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _direct_reads(monkeypatch)
    with _opened(data) as (fd, reads):
        evict(data)
        for offset in (2 << 20, 0, 1 << 20, (1 << 20) - ALIGN):  # none starts in an earlier one
            read_exact(fd, offset, 1 << 18, str(data), reads)
    assert made == [1 << 18] * 4


def test_closing_takes_no_lock(data: Path) -> None:
    """A file's reads are closed when its leaf is collected, which may happen while this thread
    holds the windows' lock (a collection run inside a window lookup): closing must not wait
    for it."""
    fd = os.open(data, os.O_RDONLY)
    reads = ColdReads(fd)
    closed = threading.Event()

    def close_under_the_lock() -> None:
        with direct._windows.lock:
            reads.close()
            closed.set()

    worker = threading.Thread(target=close_under_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=10)
    os.close(fd)
    assert closed.is_set()


def test_raw_copies_of_an_input_out_of_memory_are_read_directly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The datasets copied whole are read past the page cache (the kernel's copy would read
    them through it, a few hundred KB at a time), and the output is the same file."""
    if not _direct_works(tmp_path):
        pytest.skip("the file system of the test folder refuses O_DIRECT (tmpfs)")
    rows = 200_000
    rng = np.random.default_rng(2)
    obs = rng.standard_normal((rows + 1, 11), dtype=np.float32)
    src = tmp_path / "in.hdf5"
    with h5py.File(src, "w") as f:
        f["observations"], f["next_observations"] = obs[:-1], obs[1:]
        f["actions"] = rng.standard_normal((rows, 3))  # float64, 4.8 MB: copied raw
        f["qpos"] = rng.standard_normal((rows, 6))
        f["rewards"] = rng.standard_normal(rows, dtype=np.float32)
        f["terminals"] = np.zeros(rows, dtype=bool)
        f["timeouts"] = np.arange(rows) % 1000 == 999
    compress(src, tmp_path / "warm.h5", codec="exact")
    jobs: list[int] = []
    original_copy = RawCopies._copy

    def copy_spy(self: RawCopies, fd: int, cold: ColdReads, s: int, d: int, n: int) -> None:
        jobs.append(n)
        original_copy(self, fd, cold, s, d, n)

    monkeypatch.setattr(RawCopies, "_copy", copy_spy)
    by_thread: list[tuple[str, int]] = []
    original = ColdReads.read_direct

    def spy(self: ColdReads, offset: int, nbytes: int, into: Any = None) -> Any:
        got = original(self, offset, nbytes, into)
        by_thread.append((threading.current_thread().name, 0 if got is None else nbytes))
        return got

    monkeypatch.setattr(ColdReads, "read_direct", spy)
    evict(src)
    compress(src, tmp_path / "cold.h5", codec="exact")
    assert sum(jobs) == rows * (3 + 6) * 8  # actions and qpos
    # Most of it: pages the kernel read ahead of HDF5's reads of the file's metadata are in
    # memory, and copied from there (the kernel's copy without this read none past the cache).
    assert sum(n for name, n in by_thread if name == "obsdelta-copy") >= sum(jobs) // 2
    assert (tmp_path / "cold.h5").read_bytes() == (tmp_path / "warm.h5").read_bytes()
    verify(tmp_path / "cold.h5")


def test_a_window_being_read_is_neither_taken_nor_read_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From the moment a read reserves a window until its bytes are in: another read cannot
    take it for other bytes (which would land in the same buffer), and one that wants its
    bytes waits for them."""
    monkeypatch.setattr(direct, "WINDOWS", 1)
    windows = direct._Windows()
    w = windows.take(1, 0, 4096)
    assert w is not None
    assert windows.take(2, 0, 4096) is None  # the only window is being read
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(windows.copy(1, 100, 10)), daemon=True)
    waiting.start()
    waiting.join(timeout=0.3)
    assert waiting.is_alive() and not got  # it waits for the bytes
    data = np.arange(4096, dtype=np.uint32).astype(np.uint8)
    windows.fill(w, lambda: data)
    waiting.join(timeout=10)
    assert got and bytes(got[0]) == bytes(data[100:110])
    assert windows.take(2, 0, 4096) is w  # read: free to be taken again


def test_verify_reads_the_observations_of_a_folder_out_of_memory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Observations not in memory are hashed from the reads that rebuild the next ones, past
    the page cache: not mapped (which would read them into the cache, and once more)."""
    if not _direct_works(tmp_path):
        pytest.skip("the file system of the test folder refuses O_DIRECT (tmpfs)")
    from tensordict import TensorDict

    rows = 200_000  # 13.6 MB of observations
    obs = np.random.default_rng(0).standard_normal((rows + 1, 17)).astype(np.float32)
    td = TensorDict({"observation": obs[:-1], "next": {"observation": obs[1:]}}, batch_size=[rows])
    td.memmap(tmp_path / "run")
    compress(tmp_path / "run", tmp_path / "small")
    observations = tmp_path / "small" / "observation.memmap"
    evict(observations)
    made = _direct_reads(monkeypatch)
    verify(tmp_path / "small")
    assert cached_pages(observations) == 0
    assert obs[:-1].nbytes <= sum(made) <= obs[:-1].nbytes + 2 * (8 << 20)


def test_a_reader_cut_short_while_made_closes_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM inside ``ColdReads.__init__`` left an object without its descriptor field,
    whose ``__del__`` printed an AttributeError traceback after the command's one line."""
    seen: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    with pytest.raises(OSError):
        ColdReads(-1)  # fails where a signal may land: after the first field is set
    gc.collect()
    assert seen == []
