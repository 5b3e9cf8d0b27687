"""Packed-file filters: chunks encoded by obsdelta's encoder are exactly what the HDF5 pipeline
(HDF5's shuffle, hdf5plugin's Zstd) decodes, for every candidate, dtype and edge chunk; the
filter choice and the measured sizes match the stored chunks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli.filters import (
    FILTERS,
    ZSTD_BLOCK,
    Filter,
    candidates,
    choose,
    chunk_rows,
    compressed_size,
    frame_delta,
    sample_rows,
    undo_frame_delta,
)

#: Real values of several dtypes: Hopper observations (float32), as float64 and float16,
#: trajectory ids (int64), done flags (bool), Pong frames (uint8 images).
DTYPES = ["float32", "float64", "float16", "int64", "bool", "uint8-frames"]
#: Each dtype's shape and dtype, for its candidate filters.
LOOKS = {name: (np.dtype(name), (1, 11)) for name in DTYPES[:4]}
LOOKS.update(
    {"bool": (np.dtype(bool), (1, 1)), "uint8-frames": (np.dtype(np.uint8), (1, 1, 53, 40))}
)
CASES = [(d, f.name) for d in DTYPES for f in candidates(*LOOKS[d])]


def real_values(name: str, hopper: TensorDictBase, pong: TensorDictBase) -> np.ndarray:
    obs = hopper["observation"].numpy()
    if name == "uint8-frames":
        return pong["pixels"].numpy()
    if name == "int64":
        return hopper["collector", "traj_ids"].numpy()
    if name == "bool":
        return hopper["next", "done"].numpy()
    return obs.astype(name)


@pytest.fixture(params=DTYPES)
def values(
    request: pytest.FixtureRequest, hopper: TensorDictBase, pong: TensorDictBase
) -> np.ndarray:
    return real_values(request.param, hopper, pong)


def write(path: Path, values: np.ndarray, flt: Filter, per: int) -> None:
    """``values`` as a packed dataset: chunks encoded by ``flt``, written as stored bytes."""
    import hdf5plugin  # noqa: F401 - registers the Zstd filter

    with h5py.File(path, "w") as f:
        ds = f.create_dataset(
            "x", shape=values.shape, dtype=values.dtype, chunks=(per, *values.shape[1:]),
            **flt.kwargs(),
        )  # fmt: skip
        tail = (0,) * (values.ndim - 1)
        for first in range(0, len(values), per):
            data = flt.encode(np.ascontiguousarray(values[first : first + per]), per)
            ds.id.write_direct_chunk((first, *tail), data)


@pytest.mark.parametrize(("dtype", "name"), CASES)
def test_plain_h5py_decodes_every_encoded_chunk(
    dtype: str, name: str, tmp_path: Path, hopper: TensorDictBase, pong: TensorDictBase
) -> None:
    """A fresh interpreter with only h5py and hdf5plugin reads the values back, the last
    chunk partial (an edge chunk HDF5 pads)."""
    values, flt = real_values(dtype, hopper, pong), FILTERS[name]
    assert flt in candidates(values.dtype, values.shape)
    per = max(1, len(values) // 3 - 1)  # three full chunks and a partial one
    write(tmp_path / "x.h5", values, flt, per)
    back = read_back(tmp_path / "x.h5")
    if flt.transform:
        back = np.concatenate(
            [undo_frame_delta(back[i : i + per]) for i in range(0, len(back), per)]
        )
    assert back.dtype == values.dtype and np.array_equal(back, values)


def read_back(path: Path) -> np.ndarray:
    """Dataset ``x`` of ``path`` as a fresh interpreter with only h5py and hdf5plugin reads it."""
    script = (
        "import sys, h5py, hdf5plugin, numpy as np\n"
        "with h5py.File(sys.argv[1]) as f:\n"
        "    np.save(sys.argv[2], f['x'][()])\n"
    )
    out = path.with_suffix(".npy")
    subprocess.run([sys.executable, "-c", script, str(path), str(out)], check=True)
    return np.load(out)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64"])
def test_plain_h5py_decodes_chunks_of_long_byte_planes(
    dtype: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    """Byte planes of a zstd block or more are compressed in one call (not a block flushed per
    plane): the same one frame to HDF5."""
    obs = hopper["observation"].numpy().astype(dtype)
    rng = np.random.default_rng(0)
    rows = 4 * ZSTD_BLOCK // obs.shape[1]
    values = obs[rng.integers(0, len(obs), rows)]
    per = rows // 3 - 1
    assert per * obs.shape[1] >= ZSTD_BLOCK  # every plane of a chunk is that long
    write(tmp_path / "x.h5", values, FILTERS["shuffle-zstd1"], per)
    back = read_back(tmp_path / "x.h5")
    assert back.dtype == values.dtype and np.array_equal(back, values)


def test_measured_size_is_the_stored_size(values: np.ndarray, tmp_path: Path) -> None:
    """The choice measures exactly the bytes the file stores for each candidate."""
    per = chunk_rows(values.shape, values.dtype.itemsize)
    for flt in candidates(values.dtype, values.shape):
        write(tmp_path / f"{flt.name}.h5", values, flt, per)
        with h5py.File(tmp_path / f"{flt.name}.h5") as f:
            stored = f["x"].id.get_storage_size()
        assert compressed_size(values, per, flt) == stored


def test_choice_is_the_smallest_candidate(values: np.ndarray) -> None:
    per = chunk_rows(values.shape, values.dtype.itemsize)
    samples = [values[sl] for sl in sample_rows(len(values), per)]
    best, ratio = choose(samples, per)
    sizes = {
        f.name: sum(compressed_size(s, per, f) for s in samples)
        for f in candidates(values.dtype, values.shape)
    }
    assert sizes[best.name] == min(sizes.values())
    assert ratio == pytest.approx(sizes[best.name] / sum(s.nbytes for s in samples))
    assert 0 < ratio < 1  # every real key here compresses


def test_frames_are_never_offered_a_transform(pong: TensorDictBase) -> None:
    """Frames keep their values: a dataset read by name in another library must give them."""
    frames = torch.cat([pong["pixels"]] * 4).numpy()
    per = chunk_rows(frames.shape, 1)
    assert all(f.transform is None for f in candidates(frames.dtype, frames.shape))
    best, _ = choose([frames[sl] for sl in sample_rows(len(frames), per)], per)
    assert best.transform is None


@pytest.mark.parametrize("frames", [0, 1, 2, 31])
def test_frame_deltas_undo_exactly(pong: TensorDictBase, frames: int) -> None:
    chunk = pong["pixels"].numpy()[:frames]
    deltas = frame_delta(chunk)
    assert deltas.dtype == np.uint8 and deltas.shape == chunk.shape
    np.testing.assert_array_equal(undo_frame_delta(deltas), chunk)
    # The same running sum as numpy's, which wraps at 256 too.
    np.testing.assert_array_equal(undo_frame_delta(deltas), np.cumsum(deltas, 0, dtype=np.uint8))
