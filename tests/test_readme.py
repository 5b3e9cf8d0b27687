"""The README's examples run as written."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from obsdelta_cli import compress

from .conftest import ROOT, SAMPLE

README = (ROOT / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_training_loop_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (block,) = [b for b in _python_blocks() if "open_dataset" in b]
    compress(SAMPLE / "hopper_ted", tmp_path / "hopper_small", codec="exact")
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {"__name__": "__main__"}  # run as a script is
    exec(compile(block, "README.md", "exec"), scope)
    assert float(scope["loss"].detach()) < 10  # type: ignore[attr-defined]


def test_library_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (block,) = [b for b in _python_blocks() if "compress(" in b]
    (tmp_path / "rollouts").symlink_to(SAMPLE / "hopper_ted")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    assert (tmp_path / "rollouts_full" / "meta.json").is_file()


def test_example_output_is_current() -> None:
    """The README's example output is what the code prints now (scripts/readme_examples.py)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_examples.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_example_check_notices_a_stale_readme() -> None:
    spec = importlib.util.spec_from_file_location(
        "readme_examples", ROOT / "scripts" / "readme_examples.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stale = README.replace("dataset on disk:", "dataset on disc:", 1)
    assert stale != README and module.generate(stale) == README


def test_training_example_runs_as_a_script_under_spawn(tmp_path: Path) -> None:
    """Run as a user runs it: a script, after something (TorchRL, imported by
    ObsdeltaStorage) switched worker processes to ``spawn``, which imports the script again in
    every worker; the example's ``__main__`` guard keeps them from training too."""
    pytest.importorskip("torchrl")
    (block,) = [b for b in _python_blocks() if "open_dataset" in b]
    compress(SAMPLE / "hopper_ted", tmp_path / "hopper_small")
    script = tmp_path / "train.py"
    script.write_text(
        "import multiprocessing\n"
        "import obsdelta_cli.storage  # imports torchrl\n"
        "multiprocessing.set_start_method('spawn', force=True)\n"
        + block
        + "    print('loss', float(loss))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("loss ") == 1  # trained once, in the main process only
