"""Lint, format and type checks, configured in pyproject.toml, run with the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT

CHECKS = {
    "ruff-lint": ["ruff", "check", "."],
    "ruff-format": ["ruff", "format", "--check", "."],
    "mypy": [sys.executable, "-m", "mypy"],
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_tool_passes(name: str) -> None:
    command = CHECKS[name]
    if shutil.which(command[0]) is None and command[0] != sys.executable:
        pytest.fail(f"{command[0]} is not installed; install the test extra")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
