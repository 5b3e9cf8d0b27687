"""Same input and flags, same bytes and figures: whatever the chunk size or the number of jobs."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli.stream import BLOCK_BYTES, Behind, Geometry, ahead, beside, slices, window

from .conftest import Cli, tree_hash
from .writers import WRITERS

CHUNKS = ["0.01", "1", "8"]


def _content(path: Path) -> str:
    """A hash of the bytes below ``path`` (not of its own name)."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else tree_hash(path)


def _figures(stdout: str) -> list[dict]:
    """The JSON lines without what may differ between runs: paths."""
    out = []
    for line in stdout.splitlines():
        data = json.loads(line)
        for name in ("input", "output"):
            data.pop(name)
        out.append(data)
    return out


@pytest.fixture(scope="module")
def long_rollout(hopper: TensorDictBase) -> TensorDictBase:
    """Hopper with noise, 4x longer: many chunks at 0.01 MiB, rows whose errors differ."""
    parts = []
    for i in range(4):
        part = hopper.clone()
        noise = torch.randn(part["observation"].shape, generator=torch.Generator().manual_seed(i))
        part["observation"] += noise * 1e-3
        part["next", "observation"] = torch.roll(part["observation"], -1, 0)
        part["next", "observation"][-1] += 0.5  # the last row has no successor: an exception
        parts.append(part)
    return torch.cat(parts)


@pytest.mark.parametrize("fmt", ["ted-memmap", "d4rl-hdf5"])
@pytest.mark.parametrize("codec", ["exact", "fp16"])
def test_output_independent_of_chunk_size(
    cli: Cli, tmp_path: Path, long_rollout: TensorDictBase, fmt: str, codec: str
) -> None:
    src = WRITERS[fmt](long_rollout, tmp_path / "in")
    hashes, figures = set(), []
    for mb in CHUNKS:
        out = tmp_path / f"out{mb}{src.suffix}"
        result = cli("compress", src, "-o", out, "--codec", codec, "--chunk-mb", mb, "--json")
        hashes.add(_content(out))
        figures.append(_figures(result.stdout))
        back = tmp_path / f"back{mb}{src.suffix}"
        cli("inflate", out, "-o", back, "--chunk-mb", mb, "-q")
        hashes_back = _content(back)
        if mb == CHUNKS[0]:
            first_back = hashes_back
        assert hashes_back == first_back
    assert len(hashes) == 1, "output bytes depend on --chunk-mb"
    assert all(f == figures[0] for f in figures), "figures depend on --chunk-mb"
    key = figures[0][0]["keys"][0]
    assert key["rows"] == long_rollout.shape[0]
    # exact keeps the episode ends as exception rows; fp16 has an error to sum.
    assert key["exception_rows"] > 0 if codec == "exact" else key["rmse"] > 0


def test_output_independent_of_jobs(cli: Cli, tmp_path: Path, long_rollout: TensorDictBase) -> None:
    inputs = [
        WRITERS["ted-memmap"](long_rollout, tmp_path / "a"),
        WRITERS["d4rl-hdf5"](long_rollout[:5000], tmp_path / "b"),
        WRITERS["ted-memmap"](long_rollout[3000:], tmp_path / "c"),
    ]
    runs = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        result = cli("compress", *inputs, "-o", out, "--codec", "fp16", "-j", jobs, "--json")
        figures = sorted(_figures(result.stdout), key=lambda d: d["bytes_before"])
        runs[jobs] = (figures, {p.name: _content(p) for p in sorted(out.iterdir())})
    assert runs["1"] == runs["2"]


def test_chunks_hold_whole_blocks() -> None:
    rows, row_bytes = 10_000, 44
    block = max(1, BLOCK_BYTES // row_bytes)
    for chunk_bytes in (1, 10_000, 2**20, 8 * 2**20):
        cut = list(slices(rows, block, chunk_bytes, row_bytes))
        assert cut[0].start == 0 and cut[-1].stop == rows
        assert all(a.stop == b.start for a, b in itertools.pairwise(cut))
        assert all(sl.start % block == 0 for sl in cut)


def test_successors_along_the_time_dimension() -> None:
    g = Geometry.of([2, 3], time_dim=0, valid_rows=None)  # time is the first dim: step 3
    assert g.has_successor(np.arange(6)).tolist() == [True] * 3 + [False] * 3
    g = Geometry.of([4], time_dim=0, valid_rows=3)  # a replay buffer with len 3
    assert g.has_successor(np.arange(4)).tolist() == [True, True, False, False]


def test_rows_without_successor_and_windows_agree_with_the_row_rule() -> None:
    # window() finds the rows without a successor arithmetically; has_successor is the rule.
    rng = random.Random(0)
    for _ in range(2000):
        dims = rng.choice([1, 2, 3])
        batch = [rng.randint(1, 7) for _ in range(dims)]
        time_dim = rng.randrange(dims)
        valid = rng.choice([None, rng.randint(0, batch[0])])
        g = Geometry.of(batch, time_dim, valid)
        a = rng.randint(0, g.total)
        b = rng.randint(a, g.total)
        rows = np.arange(a, b)
        has = g.has_successor(rows)
        assert np.array_equal(g.without_successor(a, b), np.flatnonzero(~has))
        obs = np.random.default_rng(a).standard_normal((g.total, 3), dtype=np.float32)
        chunk, successor = window(obs, slice(a, b), g)
        expected = obs[a:b].copy()
        expected[has] = obs[rows[has] + g.step]
        assert np.array_equal(chunk, obs[a:b]) and np.array_equal(successor, expected)


def test_ahead_keeps_order_and_loads_at_most_one_item_ahead() -> None:
    loaded: list[int] = []
    seen = []
    for item, value in ahead(range(6), lambda i: loaded.append(i) or i * 10):
        seen.append((item, value))
        # While the caller holds item i, at most item i + 1 has been loaded.
        assert max(loaded) <= item + 1
    assert seen == [(i, i * 10) for i in range(6)]
    assert list(ahead([], lambda i: i)) == []


@pytest.mark.parametrize("count", [1, 2, 5])
def test_ahead_starts_a_thread_only_when_there_is_a_next_item_to_load(count: int) -> None:
    # A pass over one chunk (each of a robomimic file's hundreds of short demos) has nothing
    # to overlap: starting and joining a thread for it cost more than the read.
    here = threading.current_thread().name
    loaded = [name for _, name in ahead(range(count), lambda _: threading.current_thread().name)]
    assert len(loaded) == count
    assert (loaded == [here]) is (count == 1)
    assert (here in loaded) is (count == 1)


def test_ahead_raises_the_loaders_error_at_its_item() -> None:
    def load(i: int) -> int:
        if i == 3:
            raise OSError("disk gone")
        return i

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item, _ in ahead(range(6), load):
            got.append(item)
    assert got == [0, 1, 2]


def test_behind_writes_in_order_and_bounds_what_waits() -> None:
    done: list[int] = []
    gate = threading.Event()

    def write(i: int) -> None:
        gate.wait(5)
        done.append(i)

    later = Behind(depth=2)
    with later:
        later(write, 0)
        later(write, 1)
        assert len(later.pending) == 2  # the third call must wait for the first
        gate.set()
        for i in range(2, 8):
            later(write, i)
            assert len(later.pending) <= 2
    assert done == list(range(8))


def test_behind_raises_a_failed_write() -> None:
    def fail() -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"), Behind() as later:
        later(fail)


def test_beside_runs_the_work_while_the_block_runs_and_waits_for_it() -> None:
    started, finish = threading.Event(), threading.Event()
    done: list[str] = []

    def work() -> None:
        started.set()
        finish.wait(5)
        done.append("work")

    with beside([work, lambda: done.append("more work")]):
        assert started.wait(5)  # the work runs while the block does
        done.append("block")
        finish.set()
    assert done == ["block", "work", "more work"]  # in turn, and finished on leaving


def test_beside_raises_the_works_error_first() -> None:
    def work() -> None:
        raise OSError("the copy failed")

    with pytest.raises(OSError, match="the copy failed"), beside([work]):
        raise ValueError("the pass failed too")
    with pytest.raises(OSError, match="the copy failed"), beside([work]):
        pass


def test_beside_drops_the_tasks_not_started_when_the_block_fails() -> None:
    started = threading.Event()
    done: list[int] = []

    def work(n: int) -> None:
        started.set()
        threading.Event().wait(1)  # the block fails meanwhile
        done.append(n)

    with pytest.raises(ValueError, match="pass failed"), beside(partial(work, n) for n in range(5)):
        assert started.wait(5)
        raise ValueError("the pass failed")
    assert done == [0]  # the task that was running finished; the others never started


def test_beside_lets_an_interrupt_of_the_block_through() -> None:
    def work() -> None:
        raise OSError("the copy failed")

    with pytest.raises(KeyboardInterrupt), beside([work]):
        raise KeyboardInterrupt
