"""Reads of possibly damaged HDF5 files in a forked child: a crash or an endless read there is
one error of damage, the caller's process goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import pytest

from obsdelta_cli import compress
from obsdelta_cli.errors import InputError
from obsdelta_cli.formats import apart as apart_module
from obsdelta_cli.formats import hdf5_meta, hdf5_objects, hdf5_safety
from obsdelta_cli.formats.apart import ChildFault, apart, beat, begin
from obsdelta_cli.formats.hdf5_leaves import META_ATTR
from obsdelta_cli.formats.hdf5_meta import read_meta

from .conftest import SAMPLE, Cli
from .test_cli_errors import expect_error


def _children() -> set[int]:
    """This process's child processes (zombies included)."""
    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry))
    return found


def test_the_value_comes_back_and_the_child_is_gone() -> None:
    before = _children()
    assert apart(lambda: {"a": [1, 2.5, "x"], "b": None}) == {"a": [1, 2.5, "x"], "b": None}
    assert _children() == before


def test_a_crash_is_damage_and_the_process_goes_on() -> None:
    """The child kills itself as HDF5's segmentation fault would."""
    with pytest.raises(ValueError, match="crashed on it: SIGSEGV"):
        apart(lambda: os.kill(os.getpid(), signal.SIGSEGV))
    assert apart(lambda: 1) == 1


def test_errors_of_damage_are_value_errors_and_a_fault_is_not() -> None:
    def damaged() -> None:
        raise OSError("Can't synchronously read data (global heap size is too small)")

    with pytest.raises(ValueError, match="global heap size is too small"):
        apart(damaged)
    with pytest.raises(ChildFault, match="ZeroDivisionError"):
        apart(lambda: 1 / 0)


def test_a_read_that_does_not_return_is_stopped_at_the_time_limit() -> None:
    before = _children()
    start = time.monotonic()
    with pytest.raises(ValueError, match="did not return from reading it in 1 s"):
        apart(lambda: time.sleep(60), timeout=1.0)
    assert time.monotonic() - start < 10
    assert _children() == before  # killed and reaped


def test_the_limit_is_on_silence_not_on_the_whole_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashing a large file takes as long as reading it: a child that says it is getting on
    is left to finish however long it takes."""
    monkeypatch.setattr(apart_module, "BEAT_SECONDS", 0.05)

    def long_read() -> str:
        for _ in range(25):
            beat()
            time.sleep(0.1)
        return "done"

    assert apart(long_read, timeout=1.0) == "done"
    beat()  # outside a child: nothing to tell


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_does_not_outlive_its_parent(tmp_path: Path) -> None:
    """A command killed outright (SIGKILL, or a pipeline's timeout) takes its child with it: a
    child left reading a damaged file forever kept a core busy."""
    mark = tmp_path / "child.pid"
    script = (
        "import os, time\n"
        "from obsdelta_cli.formats.apart import apart\n"
        f"apart(lambda: (open({str(mark)!r}, 'w').write(str(os.getpid())), time.sleep(600)))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while not (mark.exists() and mark.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(mark.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and waiting for init to reap it, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_from_a_thread_too() -> None:
    """A Dask worker runs commands in threads: the forking thread is the child's main one."""
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(apart, lambda: "done").result() == "done"


def _heap_damaged(path: Path) -> Path:
    """A file whose metadata attribute HDF5 reads forever: the header of the first object of
    the heap holding variable-length strings zeroed (as a zeroed page of a packed file did)."""
    with h5py.File(path, "w") as f:  # a compressed D4RL file's layout, to be recognised
        for name in ("observations", "actions", "rewards", "terminals", "timeouts"):
            f[name] = np.zeros((8, 3) if name in ("observations", "actions") else 8, np.float32)
        f.attrs[META_ATTR] = '{"format": "d4rl-hdf5", "pad": "' + "y" * 3000 + '"}'
    data = bytearray(path.read_bytes())
    heap = data.find(b"GCOL")
    assert heap > 0
    data[heap + 16 : heap + 32] = bytes(16)
    path.write_bytes(bytes(data))
    return path


def test_metadata_that_hdf5_reads_forever_is_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.setattr(hdf5_meta, "META_SECONDS", 1.0)
    path = _heap_damaged(tmp_path / "d.h5")
    with h5py.File(path, "r") as f, pytest.raises(InputError, match="did not return") as err:
        read_meta(f, path)
    assert "damaged" in (err.value.hint or "")
    # Detection and opening ask again: told at once, not after the time limit again.
    start = time.monotonic()
    expect_error(cli, "verify", path, says=[path, "did not return"])
    assert time.monotonic() - start < 0.9


def test_where_no_child_can_be_made_the_work_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork refused (memory or processes short, under strict overcommit) is not damage."""

    def refused() -> int:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(os, "fork", refused)
    assert apart(lambda: os.getpid()) == os.getpid()


def _heaps_zeroed(path: Path) -> None:
    """The header of the first object of every global heap zeroed (as a zeroed page does)."""
    data = bytearray(path.read_bytes())
    at = data.find(b"GCOL")
    assert at > 0  # robomimic's env_args is a variable-length string
    while at > 0:
        data[at + 16 : at + 32] = bytes(16)
        at = data.find(b"GCOL", at + 1)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("pack", [False, True], ids=["compressed", "packed"])
def test_a_zeroed_heap_is_damage_not_a_hang(
    pack: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    """obsdelta's metadata is a fixed-length string, out of the heap; what is left in it (a
    robomimic file's env_args, a packed file's virtual mappings) is read in a child that is
    stopped once silent too long: HDF5 looped there, and verify and inflate never ended."""
    for module in (hdf5_objects, hdf5_safety):
        monkeypatch.setattr(module, "SILENCE_SECONDS", 2.0)
    small = tmp_path / "small.hdf5"
    compress(SAMPLE / "hopper_robomimic.hdf5", small, codec="exact", pack=pack)
    with h5py.File(small, "r") as f:
        stored = f.attrs.get_id(META_ATTR).get_type()  # a string, or bytes in packed files
        assert not (stored.get_class() == h5py.h5t.STRING and stored.is_variable_str())
        assert read_meta(f, small) is not None
    _heaps_zeroed(small)
    with h5py.File(small, "r") as f:  # read at once, unharmed: not in the heap
        assert read_meta(f, small) is not None
    for args in (["verify", small], ["inflate", small, "-o", tmp_path / "back.hdf5"]):
        start = time.monotonic()
        expect_error(cli, *args, says=[small, "did not return from reading it in 2 s", "damaged"])
        assert time.monotonic() - start < 60


def test_work_begun_apart_runs_while_the_caller_goes_on(tmp_path: Path) -> None:
    """The child works before its result is asked for: the caller sees its mark first."""
    mark = tmp_path / "mark"

    def work() -> int:
        mark.write_text("started")
        return 7

    pending = begin(work)
    deadline = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mark.read_text() == "started"
    assert pending.result() == 7


def test_work_given_up_leaves_no_child() -> None:
    before = _children()
    begin(lambda: time.sleep(600)).cancel()
    assert _children() == before
    lost = begin(lambda: time.sleep(600))  # dropped without a word (an error in between)
    del lost
    assert _children() == before


def test_a_result_is_asked_for_once() -> None:
    pending = begin(lambda: 1)
    assert pending.result() == 1
    with pytest.raises(RuntimeError, match="once"):
        pending.result()
    pending.cancel()  # after the result: nothing to end


def test_damage_in_work_begun_apart_is_raised_when_asked() -> None:
    def damaged() -> None:
        raise OSError("bad object header")

    pending = begin(damaged)
    with pytest.raises(ValueError, match="bad object header"):
        pending.result()
