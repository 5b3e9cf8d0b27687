"""Chunks decoded outside HDF5 are exactly what HDF5 reads: every filter pipeline taken, on
real values of every dtype, whatever the chunk shape, edge chunks and chunks a filter skipped;
what is not taken is left to HDF5, and a damaged chunk is one error naming its dataset."""

from __future__ import annotations

import ctypes
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest
from tensordict import TensorDictBase

from obsdelta_cli.errors import InputError
from obsdelta_cli.filters import hdf5_library, undo_frame_delta
from obsdelta_cli.formats import hdf5_chunks
from obsdelta_cli.formats.hdf5_chunks import DirectChunks, DirectWrites, row_reader, unshuffle
from obsdelta_cli.formats.hdf5_leaves import H5Leaf, leaves_of

from .test_filters import DTYPES, real_values

#: ``create_dataset`` keywords of every pipeline taken; HDF5 puts the shuffle first.
PIPELINES: dict[str, dict[str, Any]] = {
    "gzip": {"compression": "gzip", "compression_opts": 4},
    "shuffle-gzip": {"compression": "gzip", "shuffle": True},
    "zstd": dict(hdf5plugin.Zstd(clevel=3)),
    "shuffle-zstd": {"shuffle": True, **hdf5plugin.Zstd(clevel=1)},
}
#: Pipelines ending with HDF5's Fletcher-32 checksum (a packed file's), checked as read.
CHECKED: dict[str, dict[str, Any]] = {
    "gzip-fletcher32": {"compression": "gzip", "fletcher32": True},
    "shuffle-zstd-fletcher32": {"shuffle": True, "fletcher32": True, **hdf5plugin.Zstd(clevel=1)},
}
#: The smallest chunk decoded outside HDF5, as shipped (the tests below take every chunk).
SHIPPED_MIN_CHUNK_BYTES = hdf5_chunks.MIN_CHUNK_BYTES
#: Chunk shapes, as a function of the values' shape: whole rows, part rows, tiny chunks.
CHUNKS: dict[str, Callable[[tuple[int, ...]], tuple[int, ...]]] = {
    "rows": lambda shape: (97, *shape[1:]),
    "part-rows": lambda shape: (61, *[max(1, (d + 1) // 2) for d in shape[1:]]),
    "tiny": lambda shape: (3, *[max(1, d // 5) for d in shape[1:]]),
}


@pytest.fixture(autouse=True)
def small_chunks_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small files, small chunks: taken here as large ones are (see the last test)."""
    monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", 0)


def _values(name: str, hopper: TensorDictBase, pong: TensorDictBase) -> np.ndarray:
    values = real_values(name, hopper, pong)
    return values[:400] if name == "uint8-frames" else values[:1500]


def _file(path: Path, values: np.ndarray, **kwargs: Any) -> h5py.Dataset:
    with h5py.File(path, "w") as f:
        f.create_dataset("v", data=values, **kwargs)
    return h5py.File(path, "r")["v"]


def _direct(ds: h5py.Dataset, path: Path) -> DirectChunks:
    fd = open(path, "rb")  # noqa: SIM115 - closed with the test's garbage
    chunks = DirectChunks.of(ds, path, fd.fileno)
    assert chunks is not None
    return chunks


def _record_decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The coordinates of every chunk decoded outside HDF5 from now on, in order."""
    decoded: list[tuple[int, ...]] = []
    real = DirectChunks.decode

    def decode(self: DirectChunks, coord: tuple[int, ...], stored: Any) -> np.ndarray:
        decoded.append(coord)
        return real(self, coord, stored)

    monkeypatch.setattr(DirectChunks, "decode", decode)
    return decoded


def _ranges(n: int, per: int) -> list[tuple[int, int]]:
    # Each spans two chunks along time at least: one is left to HDF5 (see below).
    return [(0, n), (1, 2 * per + 5), (per, 3 * per), (n - per - 7, n), (n - per - 2, n + 10)]


@pytest.mark.parametrize("chunking", list(CHUNKS))
@pytest.mark.parametrize("pipeline", [*PIPELINES, *CHECKED])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_are_what_hdf5_reads(
    tmp_path: Path,
    hopper: TensorDictBase,
    pong: TensorDictBase,
    dtype: str,
    pipeline: str,
    chunking: str,
) -> None:
    values = _values(dtype, hopper, pong)
    chunks = CHUNKS[chunking](values.shape)
    path = tmp_path / "v.h5"
    ds = _file(path, values, chunks=chunks, **{**PIPELINES, **CHECKED}[pipeline])
    direct = _direct(ds, path)
    for start, stop in _ranges(len(values), chunks[0]):
        rows = direct.rows(start, stop)
        assert rows is not None and rows.dtype == values.dtype
        np.testing.assert_array_equal(rows, ds[start:stop])
    # A read of one chunk is left to HDF5 and its chunk cache; one row of chunks that each
    # hold part of a row (D4RL's, one column each) is decoded here.
    one_chunk = tuple(chunks[1:]) == values.shape[1:]
    row = direct.rows(0, 1)
    assert (row is None) == one_chunk
    if row is not None:
        np.testing.assert_array_equal(row, ds[0:1])


def test_whole_chunks_are_the_rows_of_each(tmp_path: Path, pong: TensorDictBase) -> None:
    frames = pong["pixels"].numpy()[:250]
    path = tmp_path / "v.h5"
    ds = _file(path, frames, chunks=(64, *frames.shape[1:]), **PIPELINES["zstd"])
    got = _direct(ds, path).whole([3, 0, 2], undo_frame_delta)
    for index, chunk in zip([3, 0, 2], got, strict=True):
        assert chunk is not None
        np.testing.assert_array_equal(chunk, undo_frame_delta(frames[index * 64 : index * 64 + 64]))


def test_a_filter_skipped_for_a_chunk_is_not_undone(tmp_path: Path) -> None:
    # HDF5 stores a chunk unfiltered when a filter fails or is optional; its mask says so.
    values = np.arange(400, dtype=np.float32).reshape(100, 4)
    path = tmp_path / "v.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset(
            "v", shape=values.shape, dtype="f4", chunks=(25, 4), shuffle=True, compression="gzip"
        )
        ds[:50] = values[:50]
        ds.id.write_direct_chunk((50, 0), values[50:75].tobytes(), filter_mask=0b11)
        ds.id.write_direct_chunk((75, 0), unshuffle_inverse(values[75:]), filter_mask=0b10)
    ds = h5py.File(path, "r")["v"]
    np.testing.assert_array_equal(ds[...], values)  # what HDF5 makes of it
    rows = _direct(ds, path).rows(0, 100)
    assert rows is not None
    np.testing.assert_array_equal(rows, values)


def unshuffle_inverse(values: np.ndarray) -> bytes:
    """HDF5's shuffle of ``values``: byte 0 of every element first, then byte 1, ..."""
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(-1, values.dtype.itemsize)
    return raw.T.tobytes()


def test_unshuffle_undoes_the_shuffle() -> None:
    values = np.random.default_rng(0).random(1001).astype(np.float64)
    raw = unshuffle(unshuffle_inverse(values), 8)
    np.testing.assert_array_equal(raw.view(np.float64), values)


def test_chunks_never_written_are_left_to_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "v.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset(
            "v", shape=(100, 3), dtype="f4", chunks=(10, 3), compression="gzip", fillvalue=7.0
        )
        ds[:40] = 1.0
    ds = h5py.File(path, "r")["v"]
    direct = _direct(ds, path)
    assert direct.rows(0, 40) is not None
    assert direct.rows(30, 60) is None  # HDF5 gives the fill value there
    leaf = H5Leaf(ds, path)
    np.testing.assert_array_equal(leaf.read(30, 60), ds[30:60])


def _partial_chunks_unfiltered(path: Path, values: np.ndarray) -> h5py.Dataset:
    """A dataset whose partial edge chunks HDF5 stores unfiltered (H5Pset_chunk_opts)."""
    lib = hdf5_library()
    if lib is None or not hasattr(lib, "H5Pset_chunk_opts"):
        pytest.skip("the HDF5 library cannot be called here (not Linux)")
    lib.H5Pset_chunk_opts.argtypes = [ctypes.c_int64, ctypes.c_uint]
    with h5py.File(path, "w", libver="latest") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((64, 5))
        dcpl.set_deflate(6)
        assert lib.H5Pset_chunk_opts(dcpl.id, hdf5_chunks.DONT_FILTER_PARTIAL_CHUNKS) >= 0
        space = h5py.h5s.create_simple(values.shape)
        dsid = h5py.h5d.create(f.id, b"v", h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, values)
    return h5py.File(path, "r")["v"]


@pytest.mark.parametrize("opts", ["asked", "unknown"])
def test_edge_chunks_are_read_as_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hopper: TensorDictBase, opts: str
) -> None:
    values = np.ascontiguousarray(hopper["observation"].numpy()[:300, :7])
    if opts == "unknown":  # where the chunk options cannot be asked, HDF5 reads the edges
        monkeypatch.setattr(hdf5_chunks, "_chunk_opts", lambda plist: None)
    ds = _partial_chunks_unfiltered(tmp_path / "v.h5", values)
    direct = _direct(ds, tmp_path / "v.h5")
    assert not direct.edges_direct
    for start, stop in _ranges(len(values), 64):
        rows = direct.rows(start, stop)
        assert rows is not None
        np.testing.assert_array_equal(rows, values[start:stop])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # contiguous
        {"chunks": (10, 11)},  # unfiltered: HDF5 copies as fast
        {"chunks": (10, 11), "scaleoffset": 2},
        {"chunks": (10, 11), "compression": "lzf"},
    ],
    ids=["contiguous", "unfiltered", "scaleoffset", "lzf"],
)
def test_what_is_not_taken_is_left_to_hdf5(
    tmp_path: Path, hopper: TensorDictBase, kwargs: dict[str, Any]
) -> None:
    values = hopper["observation"].numpy()[:200]
    ds = _file(tmp_path / "v.h5", values, **kwargs)
    assert DirectChunks.of(ds, tmp_path / "v.h5", lambda: -1) is None


def test_big_endian_values_come_as_hdf5_gives_them(tmp_path: Path, hopper: TensorDictBase) -> None:
    values = hopper["observation"].numpy()[:200].astype(">f8")
    ds = _file(tmp_path / "v.h5", values, chunks=(10, 11), compression="gzip", shuffle=True)
    rows = _direct(ds, tmp_path / "v.h5").rows(5, 200)
    assert rows is not None and rows.dtype == ds[5:200].dtype == np.dtype(">f8")
    np.testing.assert_array_equal(rows, values[5:])


def test_a_file_open_for_writing_is_read_by_hdf5(tmp_path: Path, hopper: TensorDictBase) -> None:
    values = hopper["observation"].numpy()[:200]
    path = tmp_path / "v.h5"
    _file(path, values, chunks=(10, 11), compression="gzip").file.close()
    with h5py.File(path, "r+") as f:
        leaf = leaves_of(f, path)[("v",)]
        assert leaf.direct_chunks() is None
        np.testing.assert_array_equal(leaf.read(0, 200), values)
    with h5py.File(path, "r") as f:
        leaf = leaves_of(f, path)[("v",)]
        assert leaf.direct_chunks() is not None
        np.testing.assert_array_equal(leaf.read(0, 200), values)


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_a_damaged_chunk_is_one_error_naming_the_dataset(
    tmp_path: Path, hopper: TensorDictBase, pipeline: str
) -> None:
    values = hopper["observation"].numpy()[:400]
    path = tmp_path / "v.h5"
    ds = _file(path, values, chunks=(50, 11), **PIPELINES[pipeline])
    offset, size = ds.id.get_chunk_info(2).byte_offset, ds.id.get_chunk_info(2).size
    ds.file.close()
    with open(path, "r+b") as fh:  # the chunk's stored bytes, truncated to garbage
        fh.seek(offset)
        fh.write(b"\xff" * size)
    with h5py.File(path, "r") as f:
        leaf = leaves_of(f, path)[("v",)]
        with pytest.raises(InputError, match=r"chunk at \[100, 0\].*does not decode") as err:
            leaf.read(0, 400)
        assert err.value.key == "v" and "damaged" in (err.value.hint or "")


def _flip_in_chunk(path: Path, ds: h5py.Dataset, index: int, at: float) -> None:
    """Flip one bit of chunk ``index``'s stored bytes, ``at`` of the way in."""
    info = ds.id.get_chunk_info(index)
    ds.file.close()
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + int(at * (info.size - 1)))
        byte = fh.read(1)[0]
        fh.seek(-1, 1)
        fh.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("at", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("pipeline", list(CHECKED))
def test_one_flipped_bit_fails_its_checksum_here_and_in_hdf5(
    tmp_path: Path, hopper: TensorDictBase, pipeline: str, at: float
) -> None:
    values = hopper["observation"].numpy()[:400]
    path = tmp_path / "v.h5"
    _flip_in_chunk(path, _file(path, values, chunks=(50, 11), **CHECKED[pipeline]), 2, at)
    with h5py.File(path, "r") as f:
        leaf = leaves_of(f, path)[("v",)]
        with pytest.raises(InputError, match=r"chunk at \[100, 0\].*checksum does not match"):
            leaf.read(0, 400)
        with pytest.raises(OSError, match="filter returned failure"):
            f["v"][100:150]
        np.testing.assert_array_equal(leaf.read(150, 400), values[150:])


def test_small_chunks_are_left_to_hdf5(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", 1 << 18)
    values = np.repeat(hopper["observation"].numpy(), 12, axis=0)  # 12 copies: zstd's job
    per = -(-(1 << 18) // values[0].nbytes)  # the fewest rows of 256 KiB
    for rows, taken in [(per - 1, False), (per, True)]:
        ds = _file(tmp_path / f"{rows}.h5", values, chunks=(rows, 11), **PIPELINES["zstd"])
        assert (DirectChunks.of(ds, tmp_path / f"{rows}.h5", lambda: -1) is not None) == taken


def test_reads_in_order_decode_each_chunk_once(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = hopper["observation"].numpy()
    path = tmp_path / "v.h5"
    ds = _file(path, values, chunks=(40, 11), **PIPELINES["shuffle-zstd"])
    direct = _direct(ds, path)
    decoded = _record_decodes(monkeypatch)
    # As a stream reads a leaf: windows of whole chunks, each with the next window's first row.
    for start in range(0, len(values) - 80, 80):
        rows = direct.rows(start, start + 81)
        assert rows is not None
        np.testing.assert_array_equal(rows, values[start : start + 81])
    assert sorted(decoded) == [(c, 0) for c in range(0, len(values), 40)]
    # Out of order, nothing read ahead is used, and the rows are still right.
    rows = direct.rows(200, 290)
    assert rows is not None
    np.testing.assert_array_equal(rows, values[200:290])


@pytest.mark.parametrize("overlap", [0, 1])
def test_reads_in_order_decode_the_next_chunks_ahead(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch, overlap: int
) -> None:
    """Reads that go on where the last one stopped, or one row before it (a stream that reads
    each row's successor with it), have the chunks after them decoded while the caller works:
    each read submits the chunks past its end."""
    values = hopper["observation"].numpy()
    path = tmp_path / "v.h5"
    ds = _file(path, values, chunks=(40, 11), **PIPELINES["shuffle-zstd"])
    direct = _direct(ds, path)
    submitted: list[int] = []
    real = DirectChunks._submit

    def submit(self: DirectChunks, coord: tuple[int, ...], *args: Any) -> Any:
        submitted.append(coord[0])
        return real(self, coord, *args)

    monkeypatch.setattr(DirectChunks, "_submit", submit)
    for start in range(0, 400, 80):
        rows = direct.rows(start, start + 80 + overlap)
        assert rows is not None
        np.testing.assert_array_equal(rows, values[start : start + 80 + overlap])
        past = -(-(start + 80 + overlap) // 40) * 40
        assert {past, past + 40} <= set(submitted), (start, submitted)
    assert sorted(submitted) == sorted(set(submitted))  # each chunk decoded once


def _rows_in_child(path: Path, queue: Any) -> None:
    with h5py.File(path, "r") as f:
        rows = _direct(f["v"], path).rows(0, 400)
        queue.put(None if rows is None else rows.tobytes())


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_decodes_with_threads_of_its_own(
    tmp_path: Path, hopper: TensorDictBase
) -> None:
    # As a DataLoader worker forked after the parent read: the parent's decoding threads do
    # not exist in the child, which must not hand them its chunks.
    values = hopper["observation"].numpy()[:400]
    path = tmp_path / "v.h5"
    ds = _file(path, values, chunks=(50, 11), **PIPELINES["zstd"])
    assert _direct(ds, path).rows(0, 400) is not None and hdf5_chunks.decoders.started
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_rows_in_child, args=(path, queue))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child waited on its parent's threads")
    assert child.exitcode == 0 and queue.get(timeout=5) == values.tobytes()


def test_d4rl_gzip_column_chunks_are_decoded_outside_hdf5(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D4RL as it ships: gzip, h5py's default chunks of one column (here 18 KB each). The
    packing reads (``row_reader``) decode them on every core, whatever rows are asked, and
    give what h5py gives; a dataset of a few rows is left to HDF5 without being looked at."""
    monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", SHIPPED_MIN_CHUNK_BYTES)
    obs = hopper["observation"].numpy()
    values = np.concatenate([obs * (1 + k / 7) for k in range(-(-24_000 // len(obs)))])[:24_000]
    path = tmp_path / "d4rl.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("observations", data=values, compression="gzip", chunks=(4_500, 1))
        f.create_dataset("rewards", data=values[:40, 0], compression="gzip", chunks=(8,))
    decoded = _record_decodes(monkeypatch)
    with h5py.File(path, "r") as f, open(path, "rb") as fd:
        read = row_reader(f["observations"], path, fd.fileno)
        for start, stop in [(0, 24_000), (0, 4_000), (4_000, 9_001), (9_000, 24_000), (7, 8)]:
            np.testing.assert_array_equal(read(start, stop), values[start:stop])
        assert {c[1] for c in decoded} == set(range(11))  # every column, outside HDF5
        monkeypatch.setattr(DirectChunks, "of", None)  # not asked: calling it would fail
        small = row_reader(f["rewards"], path, fd.fileno)
        np.testing.assert_array_equal(small(0, 40), values[:40, 0])


#: The pipelines :class:`DirectWrites` filters itself: those HDF5 ships.
WRITTEN = ["gzip", "shuffle-gzip", "gzip-fletcher32"]


@pytest.mark.parametrize("chunking", list(CHUNKS))
@pytest.mark.parametrize("pipeline", WRITTEN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_chunks_filtered_here_read_back_through_hdf5(
    dtype: str,
    pipeline: str,
    chunking: str,
    tmp_path: Path,
    hopper: TensorDictBase,
    pong: TensorDictBase,
) -> None:
    """Written in blocks of whole chunks along time (the last one partial, and chunks cut by
    the dataset's edge in every dimension), read back by HDF5 as the values, every chunk
    HDF5 did not write itself stored as HDF5 would store it."""
    values = _values(dtype, hopper, pong)
    chunks = CHUNKS[chunking](values.shape)
    path = tmp_path / "v.h5"
    kwargs = {**PIPELINES, **CHECKED}[pipeline]
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("v", shape=values.shape, dtype=values.dtype, chunks=chunks, **kwargs)
        writes = DirectWrites.of(ds)
        assert writes is not None
        step = 3 * chunks[0]
        for start in range(0, len(values), step):
            block = values[start : start + step].copy()
            writes.write(start, block)
            block[...] = 0  # the caller's array is its own again: what was given is kept
        writes.finish()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["v"][()], values)
        # The chunks written here are what HDF5 writes for the same values (one zlib).
        with h5py.File(tmp_path / "hdf5.h5", "w") as g:
            g.create_dataset("v", data=values, chunks=chunks, **kwargs)
            for i in range(f["v"].id.get_num_chunks()):
                at = f["v"].id.get_chunk_info(i).chunk_offset
                assert f["v"].id.read_direct_chunk(at) == g["v"].id.read_direct_chunk(at), at


@pytest.mark.parametrize("pipeline", ["zstd", "shuffle-zstd"])
def test_pipelines_hdf5_does_not_ship_are_not_written_here(
    tmp_path: Path, hopper: TensorDictBase, pipeline: str
) -> None:
    values = hopper["observation"].numpy()[:200]
    assert DirectWrites.of(_file(tmp_path / "v.h5", values, **PIPELINES[pipeline])) is None
