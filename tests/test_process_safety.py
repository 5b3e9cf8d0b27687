"""What happens around the writing of an output: files planted at the names obsdelta writes
beside it, a full disk, worker processes whose parent dies, inputs whose declared sizes are
hostile, and a file replaced while it is read."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from tensordict import TensorDictBase

from obsdelta_cli import commands, compress, open_dataset
from obsdelta_cli.atomic import atomic_output
from obsdelta_cli.errors import ObsdeltaError, OutputError
from obsdelta_cli.formats import hdf5_safety

from .conftest import SAMPLE, Cli, tree_hash
from .test_atomic import _tiny_tmpfs
from .test_cli_errors import assert_one_error_line
from .writers import WRITERS

D4RL = SAMPLE / "hopper_d4rl.hdf5"


def _debris(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".obsdelta-" in p.name)


# ---------------------------------------------------------------------------------------------
# Files planted at the lock and temporary names


def _lock(output: Path) -> Path:
    return output.parent / f".{output.name}.obsdelta-lock"


@pytest.fixture
def compressed(tmp_path: Path) -> Path:
    out = tmp_path / "small.hdf5"
    compress(D4RL, out, codec="fp16")
    return out


@pytest.mark.parametrize("force", [False, True], ids=["", "force"])
def test_a_lock_file_linked_to_another_file_is_refused(
    tmp_path: Path, cli: Cli, force: bool
) -> None:
    """``compress`` followed the link and wrote its PID over the file it points to."""
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's notes\n")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "out.hdf5"
    _lock(out).symlink_to(victim)
    args = ["compress", D4RL, "-o", out, "--quiet", *(["--force"] if force else [])]
    result = cli(*args, code=1)
    says = [out, "symbolic link", "delete"]
    assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=says)
    assert victim.read_text() == "someone's notes\n"
    assert _debris(folder) == [_lock(out).name] and _lock(out).is_symlink()  # left as it was
    assert not out.exists()


def test_a_dangling_lock_link_creates_nothing(tmp_path: Path, cli: Cli, compressed: Path) -> None:
    """``inflate`` created the file the link named, outside the output's folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "back.hdf5"
    _lock(out).symlink_to(elsewhere / "created")
    result = cli("inflate", compressed, "-o", out, "--quiet", code=1)
    assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=[out, "link"])
    assert list(elsewhere.iterdir()) == []
    assert not out.exists() and _debris(folder) == [_lock(out).name]


@pytest.mark.parametrize("what", ["hard link", "fifo"])
def test_a_lock_file_obsdelta_cannot_have_made_is_refused(
    tmp_path: Path, cli: Cli, what: str
) -> None:
    """Writing the PID into a hard link to another file would change that file; a pipe is no
    lock file either."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "out.hdf5"
    victim = folder / "victim.txt"
    if what == "hard link":
        victim.write_text("keep me\n")
        os.link(victim, _lock(out))
    else:
        os.mkfifo(_lock(out))
    result = cli("compress", D4RL, "-o", out, "--quiet", code=1)
    says = [out, "not a lock file obsdelta made"]
    assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=says)
    if what == "hard link":
        assert victim.read_text() == "keep me\n"
    assert not out.exists() and _debris(folder) == [_lock(out).name]


def test_a_link_at_the_name_of_an_output_set_aside_is_never_put_in_its_place(
    tmp_path: Path, cli: Cli
) -> None:
    """A ``-old-`` name is where an output is set aside while it is replaced; a link planted
    there became OUTPUT (pointing at any file), and the run then refused to replace it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "out.hdf5"
    (folder / ".out.hdf5.obsdelta-old-999999999").symlink_to(victim)
    before = tree_hash(D4RL)
    cli("compress", D4RL, "-o", out, "--quiet")
    assert out.is_file() and not out.is_symlink()
    assert _debris(folder) == [] and victim.read_text() == "keep me\n"
    assert tree_hash(D4RL) == before
    cli("verify", out, "--quiet")


def test_a_link_at_the_temporary_name_is_never_put_in_place(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out.hdf5"
    with (
        pytest.raises(OutputError, match="symbolic link took the place"),
        atomic_output(out, source=D4RL, force=False) as tmp,
    ):
        tmp.symlink_to(victim)
    assert not os.path.lexists(out) and _debris(tmp_path) == []
    assert victim.read_text() == "keep me\n"


# ---------------------------------------------------------------------------------------------
# A full disk


def _leave_free(disk: Path, free: int) -> None:
    """Fill ``disk`` with one file until ``free`` bytes are left."""
    have = shutil.disk_usage(disk).free
    with (disk / "filler").open("wb") as f:
        f.write(b"\0" * max(0, have - free))


def fill_sweep(cases: str) -> None:
    """Run in a process of its own (HDF5 may crash on a failed write: the test must see it):
    for each case (command, input, disk, free space amounts, options), the command of the
    input into the disk once for each amount of free space, the check of free space before
    writing switched off so that the disk fills at every point of the run. Prints per run the
    error (or ``ok``) and what the disk then holds."""
    from obsdelta_cli import atomic, commands
    from obsdelta_cli.errors import ObsdeltaError

    atomic.check_free_space = lambda *args, **kwargs: None
    runs = []
    for command, src, disk, frees, options in json.loads(cases):
        folder = Path(disk)
        for free in frees:
            _leave_free(folder, free)
            try:
                getattr(commands, command)(Path(src), folder / "out", **options)
                said = "ok"
            except ObsdeltaError as exc:
                said = str(exc)
            runs.append({"disk": disk, "said": said, "left": sorted(os.listdir(folder))})
            for path in folder.iterdir():
                atomic.remove_path(path)
    print(json.dumps(runs))


FULL_DISK = {
    "compress-d4rl": ("compress", "d4rl", {"codec": "fp16"}),
    "compress-memmap": ("compress", "ted-memmap", {}),
    "compress-pt": ("compress", "ted-pt", {"codec": "fp16"}),
    "compress-pack": ("compress", "ted-memmap", {"pack": True}),
    "inflate-d4rl": ("inflate", "d4rl", {}),
    "inflate-packed": ("inflate", "ted-memmap", {"pack": True}),
}


def _sweep(tmp_path: Path, hopper: TensorDictBase, fractions: list[float]) -> dict[str, int]:
    """Every ``FULL_DISK`` case, run with free space of each fraction of its output's size
    (in one process): every run that did not finish said one thing, and left the disk as it
    was. How many runs of each case did not finish."""
    cases = []
    with contextlib.ExitStack() as mounts:
        for case, (command, kind, options) in FULL_DISK.items():
            folder = tmp_path / case
            folder.mkdir()
            src = D4RL if kind == "d4rl" else WRITERS[kind](hopper, folder / "in")
            if command == "inflate":
                compress(src, folder / "compressed", **options)
                src, options = folder / "compressed", {}
            done = folder / "done"
            getattr(commands, command)(src, done, **options)
            files = [done] if done.is_file() else done.rglob("*")
            size = sum(p.stat().st_size for p in files if p.is_file())
            disk = mounts.enter_context(_tiny_tmpfs(folder / "disk", f"{size * 3 + (1 << 20)}"))
            frees = sorted({int(size * f) for f in fractions})
            cases.append((command, str(src), str(disk), frees, options))
        code = (
            f"from tests.test_process_safety import fill_sweep; fill_sweep({json.dumps(cases)!r})"
        )
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
        )
        assert run.returncode == 0, run.stderr
        runs: list[dict] = json.loads(run.stdout.splitlines()[-1])
    full = dict.fromkeys(FULL_DISK, 0)
    for r in runs:
        case = Path(r["disk"]).parent.name
        if r["said"] == "ok":
            assert r["left"] == ["filler", "out"], r
            continue
        full[case] += 1
        out = Path(r["disk"]) / "out"
        assert r["said"].startswith(f"no space left on device writing {out}"), r
        assert "or choose another output" in r["said"], r
        assert r["left"] == ["filler"], r
    return full


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path, hopper: TensorDictBase) -> None:
    """The disk fills while the working copy, the output or its metadata is written: one
    error saying how much to free, and the disk as it was. Before, HDF5's and torch's messages
    said "cannot write (unexpected pos 64 vs 0)", and a packed file's inflate ended in an
    ``OSError`` traceback."""
    assert _sweep(tmp_path, hopper, [0, 1 / 3, 2 / 3]) == dict.fromkeys(FULL_DISK, 3)


@pytest.mark.slow
def test_a_full_disk_at_any_point(tmp_path: Path, hopper: TensorDictBase) -> None:
    full = _sweep(tmp_path, hopper, [i / 16 for i in range(33)])
    assert min(full.values()) >= 10, full


def test_inflate_of_a_packed_folder_on_a_full_disk(tmp_path: Path, hopper: TensorDictBase) -> None:
    """The disk fills while the packed file is unpacked: the traceback of an ``OSError`` was
    57 lines long."""
    packed = tmp_path / "packed.h5"
    compress(WRITERS["ted-memmap"](hopper, tmp_path / "in"), packed, pack=True)
    with _tiny_tmpfs(tmp_path / "disk", "100k") as disk:
        out = disk / "back"
        run = subprocess.run(
            [sys.executable, "-m", "obsdelta_cli", "inflate", packed, "-o", out],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        says = [f"no space left on device writing {out}", "free ", "or choose another output"]
        assert_one_error_line(run.returncode, run.stdout, run.stderr, says=says)
        assert list(disk.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Hostile sizes declared in an HDF5 file


def _hollow_d4rl(path: Path, rows: int, chunked: bool) -> Path:
    """A D4RL file whose datasets declare ``rows`` rows, of which only the first 5,000 (or,
    contiguous, none) are written."""
    with h5py.File(path, "w") as f:
        for name, shape, dtype in [
            ("observations", (11,), "f4"),
            ("next_observations", (11,), "f4"),
            ("actions", (3,), "f4"),
            ("rewards", (), "f4"),
            ("terminals", (), "?"),
            ("timeouts", (), "?"),
        ]:
            chunks = (1024, *shape) if chunked else None
            d = f.create_dataset(name, shape=(rows, *shape), dtype=dtype, chunks=chunks)
            if chunked:
                d[:5000] = np.ones((5000, *shape), dtype)
    return path


@contextlib.contextmanager
def _within(seconds: int) -> Iterator[None]:
    """Fail the block if it runs longer than ``seconds`` (rather than wait for it for hours)."""

    def stop(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunks", "contiguous"])
def test_a_file_declaring_2_40_rows_is_refused_at_once(
    tmp_path: Path, cli: Cli, chunked: bool
) -> None:
    """830 KB on disk, 2**40 rows declared: ``report``, ``compress`` and ``compress --pack``
    read the fill values for hours."""
    src = _hollow_d4rl(tmp_path / "huge.hdf5", 2**40, chunked)
    before = tree_hash(src)
    for args in (
        ["report"],
        ["compress", "-o", tmp_path / "out"],
        ["compress", "--pack", "-o", tmp_path / "out.h5"],
    ):
        start = time.monotonic()
        with _within(30):
            result = cli(args[0], src, *args[1:], code=1)
        assert time.monotonic() - start < 5, args
        says = [src, "declares shape (1099511627776, ", "stored nowhere", "the file holds"]
        assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=says)
    assert tree_hash(src) == before and [p.name for p in tmp_path.iterdir()] == ["huge.hdf5"]
    with _within(30), pytest.raises(ObsdeltaError, match="stored nowhere"):
        open_dataset(src)[:]
    # Unwritten chunks within the bound are read as fill values, as HDF5 reads them.
    some = _hollow_d4rl(tmp_path / "some.hdf5", 20_000, True)
    cli("compress", some, "-o", tmp_path / "out.hdf5", "--quiet")
    data = open_dataset(tmp_path / "out.hdf5")
    assert len(data) == 20_000
    assert (data[19_999]["observation"] == 0).all() and (data[0]["observation"] == 1).all()


@pytest.mark.h5py_only
def test_many_attributes_on_one_dataset_take_linear_time(tmp_path: Path, cli: Cli) -> None:
    """5,000 attributes on one dataset: ``report`` took 47 s (each attribute opened by its
    index, which makes HDF5 list them all again); now the round trip keeps them all, in about
    the time h5py takes to read them a few times over."""
    src = tmp_path / "attrs.hdf5"
    shutil.copy(D4RL, src)
    with h5py.File(src, "a") as f:
        obs = f["observations"]
        for i in range(5000):
            obs.attrs.create(f"a{i:05d}", i)
    start = time.monotonic()
    with h5py.File(src) as f:
        wanted = dict(f["observations"].attrs)
    h5py_seconds = time.monotonic() - start
    with _within(300):
        cli("report", src)
        cli("compress", src, "-o", tmp_path / "small.hdf5", "--quiet")
        cli("inflate", tmp_path / "small.hdf5", "-o", tmp_path / "back.hdf5", "--quiet")
    with h5py.File(tmp_path / "back.hdf5") as f:
        assert dict(f["observations"].attrs) == wanted
    # The walk every HDF5 input gets first (see hdf5_safety), on the file as new.
    hdf5_safety._CONTAINED.clear()
    start = time.monotonic()
    with _within(300), h5py.File(src) as f:
        hdf5_safety.check_contained(f, src)
    took = time.monotonic() - start
    assert took < 2 * h5py_seconds + 0.5, (took, h5py_seconds)


def _with_many_attrs(path: Path, count: int) -> Path:
    """The D4RL sample with ``count`` attributes of several kinds on its observations, written
    as h5py writes a file of the newest format (in the oldest, h5py takes 800 s to write
    100,000 attributes and 150 s to read them)."""
    with h5py.File(D4RL) as src, h5py.File(path, "w", libver="latest") as f:
        for name, ds in src.items():
            if isinstance(ds, h5py.Dataset):
                f.create_dataset(name, data=ds[()])
        obs = f["observations"]
        kinds = (
            lambda i: i,  # an integer
            lambda i: np.arange(i % 7, dtype="f4"),  # float arrays, empty ones included
            lambda i: f"s{i}",  # a variable-length string
            lambda i: np.array([f"v{i}".encode()] * 2),  # fixed-length byte strings
        )
        for i in range(count):
            obs.attrs[f"a{i:06d}"] = kinds[i % len(kinds)](i)
    return path


@pytest.mark.h5py_only
def test_a_dataset_with_100_000_attributes_is_processed_in_linear_time(
    tmp_path: Path, cli: Cli
) -> None:
    """100,000 attributes on the observations of a valid file: ``compress`` ran past 20
    minutes (each attribute written to an output of HDF5's oldest format searches all those
    written before, and each was read three times over through h5py). Every command now keeps
    them all, each in a few times what h5py takes to read them once."""
    src = _with_many_attrs(tmp_path / "attrs.hdf5", 100_000)
    start = time.monotonic()
    with h5py.File(src) as f:
        wanted = {name: np.asarray(value) for name, value in f["observations"].attrs.items()}
    h5py_seconds = time.monotonic() - start
    small, back = tmp_path / "small.hdf5", tmp_path / "back.hdf5"
    took = {}
    for args in (
        ["report", src],
        ["compress", src, "-o", small, "--quiet"],
        ["verify", small],
        ["inflate", small, "-o", back, "--quiet"],
        ["compress", src, "--pack", "-o", tmp_path / "packed.h5", "--quiet"],
    ):
        start = time.monotonic()
        with _within(600):
            cli(*args)
        took[args[0] + ("-pack" if "--pack" in args else "")] = time.monotonic() - start
    for out in (back, tmp_path / "packed.h5"):
        with h5py.File(out) as f:
            got = f["observations"].attrs
            assert len(got) == len(wanted)
            for name, value in wanted.items():
                np.testing.assert_array_equal(np.asarray(got[name]), value, err_msg=name)
    # Each pass over the attributes (the safety walk, hashing, copying, checking) costs about
    # what h5py's read does; ``compress --pack`` makes the most of them.
    assert all(t < 5 * h5py_seconds + 10 for t in took.values()), (took, h5py_seconds)


def test_outputs_of_a_file_with_thousands_of_attributes_index_them(
    tmp_path: Path, cli: Cli
) -> None:
    """An object with more than ``DENSE_ATTRS`` attributes in a file of HDF5's oldest format:
    its outputs are written in the 1.8 format, where attributes are indexed by name, not
    listed (h5py writes 100,000 listed attributes in 800 s, indexed ones in 4 s)."""
    src = tmp_path / "attrs.hdf5"
    shutil.copy(D4RL, src)
    with h5py.File(src, "a") as f:
        for i in range(hdf5_safety.DENSE_ATTRS + 1):
            f["observations"].attrs[f"a{i:05d}"] = i
    cli("compress", src, "-o", tmp_path / "small.hdf5", "--quiet")
    cli("inflate", tmp_path / "small.hdf5", "-o", tmp_path / "back.hdf5", "--quiet")
    cli("compress", src, "--pack", "-o", tmp_path / "packed.h5", "--quiet")
    cli("inflate", tmp_path / "packed.h5", "-o", tmp_path / "unpacked.hdf5", "--quiet")
    for name in ("small.hdf5", "back.hdf5", "packed.h5", "unpacked.hdf5"):
        # The superblock's version: 0 in files of the oldest format, 2 from 1.8 on.
        assert (tmp_path / name).read_bytes()[8] >= 2, name
    with h5py.File(src) as a, h5py.File(tmp_path / "unpacked.hdf5") as b:
        assert dict(a["observations"].attrs) == dict(b["observations"].attrs)
    # A file with fewer keeps HDF5's oldest format.
    cli("compress", D4RL, "-o", tmp_path / "plain.hdf5", "--quiet")
    assert (tmp_path / "plain.hdf5").read_bytes()[8] == 0


# ---------------------------------------------------------------------------------------------
# Leaves of a dtype NumPy has no equivalent of


def test_a_float8_leaf_of_a_pt_file_is_refused_in_one_line(
    tmp_path: Path, cli: Cli, hopper: TensorDictBase
) -> None:
    """``torch.float8_e4m3fn`` has no NumPy dtype: ``compress`` ended in a TypeError
    traceback."""
    import torch

    td = hopper.clone()
    for key in ("observation", ("next", "observation")):
        td[key] = td[key].to(torch.float8_e4m3fn)
    src = tmp_path / "f8.pt"
    torch.save(td, src)
    before = tree_hash(src)
    for args in (["compress", src, "-o", tmp_path / "out.pt"], ["report", src]):
        result = cli(*args, code=1)
        says = [src, "key observation", "float8_e4m3fn", "float16"]
        assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=says)
    assert tree_hash(src) == before and [p.name for p in tmp_path.iterdir()] == ["f8.pt"]
