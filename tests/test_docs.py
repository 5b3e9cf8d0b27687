"""The documentation: the site builds with warnings as errors, its examples are the README's
(which tests/test_readme.py runs), and the README stays one screen of reading."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"


def test_the_readme_stays_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move the detail to docs/"


def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d",
         str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cli = (tmp_path / "html" / "_generated" / "cli.html").read_text()
    for command in ("compress", "inflate", "report", "verify"):
        assert f"obsdelta {command}" in cli  # the reference is generated from the app
    api = (tmp_path / "html" / "api.html").read_text()
    assert "open_dataset" in api and "ObsdeltaStorage" in api
    # The performance figures are the benchmark's own output, machine and date included.
    results = (tmp_path / "html" / "benchmark-results.html").read_text()
    assert "Machine:" in results and "Date:" in results


def test_every_docs_example_is_a_tested_readme_example() -> None:
    """A page shows code by including a marked README example, which test_readme runs; a code
    block written into a page itself would go untested."""
    readme = README.read_text()
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        assert "```python" not in text, f"{page}: include a README example instead"
        for marker in re.findall(r":start-after: <!-- ([\w-]+) -->", text):
            assert f"<!-- {marker} -->" in readme and f"<!-- /{marker} -->" in readme, marker


def _readme_command(name: str) -> str:
    """The command between ``<!-- name -->`` markers, as ``.ci/run`` takes it."""
    block = README.read_text().split(f"<!-- {name} -->")[1].split(f"<!-- /{name} -->")[0]
    return block.split("```bash\n")[1].split("```")[0].strip()


def test_each_test_is_run_by_one_of_the_readme_test_commands() -> None:
    """The first test command leaves out only the tests marked ``h5py_only`` (and the slow
    ones, as both do), and the second runs those: nothing falls between them."""
    marks = [
        re.findall(r"pytest .*?-m (\"[^\"]*\"|\S+)", _readme_command(name))
        for name in ("test-command", "test-command-core")
    ]
    assert marks == [['"not slow and not h5py_only"'], []], marks
    assert "-m 'not slow'" in (ROOT / "pyproject.toml").read_text()  # the second's default
