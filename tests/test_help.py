"""Help and start-up: an example in every help that runs as written, flags that read as flags,
80 columns, and no torch, tensordict or h5py for --version and --help."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from obsdelta_cli import names
from obsdelta_cli.codecs import AUTO, CODECS, DEFAULT_CODEC
from obsdelta_cli.commands import DEFAULT_CHUNK_MB
from obsdelta_cli.formats.hdf5 import H5_COMPRESSIONS

from .conftest import SAMPLE, Cli

COMMANDS = ["compress", "report", "inflate", "verify"]  # the order their examples chain in
HEAVY = ("torch", "tensordict", "h5py", "numpy", "ml_dtypes")


def _help(*args: str, columns: int = 80) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "obsdelta_cli", *args, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": str(columns)},
        check=True,
    )
    return done.stdout


@pytest.mark.parametrize("args", [[], *[[c] for c in COMMANDS]])
def test_help_fits_80_columns_and_flags_read_as_flags(args: list[str]) -> None:
    text = _help(*args)
    assert re.search(r"Example: obsdelta \S", text), text
    assert "<bool>" not in text and "bool" not in text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "…" not in text


def test_options_grouped_in_panels() -> None:
    text = _help("compress")
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert {"Codec", "Output", "Batch runs", "Advanced"} <= set(panels), panels
    codec = text[text.index("╭─ Codec") :]
    codec = codec[: codec.index("╰")]
    assert "--max-abs-error" in codec and "--jobs" not in codec


def test_examples_run_as_written(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sample_data").symlink_to(SAMPLE)
    monkeypatch.chdir(tmp_path)
    texts = [cli("--help").stdout, *[cli(c, "--help").stdout for c in COMMANDS]]
    examples = [re.findall(r"Example: (obsdelta .+)", text)[0].strip() for text in texts]
    for example in dict.fromkeys(examples):  # the top-level one is compress's
        for part in example.split("&&"):
            argv = shlex.split(part)
            if argv[0] == "obsdelta":
                cli(*argv[1:])
    assert (tmp_path / "hopper_full" / "meta.json").is_file()


def test_names_match_the_registries() -> None:
    assert {c: cls.summary for c, cls in CODECS.items()} == names.CODECS
    assert list(names.CODECS) == list(CODECS)
    assert (names.AUTO, names.DEFAULT_CODEC) == (AUTO, DEFAULT_CODEC)
    assert names.H5_COMPRESSIONS == H5_COMPRESSIONS
    assert names.DEFAULT_CHUNK_MB == DEFAULT_CHUNK_MB


def _imported(*args: str) -> set[str]:
    """The modules ``obsdelta ARGS`` imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "obsdelta_cli", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["compress", "--help"]])
def test_start_up_imports_nothing_heavy(args: list[str]) -> None:
    imported = _imported(*args)
    assert "obsdelta_cli.cli" in imported or args == ["--version"] or "typer" in imported
    assert not imported & set(HEAVY), imported & set(HEAVY)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("sample", ["hopper_ted", "hopper_d4rl.hdf5"])
def test_a_lossless_compress_imports_nothing_it_does_not_use(
    tmp_path: Path, sample: str, pack: bool
) -> None:
    """exact casts nothing (no torch, 1.1-1.75 s) and masks nothing (no numpy.ma, which
    ``np.unique`` imports on its first call: 20 ms)."""
    src = Path(__file__).parents[1] / "sample_data" / sample
    args = ["compress", str(src), "-o", str(tmp_path / "out"), *(["--pack"] if pack else [])]
    imported = _imported(*args)
    assert "obsdelta_cli.commands.compress" in imported
    assert not imported & {"torch", "tensordict", "numpy.ma"}


def test_library_names_still_import() -> None:
    code = (
        "import sys, obsdelta_cli as o; assert 'torch' not in sys.modules;"
        "from obsdelta_cli import compress, report, open_dataset, ObsdeltaError;"
        "from obsdelta_cli.commands import report as r; assert report is r and callable(report);"
        "assert o.verify.__name__ == 'verify'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
