"""Block checksums: slices of rows are checked from the values they serve, each block once."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from obsdelta_cli import compress, verify
from obsdelta_cli.blocks import CheckedRows, digests
from obsdelta_cli.checksum import BlockCheck, BlockFeed, block_rows
from obsdelta_cli.errors import DamagedError
from obsdelta_cli.formats import detect, key_str
from obsdelta_cli.formats.direct import MIN_DIRECT
from obsdelta_cli.formats.hdf5 import HDF5Format
from obsdelta_cli.formats.leaf import as_rows
from obsdelta_cli.inputs import manifest_of
from obsdelta_cli.rebuild import take

from .conftest import SAMPLE
from .manifests import manifest_of as recorded_manifest

BLOCK = 8


class CountedRows:
    """Rows read through slices, each read recorded (a lazy leaf's reads)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.shape, self.dtype = values, values.shape, values.dtype
        self.reads: list[tuple[int, int]] = []

    def __getitem__(self, key: Any) -> np.ndarray:
        start, stop, _ = key.indices(self.shape[0])
        self.reads.append((start, stop))
        return self.values[key].copy()


def _checked(values: np.ndarray) -> tuple[CheckedRows, CountedRows]:
    rows = CountedRows(values)
    return CheckedRows(rows, digests(values, BLOCK), BLOCK, file="f", key="k"), rows


def _values() -> np.ndarray:
    return np.arange(100 * 3, dtype=np.float32).reshape(100, 3)


@pytest.mark.parametrize("span", [slice(0, 100), slice(3, 61), slice(16, 32), slice(5, 7)])
def test_a_slice_is_read_once_and_its_whole_blocks_checked_from_it(span: slice) -> None:
    values = _values()
    checked, rows = _checked(values)
    got = checked[span]
    assert np.array_equal(got, values[span])
    first, last = span.start // BLOCK, -(-span.stop // BLOCK)
    assert checked.checked[first:last].all() and checked.checked.sum() == last - first
    # One read of the slice, and one more for each block its ends cut.
    cut = {
        b
        for b in (first, last - 1)
        if b * BLOCK < span.start or min((b + 1) * BLOCK, 100) > span.stop
    }
    assert rows.reads[0] == (span.start, span.stop) and len(rows.reads) == 1 + len(cut)
    rows.reads.clear()
    assert np.array_equal(checked[span], values[span])
    assert rows.reads == [(span.start, span.stop)]  # checked blocks are not read again


@pytest.mark.parametrize("span", [slice(0, 100), slice(20, 30), slice(23, 24)])
def test_damage_in_a_slice_is_caught_before_its_rows_are_served(span: slice) -> None:
    values = _values()
    checked, _ = _checked(values.copy())
    values[23, 1] += 1  # the stored rows now differ from what was hashed
    checked.rows.values = values
    with pytest.raises(DamagedError, match="rows 16-23 do not match"):
        checked[span]
    assert not checked.checked[2]


def test_damage_elsewhere_does_not_fail_a_slice_that_misses_it() -> None:
    values = _values()
    checked, rows = _checked(values.copy())
    rows.values[90, 0] = -1
    assert np.array_equal(checked[0:80], values[0:80])
    with pytest.raises(DamagedError, match="rows 88-95"):
        checked[85:95]


def test_take_gives_the_caller_its_own_rows_of_a_mapped_file(tmp_path: Any) -> None:
    mapped = np.memmap(tmp_path / "m", dtype=np.float32, mode="w+", shape=(100, 3))
    mapped[:] = _values()
    checked = CheckedRows(mapped, digests(_values(), BLOCK), BLOCK, file="f", key="k")
    for rows in (mapped, checked):
        got = take(rows, slice(10, 20))
        got[:] = -1
        assert np.array_equal(mapped[10:20], _values()[10:20])


@pytest.mark.parametrize("cuts", [[], [1], [7, 8, 9], [3, 50, 51, 99]])
def test_a_block_check_fed_in_any_pieces_checks_every_block(cuts: list[int]) -> None:
    values = _values()
    check = BlockCheck(len(values), digests(values, BLOCK), BLOCK, file="f", key="k")
    for piece in np.split(values, cuts):
        check.update(piece)
    assert check.done()


@pytest.mark.parametrize("cuts", [[], [1], [7, 8, 9], [3, 50, 51, 99]])
def test_a_block_feed_gives_the_digests_of_a_whole_read_from_reused_buffers(
    cuts: list[int],
) -> None:
    values = _values()
    feed = BlockFeed(values.shape, values.dtype, BLOCK * values[0].nbytes)
    buffer = np.empty_like(values)
    for piece in np.split(values, cuts):
        reused = buffer[: len(piece)]  # as a pass refills one buffer chunk after chunk
        reused[:] = piece
        feed.update(reused)
        reused[:] = -7
    assert feed.result() == digests(values, BLOCK)


def test_a_block_feed_fed_other_rows_gives_no_digests() -> None:
    values = _values()
    short = BlockFeed(values.shape, values.dtype, BLOCK * values[0].nbytes)
    short.update(values[:50])
    other = BlockFeed(values.shape, values.dtype, BLOCK * values[0].nbytes)
    other.update(values.astype(np.float64))
    assert short.result() is None and other.result() is None


@pytest.mark.parametrize("row", [0, 37, 99])
def test_a_block_check_stops_at_the_damaged_block(row: int) -> None:
    values = _values()
    check = BlockCheck(len(values), digests(values, BLOCK), BLOCK, file="f", key="k")
    damaged = values.copy()
    damaged[row, 2] = -1
    first = row // BLOCK * BLOCK
    last = min(first + BLOCK, len(values)) - 1
    fed = 0
    with pytest.raises(DamagedError, match=f"rows {first}-{last} do not match"):
        for piece in np.split(damaged, [10, 45, 90]):
            check.update(piece)
            fed += len(piece)
    assert fed <= row  # raised by the piece that completed the damaged block


@pytest.mark.parametrize(
    ("codec", "target", "row_bytes"),
    [
        ("exact", "action.memmap", 12),
        ("exact", "observation.memmap", 44),
        ("fp16", "next/delta/observation.memmap", 22),
    ],
)
def test_inflate_names_the_damaged_rows_and_writes_nothing(
    tmp_path: Any, hopper: Any, codec: str, target: str, row_bytes: int
) -> None:
    """A flipped bit in a leaf inflate reads itself (copied, or read to rebuild the next
    observations) stops it at that leaf's damaged block, which the error names."""
    from obsdelta_cli import compress, inflate

    hopper.memmap(tmp_path / "in")
    compress(tmp_path / "in", tmp_path / "small", codec=codec)
    leaf = tmp_path / "small" / target
    data = bytearray(leaf.read_bytes())
    at = len(data) // 2
    data[at] ^= 0x10
    leaf.write_bytes(bytes(data))
    key = target.removesuffix(".memmap")
    with pytest.raises(DamagedError, match=rf"key {key}: rows \d+-\d+ do not match") as caught:
        inflate(tmp_path / "small", tmp_path / "back")
    first, last = map(int, caught.value.message.split()[1].split("-"))
    assert first <= at // row_bytes <= last
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize("codec", ["exact", "fp16"])
@pytest.mark.parametrize(
    "sample", ["hopper_ted", "hopper_rb", "hopper_d4rl.hdf5", "hopper_robomimic.hdf5"]
)
def test_recorded_block_digests_are_those_of_the_leaves_as_read(
    sample: str, codec: str, tmp_path: Any
) -> None:
    """compress takes most block digests as it reads or writes the rows (encoded, copied,
    stored); every one equals the digests of the leaf as a reader reads it."""
    out = tmp_path / sample
    compress(SAMPLE / sample, out, codec=codec)
    fmt = detect(out)
    source = fmt.open(out)
    try:
        manifest = manifest_of(source)
        names = {key_str(k): leaf for k, leaf in source.leaves.items()}
        assert manifest.blocks and set(manifest.blocks) <= set(names)
        for name, recorded in manifest.blocks.items():
            rows = as_rows(names[name], manifest.batch_dims)
            block = block_rows(rows.shape, rows.dtype, manifest.hash_block_bytes)
            assert recorded == digests(rows, block), name
    finally:
        fmt.close(source)


def test_small_datasets_copied_whole_are_digested_from_the_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The datasets an HDF5 output copies whole are digested once every copy is done: a small
    one from the input's leaf, which holds the same values (opening a file's thousands of them
    again in the output would cost more than reading them), a large one from the output;
    every digest is that of the output as h5py reads it."""
    src = tmp_path / "in.hdf5"
    shutil.copy(SAMPLE / "hopper_d4rl.hdf5", src)
    rows = 5000
    big = np.random.default_rng(0).standard_normal((rows, MIN_DIRECT // (8 * rows) + 1))
    with h5py.File(src, "a") as f:
        assert f["observations"].shape[0] == rows
        f.create_dataset("infos/big", data=big, chunks=(625, 1), compression="gzip")
    taken: dict[str, bool] = {}
    original_written = HDF5Format.written_leaf

    def spy(self: HDF5Format, sink: Any, key: Any, original: Any = None) -> Any:
        leaf = original_written(self, sink, key, original)
        taken[key_str(key)] = leaf is original
        return leaf

    monkeypatch.setattr(HDF5Format, "written_leaf", spy)
    out = tmp_path / "out.h5"
    compress(src, out, codec="exact")
    assert taken["actions"] and taken["infos/qpos"]  # 60 KB and 240 KB
    assert taken["infos/big"] is False
    with h5py.File(out, "r") as f:
        manifest = recorded_manifest(f)
        for name in ("actions", "infos/qpos", "infos/big"):
            values = f[name][()]
            block = block_rows(values.shape, values.dtype, manifest["hash"]["block_bytes"])
            assert manifest["blocks"][name] == digests(values, block), name
    verify(out)
