"""Reads check what they return: a damaged packed chunk fails in plain ``h5py`` (with
``hdf5plugin``) as in obsdelta's own reader, instead of decoding to other values."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401 - registers the Zstd filter with HDF5
import pytest
import zstandard
from tensordict import TensorDictBase

from obsdelta_cli import compress, open_dataset
from obsdelta_cli.errors import ObsdeltaError
from obsdelta_cli.formats import hdf5_chunks

from .writers import WRITERS

PACK_KINDS = ["ted-memmap", "d4rl-hdf5", "robomimic-hdf5"]


def _filtered(path: Path) -> dict[str, h5py.Dataset]:
    """Every dataset of a packed file that went through a filter, by path."""
    out: dict[str, h5py.Dataset] = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                out.setdefault(name, obj)
                if isinstance(obj, h5py.Dataset) and obj.chunks and obj.compression
                else None
            )
        )
        return {name: (ds.fletcher32, ds.id.get_num_chunks()) for name, ds in out.items()}


def _chunk_at(path: Path, name: str, index: int) -> tuple[int, int]:
    with h5py.File(path, "r") as f:
        info = f[name].id.get_chunk_info(index)
        return int(info.byte_offset), int(info.size)


def _plain_values(path: Path, name: str) -> object:
    with h5py.File(path, "r") as f:
        return f[name][()]


@pytest.mark.parametrize("kind", PACK_KINDS)
def test_every_packed_chunk_carries_checksums(
    kind: str, hopper: TensorDictBase, tmp_path: Path
) -> None:
    src = WRITERS[kind](hopper[:600].clone(), tmp_path / "in")
    packed = tmp_path / "p.h5"
    compress(src, packed, codec="fp16", pack=True)
    datasets = _filtered(packed)
    assert datasets
    for name, (fletcher, _) in datasets.items():
        assert fletcher, name  # HDF5 checks it before it decodes
        with h5py.File(packed, "r") as f:
            _, raw = f[name].id.read_direct_chunk(f[name].id.get_chunk_info(0).chunk_offset)
        frame = raw[:-4]
        assert zstandard.get_frame_parameters(frame).has_checksum, name


@pytest.mark.parametrize("direct", [False, True], ids=["hdf5", "direct"])
@pytest.mark.parametrize("kind", PACK_KINDS)
def test_a_flipped_bit_in_a_packed_chunk_fails_plain_h5py(
    kind: str, direct: bool, hopper: TensorDictBase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bit flipped in each filtered dataset's chunks, at several places: plain h5py with
    hdf5plugin raises instead of giving other values, and so does ``open_dataset``, whether
    HDF5 or obsdelta decodes the chunks (small ones are left to HDF5 unless the floor is
    lifted)."""
    if direct:
        monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", 0)
    src = WRITERS[kind](hopper[:600].clone(), tmp_path / "in")
    packed = tmp_path / "p.h5"
    compress(src, packed, codec="fp16", pack=True)
    rng = random.Random(kind)
    for name, (_, chunks) in _filtered(packed).items():
        for _ in range(3):
            damaged = tmp_path / "d.h5"
            shutil.copy(packed, damaged)
            offset, size = _chunk_at(damaged, name, rng.randrange(chunks))
            with open(damaged, "r+b") as fh:
                fh.seek(offset + rng.randrange(size))
                byte = fh.read(1)[0]
                fh.seek(-1, 1)
                fh.write(bytes([byte ^ (1 << rng.randrange(8))]))
            with pytest.raises(OSError, match="filter returned failure"):
                _plain_values(damaged, name)
            data = open_dataset(damaged)
            try:
                with pytest.raises(ObsdeltaError, match="damaged"):
                    data[0 : len(data)]
            finally:
                data.close()
