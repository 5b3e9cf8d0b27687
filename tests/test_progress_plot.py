"""Progress bars on a terminal only, and the report's plot."""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tensordict import TensorDictBase

from obsdelta_cli import compress
from obsdelta_cli.progress import Recorder, showing

from .conftest import SAMPLE, Cli
from .test_cli_errors import expect_error


def test_pipeline_reports_bytes_of_each_key(tmp_path: Path) -> None:
    with showing(Recorder()) as rec:
        compress(SAMPLE / "hopper_ted", tmp_path / "s", codec="exact", chunk_mb=0.01, verify=False)
    tasks = [e for e in rec.events if e[0] == "task"]
    assert tasks == [("task", "next/observation", 3000 * 11 * 4)]
    advances = [e[2] for e in rec.events if e[0] == "advance"]
    assert len(advances) > 10 and sum(advances) == 3000 * 11 * 4


def _on_a_terminal(*args: str) -> str:
    """Run obsdelta with stdout and stderr on a pseudo-terminal; return what it showed."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "obsdelta_cli", *args],
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "COLUMNS": "160"},
    )
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    os.close(main)
    return b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, hopper: TensorDictBase) -> Path:
    import torch

    path = tmp_path_factory.mktemp("big") / "big"
    torch.cat([hopper] * 200).memmap(path)
    return path


#: A transfer speed as the progress bar shows it ("/s" alone may be in a path); its unit
#: depends on how fast the machine is.
_SPEED = re.compile(r"\d(\.\d+)? ?[kMG]?B/s")


def test_progress_bars_on_a_terminal(big: Path, tmp_path: Path) -> None:
    shown = _on_a_terminal("compress", str(big), "-o", str(tmp_path / "o"), "--chunk-mb", "0.5")
    assert "compress next/observation" in shown and _SPEED.search(shown)


@pytest.mark.parametrize("flag", ["--json", "--quiet"])
def test_no_progress_with_json_or_quiet(big: Path, tmp_path: Path, flag: str) -> None:
    shown = _on_a_terminal("compress", str(big), "-o", str(tmp_path / "o"), flag)
    assert "compress next/observation" not in shown and not _SPEED.search(shown)


def test_no_progress_when_not_a_terminal(cli: Cli, big: Path, tmp_path: Path) -> None:
    result = cli("compress", big, "-o", tmp_path / "o")
    assert result.stderr == "" and not _SPEED.search(result.stdout)


def test_plot_is_a_real_png(cli: Cli, tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    out = tmp_path / "report.png"
    cli("report", SAMPLE / "hopper_robomimic.hdf5", "--max-abs-error", "1e-3", "--plot", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 20_000 < out.stat().st_size < 2_000_000
    height, width, _ = image.imread(out).shape
    assert width == 1200 and 600 <= height <= 1200  # 2 panels a key, 3 keys


def test_plot_of_a_compressed_file(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    compress(SAMPLE / "hopper_d4rl.hdf5", tmp_path / "s.h5", codec="fp16")
    cli("report", tmp_path / "s.h5", "--plot", tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    expect_error(
        cli,
        "report",
        SAMPLE / "hopper_ted",
        "--plot",
        tmp_path / "p.png",
        code=2,
        says=["--plot needs matplotlib", "obsdelta[plot]"],
    )
    assert not (tmp_path / "p.png").exists()


def test_a_batch_in_workers_counts_its_inputs_on_a_terminal(big: Path, tmp_path: Path) -> None:
    """With --jobs, each input's bars stay in its worker: the terminal shows the inputs done."""
    inputs = [str(shutil.copytree(big, tmp_path / f"in{i}")) for i in range(3)]
    shown = _on_a_terminal("compress", *inputs, "-o", str(tmp_path / "o") + "/", "--jobs", "2")
    assert re.search(r"[0-3]/3 inputs", shown), shown


def test_the_input_count_is_reported_per_input() -> None:
    from obsdelta_cli.progress import Recorder, showing

    with showing(Recorder()) as rec:
        task = rec.inputs(3)
        for _ in range(3):
            rec.advance(task, 1)
    assert rec.events == [("task", "inputs", 3)] + [("advance", 0, 1)] * 3


def test_the_plot_shows_the_codec_it_picks() -> None:
    """A pick of a few KB beside raw bytes of hundreds: sizes on a log scale, every bar
    labelled, and the title names the pick (on a linear MB axis it was no bar at all)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from obsdelta_cli import report
    from obsdelta_cli.plot import draw_report

    result = report(SAMPLE / "hopper_d4rl.hdf5")
    (key,) = result.keys
    assert key.auto_pick == "exact" and key.bytes_before / 100 > min(
        c.bytes_after for c in key.candidates or []
    )
    fig = draw_report(result)
    try:
        sizes = fig.axes[0]
        assert sizes.get_yscale() == "log"
        assert "picked, in red: exact (1.8 KB)" in sizes.get_title()
        labels = [t.get_text() for t in sizes.texts]
        assert "1.8 KB" in labels and "214.8 KB" in labels
    finally:
        plt.close(fig)
