"""Training reads of compressed HDF5 files whose datasets are filtered in chunks of one column,
as D4RL ships them: decoded chunks are kept, within ``cache_mb``, and each band of a dataset's
rows is decoded once while it stays kept."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress, open_dataset
from obsdelta_cli.dataset import ObsdeltaDataset
from obsdelta_cli.errors import DamagedError
from obsdelta_cli.formats.chunk_cache import BandReads, ChunkCache
from obsdelta_cli.formats.d4rl import TED_NAMES
from obsdelta_cli.formats.hdf5_leaves import H5Leaf

#: Rows per chunk: h5py's default chunks of a 1 M-row D4RL file span 1/64 of its rows and one
#: column; these span 1/12 of the 3,000 rows of the sample.
CHUNK_ROWS = 250
BATCH = 256
TORCHRL = importlib.util.find_spec("torchrl") is not None
#: D4RL's dataset of each key an item of ``open_dataset`` has.
D4RL_KEYS = {name[0]: key for name, key in TED_NAMES.items()}


def column_chunked_d4rl(td: TensorDictBase, path: Path) -> Path:
    """The sample rollout in D4RL's layout, every dataset gzip-filtered in chunks of
    ``CHUNK_ROWS`` rows and one column, as h5py chunks a D4RL file of 1 M rows."""
    flat = td.reshape(-1)
    terminated = flat["next", "terminated"].reshape(-1).numpy()
    columns = {
        "observations": flat["observation"].numpy(),
        "next_observations": flat["next", "observation"].numpy(),
        "actions": flat["action"].numpy(),
        "rewards": flat["next", "reward"].reshape(-1).numpy(),
        "terminals": terminated,
        "timeouts": flat["next", "truncated"].reshape(-1).numpy() & ~terminated,
        "infos/traj_ids": flat["collector", "traj_ids"].numpy(),
    }
    with h5py.File(path, "w") as f:
        for name, values in columns.items():
            chunks = (CHUNK_ROWS, *[1] * (values.ndim - 1))
            f.create_dataset(name, data=values, chunks=chunks, compression="gzip")
        f["metadata/algorithm"] = np.bytes_(b"SAC")
    return path


@pytest.fixture
def d4rl_gzip(tmp_path: Path, hopper: TensorDictBase) -> tuple[Path, Path]:
    """The column-chunked D4RL file and its compressed output."""
    src = column_chunked_d4rl(hopper, tmp_path / "hopper.hdf5")
    compress(src, tmp_path / "small.hdf5")
    return src, tmp_path / "small.hdf5"


def _caches(data: ObsdeltaDataset) -> dict[str, ChunkCache]:
    """The decoded-chunk cache of every dataset of the file, by name."""
    return {
        "/".join(key): leaf.bands.cache
        for key, leaf in data._source.leaves.items()
        if isinstance(leaf, H5Leaf) and leaf.bands is not None
    }


def _original(src: Path) -> dict[tuple[str, ...], np.ndarray]:
    with h5py.File(src, "r") as f:
        return {key: f[name][()] for name, key in D4RL_KEYS.items()}


def _batches(count: int, rows: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, rows, BATCH) for _ in range(count)]


def test_random_batches_equal_the_original(d4rl_gzip: tuple[Path, Path]) -> None:
    src, small = d4rl_gzip
    original = _original(src)
    data = open_dataset(small)
    try:
        # Read through kept chunks: the compressed observations are the original's datasets.
        assert {"observations", "actions", "rewards"} <= set(_caches(data))
        for idx in _batches(20, len(data)):  # unsorted, with repeats
            batch = data[torch.from_numpy(idx)]
            for key, values in original.items():
                got = batch[key].numpy().reshape(values[idx].shape)
                assert np.array_equal(got, values[idx]), key
        assert sum(c.stats.hits for c in _caches(data).values()) > 0
    finally:
        data.close()


@pytest.mark.skipif(not TORCHRL, reason="needs torchrl")
def test_torchrl_storage_reads_through_kept_chunks(d4rl_gzip: tuple[Path, Path]) -> None:
    from obsdelta_cli.storage import ObsdeltaStorage

    src, small = d4rl_gzip
    original = _original(src)
    storage = ObsdeltaStorage(small)
    try:
        for idx in _batches(5, len(storage), seed=1):
            batch = storage.get(torch.from_numpy(idx))
            for key in (("observation",), ("next", "observation"), ("action",)):
                values = original[key]
                assert np.array_equal(batch[key].numpy(), values[idx]), key
        assert _caches(storage._data)["observations"].stats.decodes > 0
    finally:
        storage.close()


def test_kept_chunks_stay_within_cache_mb(d4rl_gzip: tuple[Path, Path]) -> None:
    src, small = d4rl_gzip
    original = _original(src)
    # Room for about 3 of the 12 bands of the observations (11 float32 columns).
    cache_mb = 3 * CHUNK_ROWS * 11 * 4 / 2**20
    data = open_dataset(small, cache_mb=cache_mb)
    try:
        caches = _caches(data)
        for idx in _batches(10, len(data), seed=2):
            batch = data[idx]
            assert np.array_equal(batch["observation"].numpy(), original["observation",][idx])
            for name, cache in caches.items():
                assert cache.capacity == int(cache_mb * 2**20), name
                assert cache.nbytes <= cache.capacity, name
                assert cache.nbytes == sum(v.nbytes for v in cache._kept.values()), name
        assert caches["observations"].stats.evictions > 0  # the budget was reached
    finally:
        data.close()


def test_each_band_is_decoded_once_while_kept(d4rl_gzip: tuple[Path, Path]) -> None:
    """Many random batches decode each band of each dataset at most once when the whole
    dataset fits the budget: decodes are bounded by the bands, not by the batches."""
    _, small = d4rl_gzip
    data = open_dataset(small)
    try:
        for idx in _batches(50, len(data), seed=3):
            data[idx]
        bands = -(-len(data) // CHUNK_ROWS)
        caches = _caches(data)
        for name, cache in caches.items():
            assert 0 < cache.stats.decodes <= bands, name
            assert cache.stats.evictions == 0, name
        assert caches["observations"].stats.hits >= 49 * 2  # successors read it too
    finally:
        data.close()


def test_commands_keep_no_decoded_chunks(d4rl_gzip: tuple[Path, Path]) -> None:
    """The commands read each chunk once, in order: nothing is kept for them."""
    from obsdelta_cli.inputs import open_input

    fmt, source = open_input(d4rl_gzip[1])
    try:
        leaf = source.leaves["observations",]
        assert isinstance(leaf, H5Leaf) and leaf.bands is None
    finally:
        fmt.close(source)


def _random_walk_d4rl(path: Path, rows: int, chunk_rows: int) -> Path:
    """A D4RL file of ``rows`` rows of random walks (episodes of 100 steps), gzip-filtered in
    chunks of ``chunk_rows`` rows and one column."""
    rng = np.random.default_rng(4)
    states = np.cumsum(rng.standard_normal((rows + 1, 3)), axis=0).astype(np.float32)
    ends = np.zeros(rows, dtype=bool)
    ends[99::100] = True
    columns = {
        "observations": states[:-1],
        "next_observations": states[1:],
        "actions": rng.standard_normal((rows, 3)).astype(np.float32),
        "rewards": rng.standard_normal(rows).astype(np.float32),
        "terminals": ends,
        "timeouts": np.zeros(rows, dtype=bool),
    }
    with h5py.File(path, "w") as f:
        for name, values in columns.items():
            chunks = (chunk_rows, *[1] * (values.ndim - 1))
            f.create_dataset(name, data=values, chunks=chunks, compression="gzip")
    return path


def test_a_damaged_row_fails_its_block_even_with_its_chunk_kept(tmp_path: Path) -> None:
    """A chunk decoded for the check of one block, and kept, still has the other block it
    spans checked on its first read."""
    # Blocks of actions (12 bytes a row) are 65,536 rows: the chunk of rows 50,000-74,999
    # spans the first two.
    src = _random_walk_d4rl(tmp_path / "walk.hdf5", 140_000, 25_000)
    small = tmp_path / "small.hdf5"
    compress(src, small)
    with h5py.File(small, "r+") as f:
        ds = f["actions"]
        values = ds[70_000]
        values[0] = np.nextafter(values[0], np.float32(10))
        ds[70_000] = values
    data = open_dataset(small)
    try:
        data.read(np.array([50_000]), keys=[("action",)])  # the first block: checked, kept
        assert _caches(data)["actions"].stats.decodes == 3
        with pytest.raises(DamagedError, match="actions"):
            data.read(np.array([70_000]), keys=[("action",)])
    finally:
        data.close()


def test_reads_of_bands_are_copies() -> None:
    """What a read returns can be changed by its caller without changing what is kept."""
    cache = ChunkCache(1 << 20)
    bands = BandReads(10, 4, lambda a, b: np.arange(a, b, dtype=np.int64), cache)
    bands.read(0, 2)[:] = -1
    bands.select(np.array([0, 1]))[:] = -1
    assert bands.read(0, 4).tolist() == [0, 1, 2, 3]
    assert cache.stats.decodes == 1
