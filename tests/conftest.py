"""Shared fixtures: real sample rollouts, writers for every format, and a CLI runner."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from typer.testing import CliRunner

from obsdelta_cli.cli import app
from obsdelta_cli.formats import FORMATS

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


def write_memmap(td: TensorDictBase, path: Path) -> Path:
    td.memmap(path)
    return path


def write_pt(td: TensorDictBase, path: Path) -> Path:
    path = path.with_suffix(".pt")
    torch.save(td, path)
    return path


def write_rb(td: TensorDictBase, path: Path) -> Path:
    """A real TorchRL replay-buffer dump holding ``td`` (flattened), with spare capacity."""
    rl_data = pytest.importorskip("torchrl.data")
    flat = td.reshape(-1) if td.batch_dims > 1 else td
    rb = rl_data.TensorDictReplayBuffer(
        storage=rl_data.LazyMemmapStorage(flat.shape[0] + 37, scratch_dir=path.parent / "scratch")
    )
    rb.extend(flat)
    rb.dumps(path)
    return path


#: One writer per format in the registry; a new format without a writer fails test_formats.
WRITERS: dict[str, Callable[[TensorDictBase, Path], Path]] = {
    "ted-memmap": write_memmap,
    "ted-pt": write_pt,
    "torchrl-rb": write_rb,
}


@pytest.fixture(params=list(FORMATS))
def fmt(request: pytest.FixtureRequest) -> str:
    return request.param


def read_any(path: Path) -> TensorDictBase:
    """Read an output of any format back into memory, as a user would."""
    if path.is_file():
        return torch.load(path, weights_only=False)
    if (path / "storage").is_dir():
        return TensorDict.load_memmap(path / "storage")
    return TensorDict.load_memmap(path)


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
