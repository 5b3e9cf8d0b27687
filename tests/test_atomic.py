"""Writing outputs: one writer per output, atomic replacement, what --force may replace, free
space, and write failures at any moment."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import atomic, compress, inflate, interrupts, verify
from obsdelta_cli.atomic import (
    atomic_output,
    clean_after_killed,
    clean_stale,
    output_lock,
    release_locks,
)
from obsdelta_cli.errors import OutputError
from obsdelta_cli.formats import hdf5_safety
from obsdelta_cli.formats.apart import ChildFault
from obsdelta_cli.formats.base import LeafSpec, Plan, Source
from obsdelta_cli.outputs import check_replaceable, estimate_output_bytes, replaceable_by

from .conftest import SAMPLE, tree_hash
from .test_cli_errors import assert_one_error_line
from .test_direct import cached_pages, evict
from .writers import WRITERS


def _debris(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".obsdelta-" in p.name)


def _cli(*args: str | Path, **kwargs) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "obsdelta_cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------
# Atomic replacement


def _write(tmp: Path, kind: str, text: str) -> None:
    if kind == "dir":
        tmp.mkdir()
        (tmp / "data").write_text(text)
    else:
        tmp.write_text(text)


def _read(path: Path) -> str:
    return (path / "data").read_text() if path.is_dir() else path.read_text()


@pytest.mark.parametrize("old", ["file", "dir"])
@pytest.mark.parametrize("new", ["file", "dir"])
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_replace_swaps_in_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, exchange: bool
) -> None:
    if not exchange:
        monkeypatch.setattr(atomic, "_renameat2", lambda *a: False)
    out = tmp_path / "out"
    _write(out, old, "old")
    with atomic_output(out, source=tmp_path / "in", force=True) as tmp:
        _write(tmp, new, "new")
        assert _read(out) == "old"
        assert _debris(tmp_path) == [".out.obsdelta-lock", f".out.obsdelta-tmp-{os.getpid()}"]
    assert _read(out) == "new" and out.is_dir() == (new == "dir")
    assert _debris(tmp_path) == []


def test_renameat2_exchange_is_available_here(tmp_path: Path) -> None:
    """The one-step swap is what runs on this system, not the fallback."""
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").mkdir()
    assert atomic._renameat2(tmp_path / "a", tmp_path / "b", atomic._RENAME_EXCHANGE)
    assert (tmp_path / "a").is_dir() and (tmp_path / "b").read_text() == "a"


def test_crash_between_the_fallback_renames_is_repaired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without renameat2, a crash after moving OUTPUT aside leaves it as ``-old-PID``; the next
    run puts it back before anything else."""
    monkeypatch.setattr(atomic, "_renameat2", lambda *a: False)
    out = tmp_path / "out"
    out.write_text("old")
    rename = os.rename
    calls = []

    def crash_after_first(src: str | Path, dst: str | Path) -> None:
        calls.append(dst)
        rename(src, dst)
        if len(calls) == 1:
            raise SystemExit("killed")

    monkeypatch.setattr(os, "rename", crash_after_first)
    with pytest.raises(SystemExit), atomic_output(out, source=tmp_path / "in", force=True) as tmp:
        tmp.write_text("new")
    monkeypatch.setattr(os, "rename", rename)
    assert not out.exists() and _debris(tmp_path) == [f".out.obsdelta-old-{os.getpid()}"]
    clean_stale(out, locked=True)
    assert out.read_text() == "old" and _debris(tmp_path) == []


def test_stale_debris_of_any_pid_is_removed_under_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("current")
    for name in (".out.obsdelta-tmp-1", ".out.obsdelta-old-2", f".out.obsdelta-tmp-{os.getpid()}"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x").write_text("debris")
    (tmp_path / ".out.obsdelta-lock").write_text("999999\n")  # a killed run's lock
    (tmp_path / ".other.obsdelta-tmp-1").write_text("another output's")
    with atomic_output(out, source=tmp_path / "in", force=True) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "new"
    assert _debris(tmp_path) == [".other.obsdelta-tmp-1"]


# ---------------------------------------------------------------------------------------------
# One writer per output


def test_second_writer_without_force_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "small.hdf5"
    with atomic_output(out, source=SAMPLE / "x", force=False) as tmp:
        tmp.write_text("first run, still writing")
        run = _cli("compress", SAMPLE / "hopper_d4rl.hdf5", "-o", out)
        stdout, stderr = run.communicate(timeout=120)
        says = [out, f"another obsdelta run (pid {os.getpid()}) is writing this output"]
        assert_one_error_line(run.returncode, stdout, stderr, says=says)
    assert out.read_text() == "first run, still writing"
    assert _debris(tmp_path) == []


def test_second_writer_with_force_waits(tmp_path: Path) -> None:
    """With --force the second run waits for the first to finish, then replaces its output:
    the two never write at the same time."""
    out = tmp_path / "small.hdf5"
    first = tmp_path / "first" / "small.hdf5"
    first.parent.mkdir()
    compress(SAMPLE / "hopper_d4rl.hdf5", first)  # what a first run writes: --force may replace it
    with atomic_output(out, source=SAMPLE / "x", force=True) as tmp:
        shutil.copyfile(first, tmp)
        run = _cli("compress", SAMPLE / "hopper_d4rl.hdf5", "-o", out, "--force", "--quiet")
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.wait(timeout=8)  # long enough to import, open the input and reach the lock
        assert run.poll() is None, run.communicate()
        assert _debris(tmp_path) == [".small.hdf5.obsdelta-lock", tmp.name]
    assert out.read_bytes() == first.read_bytes()
    stdout, stderr = run.communicate(timeout=120)
    assert (run.returncode, stdout, stderr) == (0, "", "")
    verify(out)
    assert _debris(tmp_path) == []


def test_lock_file_is_the_one_at_the_path(tmp_path: Path) -> None:
    """A waiter that opened the lock file before its holder removed it must not count as
    holding the lock: it retries on the file now at the path."""
    out = tmp_path / "out"
    holding = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        with output_lock(out, wait=True):
            holding.set()
            release.wait(10)
            order.append("first out")

    def later(name: str) -> None:
        with output_lock(out, wait=True):
            order.append(f"{name} in")
            time.sleep(0.2)
            order.append(f"{name} out")

    t1 = threading.Thread(target=first)
    t1.start()
    holding.wait(10)
    waiters = [threading.Thread(target=later, args=(n,)) for n in ("b", "c")]
    for t in waiters:
        t.start()
    time.sleep(0.3)  # both waiters have opened the lock file and block on it
    release.set()
    for t in [t1, *waiters]:
        t.join(20)
    assert order[0] == "first out"
    # Never two holders at once: every "in" is followed by its own "out".
    for i in range(1, len(order), 2):
        assert order[i].endswith(" in") and order[i + 1] == order[i].replace(" in", " out")
    assert _debris(tmp_path) == []


def _interrupt_first_flock(monkeypatch: pytest.MonkeyPatch, after: bool) -> None:
    """The first ``flock`` is cut short by a signal: before it locks, or just after."""
    real, calls = fcntl.flock, []

    def flock(fd: int, operation: int) -> None:
        calls.append(operation)
        if len(calls) > 1:
            return real(fd, operation)
        if after:
            real(fd, operation)
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.fcntl, "flock", flock)


@pytest.mark.parametrize("after", [False, True], ids=["before-locking", "after-locking"])
@pytest.mark.parametrize("wait", [False, True])
def test_a_signal_while_taking_the_lock_leaves_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: bool, wait: bool
) -> None:
    # A batch stopped by Ctrl-C just as a worker starts its next input (when the outputs
    # finished so far appear, which is when people press it) left the lock file behind.
    _interrupt_first_flock(monkeypatch, after)
    with pytest.raises(KeyboardInterrupt), output_lock(tmp_path / "out", wait=wait):
        pytest.fail("the lock was taken")
    assert _debris(tmp_path) == []


def test_a_signal_while_waiting_for_the_lock_leaves_the_holders_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    with output_lock(out, wait=False):
        lock = tmp_path / _debris(tmp_path)[0]
        held = lock.stat().st_ino
        _interrupt_first_flock(monkeypatch, after=False)  # Ctrl-C while waiting
        with pytest.raises(KeyboardInterrupt), output_lock(out, wait=True):
            pytest.fail("the lock was taken twice")
        assert lock.stat().st_ino == held  # still there, and still the holder's
        monkeypatch.undo()
        with pytest.raises(OutputError, match="another obsdelta run"), output_lock(out, wait=False):
            pytest.fail("the lock was taken twice")
    assert _debris(tmp_path) == []


def test_a_signal_while_letting_go_of_the_lock_leaves_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch stopped by SIGTERM just as a worker finished an output: the signal landed while
    # the lock was let go of, after the lock had been forgotten and before its file was removed.
    real, calls = atomic._at, []

    def at(path: Path, fd: int) -> bool:
        calls.append(path)
        if len(calls) == 2:  # the first is taking the lock, the second letting go of it
            raise interrupts.Terminated
        return real(path, fd)

    monkeypatch.setattr(atomic, "_at", at)
    with pytest.raises(interrupts.Terminated), output_lock(tmp_path / "out", wait=False):
        pass
    release_locks()  # what a stopped worker, or the command, does on its way out
    assert _debris(tmp_path) == []
    assert atomic._HELD == {}


def _race(tmp_path: Path, trial: int, force: bool) -> list[tuple[int, str, str]]:
    out = tmp_path / f"race{trial}.hdf5"
    extra = ["--force"] if force else []
    runs = [
        _cli("compress", SAMPLE / "hopper_d4rl.hdf5", "-o", out, "--quiet", *extra)
        for _ in range(2)
    ]
    results = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=120)
        results.append((run.returncode, stdout, stderr))
    return results


def test_two_writers_race_exactly_one_wins(tmp_path: Path) -> None:
    """10 races of two runs started together on one output, without --force."""
    outcomes = {"first-refused-while-writing": 0, "then-exists": 0}
    for trial in range(10):
        results = _race(tmp_path, trial, force=False)
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 1], results
        _, stdout, stderr = next(r for r in results if r[0] == 1)
        line = assert_one_error_line(1, stdout, stderr)
        assert "is writing this output" in line or "already exists" in line, line
        outcomes["first-refused-while-writing" if "writing" in line else "then-exists"] += 1
        verify(tmp_path / f"race{trial}.hdf5")
    print(f"races without --force: {outcomes}")
    assert _debris(tmp_path) == []


def test_two_writers_with_force_both_finish(tmp_path: Path) -> None:
    for trial in range(2):
        results = _race(tmp_path, trial, force=True)
        assert [r[0] for r in results] == [0, 0], results
        verify(tmp_path / f"race{trial}.hdf5")
    assert _debris(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# SIGKILL during --force replacement


def _big_input(tmp_path: Path, hopper: TensorDictBase, tiles: int) -> Path:
    torch.cat([hopper] * tiles).memmap(tmp_path / "big")
    return tmp_path / "big"


def _wait_for_lock(proc: subprocess.Popen[str], out: Path) -> float:
    """Block until ``proc`` holds the lock of ``out`` (the lock file holds its PID)."""
    lock = out.parent / f".{out.name}.obsdelta-lock"
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if lock.read_text().strip() == str(proc.pid):
                break
        time.sleep(0.002)
    return time.monotonic()


def _kill_during_replacement(tmp_path: Path, hopper: TensorDictBase, trials: int) -> None:
    src = _big_input(tmp_path, hopper, 120)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    compress(src, out, codec="fp16")
    old_hash = tree_hash(out)
    args = ("compress", src, "-o", out, "--force", "--codec", "exact", "--quiet")
    timing = _cli(*args)
    began = _wait_for_lock(timing, out)
    while _debris(work) and timing.poll() is None:
        time.sleep(0.002)
    window = time.monotonic() - began  # holding the lock: write, verify, swap, clean up
    assert timing.communicate(timeout=300)[1] == ""
    new_hash = tree_hash(out)
    assert new_hash != old_hash
    rng = random.Random(20261123)
    seen = {"old": 0, "new": 0, "left debris": 0}
    for trial in range(trials):
        if trial % 2 == 0:  # put the old one back, so that there is something to replace
            shutil.rmtree(out)
            compress(src, out, codec="fp16")
        proc = _cli(*args)
        _wait_for_lock(proc, out)
        # Spread over the window: trial i dies in the i-th slice of it, at a random point.
        time.sleep((trial + rng.random()) / trials * 1.1 * window)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        seen["left debris"] += bool(_debris(work))
        assert out.is_dir(), f"trial {trial}: OUTPUT missing"
        h = tree_hash(out)
        assert h in (old_hash, new_hash), f"trial {trial}: OUTPUT is neither old nor new"
        verify(out)
        seen["old" if h == old_hash else "new"] += 1
    print(f"SIGKILL during --force replacement, {trials} runs over {window:.2f} s: {seen}")
    assert seen["old"] > 0 and seen["left debris"] > 0
    done = _cli(*args)
    assert done.communicate(timeout=300) == ("", "") and done.returncode == 0
    assert tree_hash(out) == new_hash
    assert _debris(work) == [], "the next run removes what killed runs left"


def test_sigkill_during_force_replacement(tmp_path: Path, hopper: TensorDictBase) -> None:
    _kill_during_replacement(tmp_path, hopper, trials=5)


@pytest.mark.slow
def test_sigkill_during_force_replacement_many(tmp_path: Path, hopper: TensorDictBase) -> None:
    _kill_during_replacement(tmp_path, hopper, trials=40)


# ---------------------------------------------------------------------------------------------
# What --force may replace


@contextlib.contextmanager
def _refused(target: Path, says: str) -> Iterator[None]:
    before = tree_hash(target) if target.exists() else None
    with pytest.raises(OutputError, match=says):
        yield
    assert (tree_hash(target) if target.exists() else None) == before
    assert _debris(target.parent) == []


def _replace(target: Path, kind: str) -> None:
    with atomic_output(
        target, source=target.parent / "in", force=True, replaceable=replaceable_by(kind)
    ) as tmp:
        tmp.mkdir()
        (tmp / "new").write_text("new")
    assert (target / "new").read_text() == "new"
    assert _debris(target.parent) == []


@pytest.mark.parametrize("fmt", ["ted-memmap", "ted-pt", "torchrl-rb", "ted-hdf5"])
def test_force_replaces_an_earlier_output(tmp_path: Path, hopper: TensorDictBase, fmt: str) -> None:
    plain = WRITERS[fmt](hopper[:200], tmp_path / "plain")
    small = tmp_path / ("small" + plain.suffix)
    compress(plain, small, codec="fp16")
    back = tmp_path / ("back" + plain.suffix)
    inflate(small, back)
    _replace(small, fmt)  # an earlier compress
    _replace(back, fmt)  # an earlier inflate: a dataset of the output's own format
    _replace(plain, fmt)


def test_force_replaces_obsdelta_outputs_of_another_format(tmp_path: Path) -> None:
    small = tmp_path / "small.hdf5"
    compress(SAMPLE / "hopper_d4rl.hdf5", small, codec="fp16")
    _replace(small, "ted-memmap")


@pytest.mark.parametrize(
    "what", ["text-file", "folder", "home", "other-format", "damaged-hdf5", "symlink", "hostile"]
)
def test_force_refuses_what_obsdelta_did_not_write(tmp_path: Path, what: str) -> None:
    target = tmp_path / "target"
    kind = "ted-memmap"
    says = "neither an obsdelta output nor a dataset obsdelta reads"
    if what == "text-file":
        target.write_text("not ours to delete")
    elif what == "folder":
        target.mkdir()
        (target / "keep.txt").write_text("not ours")
    elif what == "home":
        for name in (".bashrc", "notes/todo.txt", "code/meta.json.bak", "data/run.pt"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_text("mine")
    elif what == "other-format":
        shutil.copy(SAMPLE / "hopper_d4rl.hdf5", target)
        says = "a d4rl-hdf5 dataset, not ted-memmap, and not an obsdelta output"
    elif what == "damaged-hdf5":
        target.write_bytes((SAMPLE / "hopper_d4rl.hdf5").read_bytes()[:5000])
        kind = "d4rl-hdf5"
    elif what == "symlink":
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
        says = "a symbolic link"
    else:  # a .pt that would run code if unpickled: checked, never run
        marker = tmp_path / "MARKER"
        from .test_hostile import _hostile_pt

        _hostile_pt("object", tmp_path, marker).rename(target)
        kind = "d4rl-hdf5"  # another kind: the check has to open it to look for metadata
    with (
        _refused(target, says),
        atomic_output(
            target, source=tmp_path / "in", force=True, replaceable=replaceable_by(kind)
        ) as tmp,
    ):
        tmp.write_text("never put in place")
    if what == "hostile":
        assert not (tmp_path / "MARKER").exists()
    check_replaceable(tmp_path / "missing", kind)  # nothing there: nothing to refuse


def test_replaceable_callable_and_default(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("x")

    def never(path: Path) -> None:
        raise OutputError("not this one", file=path)

    with (
        _refused(target, "not this one"),
        atomic_output(target, source=tmp_path / "in", force=True, replaceable=never) as tmp,
    ):
        tmp.write_text("y")
    with atomic_output(target, source=tmp_path / "in", force=True) as tmp:
        tmp.write_text("y")  # without `replaceable`, --force replaces anything, as before
    assert target.read_text() == "y"


# ---------------------------------------------------------------------------------------------
# Free space and write failures


def test_not_enough_free_space_is_refused_before_writing(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    out = tmp_path / "out"
    with (
        pytest.raises(OutputError, match=r"not enough free space: the output needs about .* free"),
        atomic_output(out, source=tmp_path / "in", force=False, expected_bytes=free + 2**30) as t,
    ):
        t.write_text("never")
    assert list(tmp_path.iterdir()) == []
    with atomic_output(out, source=tmp_path / "in", force=False, expected_bytes=1000) as tmp:
        tmp.write_text("fits")
    assert out.read_text() == "fits"


def test_estimate_output_bytes(tmp_path: Path) -> None:
    (tmp_path / "in.bin").write_bytes(b"x" * 10_000)
    leaves = {("a",): np.zeros((100, 4), np.float32), ("b",): np.zeros((100, 4), np.float32)}
    source = Source(tmp_path / "in.bin", leaves, 1, None)  # 1600 bytes a leaf
    plan = Plan(order=[("a",), ("c",)], new={("c",): LeafSpec((100, 4), np.dtype(np.float16))})
    assert estimate_output_bytes(source, plan) == int((10_000 - 1600 + 800) * 1.05) + 2**20


def _limit(nbytes: int):
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill, as a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return limit


H5_WRITES = {
    "d4rl-compress": ("compress", "hopper_d4rl.hdf5", ["--codec", "fp16"]),
    "robomimic-compress": ("compress", "hopper_robomimic.hdf5", ["--h5-compression", "gzip"]),
    "d4rl-inflate": ("inflate", "small_d4rl.hdf5", []),
}


@pytest.mark.h5py_only
@pytest.mark.parametrize("case", list(H5_WRITES))
def test_hdf5_write_fails_at_any_point(tmp_path: Path, case: str) -> None:
    """The file-size limit hits while creating the file, copying objects, writing rows,
    writing the metadata and closing: always exit 1, one line, nothing left, no crash."""
    command, name, extra = H5_WRITES[case]
    src = SAMPLE / name
    if name == "small_d4rl.hdf5":
        src = tmp_path / name
        compress(SAMPLE / "hopper_d4rl.hdf5", src, codec="fp16")
    before = tree_hash(src)
    full = tmp_path / "full.hdf5"
    ok = _cli(command, src, "-o", full, "--quiet", *extra)
    assert ok.communicate(timeout=120) == ("", "") and ok.returncode == 0
    size = full.stat().st_size
    limits = [0, size // 10, size // 2, size - 1]
    runs = []
    for i, nbytes in enumerate(limits):
        folder = tmp_path / f"limit{i}"
        folder.mkdir()
        runs.append(
            (
                folder,
                _cli(command, src, "-o", folder / "out.hdf5", *extra, preexec_fn=_limit(nbytes)),
            )
        )
    for folder, run in runs:
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 1, (folder, run.returncode, stderr)  # not -11 (SIGSEGV)
        says = [folder / "out.hdf5", "cannot write", "free space"]
        line = assert_one_error_line(run.returncode, stdout, stderr, says=says)
        assert ".obsdelta-tmp-" not in line, line
        assert list(folder.iterdir()) == [], folder
    assert tree_hash(src) == before


@contextlib.contextmanager
def _tiny_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("fmt", ["d4rl-hdf5", "ted-memmap", "ted-pt"])
def test_real_full_disk(tmp_path: Path, hopper: TensorDictBase, fmt: str) -> None:
    """ENOSPC from a file system that is really full (a 256 KB tmpfs), not just a limit."""
    if fmt == "d4rl-hdf5":
        src = SAMPLE / "hopper_d4rl.hdf5"
    else:
        src = WRITERS[fmt](hopper, tmp_path / "in")
    with _tiny_tmpfs(tmp_path / "disk", "256k") as disk:
        (disk / "filler").write_bytes(b"\0" * 100_000)
        out = disk / ("out" + src.suffix)
        run = _cli("compress", src, "-o", out, "--codec", "fp16")
        stdout, stderr = run.communicate(timeout=120)
        says = [out, "free space"]  # "cannot write ...; check free space", or refused before
        assert_one_error_line(run.returncode, stdout, stderr, says=says)
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]


def test_free_space_check_on_a_small_disk(tmp_path: Path) -> None:
    with _tiny_tmpfs(tmp_path / "disk", "256k") as disk:
        out = disk / "out"
        with (
            pytest.raises(OutputError, match=r"needs about 1.0 MB, 25\d\.\d KB is free"),
            atomic_output(out, source=tmp_path / "in", force=False, expected_bytes=2**20) as tmp,
        ):
            tmp.write_text("never")
        assert list(disk.iterdir()) == []


def test_write_back_starts_every_file_of_an_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    (out / "next" / "delta").mkdir(parents=True)
    names = ["meta.json", "next/delta/obs.memmap", "obs.memmap"]
    for name in names:
        (out / name).write_bytes(os.urandom(4096))
    seen: list[str] = []
    monkeypatch.setattr(
        atomic, "_start_writeback", lambda fd: seen.append(os.readlink(f"/proc/self/fd/{fd}"))
    )
    atomic.write_back(out).join()
    assert sorted(seen) == sorted(str(out / n) for n in names)
    seen.clear()
    atomic.write_back(out / "obs.memmap").join()
    assert seen == [str(out / "obs.memmap")]
    seen.clear()
    with atomic.scratch_folder(tmp_path):  # a working copy: never written to disk
        atomic.write_back(out).join()
    assert seen == []


def test_scratch_outputs_are_put_in_place_without_flushing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--pack``'s working copy is read back at once and deleted: it is never flushed; an
    output outside the scratch folder still is, before and after."""
    flushed: list[Path] = []
    monkeypatch.setattr(atomic, "_fsync_tree", flushed.append)
    work = tmp_path / "work"
    work.mkdir()
    with atomic.scratch_folder(work):
        assert atomic.in_scratch(work / "inner")
        with atomic_output(work / "inner", source=tmp_path / "in", force=False) as tmp:
            tmp.write_text("inner")
        with atomic_output(tmp_path / "out", source=tmp_path / "in", force=False) as tmp:
            tmp.write_text("out")
    assert not atomic.in_scratch(work / "inner")
    assert (work / "inner").read_text() == "inner" and (tmp_path / "out").read_text() == "out"
    assert [p.name for p in flushed] == [".out.obsdelta-tmp-" + str(os.getpid())]


def test_what_a_killed_run_left_is_removed_unless_another_run_writes_the_output(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.h5"
    lock, tmp = tmp_path / ".out.h5.obsdelta-lock", tmp_path / ".out.h5.obsdelta-tmp-1"
    with output_lock(out, wait=False):  # another run, writing now
        tmp.write_bytes(b"partial")
        clean_after_killed(out)
        assert lock.exists() and tmp.exists()
    lock.write_bytes(b"999999\n")  # a killed run's lock file, held by no one
    clean_after_killed(out)
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise and mincore")
@pytest.mark.parametrize("name", ["hopper_ted", "hopper_d4rl.hdf5", "pong_pixels.pt"])
def test_outputs_leave_the_page_cache_once_on_disk_and_inputs_stay(
    tmp_path: Path, name: str
) -> None:
    """Each file of a flushed output is dropped from the page cache (its pages go to the next
    output); the input's pages are left where they were, and a working copy is not dropped."""
    src = tmp_path / name
    (shutil.copytree if (SAMPLE / name).is_dir() else shutil.copy)(SAMPLE / name, src)
    probe = tmp_path / "probe"
    probe.write_bytes(bytes(1 << 16))
    evict(probe)
    if cached_pages(probe):
        pytest.skip("this file system keeps its files in memory (tmpfs): nothing is dropped")
    inputs = [p for p in ([src] if src.is_file() else src.rglob("*")) if p.is_file()]
    for p in inputs:
        p.read_bytes()  # cached, as a file just written or read is
    cached = {p: cached_pages(p) for p in inputs}
    assert sum(cached.values()) > 0
    out = tmp_path / "small"
    compress(src, out)
    files = [p for p in ([out] if out.is_file() else out.rglob("*")) if p.is_file()]
    assert files and sum(p.stat().st_size for p in files) > 64 << 10
    assert {p.name: cached_pages(p) for p in files} == {p.name: 0 for p in files}
    assert {p: cached_pages(p) for p in inputs} == cached
    work = tmp_path / "work"
    work.mkdir()
    with atomic.scratch_folder(work):
        compress(src, work / "inner")
    inner = [p for p in (work / "inner").rglob("*") if p.is_file()] or [work / "inner"]
    assert sum(cached_pages(p) for p in inner) > 0
    verify(out)


def test_force_knows_an_hdf5_output_by_its_metadata_without_a_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier compressed or packed HDF5 output is known by its root attribute: its
    objects (thousands in a file of many episodes) are not walked as an input's are. A file
    without the attribute still is."""
    small, packed = tmp_path / "small.hdf5", tmp_path / "packed.hdf5"
    compress(SAMPLE / "hopper_robomimic.hdf5", small, codec="exact")
    compress(SAMPLE / "hopper_robomimic.hdf5", packed, codec="exact", pack=True)
    copies = [shutil.copy(p, tmp_path / f"copy-{p.name}") for p in (small, packed)]
    plain = Path(shutil.copy(SAMPLE / "hopper_d4rl.hdf5", tmp_path / "plain.hdf5"))

    def no_walk(*_: object) -> None:
        raise AssertionError("walked")

    monkeypatch.setattr(hdf5_safety, "_refusal", no_walk)
    for copy in copies:  # new files: nothing found out about them before
        check_replaceable(Path(copy), "ted-memmap")
    with pytest.raises(ChildFault, match="walked"):
        check_replaceable(plain, "ted-memmap")
