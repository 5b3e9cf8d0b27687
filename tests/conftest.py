"""Shared fixtures: real sample rollouts, writers for every format, and a CLI runner."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from typer.testing import CliRunner

from obsdelta_cli.cli import app

from .writers import TED_KEYED, read_h5_td

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"

# Stable Rich output for assertions on tables.
os.environ.setdefault("COLUMNS", "120")


def load_sample(name: str) -> TensorDictBase:
    """A sample rollout, fully in memory (so tests never write through to sample_data/)."""
    path = SAMPLE / name
    if path.is_dir():
        return TensorDict.load_memmap(path).clone()
    return torch.load(path, weights_only=False).clone()


#: Input formats that h5py writes and obsdelta reads through h5py alone (``h5py_only``; a TED
#: HDF5 file is tensordict's writing, so it is not one).
H5PY_ONLY_KINDS = frozenset({"d4rl-hdf5", "robomimic-hdf5", "minari-hdf5"})


def h5py_only_marks(kind: str, only: Collection[str] = H5PY_ONLY_KINDS) -> list[Any]:
    """The marks of a test parameter for an input of ``kind``: ``h5py_only`` where ``kind`` is
    in ``only`` (names of inputs h5py writes and obsdelta reads through h5py alone:
    :data:`H5PY_ONLY_KINDS`, or a test's own)."""
    return [pytest.mark.h5py_only] if kind in only else []


def marked_h5py_only(kinds: Iterable[str], only: Collection[str] = H5PY_ONLY_KINDS) -> list[Any]:
    """``kinds`` as parameters, each with its :func:`h5py_only_marks`."""
    return [pytest.param(k, marks=h5py_only_marks(k, only)) for k in kinds]


@pytest.fixture(scope="session")
def hopper() -> TensorDictBase:
    """Hopper-v5 rollout, batch [3000], episodes ending by termination and truncation."""
    return load_sample("hopper_ted")


@pytest.fixture(scope="session")
def cheetah() -> TensorDictBase:
    """HalfCheetah-v5 rollout, batch [4, 250]."""
    return load_sample("halfcheetah_ted.pt")


@pytest.fixture(scope="session")
def pong() -> TensorDictBase:
    """ALE Pong frames, uint8 pixels [200, 1, 53, 40]."""
    return load_sample("pong_pixels.pt")


@pytest.fixture(params=TED_KEYED)
def fmt(request: pytest.FixtureRequest) -> str:
    """Every format whose keys follow TED; the HDF5 layouts have tests of their own."""
    return request.param


def read_any(path: Path) -> TensorDictBase:
    """Read an output of a TED-keyed format back into memory, as a user would."""
    if path.suffix == ".h5":
        return read_h5_td(path)
    if path.is_file():
        return torch.load(path, weights_only=False)
    if (path / "storage").is_dir():
        return TensorDict.load_memmap(path / "storage")
    return TensorDict.load_memmap(path)


def in_the_foreground() -> None:
    """``preexec_fn`` for a process the test sends SIGINT: a job in an interactive shell gets
    Ctrl-C; one started in the background (as this test run may be) inherits SIGINT ignored,
    which obsdelta respects."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    """Wait for ``proc``: its exit code, stdout and stderr. If it has not ended in ``timeout``
    seconds, fail with the stacks of its threads (it must run with ``faulthandler``, which
    prints them on SIGABRT)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail(f"still running after {timeout} s:\n{proc.communicate(timeout=60)[1]}")
    return proc.returncode, out, err


def tree_hash(path: Path) -> str:
    """sha256 over every file name and byte below ``path`` (or of the file)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


class Cli:
    """Runs ``obsdelta`` in-process through Typer's runner."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str | Path, code: int | None = 0):
        result = self.runner.invoke(app, [str(a) for a in args])
        if code is not None:
            assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        return result


@pytest.fixture
def cli() -> Cli:
    return Cli()
