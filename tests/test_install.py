"""Installs keep what the user has: the torch, tensordict and typer of the environment the suite
runs in (CI runs it at the lowest versions obsdelta admits and at the newest this machine
installs) satisfy obsdelta's requirements, so ``pip install -e .`` replaces none of them."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
KEPT = ("torch", "tensordict", "typer", "numpy", "h5py")


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {r.name: r for r in map(Requirement, project["dependencies"])}


@pytest.mark.parametrize("name", KEPT)
def test_the_installed_version_is_inside_the_declared_range(name: str) -> None:
    installed = version(name)
    assert _requirements()[name].specifier.contains(installed, prereleases=True), installed


def test_an_install_replaces_nothing_already_installed(tmp_path: Path) -> None:
    """pip resolves obsdelta's requirements from what is installed alone (no index): nothing
    would be installed, so ``pip install -e .`` keeps every installed dependency as it is."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet",
            "--report", str(report), *map(str, _requirements().values()),
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == [], installs
