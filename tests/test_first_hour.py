"""What a new user meets in the first hour: messages that name only what exists, JSON that says
what was asked, tables that say whether the values come back as they were."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import SAMPLE, Cli


def test_an_unknown_key_lists_only_pairs_that_exist(cli: Cli, tmp_path: Path) -> None:
    err = cli("compress", SAMPLE / "hopper_ted", "-o", tmp_path / "out", "--key", "pixels",
              code=1).stderr  # fmt: skip
    known = err.split("known: ")[1].strip().split(", ")
    assert known == ["next/done", "next/observation", "next/terminated", "next/truncated"]
    assert "next/action" not in err and "traj_ids" not in err  # no twin: nothing to name


def test_a_key_without_twin_names_the_keys_that_work(cli: Cli, tmp_path: Path) -> None:
    err = cli("compress", SAMPLE / "hopper_ted", "-o", tmp_path / "out", "--key", "action",
              code=1).stderr  # fmt: skip
    assert "has no twin next/action" in err
    assert err.strip().endswith("keys this codec can encode: next/observation")
    assert "pick keys with --key" not in err


def test_the_bound_is_null_when_none_was_asked_for(cli: Cli, tmp_path: Path) -> None:
    src = SAMPLE / "hopper_d4rl.hdf5"
    plain = json.loads(cli("compress", src, "-o", tmp_path / "a.hdf5", "--json").stdout)
    (key,) = plain["keys"]
    assert key["max_abs_error_bound"] is None and key["lossless"] is True
    bounded = cli("compress", src, "-o", tmp_path / "b.hdf5", "--json", "--max-abs-error",
                  "1e-3", "--codec", "q16").stdout  # fmt: skip
    (key,) = json.loads(bounded)["keys"]
    assert key["max_abs_error_bound"] == 1e-3 and key["lossless"] is False
    for name in ("a.hdf5", "b.hdf5"):  # and as verify reads it back from the file
        (key,) = json.loads(cli("verify", tmp_path / name, "--json").stdout)["keys"]
        assert key["max_abs_error_bound"] == (None if name == "a.hdf5" else 1e-3)


def test_tables_say_lossless_or_lossy(cli: Cli, tmp_path: Path) -> None:
    src = SAMPLE / "hopper_d4rl.hdf5"
    out = cli("compress", src, "-o", tmp_path / "a.hdf5").stdout
    assert "lossless: every value comes back bit for bit" in out
    out = cli("compress", src, "-o", tmp_path / "b.hdf5", "--codec", "fp16").stdout
    line = next(x for x in out.splitlines() if x.startswith("lossy:"))
    assert line.startswith("lossy: next_observations within 0.000")
    verified = cli("verify", tmp_path / "b.hdf5").stdout
    assert "lossy: next_observations within" in " ".join(verified.split())
