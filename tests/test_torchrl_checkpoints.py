"""TorchRL's flat, nested and H5 storage checkpoints store each observation once: obsdelta
recognises them and says so, as for Minari files, and never calls them damaged."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from tensordict import TensorDictBase

from .conftest import Cli
from .writers import CHECKPOINTERS, write_checkpoint


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(params=sorted(CHECKPOINTERS))
def checkpoint(request: pytest.FixtureRequest, tmp_path: Path, hopper: TensorDictBase) -> Path:
    return write_checkpoint(hopper, tmp_path / request.param, request.param)


def _inputs(checkpoint: Path) -> list[Path]:
    """The dump, its storage folder, and an H5 checkpoint's file itself."""
    return [checkpoint, checkpoint / "storage", *sorted((checkpoint / "storage").glob("*.h5"))]


def test_report_says_there_is_nothing_to_remove(cli: Cli, checkpoint: Path) -> None:
    for path in _inputs(checkpoint):
        out = " ".join(cli("report", path).stdout.split())
        assert "(torchrl-checkpoint)" in out and "stores its observations once" in out, path


@pytest.mark.parametrize("pack", [False, True])
def test_compress_refuses_in_one_line(
    cli: Cli, checkpoint: Path, tmp_path: Path, pack: bool
) -> None:
    before = _digest(checkpoint)
    for path in _inputs(checkpoint):
        out = tmp_path / ("out.h5" if pack else "out")
        args = ["compress", path, "-o", out, *(["--pack"] if pack else [])]
        err = cli(*args, code=1).stderr
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "TorchRL storage checkpoint" in err and "nothing for obsdelta to remove" in err
        assert ("--pack does not take it" in err) == pack
        assert not out.exists()
    assert _digest(checkpoint) == before


def test_torchrl_still_loads_what_was_recognised(checkpoint: Path, hopper: TensorDictBase) -> None:
    """The files are TorchRL's own, untouched: loading them gives the rollout back."""
    from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers import checkpointers

    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(hopper.shape[0]))
    rb._storage.checkpointer = getattr(checkpointers, CHECKPOINTERS[checkpoint.name])()
    rb.loads(checkpoint)
    back = rb[:]
    assert (back["next", "observation"] == hopper["next", "observation"]).all()
