"""Read-ahead of inputs: only the input's own regular files, within the budget, never an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from obsdelta_cli import readahead


def test_files_are_the_inputs_own_in_sorted_order(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"s" * 10)
    folder = tmp_path / "rollout"
    (folder / "next").mkdir(parents=True)
    (folder / "obs.memmap").write_bytes(b"o" * 100)
    (folder / "next" / "obs.memmap").write_bytes(b"n" * 50)
    (folder / "link.memmap").symlink_to(outside)
    (folder / "dir_link").symlink_to(tmp_path, target_is_directory=True)
    found = [(p.relative_to(folder).as_posix(), n) for p, n in readahead.files(folder)]
    assert found == [("obs.memmap", 100), ("next/obs.memmap", 50)]
    assert readahead.files(folder / "link.memmap") == []


def test_advice_stays_within_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(b"x" * 1000)
    advised: list[tuple[int, int]] = []
    monkeypatch.setattr(
        os, "posix_fadvise", lambda fd, offset, length, advice: advised.append((offset, length))
    )
    readahead.start([tmp_path], budget=1500).join()
    assert advised == [(0, 1000), (0, 500)]


def test_a_missing_or_unreadable_input_is_left_to_the_command(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.write_bytes(b"x")
    locked.chmod(0)
    readahead.start([tmp_path / "missing", locked, tmp_path]).join()  # no exception escapes


def test_available_memory_is_known_here() -> None:
    assert readahead.available_memory() > 0
