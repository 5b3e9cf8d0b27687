"""Tables fit the terminal: no line longer than COLUMNS and no elided number, at 60, 80 and 200
columns, for compress (plain and ``--pack``), report (dry run, ``--pack`` and compressed
input), verify and a batch summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from obsdelta_cli import compress
from obsdelta_cli.render import _ratio, _size

from .conftest import SAMPLE, Cli

DRY_RUNS = [
    ["report", "hopper_d4rl.hdf5", "--max-abs-error", "1e-3"],
    ["report", "hopper_robomimic.hdf5"],
    ["report", "halfcheetah_ted.pt", "-e", "0.01"],
    ["report", "hopper_rb"],
    ["report", "hopper_d4rl.hdf5", "--pack"],
]


def _run(args: list[str], columns: int, cwd: Path) -> str:
    """The command's stdout at ``columns`` (in-process: Rich reads COLUMNS as a user's shell
    sets it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", str(columns))
        patch.chdir(cwd)
        return Cli()(*args).stdout


def test_width_follows_columns_when_piped(work: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "obsdelta_cli", *DRY_RUNS[0]],
        capture_output=True,
        text=True,
        cwd=work,
        env={**os.environ, "COLUMNS": "80"},
        check=True,
    )
    assert max(map(len, done.stdout.splitlines())) <= 80
    assert done.stdout == _run(DRY_RUNS[0], 80, work)


def _check(text: str, columns: int) -> None:
    lines = text.splitlines()
    assert lines, "no output"
    too_long = [line for line in lines if len(line) > columns]
    assert not too_long, "\n".join(too_long)
    assert "…" not in text, text


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("render")
    for name in ("hopper_d4rl.hdf5", "hopper_robomimic.hdf5", "halfcheetah_ted.pt", "hopper_rb"):
        (work / name).symlink_to(SAMPLE / name)
    (work / "hopper_ted").symlink_to(SAMPLE / "hopper_ted")
    return work


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_every_command_fits(work: Path, columns: int) -> None:
    out = f"small{columns}"
    compress = _run(["compress", "hopper_ted", "-o", out, "--force"], columns, work)
    _check(compress, columns)
    assert "next/observation" in compress and "3000" in compress
    for args in [["report", out], ["verify", out], *DRY_RUNS]:
        text = _run(args, columns, work)
        _check(text, columns)
    packed = _run(
        ["compress", "hopper_d4rl.hdf5", "-o", f"p{columns}.h5", "--pack", "-f"], columns, work
    )
    _check(packed, columns)
    assert "dataset on disk" in packed and "packed into one HDF5 file" in " ".join(packed.split())
    robomimic = _run(DRY_RUNS[1], columns, work)
    # Long key names fold rather than being cut.
    assert "camera" in robomimic and "image" in robomimic


def test_wide_terminal_keeps_every_column(work: Path) -> None:
    text = _run(DRY_RUNS[0], 200, work)
    header = next(line for line in text.splitlines() if "rmse" in line)
    for name in ("key", "codec", "before", "after", "ratio", "max abs err", "exact rows"):
        assert name in header
    narrow = _run(DRY_RUNS[0], 80, work)
    assert "rmse" not in narrow and "exact rows" not in narrow
    # Every codec's figures are still there.
    for figure in ("0.000487", "1.19e-07", "4523", "121x", "1.82 KB"):
        assert figure in narrow and figure in text


def test_batch_summary_fits(work: Path) -> None:
    # Outputs of its own: the test that compresses at each width may run in another process.
    names = ["batch1", "batch2", "batch3"]
    for name in names:
        compress(work / "hopper_ted", work / name, force=True)
    text = _run(["verify", *names], 80, work)
    _check(text, 80)
    assert "summary" in text and text.count("ok") >= 3


def test_units() -> None:
    assert [_size(n) for n in (0, 999, 1000, 999_499, 999_500, 12_345_678_901)] == [
        "0 B",
        "999 B",
        "1 KB",
        "999 KB",
        "1 MB",
        "12.3 GB",
    ]
    assert [_ratio(1000, n) for n in (1, 10, 100, 999, 2000)] == [
        "1000x",
        "100x",
        "10.0x",
        "1.00x",
        "0.50x",
    ]
