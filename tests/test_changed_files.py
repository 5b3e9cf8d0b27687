"""A file replaced, truncated or removed under an open reader: the reader keeps reading the file
it opened, or says that the file changed; never another exception, never rows of two files,
never "damaged" for a sound file."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress, open_dataset
from obsdelta_cli.dataset import ObsdeltaDataset
from obsdelta_cli.errors import FileChangedError

from .conftest import ROOT
from .writers import WRITERS

KINDS = ["ted-memmap", "torchrl-rb", "ted-pt", "d4rl-hdf5", "robomimic-hdf5", "ted-hdf5", "packed"]
CHANGED = "changed while it was read"
#: Times the output is written again while it is read.
WRITES = 12


@pytest.fixture(scope="module")
def versions(hopper: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
    """Two rollouts of one shape whose every observation differs."""
    first = hopper[:600].clone()
    second = first.clone()
    second["observation"] += 1
    second["next", "observation"] += 1
    return first, second


def _inputs(
    kind: str, versions: tuple[TensorDictBase, TensorDictBase], tmp_path: Path
) -> tuple[Path, Path, Path]:
    """The two versions written as ``kind``, and where their output goes."""
    writer = WRITERS["d4rl-hdf5" if kind == "packed" else kind]
    made = []
    for name, td in zip("ab", versions, strict=True):
        (tmp_path / name).mkdir()
        made.append(writer(td.clone(), tmp_path / name / "in"))
    out = tmp_path / ("out.h5" if kind == "packed" else "out" + made[0].suffix)
    return made[0], made[1], out


def _bits(td: TensorDictBase) -> dict[str, bytes]:
    return {
        str(k): v.contiguous().view(torch.uint8).numpy().tobytes()
        for k, v in td.items(include_nested=True, leaves_only=True)
    }


def _all_rows(data: ObsdeltaDataset) -> dict[str, bytes]:
    return _bits(data[0 : len(data)])


def _rows_of(path: Path) -> dict[str, bytes]:
    data = open_dataset(path)
    try:
        return _all_rows(data)
    finally:
        data.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_keeps_reading_the_file_it_opened(
    kind: str, versions: tuple[TensorDictBase, TensorDictBase], tmp_path: Path
) -> None:
    """An output written again, then removed, under an open reader: it still returns the rows
    of the file it opened (memmap folders mapped their leaves by name at the first random
    read, and returned the new file's rows; robomimic files called the new file damaged)."""
    a, b, out = _inputs(kind, versions, tmp_path)
    pack = kind == "packed"
    compress(a, out, codec="exact", pack=pack)
    want = _rows_of(out)
    data = open_dataset(out)
    try:
        compress(b, out, codec="exact", pack=pack, force=True)
        assert _rows_of(out) != want  # the new file holds other rows
        assert _all_rows(data) == want
        shutil.rmtree(out) if out.is_dir() else out.unlink()
        assert _all_rows(data) == want
    finally:
        data.close()


@pytest.mark.parametrize("kind", ["ted-memmap", "d4rl-hdf5"])
def test_a_worker_reopening_a_replaced_file_says_it_changed(
    kind: str, versions: tuple[TensorDictBase, TensorDictBase], tmp_path: Path
) -> None:
    """A DataLoader worker reopens the file by name: one replaced since the dataset was opened
    is refused, rather than served as if it were the file the parent opened."""
    a, b, out = _inputs(kind, versions, tmp_path)
    compress(a, out, codec="exact")
    data = open_dataset(out)
    try:
        state = pickle.dumps(data)
        assert len(pickle.loads(state)) == len(data)  # the same file: reopened
        compress(b, out, codec="exact", force=True)
        with pytest.raises(FileChangedError, match=CHANGED) as caught:
            pickle.loads(state)
        assert str(out) in str(caught.value) and "open it again" in str(caught.value)
    finally:
        data.close()


@pytest.mark.parametrize("kind", ["d4rl-hdf5", "packed"])
def test_a_file_truncated_under_a_reader_has_changed_not_been_damaged(
    kind: str, versions: tuple[TensorDictBase, TensorDictBase], tmp_path: Path
) -> None:
    """A file cut short in place after it was opened: the read that fails says the file
    changed (it was called damaged). Chunked HDF5 files are read with ``pread``; a file
    mapped into memory cannot be cut short under its reader safely (see the limitations)."""
    a, _, out = _inputs(kind, versions, tmp_path)
    compress(a, out, codec="fp16", pack=kind == "packed")
    data = open_dataset(out)
    try:
        os.truncate(out, out.stat().st_size // 2)
        with pytest.raises(FileChangedError, match=CHANGED):
            _all_rows(data)
    finally:
        data.close()


@pytest.mark.parametrize("kind", ["ted-memmap", "ted-pt", "robomimic-hdf5"])
def test_an_output_replaced_while_it_is_opened_is_opened_whole(
    kind: str,
    versions: tuple[TensorDictBase, TensorDictBase],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The output is replaced after its metadata is read and before its exception rows are:
    the open starts again and serves the new file whole (the old metadata with the new rows
    was called damaged, or gave rows of neither)."""
    a, b, out = _inputs(kind, versions, tmp_path)
    compress(b, out, codec="exact")
    want = _rows_of(out)
    compress(a, out, codec="exact", force=True)
    build = ObsdeltaDataset._build
    replaced = []

    def replace_once(self: ObsdeltaDataset, *args: object) -> object:
        if not replaced:
            replaced.append(compress(b, out, codec="exact", force=True))
        return build(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ObsdeltaDataset, "_build", replace_once)
    data = open_dataset(out)
    try:
        assert replaced and _all_rows(data) == want
    finally:
        data.close()


_WRITER = """
import sys
from typer.testing import CliRunner
from obsdelta_cli.cli import app
first, second, out, times = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
runner = CliRunner()
for done in range(times):
    source = first if done % 2 else second
    result = runner.invoke(app, ["compress", source, "-o", out, "--force", "-q"])
    assert result.exit_code == 0, result.output
"""


@pytest.mark.parametrize("kind", ["ted-memmap", "ted-pt", "d4rl-hdf5"])
def test_reads_while_compress_force_replaces_the_output(
    kind: str, versions: tuple[TensorDictBase, TensorDictBase], tmp_path: Path
) -> None:
    """Readers (``open_dataset`` and the TorchRL storage, in turn) open and read the output in
    a loop while another process runs ``compress --force`` over it, from two inputs in turn:
    every read returns the rows of one of the two files whole, or says the file changed
    (``FileNotFoundError`` and "damaged" were raised before)."""
    pytest.importorskip("torchrl")  # the TorchRL storage reads in turn with open_dataset
    from obsdelta_cli.storage import ObsdeltaStorage

    a, b, out = _inputs(kind, versions, tmp_path)
    compress(a, out)
    wants = [_rows_of(out)]
    compress(b, out, force=True)
    wants.append(_rows_of(out))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(a), str(b), str(out), str(WRITES)],
        env=env,
    )
    seen: Counter[str] = Counter()
    rng = np.random.default_rng(0)
    try:
        while writer.poll() is None:
            reader = ObsdeltaDataset if seen.total() % 2 else ObsdeltaStorage
            try:
                data = reader(out)
            except FileChangedError as exc:
                assert CHANGED in str(exc)
                seen["changed"] += 1
                continue
            try:
                version = None
                for _ in range(3):
                    idx = torch.from_numpy(rng.integers(0, len(data), 64))
                    got = _bits(data.get(idx) if isinstance(data, ObsdeltaStorage) else data[idx])
                    found = [
                        i
                        for i, want in enumerate(wants)
                        if got.keys() <= {*want}
                        and all(v == _bits_at(want, k, idx, len(data)) for k, v in got.items())
                    ]
                    assert found and version in (None, *found), "rows of neither file"
                    version = found[0]
                    seen["rows"] += 1
            except FileChangedError as exc:
                assert CHANGED in str(exc) and str(out) in str(exc)
                seen["changed"] += 1
            finally:
                data.close()
    finally:
        writer.wait(timeout=120)
    assert writer.returncode == 0
    assert seen["rows"] >= 10, seen


def _bits_at(whole: dict[str, bytes], key: str, idx: torch.Tensor, rows: int) -> bytes:
    """The bytes of rows ``idx`` of leaf ``key``, from the bytes of all its rows."""
    values = np.frombuffer(whole[key], dtype=np.uint8).reshape(rows, -1)
    return values[idx.numpy()].tobytes()


def test_what_was_read_of_a_replaced_file_is_not_taken_for_the_new_one(
    versions: tuple[TensorDictBase, TensorDictBase], tmp_path: Path
) -> None:
    """A reader opens an output, then another process puts a new output at its name before the
    reader reads the manifest (and checks the file's pointers): what it found is remembered for
    the file it opened, not for what the name holds now. Before, the old file's manifest was
    remembered for the new file, and the next reader of it said it was damaged."""
    import h5py

    from obsdelta_cli.formats import hdf5_safety
    from obsdelta_cli.formats.hdf5_meta import read_meta

    a, b, out = _inputs("d4rl-hdf5", versions, tmp_path)
    newer = tmp_path / "newer.hdf5"
    compress(a, out)
    compress(b, newer)
    with h5py.File(newer) as f:
        wanted_meta = read_meta(f, newer)
    wanted = _rows_of(newer)
    with h5py.File(out) as f:  # opened, then replaced
        os.replace(newer, out)
        old_meta = read_meta(f, out)
        hdf5_safety.check_contained(f, out)
    assert old_meta != wanted_meta
    with h5py.File(out) as f:
        assert read_meta(f, out) == wanted_meta
    assert _rows_of(out) == wanted
