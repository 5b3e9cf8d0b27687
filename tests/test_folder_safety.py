"""Folder inputs are self-contained and their metadata bounded.

A TED memmap folder, a replay-buffer dump and a compressed folder output are read only through
files inside them: a symbolic link anywhere below one is refused before anything is read
through it. Names obsdelta writes itself are refused in a user's own input, every byte of a leaf
file must be one ``meta.json`` describes, and nesting, keys and declared sizes are bounded.
Each refusal ends like any bad input: exit 1, one line on stderr naming the file, nothing
written, the input untouched; :func:`obsdelta_cli.open_dataset` raises an ``ObsdeltaError``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from tensordict import TensorDictBase

from obsdelta_cli import compress, open_dataset
from obsdelta_cli.errors import ObsdeltaError

from .conftest import Cli
from .test_cli_errors import expect_error, write

COMMANDS = ["compress", "report", "verify", "inflate"]
LINK = "is a symbolic link; obsdelta reads only files inside the folder; replace it with the file"


@pytest.fixture(scope="module")
def rows(hopper: TensorDictBase) -> TensorDictBase:
    """A few hundred real Hopper transitions: enough for every codec, quick to write."""
    return hopper[:300].clone()


def command_line(command: str, src: Path, tmp_path: Path) -> list[str | Path]:
    """``command src``, with ``-o`` for the commands that write."""
    out = ["-o", tmp_path / "out"] if command in ("compress", "inflate") else []
    return [command, src, *out]


def _plain(fmt: str, td: TensorDictBase, tmp_path: Path) -> Path:
    return write(fmt, td, tmp_path)


def _compressed(fmt: str, td: TensorDictBase, tmp_path: Path) -> Path:
    src = write(fmt, td, tmp_path, name="plain")
    out = tmp_path / "small"
    compress(src, out, codec="fp16")
    return out


def _storage(root: Path) -> Path:
    """The memmap tree of a folder dataset (a dump keeps it in ``storage/``)."""
    return root / "storage" if (root / "storage").is_dir() else root


def _replace_with_link(path: Path, target: Path | str | None = None) -> Path:
    """``path`` made a symbolic link to a moved copy of itself, or to ``target``."""
    if target is None:
        target = path.parent.parent / f"moved-{path.name}"
        while Path(target).exists():
            target = Path(f"{target}-")
        shutil.move(path, target)
    elif path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.symlink_to(target)
    return path


#: Where a link goes in a folder dataset, and what it points to.
LINKS: dict[str, Callable[[Path], Path]] = {
    "leaf": lambda root: _replace_with_link(_storage(root) / "observation.memmap"),
    "sub-folder": lambda root: _replace_with_link(_storage(root) / "next"),
    "meta.json": lambda root: _replace_with_link(_storage(root) / "next" / "meta.json"),
    "extra-to-dev-zero": lambda root: _replace_with_link(root / "extra.bin", "/dev/zero"),
    "dangling": lambda root: _replace_with_link(root / "env_metadata.json", "/nonexistent/x"),
}


#: Where else a link goes in a replay-buffer dump.
DUMP_LINKS: dict[str, Callable[[Path], Path]] = {
    "buffer_metadata.json": lambda root: _replace_with_link(root / "buffer_metadata.json"),
    "prefetch.pkl-to-dev-zero": lambda root: _replace_with_link(root / "prefetch.pkl", "/dev/zero"),
    "storage_metadata.json": lambda root: _replace_with_link(
        root / "storage" / "storage_metadata.json"
    ),
    "storage": lambda root: _replace_with_link(root / "storage"),
    "root-meta.json-to-dev-zero": lambda root: _replace_with_link(
        root / "storage" / "meta.json", "/dev/zero"
    ),
}
PLACES = [(fmt, where) for fmt in ("ted-memmap", "torchrl-rb") for where in LINKS] + [
    ("torchrl-rb", where) for where in DUMP_LINKS
]


@pytest.mark.parametrize(("fmt", "where"), PLACES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_link_in_a_plain_folder_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, fmt: str, command: str, where: str
) -> None:
    src = _plain(fmt, rows, tmp_path)
    link = {**LINKS, **DUMP_LINKS}[where](src)
    expect_error(cli, *command_line(command, src, tmp_path), says=[link, LINK])


@pytest.mark.parametrize("where", ["leaf", "meta.json", "extra-to-dev-zero"])
@pytest.mark.parametrize("fmt", ["ted-memmap", "torchrl-rb"])
@pytest.mark.parametrize("command", ["verify", "inflate", "report"])
def test_a_link_in_a_compressed_folder_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, fmt: str, command: str, where: str
) -> None:
    """A leaf linked to a moved copy of itself would pass verify, were the link followed."""
    small = _compressed(fmt, rows, tmp_path)
    link = LINKS[where](small)
    expect_error(cli, *command_line(command, small, tmp_path), says=[link, LINK])


@pytest.mark.parametrize("fmt", ["ted-memmap", "torchrl-rb"])
def test_a_link_is_refused_by_pack(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, fmt: str
) -> None:
    src = _plain(fmt, rows, tmp_path)
    link = LINKS["leaf"](src)
    out = tmp_path / "out.h5"
    expect_error(cli, "compress", src, "--pack", "-o", out, says=[link, LINK])


@pytest.mark.parametrize("where", ["leaf", "sub-folder", "extra-to-dev-zero"])
@pytest.mark.parametrize("fmt", ["ted-memmap", "torchrl-rb"])
def test_a_link_is_refused_by_open_dataset(
    tmp_path: Path, rows: TensorDictBase, fmt: str, where: str
) -> None:
    small = _compressed(fmt, rows, tmp_path)
    link = LINKS[where](small)
    with pytest.raises(ObsdeltaError, match="is a symbolic link") as caught:
        open_dataset(small)
    assert str(link) in str(caught.value)


def test_a_pipe_in_a_folder_is_refused(cli: Cli, tmp_path: Path, rows: TensorDictBase) -> None:
    """Reading a pipe would wait forever; copying one copies nothing."""
    src = _plain("ted-memmap", rows, tmp_path)
    os.mkfifo(src / "notes.txt")
    says = [src / "notes.txt", "is neither a file nor a folder"]
    expect_error(cli, *command_line("compress", src, tmp_path), says=says)
