"""Error handling of the command line, end to end.

Every problem with the data or the files must end the same way: exit code 1 (2 for usage
errors), exactly one line on stderr starting ``obsdelta: error: `` that names the file (and the
key, where one is involved), no traceback, nothing on stdout, no output or temporary file left
behind, and the input byte-for-byte unchanged. :func:`expect_error` checks all of that.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import h5py
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli.formats import FORMATS

from .conftest import read_any, tree_hash
from .manifests import manifest_of, rewrite_manifest
from .writers import WRITERS

PREFIX = "obsdelta: error: "
DIR_FORMATS = [name for name in FORMATS if name in ("ted-memmap", "torchrl-rb")]
#: Temporary siblings of an output (".NAME.obsdelta-tmp-PID", ".NAME.obsdelta-old-PID").
TMP_GLOB = "*.obsdelta-*"

# ---------------------------------------------------------------------------------------------
# The contract, in one place


def _paths(args: Sequence[str | Path]) -> tuple[Path | None, Path | None]:
    """INPUT (the argument after the command) and OUTPUT (after ``-o``) of a command line."""
    inp = args[1] if len(args) > 1 and isinstance(args[1], Path) else None
    out = Path(args[args.index("-o") + 1]) if "-o" in args else None
    return inp, out


@contextmanager
def files_untouched(args: Sequence[str | Path]) -> Iterator[None]:
    """Around a failing command: the input keeps its bytes; an existing output keeps its bytes,
    a new one never appears; no temporary sibling is left in the output's folder."""
    inp, out = _paths(args)
    inp_hash = tree_hash(inp) if inp is not None and inp.exists() else None
    out_hash = tree_hash(out) if out is not None and out.exists() else None
    yield
    if inp_hash is not None:
        assert tree_hash(inp) == inp_hash, f"input {inp} was modified"
    if out is not None:
        if out_hash is None:
            assert not out.exists(), f"partial output {out} left behind"
        else:
            assert tree_hash(out) == out_hash, f"existing output {out} was modified"
        if out.parent.is_dir():
            leftovers = list(out.parent.glob(TMP_GLOB))
            assert not leftovers, f"temporary files left behind: {leftovers}"


def assert_one_error_line(
    exit_code: int, stdout: str, stderr: str, *, code: int = 1, says: Sequence[object] = ()
) -> str:
    """Exit ``code``, nothing on stdout, one clean ``obsdelta: error:`` line holding ``says``."""
    assert exit_code == code, (exit_code, stdout, stderr)
    assert "Traceback" not in stderr, stderr
    assert stdout == "", stdout
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith(PREFIX), line
    for text in says:
        assert str(text) in line, f"{str(text)!r} missing from: {line}"
    return line


def _stderr(result) -> str:
    """stderr as a terminal shows it: the runner keeps an escaped exception aside, Python
    would print its traceback."""
    exc = result.exception
    if exc is None or isinstance(exc, SystemExit):
        return result.stderr
    return result.stderr + "".join(traceback.format_exception(exc))


def expect_error(cli, *args: str | Path, code: int = 1, says: Sequence[object] = ()) -> str:
    """Run ``obsdelta *args`` and check the whole error contract; return the error line."""
    with files_untouched(args):
        result = cli(*args, code=None)
        return assert_one_error_line(
            result.exit_code, result.stdout, _stderr(result), code=code, says=says
        )


def expect_usage_error(cli, *args: str | Path) -> None:
    """A command line the parser rejects: exit 2, no traceback, no stdout, nothing written."""
    with files_untouched(args):
        result = cli(*args, code=None)
        assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
        assert "Traceback" not in _stderr(result), _stderr(result)
        assert result.stdout == ""


# ---------------------------------------------------------------------------------------------
# Data helpers


def write(fmt: str, td: TensorDictBase, tmp_path: Path, name: str = "in") -> Path:
    """``td`` written in ``fmt`` as ``tmp_path/name_src/name`` (``name.pt`` for ted-pt).

    Each dataset gets a folder of its own: replay-buffer writers keep a scratch folder beside it.
    """
    home = tmp_path / f"{name}_src"
    home.mkdir()
    return WRITERS[fmt](td, home / name)


def out_for(src: Path, folder: Path, name: str = "out") -> Path:
    """An output path in ``folder`` for a dataset like ``src``."""
    return folder / (name + src.suffix if src.is_file() else name)


def command_line(command: str, src: Path, tmp_path: Path, *extra: str) -> list[str | Path]:
    """``command src [-o OUT] extra...``; ``report`` writes nothing, so takes no ``-o``."""
    out = [] if command == "report" else ["-o", out_for(src, tmp_path)]
    return [command, src, *out, *extra]


def compressed(cli, fmt: str, td: TensorDictBase, tmp_path: Path) -> Path:
    """A dataset in ``fmt`` compressed by obsdelta (which must succeed)."""
    src = write(fmt, td, tmp_path, "plain")
    dst = out_for(src, tmp_path, "small")
    cli("compress", src, "-o", dst, "--quiet")
    return dst


def leaf_file(src: Path, name: str) -> Path:
    """The raw memmap file of root leaf ``name`` in a memmap folder or replay-buffer dump."""
    root = src / "storage" if (src / "storage").is_dir() else src
    return root / f"{name}.memmap"


def leaf_keys(path: Path) -> set[tuple[str, ...]]:
    return set(read_any(path).keys(include_nested=True, leaves_only=True))


def edit_obsdelta_meta(path: Path, **changes: object) -> None:
    """Change fields of the obsdelta metadata of a compressed dataset of any format."""
    if path.suffix == ".h5":
        with h5py.File(path, "r+") as f:
            rewrite_manifest(f, {**manifest_of(f), **changes})
    elif path.is_file():
        td = torch.load(path, weights_only=False)
        entry = td.get_non_tensor("_obsdelta")
        entry = {**entry, "meta": json.dumps({**json.loads(entry["meta"]), **changes})}
        td.set_non_tensor("_obsdelta", entry)
        torch.save(td, path)
    else:
        sidecar = path / "obsdelta.json"
        sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), **changes}))


# ---------------------------------------------------------------------------------------------
# Inputs obsdelta cannot read


@pytest.mark.parametrize("command", ["compress", "inflate", "report"])
def test_missing_input(cli, tmp_path: Path, command: str) -> None:
    src = tmp_path / "nowhere"
    expect_error(cli, *command_line(command, src, tmp_path), says=[src, "no such file"])


UNREADABLE = {
    "empty-dir": lambda p: p.mkdir(),
    "dir-without-meta.json": lambda p: (
        p.mkdir(),
        (p / "observation.memmap").write_bytes(bytes(64)),
    ),
    "text-file": lambda p: p.write_text("step,observation\n0,1.5\n"),
    "random-bytes": lambda p: p.write_bytes(random.Random(0).randbytes(4096)),
    "pickle-like-garbage": lambda p: p.write_bytes(b"\x80" + b"\x01" * 100),
}


@pytest.mark.parametrize("kind", list(UNREADABLE))
@pytest.mark.parametrize("command", ["compress", "inflate", "report"])
def test_unreadable_input(cli, tmp_path: Path, kind: str, command: str) -> None:
    src = tmp_path / "data"
    UNREADABLE[kind](src)
    expect_error(cli, *command_line(command, src, tmp_path), says=[src])


@pytest.mark.parametrize("fmt", DIR_FORMATS)
@pytest.mark.parametrize("command", ["compress", "report"])
def test_truncated_leaf_file(cli, hopper, tmp_path: Path, fmt: str, command: str) -> None:
    src = write(fmt, hopper, tmp_path)
    leaf = leaf_file(src, "observation")
    os.truncate(leaf, leaf.stat().st_size // 2)
    says = [leaf, "key observation", "truncated"]
    expect_error(cli, *command_line(command, src, tmp_path), says=says)


@pytest.mark.parametrize(
    "payload",
    [{"observation": torch.zeros(3, 2)}, torch.zeros(3, 2), [1, 2, 3]],
    ids=["dict", "tensor", "list"],
)
def test_pt_file_without_tensordict(cli, tmp_path: Path, payload: object) -> None:
    src = tmp_path / "in.pt"
    torch.save(payload, src)
    says = [src, f"holds a {type(payload).__name__}, not a TensorDict"]
    expect_error(cli, *command_line("compress", src, tmp_path), says=says)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_truncated_pt_file(cli, hopper, tmp_path: Path, legacy: bool, keep: float) -> None:
    src = tmp_path / "in.pt"
    torch.save(hopper, src, _use_new_zipfile_serialization=not legacy)
    os.truncate(src, int(src.stat().st_size * keep))
    expect_error(cli, *command_line("compress", src, tmp_path), says=[src])
    expect_error(cli, *command_line("report", src, tmp_path), says=[src])


# ---------------------------------------------------------------------------------------------
# Data that cannot be encoded as asked


@pytest.mark.parametrize(
    ("data", "rows", "count"),
    [
        ("hopper", (slice(100, 107),), "7 of 3000 rows"),
        ("cheetah", (1, slice(10, 13)), "3 of 1000 rows"),  # batch [4, 250]: rows count flat
    ],
)
def test_fp16_overflow_then_fp32(
    cli, request, tmp_path: Path, fmt: str, data: str, rows: tuple, count: str
) -> None:
    td = request.getfixturevalue(data).clone()
    td["next", "observation"][rows] = 1e5  # |delta| beyond float16's 65504; obs stays small
    src = write(fmt, td, tmp_path)
    args = command_line("compress", src, tmp_path)
    says = [src, "key next/observation", count, "fp16's range", "--codec fp32"]
    expect_error(cli, *args, "--codec", "fp16", "--no-exceptions", says=says)

    cli(*args, "--codec", "fp32", "--no-exceptions", "--quiet")
    back = read_any(out_for(src, tmp_path))
    assert back["next", "delta", "observation"].dtype == torch.float32
    assert ("next", "observation") not in back.keys(include_nested=True)


@pytest.mark.parametrize("codec", ["fp16", "fp32"])
def test_nonfinite_next_observation(cli, hopper, tmp_path: Path, fmt: str, codec: str) -> None:
    td = hopper.clone()
    td["next", "observation"][5, 0] = float("nan")
    td["next", "observation"][6:8, 3] = float("inf")
    td["next", "observation"][2999, -1] = -float("inf")
    src = write(fmt, td, tmp_path)
    says = [src, "key next/observation", "4 of 3000 rows", "NaN or inf", "--no-exceptions"]
    args = command_line("compress", src, tmp_path, "--codec", codec, "--no-exceptions")
    expect_error(cli, *args, says=says)


MISMATCHES = {
    "shape": lambda nxt: nxt[..., :10].clone(),
    "dtype": lambda nxt: nxt.double(),
}


def _mismatched(hopper: TensorDictBase, mismatch: str) -> TensorDictBase:
    td = hopper.clone()
    td.set(("next", "observation"), MISMATCHES[mismatch](td["next", "observation"]))
    return td


@pytest.mark.parametrize("mismatch", list(MISMATCHES))
@pytest.mark.parametrize("key", ["observation", "next/observation"])
@pytest.mark.parametrize("command", ["compress", "report"])
def test_mismatched_twin_named_explicitly(
    cli, hopper, tmp_path: Path, fmt: str, mismatch: str, key: str, command: str
) -> None:
    src = write(fmt, _mismatched(hopper, mismatch), tmp_path)
    args = command_line(command, src, tmp_path, "--key", key)
    expect_error(cli, *args, says=[src, f"key {key}", "differs from next/observation"])


@pytest.mark.parametrize("mismatch", list(MISMATCHES))
def test_mismatched_twin_is_not_selected(
    cli, hopper, tmp_path: Path, fmt: str, mismatch: str
) -> None:
    td = _mismatched(hopper, mismatch)
    alone = write(fmt, td, tmp_path, "alone")
    says = [alone, "no observation pair can be encoded", "--key"]
    expect_error(cli, *command_line("compress", alone, tmp_path), says=says)

    td.set("state", td["observation"][..., :4].clone())
    td.set(("next", "state"), td["observation"][..., :4] + 0.25)
    src = write(fmt, td, tmp_path)
    cli(*command_line("compress", src, tmp_path, "--quiet", "--codec", "fp16"))
    keys = leaf_keys(out_for(src, tmp_path))
    assert ("next", "delta", "state") in keys
    assert ("next", "delta", "observation") not in keys
    assert ("next", "observation") in keys


@pytest.mark.parametrize(
    ("data", "key", "says"),
    [
        ("hopper", "velocity", "no such leaf"),
        ("hopper", "action", "has no twin next/action"),
        ("hopper", "", "empty key"),
    ],
)
@pytest.mark.parametrize("command", ["compress", "report"])
def test_bad_key(
    cli, request, tmp_path: Path, fmt: str, command: str, data: str, key: str, says: str
) -> None:
    src = write(fmt, request.getfixturevalue(data), tmp_path)
    args = command_line(command, src, tmp_path, "--key", key)
    expect_error(cli, *args, says=[src, f"key {key}:", says])


def test_integer_key_needs_a_lossless_codec(cli, pong, tmp_path: Path, fmt: str) -> None:
    src = write(fmt, pong, tmp_path)
    args = command_line("compress", src, tmp_path, "--key", "pixels")
    says = [src, "key pixels:", "uint8, which the chosen codec cannot encode"]
    expect_error(cli, *args, "--codec", "fp16", says=says)
    cli(*args, "--quiet")  # the default is lossless, and exact encodes integers
    assert ("next", "pixels") not in leaf_keys(out_for(src, tmp_path))


@pytest.mark.parametrize("command", ["compress", "report"])
def test_zero_rows(cli, hopper, tmp_path: Path, fmt: str, command: str) -> None:
    if fmt == "torchrl-rb":  # a replay buffer cannot be extended with nothing: empty it
        src = write(fmt, hopper, tmp_path)
        meta_file = src / "storage" / "storage_metadata.json"
        meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "len": 0}))
    else:
        src = write(fmt, hopper[:0], tmp_path)
    expect_error(cli, *command_line(command, src, tmp_path), says=[src, "no rows"])


def _zero_width(td: TensorDictBase, key: str) -> TensorDictBase:
    """``td`` with observation ``key`` and its next observation holding no values per row."""
    td = td.clone()
    width = td[key][..., :0]
    td[key], td["next", key] = width, width.clone()
    return td


@pytest.mark.parametrize("command", ["compress", "report"])
def test_rows_of_no_values(cli, hopper, tmp_path: Path, fmt: str, command: str) -> None:
    src = write(fmt, _zero_width(hopper, "observation"), tmp_path)
    says = [src, "observation has rows of no values, so nothing to compress"]
    expect_error(cli, *command_line(command, src, tmp_path), says=says)
    named = [src, "key observation:", "rows of no values"]
    expect_error(cli, *command_line(command, src, tmp_path, "--key", "observation"), says=named)


@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
def test_a_pair_of_no_values_is_kept_beside_the_others(
    cli, hopper, tmp_path: Path, fmt: str, pack: bool
) -> None:
    # A camera key of 0x0 pixels, or an empty goal, beside real observations.
    td = hopper.clone()
    td["goal"] = torch.zeros(*td.shape, 0, 3)
    td["next", "goal"] = td["goal"].clone()
    src = write(fmt, td, tmp_path)
    small = tmp_path / "small.h5" if pack else out_for(src, tmp_path, "small")
    cli("compress", src, "-o", small, "--quiet", *(["--pack"] if pack else []))
    if not pack:
        kept = leaf_keys(small)
        assert ("next", "goal") in kept and ("next", "observation") not in kept
    cli("verify", small, "--quiet")
    back = out_for(src, tmp_path, "back")
    cli("inflate", small, "-o", back, "--quiet")
    if src.suffix == ".h5":  # object for object
        again = read_any(back)
        for key in td.keys(include_nested=True, leaves_only=True):
            assert again[key].shape == td[key].shape and torch.equal(again[key], td[key]), key
    elif src.is_file():  # byte for byte
        assert back.read_bytes() == src.read_bytes()
    else:
        assert tree_hash(back) == tree_hash(src)


# ---------------------------------------------------------------------------------------------
# The wrong kind of dataset for the command


def test_compress_twice_and_inflate_plain(cli, hopper, tmp_path: Path, fmt: str) -> None:
    small = compressed(cli, fmt, hopper, tmp_path)
    says = [small, "already compressed", "inflate it"]
    expect_error(cli, *command_line("compress", small, tmp_path), says=says)

    plain = write(fmt, hopper, tmp_path)
    says = [plain, "not compressed by obsdelta", "compress it first"]
    expect_error(cli, *command_line("inflate", plain, tmp_path), says=says)


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("compress", "already holds next/delta leaves but no obsdelta metadata"),
        ("report", "already holds next/delta leaves but no obsdelta metadata"),
        ("inflate", "not compressed by obsdelta"),
    ],
)
def test_foreign_delta_leaves(
    cli, hopper, tmp_path: Path, fmt: str, command: str, says: str
) -> None:
    # What TorchRL's NextObservationDelta leaves in a buffer: ("next", k) replaced by a
    # float16 ("next", "delta", k), and no obsdelta metadata.
    td = hopper.clone()
    nxt = td.pop(("next", "observation"))
    td.set(("next", "delta", "observation"), (nxt - td["observation"]).to(torch.float16))
    src = write(fmt, td, tmp_path)
    expect_error(cli, *command_line(command, src, tmp_path), says=[src, says])


@pytest.mark.parametrize(
    ("version", "says"),
    [
        (999, ["obsdelta format 999", "upgrade obsdelta"]),
        ("1", ["obsdelta_format has the wrong type"]),
    ],
    ids=["newer", "not-an-int"],
)
@pytest.mark.parametrize("command", ["inflate", "report"])
def test_compressed_format_version(
    cli, hopper, tmp_path: Path, fmt: str, command: str, version: object, says: list[str]
) -> None:
    small = compressed(cli, fmt, hopper, tmp_path)
    edit_obsdelta_meta(small, obsdelta_format=version)
    expect_error(cli, *command_line(command, small, tmp_path), says=[small, *says])


# ---------------------------------------------------------------------------------------------
# Where the output goes


def _source(cli, command: str, fmt: str, hopper: TensorDictBase, tmp_path: Path) -> Path:
    """An input ``command`` accepts: plain for compress, compressed for inflate."""
    if command == "compress":
        return write(fmt, hopper, tmp_path)
    return compressed(cli, fmt, hopper, tmp_path)


@pytest.mark.parametrize("command", ["compress", "inflate"])
def test_existing_output(cli, hopper, tmp_path: Path, fmt: str, command: str) -> None:
    src = _source(cli, command, fmt, hopper, tmp_path)
    args = command_line(command, src, tmp_path)
    dst = out_for(src, tmp_path)
    if src.is_dir():
        dst.mkdir()
        (dst / "keep.txt").write_text("not ours to delete")
    else:
        dst.write_text("not ours to delete")
    expect_error(cli, *args, says=[dst, "already exists", "--force"])
    # --force replaces only what obsdelta could have written: not a folder or file of others.
    expect_error(cli, *args, "--force", says=[dst])
    if src.is_dir():
        shutil.rmtree(dst)
    else:
        dst.unlink()

    cli(*args, "--quiet")  # an earlier output, which --force may replace
    cli(*args, "--force", "--quiet", *(["--codec", "fp16"] if command == "compress" else []))
    assert (("next", "delta", "observation") in leaf_keys(dst)) == (command == "compress")
    assert not list(tmp_path.glob(TMP_GLOB))


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["no-force", "force"])
def test_output_is_input(cli, hopper, tmp_path: Path, fmt: str, force: list[str]) -> None:
    src = write(fmt, hopper, tmp_path)
    expect_error(cli, "compress", src, "-o", src, *force, says=[src, "overlaps the input"])
    small = compressed(cli, fmt, hopper, tmp_path)
    expect_error(cli, "inflate", small, "-o", small, *force, says=[small, "overlaps the input"])


@pytest.mark.parametrize("fmt", DIR_FORMATS)
@pytest.mark.parametrize("force", [[], ["--force"]], ids=["no-force", "force"])
def test_output_overlaps_input_folder(
    cli, hopper, tmp_path: Path, fmt: str, force: list[str]
) -> None:
    src = write(fmt, hopper, tmp_path)
    inside = [src / "out", leaf_file(src, "observation").parent / "next" / "out"]
    for dst in [*inside, src.parent]:  # the last one holds the input: --force would delete it
        expect_error(cli, "compress", src, "-o", dst, *force, says=["overlaps the input"])


def test_output_folder_missing(cli, hopper, tmp_path: Path, fmt: str) -> None:
    src = write(fmt, hopper, tmp_path)
    folder = tmp_path / "no" / "such"
    says = [folder, "output folder does not exist", "create it first"]
    expect_error(cli, "compress", src, "-o", folder / "out", says=says)


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Make ``folder`` unwritable: chmod, or for root (who ignores modes) chattr +i."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", folder], capture_output=True).returncode:
        pytest.skip(
            "running as root, which ignores chmod 0o555, and chattr +i is unavailable here; "
            "test_disk_full covers failed writes"
        )
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", folder], check=True)


@pytest.mark.parametrize("command", ["compress", "inflate"])
def test_read_only_output_folder(cli, hopper, tmp_path: Path, fmt: str, command: str) -> None:
    src = _source(cli, command, fmt, hopper, tmp_path)
    folder = tmp_path / "locked"
    folder.mkdir()
    with read_only(folder):
        says = ["cannot write", "permissions"]
        expect_error(cli, command, src, "-o", out_for(src, folder), says=says)
    assert list(folder.iterdir()) == []


def _limit_file_size() -> None:
    # Writes past 20 kB fail with EFBIG, as on a full disk (SIGXFSZ would kill the process).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))


def test_disk_full(hopper, tmp_path: Path, fmt: str) -> None:
    # A separate process, so the limit cannot hit pytest; inflate shares the same writer.
    src = write(fmt, hopper, tmp_path)
    folder = tmp_path / "small_disk"
    folder.mkdir()
    args = ["compress", src, "-o", out_for(src, folder)]
    with files_untouched(args):
        run = subprocess.run(
            [sys.executable, "-m", "obsdelta_cli", *map(str, args)],
            preexec_fn=_limit_file_size,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        says = ["cannot write", "free space"]
        assert_one_error_line(run.returncode, run.stdout, run.stderr, says=says)
    assert list(folder.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Usage errors


@pytest.mark.parametrize(
    ("data", "time_dim"), [("hopper", "5"), ("hopper", "1"), ("hopper", "-2"), ("cheetah", "2")]
)
def test_time_dim_out_of_range(cli, request, tmp_path: Path, data: str, time_dim: str) -> None:
    src = write("ted-pt", request.getfixturevalue(data), tmp_path)
    args = command_line("compress", src, tmp_path, "--time-dim", time_dim)
    says = [src, f"--time-dim {time_dim} is not a batch dimension"]
    expect_error(cli, *args, code=2, says=says)


@pytest.mark.parametrize(
    "extra",
    [
        ["compress", "-o", "OUT", "--codec", "zstd"],
        ["report", "--codec", "fp8"],
        ["compress"],
        ["inflate"],
        ["compress", "-o", "OUT", "--time-dim", "last"],
        ["compress", "-o", "OUT", "--chunk-mb", "0"],
    ],
    ids=[
        "compress-codec",
        "report-codec",
        "compress-no-output",
        "inflate-no-output",
        "time-dim-word",
        "chunk-mb-zero",
    ],
)
def test_usage_errors(cli, hopper, tmp_path: Path, extra: list[str]) -> None:
    src = write("ted-pt", hopper, tmp_path)
    command, *rest = extra
    expect_usage_error(cli, command, src, *[tmp_path / "out.pt" if a == "OUT" else a for a in rest])
