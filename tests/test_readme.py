"""The README's examples run as written."""

from __future__ import annotations

import re
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
    scope: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert float(scope["loss"].detach()) < 10  # type: ignore[attr-defined]


def test_library_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (block,) = [b for b in _python_blocks() if "compress(" in b]
    (tmp_path / "rollouts").symlink_to(SAMPLE / "hopper_ted")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    assert (tmp_path / "rollouts_full" / "meta.json").is_file()
