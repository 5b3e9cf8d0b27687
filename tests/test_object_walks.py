"""Files of thousands of episodes: every command opens each HDF5 object a bounded number of
times, so its cost follows the objects once, not once per step of the command.

h5py's ``h5o.open``, ``h5d.open`` and ``h5g.open`` are counted in this process and in the
children obsdelta forks to read a file apart (each open appends a byte to one file, which
forked children share)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from obsdelta_cli import compress, inflate, report, verify

DEMOS = 2_000


def write_many_demos(path: Path, demos: int = DEMOS, seed: int = 0) -> Path:
    """robomimic's layout (``data/demo_i`` with ``obs``/``next_obs`` groups, ``actions``,
    ``rewards``, ``dones``, ``states``, ``mask/*``), 5-12 steps a demo of random walks that
    never repeat: 2,000 demos make about 26,000 objects."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for i in range(demos):
            n = int(rng.integers(5, 13))
            demo = data.create_group(f"demo_{i}")
            demo.attrs["num_samples"] = n
            walk = np.cumsum(rng.normal(size=(n + 1, 9)), axis=0)
            demo.create_dataset("states", data=walk[:n, :4])
            demo.create_dataset("actions", data=rng.uniform(-1, 1, (n, 3)))
            demo.create_dataset("rewards", data=rng.normal(size=n))
            demo.create_dataset("dones", data=np.arange(n) == n - 1)
            for k, cols in (("qpos", slice(0, 5)), ("qvel", slice(5, 9))):
                demo.create_dataset(f"obs/{k}", data=walk[:n, cols])
                demo.create_dataset(f"next_obs/{k}", data=walk[1:, cols])
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
    }
    per_object = {}
    for name, step in steps.items():
        step()
        per_object[name] = count_opens() / objects
    print({k: round(v, 2) for k, v in per_object.items()})
    # Each pass that needs an object (safety walk, leaves, copy, hash, the output's own
    # check) may open it once; ``--pack`` also packs the compressed file in a second pass. A
    # pass that opened objects per key, per demo or per row would be far above these.
    bounds = {name: 9 if "pack" in name else 6 for name in steps}
    assert all(per_object[name] <= bounds[name] for name in steps), per_object
