"""Files of thousands of episodes: every command opens each HDF5 object a bounded number of
times, so its cost follows the objects once, not once per step of the command.

h5py's ``h5o.open``, ``h5d.open`` and ``h5g.open`` are counted in this process and in the
children obsdelta forks to read a file apart (each open appends a byte to one file, which
forked children share)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from obsdelta_cli import compress, inflate, report, verify
from obsdelta_cli.inputs import open_input

#: robomimic files written by h5py: see the ``h5py_only`` marker.
pytestmark = pytest.mark.h5py_only

DEMOS = 2_000


def write_many_demos(
    path: Path, demos: int = DEMOS, seed: int = 0, chunks: bool | None = None
) -> Path:
    """robomimic's layout (``data/demo_i`` with ``obs``/``next_obs`` groups, ``actions``,
    ``rewards``, ``dones``, ``states``, ``mask/*``), 5-12 steps a demo of random walks that
    never repeat: 2,000 demos make about 26,000 objects. ``chunks=True``: each dataset chunked
    (as a file written episode by episode is, Minari's), which packing repacks."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for i in range(demos):
            n = int(rng.integers(5, 13))
            demo = data.create_group(f"demo_{i}")
            demo.attrs["num_samples"] = n
            walk = np.cumsum(rng.normal(size=(n + 1, 9)), axis=0)
            demo.create_dataset("states", data=walk[:n, :4], chunks=chunks)
            demo.create_dataset("actions", data=rng.uniform(-1, 1, (n, 3)), chunks=chunks)
            demo.create_dataset("rewards", data=rng.normal(size=n), chunks=chunks)
            demo.create_dataset("dones", data=np.arange(n) == n - 1, chunks=chunks)
            for k, cols in (("qpos", slice(0, 5)), ("qvel", slice(5, 9))):
                demo.create_dataset(f"obs/{k}", data=walk[:n, cols], chunks=chunks)
                demo.create_dataset(f"next_obs/{k}", data=walk[1:, cols], chunks=chunks)
        names = np.array([f"demo_{i}".encode() for i in range(demos)], dtype="S")
        f.create_dataset("mask/train", data=names)
    return path


def objects_in(path: Path) -> int:
    found: list[bytes] = []
    with h5py.File(path, "r") as f:
        h5py.h5o.visit(f.id, found.append)
    return len(found)


@pytest.fixture
def count_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], int]]:
    """The number of HDF5 objects opened since the fixture began, forked children included."""
    tally = tmp_path / "opens"
    fd = os.open(tally, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def counted(module: Any, name: str) -> None:
        real = getattr(module, name)

        def opener(*args: Any, **kwargs: Any) -> Any:
            os.write(fd, b".")
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, opener)

    counted(h5py.h5o, "open")
    counted(h5py.h5d, "open")
    counted(h5py.h5g, "open")
    start = os.lseek(fd, 0, os.SEEK_END)

    def opened() -> int:
        nonlocal start
        end = os.lseek(fd, 0, os.SEEK_END)
        count, start = end - start, end
        return count

    yield opened
    os.close(fd)


def test_each_command_opens_each_object_a_bounded_number_of_times(
    tmp_path: Path, count_opens: Callable[[], int]
) -> None:
    src = write_many_demos(tmp_path / "demos.hdf5")
    objects = objects_in(src)
    assert objects > 20_000
    count_opens()
    small = tmp_path / "small.hdf5"
    steps: dict[str, Callable[[], object]] = {
        "compress": lambda: compress(src, small),
        "verify": lambda: verify(small),
        "report": lambda: report(src),
        "inflate": lambda: inflate(small, tmp_path / "back.hdf5"),
        "compress --pack": lambda: compress(src, tmp_path / "packed.hdf5", pack=True),
        "verify packed": lambda: verify(tmp_path / "packed.hdf5"),
        "inflate packed": lambda: inflate(tmp_path / "packed.hdf5", tmp_path / "unpacked.hdf5"),
    }
    per_object = {}
    for name, step in steps.items():
        step()
        per_object[name] = count_opens() / objects
    print({k: round(v, 2) for k, v in per_object.items()})
    # Each pass that needs an object (safety walk, leaves, hash, the output's own check) may
    # open it once; ``--pack`` also packs the compressed file in a second pass, and the
    # inflate of a packed file unpacks it before it inflates. The copy opens no small numeric
    # dataset again, nor does report to measure a key's pairs. A pass that opened objects per
    # key, per demo or per row would be far above these.
    bounds = {
        "compress": 5,
        "verify": 2,
        "report": 1.5,
        "inflate": 2.5,
        "compress --pack": 7,
        "verify packed": 2.5,
        "inflate packed": 6,
    }
    assert all(per_object[name] <= bounds[name] for name in steps), per_object


def _open_datasets() -> int:
    """Datasets open in this process, in every file."""
    return int(h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_DATASET))


def test_objects_held_open_at_once_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HDF5 holds about 11 KB for each open object: hashing an output's leaves and repacking a
    file's datasets hold a bounded number open (at most the :data:`~.hdf5_walk.HELD` of the
    input's walk, and a few more), not one per dataset of the file. Before, a packed Minari
    file of 2,500 episodes peaked at 825 MB."""
    from obsdelta_cli.formats import hdf5_walk, pack_columns, pack_io

    compress_module = importlib.import_module("obsdelta_cli.commands.compress")

    monkeypatch.setattr(hdf5_walk, "HELD", 512)  # a file of more objects than are held
    # Columns this few repeat, stored once all the same (see below).
    monkeypatch.setattr(pack_columns, "MIN_PACK_BYTES", 1)
    src = write_many_demos(tmp_path / "demos.hdf5", demos=300, chunks=True)
    with h5py.File(src) as f:
        datasets = sum(isinstance(o, h5py.Dataset) for _, o in hdf5_walk._visit(f))
    assert datasets > 3 * 512
    peaks = {"hashing": 0, "repacking": 0}
    digests, repack, copy = compress_module.leaf_digests, pack_io._repack, pack_io.copy_object

    def hashing(leaves: Any, *args: Any) -> Any:
        def counted() -> Iterator[Any]:
            for pair in leaves:
                peaks["hashing"] = max(peaks["hashing"], _open_datasets())
                yield pair

        if isinstance(leaves, dict):  # every leaf made before the first is hashed
            peaks["hashing"] = max(peaks["hashing"], _open_datasets())
            return digests(leaves, *args)
        return digests(counted(), *args)

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any) -> Any:  # each dataset the packing walk copies or repacks
            peaks["repacking"] = max(peaks["repacking"], _open_datasets())
            return real(*args)

        return step

    monkeypatch.setattr(compress_module, "leaf_digests", hashing)
    monkeypatch.setattr(pack_io, "_repack", counting(repack))
    monkeypatch.setattr(pack_io, "copy_object", counting(copy))
    packed = tmp_path / "packed.hdf5"
    compress(src, packed, pack=True)
    assert 0 < peaks["hashing"] <= 512 + 64, peaks
    assert 0 < peaks["repacking"] <= 512 + 64, peaks
    # Reading the packed file: each demo's obs/qpos repeats columns of its states, so it is
    # stored as a virtual dataset whose leaf reads those columns from states. Such leaves ask
    # for their sources as the walk holds them: holding their own kept thousands open.
    with h5py.File(packed) as f:
        virtual = [
            n for n, o in hdf5_walk._visit(f) if isinstance(o, h5py.Dataset) and o.is_virtual
        ]
    assert len(virtual) >= 300, len(virtual)
    fmt, source = open_input(packed)
    try:
        reading = 0
        for key, leaf in source.leaves.items():
            values = leaf.read(0, leaf.shape[0])
            reading = max(reading, _open_datasets())
            if key == ("data", "demo_299", "obs", "qpos"):
                with h5py.File(src) as f:
                    np.testing.assert_array_equal(values, f["data/demo_299/obs/qpos"][()])
        assert 0 < reading <= 512 + 64, reading
    finally:
        fmt.close(source)
    with h5py.File(src) as a, h5py.File(tmp_path / "packed.hdf5") as b:
        for name in ("data/demo_7/obs/qpos", "data/demo_299/actions"):
            np.testing.assert_array_equal(a[name][()], b[name][()])
