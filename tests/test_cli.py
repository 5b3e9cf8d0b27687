"""The command line on real samples: tables for people, JSON Lines for scripts, help and version."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensordict import TensorDictBase

from obsdelta_cli import __version__
from obsdelta_cli.codecs import CODECS

from .conftest import SAMPLE, Cli, tree_hash
from .writers import WRITERS

KEY_FIELDS = {
    "key",
    "codec",
    "dtype",
    "shape",
    "bytes_before",
    "bytes_after",
    "max_abs_error",
    "rmse",
    "rows",
    "exact_rows",
}
TOP_FIELDS = {
    "schema",
    "command",
    "input",
    "output",
    "format",
    "bytes_before",
    "bytes_after",
    "keys",
}


def _json(result) -> dict:
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    data = json.loads(lines[0])
    assert set(data) >= TOP_FIELDS and data["schema"] == "obsdelta/1"
    for key in data["keys"]:
        assert set(key) >= KEY_FIELDS
    return data


def test_compress_inflate_report_json(
    cli: Cli, fmt: str, tmp_path: Path, cheetah: TensorDictBase
) -> None:
    src = WRITERS[fmt](cheetah, tmp_path / "in")
    before = tree_hash(src)
    small, back = tmp_path / ("small" + src.suffix), tmp_path / ("back" + src.suffix)

    c = _json(cli("compress", src, "-o", small, "--json", "--codec", "fp16"))
    assert (c["command"], c["format"], c["output"]) == ("compress", fmt, str(small))
    assert c["bytes_after"] < c["bytes_before"]
    (key,) = c["keys"]
    assert key["key"] == "next/observation" and key["codec"] == "fp16"
    assert key["bytes_after"] * 2 == key["bytes_before"]

    r = _json(cli("report", small, "--json"))
    assert r["output"] is None and r["keys"][0]["max_abs_error"] == key["max_abs_error"]

    i = _json(cli("inflate", small, "-o", back, "--json"))
    assert i["keys"][0]["max_abs_error"] == key["max_abs_error"]
    assert tree_hash(src) == before


#: The shipped samples: one of every input format.
SAMPLES = [p.name for p in sorted(SAMPLE.iterdir()) if p.suffix not in {".md", ".py"}]


def _open_files() -> list[str]:
    """What this process holds open, by path (sockets and pipes by their kind)."""
    fds = Path("/proc/self/fd")
    held = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            held.append(os.readlink(fd))
    return sorted(held)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("sample", SAMPLES)
def test_commands_leave_no_file_open(cli: Cli, tmp_path: Path, sample: str) -> None:
    """Every command closes every file it opened, whether it succeeds or refuses, without
    waiting for the collector: a process that runs many commands (a notebook, a test session, a
    Dask worker) never runs out of file descriptors."""
    src = SAMPLE / sample
    small, back = tmp_path / ("small" + src.suffix), tmp_path / ("back" + src.suffix)
    packed, unpacked = tmp_path / "packed.h5", tmp_path / ("unpacked" + src.suffix)
    cli("report", src)  # anything imported once is imported before the count
    before = _open_files()
    cli("compress", src, "-o", small, "-q")
    for args in (["report", src], ["report", small], ["verify", small]):
        cli(*args)
    cli("inflate", small, "-o", back, "-q")
    cli("compress", src, "-o", tmp_path / "refused", "--key", "no_such_key", code=1)
    cli("compress", "--pack", src, "-o", packed, "-q")
    cli("inflate", packed, "-o", unpacked, "-q")
    assert _open_files() == before


def test_report_dry_run_lists_every_codec(cli: Cli) -> None:
    data = _json(cli("report", SAMPLE / "hopper_ted", "--max-abs-error", "1e-3", "--json"))
    (key,) = data["keys"]
    assert [c["codec"] for c in key["candidates"]] == list(CODECS)
    assert key["auto_pick"] == "exact" and key["codec"] == "exact"
    assert all(
        {"codec", "bytes_after", "max_abs_error", "rmse"} <= set(c) for c in key["candidates"]
    )


def test_tables_for_people(cli: Cli, tmp_path: Path) -> None:
    out = cli("compress", SAMPLE / "hopper_ted", "-o", tmp_path / "small").stdout
    assert "next/observation" in out and "exact" in out and "dataset on disk" in out
    dry = cli("report", SAMPLE / "halfcheetah_ted.pt", "-e", "0.01").stdout
    assert all(c in dry for c in CODECS) and "estimate" in dry and "exact * auto" in dry
    assert cli("inflate", tmp_path / "small", "-o", tmp_path / "back", "-q").stdout == ""


def test_version_and_help(cli: Cli) -> None:
    assert cli("--version").stdout.strip() == f"obsdelta {__version__}"
    for command in ("compress", "inflate", "report"):
        assert "Example: obsdelta " + command in cli(command, "--help").stdout


@pytest.mark.parametrize(
    "args", [["compress", "x"], ["compress", "x", "-o", "y", "--codec", "zz"], ["frobnicate"]]
)
def test_usage_errors_exit_2(cli: Cli, args: list[str]) -> None:
    cli(*args, code=2)


def test_module_entry_point(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "obsdelta_cli",
            "compress",
            str(SAMPLE / "halfcheetah_ted.pt"),
            "-o",
            str(tmp_path / "o.pt"),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "ted-pt"


@pytest.mark.parametrize("busy", [False, True])
def test_a_finished_command_leaves_at_once_unless_something_still_runs(busy: bool) -> None:
    """After a command, the process ends without the interpreter's teardown (atexit hooks do
    not run), with the command's exit code and its output flushed; with a thread still
    running it takes the ordinary exit, which waits for it."""
    program = "\n".join(
        [
            "import atexit, sys, threading, time",
            "from obsdelta_cli.__main__ import _leave",
            "atexit.register(lambda: print('teardown ran'))",
            "threading.Thread(target=time.sleep, args=(0.2,)).start()" if busy else "",
            "print('report', end='')",
            "_leave(SystemExit(3))",
        ]
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 3
    assert done.stdout == ("reportteardown ran\n" if busy else "report")
