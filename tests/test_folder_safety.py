"""Folder inputs are self-contained and their metadata bounded.

A TED memmap folder, a replay-buffer dump and a compressed folder output are read only through
files inside them: a symbolic link anywhere below one is refused before anything is read
through it. Names obsdelta writes itself are refused in a user's own input, every byte of a leaf
file must be one ``meta.json`` describes, and nesting, keys and declared sizes are bounded.
Each refusal ends like any bad input: exit 1, one line on stderr naming the file, nothing
written, the input untouched; :func:`obsdelta_cli.open_dataset` raises an ``ObsdeltaError``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress, open_dataset
from obsdelta_cli.errors import ObsdeltaError
from obsdelta_cli.formats.torchrl_rb import STORAGE_META

from .conftest import Cli
from .test_cli_errors import _stderr, assert_one_error_line, expect_error, write
from .writers import write_d4rl, write_ted_hdf5

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
    src = write(fmt, rows, tmp_path)
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
    src = write(fmt, rows, tmp_path)
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
    src = write("ted-memmap", rows, tmp_path)
    os.mkfifo(src / "notes.txt")
    says = [src / "notes.txt", "is neither a file nor a folder"]
    expect_error(cli, *command_line("compress", src, tmp_path), says=says)


# ---------------------------------------------------------------------------------------------
# Names obsdelta writes itself, in a user's own dataset

OWN_NAMES: dict[str, Callable[[Path], Path]] = {
    "obsdelta.meta/": lambda root: _own_folder(root / "obsdelta.meta"),
    "obsdelta.arrays/": lambda root: _own_folder(root / "obsdelta.arrays"),
    "storage/obsdelta.meta/": lambda root: _own_folder(root / "storage" / "obsdelta.meta"),
    "storage/obsdelta.json": lambda root: _own_file(root / "storage" / "obsdelta.json"),
}


def _own_folder(path: Path) -> Path:
    """A user's folder of notes that happens to bear one of obsdelta's names."""
    path.mkdir()
    (path / "notes.txt").write_text("kept by the user\n")
    return path


def _own_file(path: Path) -> Path:
    path.write_text('{"note": "kept by the user"}\n')
    return path


@pytest.mark.parametrize(
    ("fmt", "where"),
    [
        ("ted-memmap", "obsdelta.meta/"),
        ("ted-memmap", "obsdelta.arrays/"),
        ("torchrl-rb", "obsdelta.meta/"),
        ("torchrl-rb", "obsdelta.arrays/"),
        ("torchrl-rb", "storage/obsdelta.meta/"),
        ("torchrl-rb", "storage/obsdelta.json"),
    ],
)
@pytest.mark.parametrize("command", ["compress", "report"])
def test_an_own_name_in_a_plain_folder_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, fmt: str, where: str, command: str
) -> None:
    """Today the user's folder is left out of the output, with exit 0."""
    src = write(fmt, rows, tmp_path)
    own = OWN_NAMES[where](src)
    says = [own, "is a name obsdelta writes itself"]
    expect_error(cli, *command_line(command, src, tmp_path), says=says)
    expect_error(cli, "compress", src, "--pack", "-o", tmp_path / "out.h5", says=says)


@pytest.mark.parametrize("value", ["tensor", "string"])
@pytest.mark.parametrize("command", ["compress", "report"])
def test_an_own_key_in_a_pt_file_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, value: str, command: str
) -> None:
    """A user's own ``_obsdelta`` leaf in a ``.pt`` file: a tensor there was a traceback, a
    string was called damaged."""
    td = rows.clone()
    if value == "tensor":
        td["_obsdelta"] = torch.zeros(td.shape)
    else:
        td.set_non_tensor("_obsdelta", "kept by the user")
    src = tmp_path / "own.pt"
    torch.save(td, src)
    says = [src, "key _obsdelta is a name obsdelta writes itself"]
    expect_error(cli, *command_line(command, src, tmp_path), says=says)


def test_an_own_name_is_refused_by_open_dataset(tmp_path: Path, rows: TensorDictBase) -> None:
    src = write("ted-memmap", rows, tmp_path)
    own = _own_folder(src / "obsdelta.arrays")
    with pytest.raises(ObsdeltaError, match="is a name obsdelta writes itself") as caught:
        open_dataset(src)
    assert str(own) in str(caught.value)


def test_own_names_deeper_in_a_dump_are_the_users(
    cli: Cli, tmp_path: Path, rows: TensorDictBase
) -> None:
    """Only the dump's root holds obsdelta's files: the same names below it are the user's
    and come back, byte for byte."""
    src = write("torchrl-rb", rows, tmp_path)
    kept = [
        _own_file(src / "writer" / "obsdelta.json"),
        _own_folder(src / "writer" / "obsdelta.meta") / "notes.txt",
    ]
    small, back = tmp_path / "small", tmp_path / "back"
    cli("compress", src, "-o", small, "--codec", "exact", "--quiet")
    cli("verify", small, "--quiet")
    cli("inflate", small, "-o", back, "--quiet")
    for file in kept:
        rel = file.relative_to(src)
        assert (small / rel).read_bytes() == file.read_bytes(), rel
        assert (back / rel).read_bytes() == file.read_bytes(), rel


def _d4rl_with_own_group(td: TensorDictBase, folder: Path) -> Path:
    src = write_d4rl(td, folder / "d4rl")
    with h5py.File(src, "r+") as f:
        f["obsdelta/delta/next_observations"] = np.zeros((len(td), 11), "f4")
        f["obsdelta/notes"] = np.bytes_(b"kept by the user")
    return src


def _d4rl_with_own_group_in_metadata(td: TensorDictBase, folder: Path) -> Path:
    """``/metadata/obsdelta``: where obsdelta keeps its group in a D4RL file with metadata."""
    src = write_d4rl(td, folder / "d4rl")
    with h5py.File(src, "r+") as f:
        f["metadata/obsdelta/notes"] = np.bytes_(b"kept by the user")
    return src


def _ted_h5_with_own_group(td: TensorDictBase, folder: Path) -> Path:
    td = td.clone()
    td["obsdelta", "score"] = torch.zeros(td.shape)
    return write_ted_hdf5(td, folder / "ted")


@pytest.mark.parametrize(
    ("writer", "name"),
    [
        (_d4rl_with_own_group, "/obsdelta"),
        (_d4rl_with_own_group_in_metadata, "/metadata/obsdelta"),
        (_ted_h5_with_own_group, "/obsdelta"),
    ],
)
@pytest.mark.parametrize("command", ["compress", "report"])
def test_an_own_group_in_a_plain_hdf5_file_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, writer: Callable, name: str, command: str
) -> None:
    src = writer(rows, tmp_path)
    says = [src, f"object {name} is a name obsdelta writes itself"]
    expect_error(cli, *command_line(command, src, tmp_path), says=says)


# ---------------------------------------------------------------------------------------------
# Every byte of a leaf file is one meta.json describes


def _edit_meta(meta_file: Path, edit: Callable[[dict], object]) -> None:
    """Rewrite a ``meta.json`` after ``edit`` changed what it holds."""
    content = json.loads(meta_file.read_text())
    edit(content)
    meta_file.write_text(json.dumps(content))


@pytest.mark.parametrize(
    ("change", "found"), [(+4096, "holds"), (-44, "holds"), (None, "is missing")]
)
@pytest.mark.parametrize(
    ("fmt", "compressed"),
    [("ted-memmap", False), ("torchrl-rb", False), ("ted-memmap", True), ("torchrl-rb", True)],
)
def test_a_leaf_file_of_another_size_is_refused(
    cli: Cli,
    tmp_path: Path,
    rows: TensorDictBase,
    fmt: str,
    compressed: bool,
    change: int | None,
    found: str,
) -> None:
    """Bytes past the leaf were left out of every output; a short or missing file is damage."""
    src = (_compressed if compressed else write)(fmt, rows, tmp_path)
    leaf = _storage(src) / "action.memmap"
    size = leaf.stat().st_size
    if change is None:
        leaf.unlink()
    elif change > 0:
        with leaf.open("ab") as fh:
            fh.write(os.urandom(change))
    else:
        os.truncate(leaf, size + change)
    says = [leaf, "key action", f"leaf file {found}", f"where meta.json describes {size}"]
    for command in ("compress", "report") if not compressed else ("verify", "inflate"):
        expect_error(cli, *command_line(command, src, tmp_path), says=says)
    if compressed:
        with pytest.raises(ObsdeltaError, match=f"where meta.json describes {size}"):
            open_dataset(src)


BAD_SHAPES = {
    "bool": ([True, 3], "leaf shape [true, 3] is not a list of sizes"),
    "negative": ([300, -3], "leaf shape [300, -3] is not a list of sizes"),
    "float": ([300.0, 3], "leaf shape [300.0, 3] is not a list of sizes"),
    "string": (["300", 3], 'leaf shape ["300", 3] is not a list of sizes'),
    "not-the-batch": ([150, 3], "leaf shape [150, 3] does not start with the batch shape [300]"),
    "huge-but-empty": ([300, 0, 2**62, 2**62], "describes more values than a file can hold"),
    "too-many-dims": ([300] + [1] * 40, "has more than 32 dimensions"),
}


@pytest.mark.parametrize("kind", list(BAD_SHAPES))
def test_a_leaf_shape_that_is_no_shape_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, kind: str
) -> None:
    src = write("ted-memmap", rows, tmp_path)
    shape, says = BAD_SHAPES[kind]
    _edit_meta(src / "meta.json", lambda m: m["action"].update(shape=shape))
    expect_error(cli, *command_line("compress", src, tmp_path), says=[src / "meta.json", says])


@pytest.mark.parametrize("shape", [[True], [-300], ["300"]], ids=["bool", "negative", "string"])
@pytest.mark.parametrize("fmt", ["ted-memmap", "torchrl-rb"])
def test_a_batch_shape_that_is_no_shape_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, fmt: str, shape: list
) -> None:
    src = write(fmt, rows, tmp_path)
    meta = _storage(src) / "meta.json"
    _edit_meta(meta, lambda m: m.update(shape=shape))
    says = [meta, f"batch shape {json.dumps(shape)} is not a list of sizes"]
    expect_error(cli, *command_line("report", src, tmp_path), says=says)


# ---------------------------------------------------------------------------------------------
# Hostile nesting and sizes are bounded


def _deep_json(depth: int) -> str:
    """A JSON object holding a value nested ``depth`` lists deep."""
    return '{"shape": [300], "x": ' + "[" * depth + "]" * depth + "}"


#: JSON files of a folder dataset, and which formats hold them.
DEEP: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "meta.json": ("ted-memmap", lambda root: root / "meta.json"),
    "next/meta.json": ("ted-memmap", lambda root: root / "next" / "meta.json"),
    "storage_metadata.json": ("torchrl-rb", lambda root: root / "storage" / STORAGE_META),
}


@pytest.mark.parametrize("where", list(DEEP))
@pytest.mark.parametrize("command", ["compress", "report"])
def test_a_deeply_nested_json_file_is_refused(
    cli: Cli, tmp_path: Path, rows: TensorDictBase, where: str, command: str
) -> None:
    """Python's JSON parser recurses: 100,000 brackets end it with RecursionError."""
    fmt, find = DEEP[where]
    src = write(fmt, rows, tmp_path)
    find(src).write_text(_deep_json(100_000))
    says = [find(src), "nests JSON 100,001 levels deep; obsdelta reads at most 32"]
    expect_error(cli, *command_line(command, src, tmp_path), says=says)


@pytest.mark.parametrize("fmt", ["ted-memmap", "torchrl-rb"])
@pytest.mark.parametrize("name", ["meta.json", "obsdelta.json"])
def test_a_deeply_nested_json_file_is_refused_by_open_dataset(
    tmp_path: Path, rows: TensorDictBase, fmt: str, name: str
) -> None:
    small = _compressed(fmt, rows, tmp_path)
    file = (_storage(small) if name == "meta.json" else small) / name
    file.write_text(_deep_json(100_000))
    with pytest.raises(ObsdeltaError, match="nests JSON 100,001 levels deep") as caught:
        open_dataset(small)
    assert str(file) in str(caught.value)


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` and its bytes, listed without recursion and opened relative
    to its folder (a path 1,200 folders long costs as much to resolve)."""
    out: dict[str, bytes] = {}
    folders = [(os.open(root, os.O_RDONLY), "")]
    while folders:
        fd, rel = folders.pop()
        with os.scandir(fd) as entries:
            for entry in entries:
                name = f"{rel}/{entry.name}"
                inner = os.open(entry.name, os.O_RDONLY, dir_fd=fd)
                if entry.is_dir(follow_symlinks=False):
                    folders.append((inner, name))
                else:
                    with os.fdopen(inner, "rb") as fh:
                        out[name] = fh.read()
        os.close(fd)
    return out


def _write_at(fd: int, name: str, data: bytes) -> None:
    """Write the file ``name`` of the folder open as ``fd``."""
    with os.fdopen(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as fh:
        fh.write(data)


def _remove(root: Path) -> None:
    """Delete ``root``, whose sub-folders may nest ``x/x/...`` deeper than ``shutil.rmtree``
    (and pytest's cleanup of old temporary folders) recurse: each chain is emptied from its
    bottom up, one folder open at a time."""
    for top in (p for p in (root / "x", root / "storage" / "x") if p.is_dir()):
        fd = os.open(top, os.O_RDONLY)
        while True:  # down to the bottom
            try:
                inner = os.open("x", os.O_RDONLY, dir_fd=fd)
            except FileNotFoundError:
                break
            os.close(fd)
            fd = inner
        while True:  # up again, deleting
            for entry in os.scandir(fd):
                os.unlink(entry.name, dir_fd=fd)
            if os.path.samestat(os.fstat(fd), top.stat()):
                break
            parent = os.open("..", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir("x", dir_fd=fd)
        os.close(fd)
    shutil.rmtree(root)


@pytest.fixture
def deep() -> Iterator[list[Path]]:
    """Folders to delete after the test, however deep they nest."""
    made: list[Path] = []
    yield made
    for folder in made:
        if folder.exists():
            _remove(folder)


def _nest(folder: Path, depth: int) -> None:
    """Sub-TensorDicts ``x/x/...`` ``depth`` deep below ``folder``, each holding a one-byte
    per-transition leaf, as tensordict lays them out; each made relative to the one above (a
    path 1,200 folders long costs as much to resolve)."""
    _edit_meta(folder / "meta.json", lambda m: m.update(x={"type": "TensorDict"}))
    batch = json.loads((folder / "meta.json").read_text())["shape"]
    leaf = {"device": "cpu", "shape": batch, "dtype": "torch.uint8", "is_nested": False}
    fd = os.open(folder, os.O_RDONLY)
    for level in range(depth):
        os.mkdir("x", dir_fd=fd)
        inner = os.open("x", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
        meta = {"flag": leaf, "shape": batch, "device": "cpu"}
        if level < depth - 1:
            meta["x"] = {"type": "TensorDict"}
        _write_at(fd, "meta.json", json.dumps(meta).encode())
        _write_at(fd, "flag.memmap", bytes(batch[0]))
    os.close(fd)


@pytest.mark.parametrize(
    ("fmt", "command", "depth"),
    [
        ("ted-memmap", "compress", 1200),  # Python's own recursion ends at 1,000 frames
        ("ted-memmap", "report", 65),
        ("torchrl-rb", "compress", 65),
        ("torchrl-rb", "report", 65),
    ],
)
def test_sub_tensordicts_nested_too_deep_are_refused(
    cli: Cli,
    tmp_path: Path,
    rows: TensorDictBase,
    fmt: str,
    command: str,
    depth: int,
    deep: list[Path],
) -> None:
    """The error contract checked without recursing (``expect_error`` hashes with rglob)."""
    src = write(fmt, rows, tmp_path)
    deep.append(src)
    _nest(_storage(src), depth)
    before = _snapshot(src)
    result = cli(*command_line(command, src, tmp_path), code=None)
    says = [src, "folders below it nest more than 64 levels deep"]
    assert_one_error_line(result.exit_code, result.stdout, _stderr(result), says=says)
    assert _snapshot(src) == before
    assert not (tmp_path / "out").exists()


def test_sub_tensordicts_nested_1200_deep_are_refused_by_open_dataset(
    tmp_path: Path, rows: TensorDictBase, deep: list[Path]
) -> None:
    small = _compressed("ted-memmap", rows, tmp_path)
    deep.append(small)
    _nest(small, 1200)
    with pytest.raises(ObsdeltaError, match="nest more than 64 levels deep"):
        open_dataset(small)


def test_too_many_keys_are_refused(cli: Cli, tmp_path: Path, rows: TensorDictBase) -> None:
    src = write("ted-memmap", rows, tmp_path)
    extra = {f"note{i}": {"type": "NonTensorData"} for i in range(100_001)}
    _edit_meta(src / "meta.json", lambda m: m.update(extra))
    says = [src / "meta.json", "name more than 100,000 keys"]
    expect_error(cli, *command_line("report", src, tmp_path), says=says)


def test_an_oversized_meta_json_is_refused_unread(
    cli: Cli, tmp_path: Path, rows: TensorDictBase
) -> None:
    src = write("ted-memmap", rows, tmp_path)
    meta = src / "meta.json"
    with meta.open("a") as fh:  # whitespace: still the same JSON
        fh.write(" " * (16 << 20))
    says = [meta, f"holds {meta.stat().st_size:,} bytes; obsdelta reads such a file up to"]
    expect_error(cli, *command_line("compress", src, tmp_path), says=says)
