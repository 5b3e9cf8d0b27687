"""Many inputs in one command: a folder of outputs, worker processes, a Dask cluster, and one
outcome per input whatever happens to the others."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from obsdelta_cli import options, verify
from obsdelta_cli.batch import Job, run_all
from obsdelta_cli.interrupts import import_heavy
from obsdelta_cli.options import CompressOptions

from .conftest import SAMPLE, Cli

INPUTS = [SAMPLE / "hopper_ted", SAMPLE / "halfcheetah_ted.pt", SAMPLE / "hopper_d4rl.hdf5"]


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_folder_of_outputs_and_a_failure_that_stops_nothing(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    out = tmp_path / "out"
    result = cli("compress", *INPUTS, missing, "-o", out, "--codec", "exact", "--json", code=1)
    lines = {Path(line["input"]).name: line for line in _lines(result.stdout)}
    assert set(lines) == {p.name for p in [*INPUTS, missing]}
    assert lines["missing"] == {
        "schema": "obsdelta/1",
        "command": "compress",
        "input": str(missing),
        "output": str(out / "missing"),
        "ok": False,
        "error": f"{missing}: no such file or directory; check the path",
    }
    assert result.stderr.count("obsdelta: error:") == 1
    for p in INPUTS:
        assert lines[p.name]["ok"] and lines[p.name]["output"] == str(out / p.name)
        verify(out / p.name)


def test_summary_table_for_people(cli: Cli, tmp_path: Path) -> None:
    text = cli("report", *INPUTS).stdout
    assert "summary" in text and all(p.name in text for p in INPUTS)


def test_trailing_slash_means_a_folder(cli: Cli, tmp_path: Path) -> None:
    cli("compress", INPUTS[0], "-o", f"{tmp_path / 'dir'}/", "-q")
    assert (tmp_path / "dir" / "hopper_ted" / "obsdelta.json").is_file()


def test_a_folder_of_packed_files_names_them_as_hdf5_and_inflate_names_them_back(
    cli: Cli, tmp_path: Path
) -> None:
    packed, back = tmp_path / "packed", tmp_path / "back"
    cli("compress", *INPUTS, "--pack", "-o", packed, "-q")
    # A packed file is an HDF5 file whatever it holds: a .pt name would send users to torch.load.
    assert sorted(p.name for p in packed.iterdir()) == [
        "halfcheetah_ted.pt.h5",
        "hopper_d4rl.hdf5",
        "hopper_ted.h5",
    ]
    for name in ["halfcheetah_ted.pt.h5", "hopper_ted.h5"]:
        with h5py.File(packed / name, "r"):
            pass
    made = cli("inflate", *sorted(packed.iterdir()), "-o", back, "--json").stdout
    assert sorted(Path(line["output"]).name for line in _lines(made)) == sorted(
        p.name for p in INPUTS
    )
    assert (back / "halfcheetah_ted.pt").read_bytes() == (
        SAMPLE / "halfcheetah_ted.pt"
    ).read_bytes()
    for path in (SAMPLE / "hopper_ted").rglob("*"):
        if path.is_file():
            assert (back / "hopper_ted" / path.relative_to(SAMPLE / "hopper_ted")).read_bytes() == (
                path.read_bytes()
            )
    assert (back / "hopper_d4rl.hdf5").is_file()
    # One input names its output as given; a failure in a folder names the output it was to be.
    cli("inflate", packed / "hopper_ted.h5", "-o", tmp_path / "one.h5", "-q")
    assert (tmp_path / "one.h5" / "meta.json").is_file()
    again = cli(
        "inflate",
        packed / "hopper_ted.h5",
        packed / "hopper_d4rl.hdf5",
        "-o",
        back,
        "--json",
        code=1,
    )
    assert [line["output"] for line in _lines(again.stdout)] == [
        str(back / "hopper_ted"),
        str(back / "hopper_d4rl.hdf5"),
    ]
    assert f"{back / 'hopper_ted'}: output already exists" in again.stderr


def test_colliding_names_are_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "hopper_ted").symlink_to(SAMPLE / "hopper_ted")
    result = cli("compress", INPUTS[0], tmp_path / "a" / "hopper_ted", "-o", tmp_path / "o", code=2)
    assert "collide" in result.stderr


def test_worker_processes_give_the_same_outputs(tmp_path: Path) -> None:
    fp16 = CompressOptions(codec="fp16")
    serial = [Job(p, tmp_path / "s" / p.name, fp16) for p in INPUTS]
    parallel = [Job(p, tmp_path / "p" / p.name, fp16) for p in INPUTS]
    (tmp_path / "s").mkdir()
    (tmp_path / "p").mkdir()
    a = {o.job.input: o.result for o in run_all(serial)}
    b = {o.job.input: o.result for o in run_all(parallel, workers=2)}
    for p in INPUTS:
        assert a[p] is not None and b[p] is not None
        assert a[p].keys == b[p].keys


def test_dask_cluster_on_loopback(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
    ):
        out = tmp_path / "out"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "obsdelta_cli",
                "compress",
                *map(str, INPUTS),
                "-o",
                str(out),
                "--scheduler",
                cluster.scheduler_address,
                "--json",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    assert {Path(line["input"]).name for line in _lines(done.stdout)} == {p.name for p in INPUTS}
    for p in INPUTS:
        verify(out / p.name)


def test_unreachable_scheduler(cli: Cli, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    result = cli("report", INPUTS[0], "--scheduler", "tcp://127.0.0.1:9", code=2)
    assert "cannot reach the Dask scheduler" in result.stderr


def test_objects_made_by_the_imports_are_kept_out_of_garbage_collection() -> None:
    options.load_commands()
    assert gc.get_freeze_count() > 100_000  # torch's modules, functions and types


@pytest.mark.parametrize("enabled", [True, False])
def test_heavy_imports_leave_the_collector_as_they_found_it(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        import_heavy("json.tool")  # a collection during it would have been wasted
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
