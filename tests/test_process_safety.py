"""What happens around the writing of an output: files planted at the names obsdelta writes
beside it, a full disk, worker processes whose parent dies, inputs whose declared sizes are
hostile, and a file replaced while it is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from obsdelta_cli import compress
from obsdelta_cli.atomic import atomic_output
from obsdelta_cli.errors import OutputError

from .conftest import SAMPLE, Cli, tree_hash
from .test_cli_errors import assert_one_error_line

D4RL = SAMPLE / "hopper_d4rl.hdf5"


def _debris(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".obsdelta-" in p.name)


# ---------------------------------------------------------------------------------------------
# Files planted at the lock and temporary names


def _lock(output: Path) -> Path:
    return output.parent / f".{output.name}.obsdelta-lock"


@pytest.fixture
def compressed(tmp_path: Path) -> Path:
    out = tmp_path / "small.hdf5"
    compress(D4RL, out, codec="fp16")
    return out


@pytest.mark.parametrize("force", [False, True], ids=["", "force"])
def test_a_lock_file_linked_to_another_file_is_refused(
    tmp_path: Path, cli: Cli, force: bool
) -> None:
    """``compress`` followed the link and wrote its PID over the file it points to."""
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's notes\n")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "out.hdf5"
    _lock(out).symlink_to(victim)
    args = ["compress", D4RL, "-o", out, "--quiet", *(["--force"] if force else [])]
    result = cli(*args, code=1)
    says = [out, "symbolic link", "delete"]
    assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=says)
    assert victim.read_text() == "someone's notes\n"
    assert _debris(folder) == [_lock(out).name] and _lock(out).is_symlink()  # left as it was
    assert not out.exists()


def test_a_dangling_lock_link_creates_nothing(tmp_path: Path, cli: Cli, compressed: Path) -> None:
    """``inflate`` created the file the link named, outside the output's folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "back.hdf5"
    _lock(out).symlink_to(elsewhere / "created")
    result = cli("inflate", compressed, "-o", out, "--quiet", code=1)
    assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=[out, "link"])
    assert list(elsewhere.iterdir()) == []
    assert not out.exists() and _debris(folder) == [_lock(out).name]


@pytest.mark.parametrize("what", ["hard link", "fifo"])
def test_a_lock_file_obsdelta_cannot_have_made_is_refused(
    tmp_path: Path, cli: Cli, what: str
) -> None:
    """Writing the PID into a hard link to another file would change that file; a pipe is no
    lock file either."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "out.hdf5"
    victim = folder / "victim.txt"
    if what == "hard link":
        victim.write_text("keep me\n")
        os.link(victim, _lock(out))
    else:
        os.mkfifo(_lock(out))
    result = cli("compress", D4RL, "-o", out, "--quiet", code=1)
    says = [out, "not a lock file obsdelta made"]
    assert_one_error_line(result.exit_code, result.stdout, result.stderr, says=says)
    if what == "hard link":
        assert victim.read_text() == "keep me\n"
    assert not out.exists() and _debris(folder) == [_lock(out).name]


def test_a_link_at_the_name_of_an_output_set_aside_is_never_put_in_its_place(
    tmp_path: Path, cli: Cli
) -> None:
    """A ``-old-`` name is where an output is set aside while it is replaced; a link planted
    there became OUTPUT (pointing at any file), and the run then refused to replace it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "out.hdf5"
    (folder / ".out.hdf5.obsdelta-old-999999999").symlink_to(victim)
    before = tree_hash(D4RL)
    cli("compress", D4RL, "-o", out, "--quiet")
    assert out.is_file() and not out.is_symlink()
    assert _debris(folder) == [] and victim.read_text() == "keep me\n"
    assert tree_hash(D4RL) == before
    cli("verify", out, "--quiet")


def test_a_link_at_the_temporary_name_is_never_put_in_place(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out.hdf5"
    with (
        pytest.raises(OutputError, match="symbolic link took the place"),
        atomic_output(out, source=D4RL, force=False) as tmp,
    ):
        tmp.symlink_to(victim)
    assert not os.path.lexists(out) and _debris(tmp_path) == []
    assert victim.read_text() == "keep me\n"
