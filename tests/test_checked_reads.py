"""Reads check what they return: a damaged packed chunk fails in plain ``h5py`` (with
``hdf5plugin``) as in obsdelta's own reader, instead of decoding to other values."""

from __future__ import annotations

import importlib.util
import random
import shutil
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401 - registers the Zstd filter with HDF5
import numpy as np
import pytest
import torch
import zstandard
from tensordict import TensorDictBase
from torch.utils.data import DataLoader

from obsdelta_cli import compress, open_dataset
from obsdelta_cli.dataset import collate
from obsdelta_cli.errors import ObsdeltaError
from obsdelta_cli.formats import hdf5_chunks

from .writers import WRITERS

#: The TorchRL storage is read through where torchrl is installed.
TORCHRL = importlib.util.find_spec("torchrl") is not None

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


# ---------------------------------------------------------------------------------------------
# Fault injection: every row read through the training readers is the original or an error

KINDS = ["ted-memmap", "torchrl-rb", "ted-pt", "d4rl-hdf5", "robomimic-hdf5", "ted-hdf5"]
CODECS = ["exact", "fp16"]
FAULTS = ["flip", "zero-page", "truncate"]
PAGE = 4096


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def _damage(path: Path, fault: str, rng: random.Random) -> str:
    """One fault at a random byte of ``path`` (a file or a folder's files, by their sizes)."""
    files = [f for f in _files(path) if f.stat().st_size]
    sizes = [f.stat().st_size for f in files]
    at = rng.randrange(sum(sizes))
    for f, size in zip(files, sizes, strict=True):
        if at >= size:
            at -= size
            continue
        data = bytearray(f.read_bytes())
        if fault == "flip":
            data[at] ^= 1 << rng.randrange(8)
        elif fault == "zero-page":
            page = at - at % PAGE
            data[page : page + PAGE] = bytes(len(data[page : page + PAGE]))
        else:
            del data[at:]
        f.write_bytes(bytes(data))
        return f"{fault} {f.name}@{at}"
    raise AssertionError("unreachable")


def _order(rows: int) -> list[np.ndarray]:
    """Every row once, shuffled, in batches (the second batch repeats rows of the first)."""
    perm = np.random.default_rng(rows).permutation(rows)
    batches = [perm[i : i + 96] for i in range(0, rows, 96)]
    return [batches[0], np.concatenate([batches[0][:8], batches[1]]), *batches[2:]]


def _bits(td: TensorDictBase) -> dict[str, bytes]:
    return {
        "/".join(k if isinstance(k, tuple) else (k,)): v.contiguous()
        .view(torch.uint8)
        .numpy()
        .tobytes()
        for k, v in td.items(include_nested=True, leaves_only=True)
    }


def _plain_h5py(path: Path) -> list[dict[str, bytes]]:
    """The values of every checksummed dataset of a packed file, read by plain h5py (with
    hdf5plugin); any error HDF5 raises becomes an ObsdeltaError here (a refused read)."""
    out: dict[str, bytes] = {}
    try:
        with h5py.File(path, "r") as f:
            names: list[str] = []
            f.visititems(
                lambda n, o: (
                    names.append(n) if isinstance(o, h5py.Dataset) and o.fletcher32 else None
                )
            )
            for name in names:
                out[name] = np.ascontiguousarray(f[name][()]).tobytes()
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise ObsdeltaError(f"h5py: {exc}") from None
    return [out]


def _rows_by_reader(path: Path, reader: str) -> list[dict[str, bytes]]:
    """Every row of ``path``, batch by batch (see :func:`_order`), through ``reader``."""
    if reader == "h5py":
        return _plain_h5py(path)
    if reader == "storage":
        from obsdelta_cli.storage import ObsdeltaStorage

        storage = ObsdeltaStorage(path)
        try:
            return [_bits(storage.get(torch.from_numpy(b))) for b in _order(len(storage))]
        finally:
            storage.close()
    data = open_dataset(path)
    try:
        batches = _order(len(data))
        if reader == "dataset":
            return [_bits(data[torch.from_numpy(b)]) for b in batches]
        if reader == "slices":  # consecutive rows, read a slice at a time
            return [_bits(data[a : a + 96]) for a in range(0, len(data), 96)]
        loader = DataLoader(
            data,
            sampler=[b.tolist() for b in batches],
            batch_size=None,
            collate_fn=collate,
            num_workers=2,
            multiprocessing_context="fork",
        )
        return [_bits(td) for td in loader]
    finally:
        data.close()


def run_faults(
    kind: str,
    codec: str,
    pack: bool,
    hopper: TensorDictBase,
    tmp: Path,
    faults: int,
    readers: tuple[str, ...],
    *,
    seed: str = "",
) -> dict[str, list[str]]:
    """``faults`` faults (flips, zeroed pages, truncations in turn) in copies of one output,
    every row of each read through each of ``readers`` (the DataLoader's two workers only
    after the first fault: they cost a second a read): the tally of what they gave."""
    tmp = tmp / f"{codec}-{pack}"
    tmp.mkdir()
    src = WRITERS[kind](hopper[:600].clone(), tmp / "in")
    out = tmp / ("p.h5" if pack else f"c{src.suffix}")
    compress(src, out, codec=codec, pack=pack)
    if pack:  # plain h5py reads the filtered datasets of a packed file as well
        readers = (*readers, "h5py")
    references = {
        r: _rows_by_reader(out, r)
        for r in {"dataset", "slices", "storage", "loader"} & set(readers)
    }
    references["h5py"] = _rows_by_reader(out, "h5py") if pack else []
    rng = random.Random(f"{kind}-{codec}-{pack}{seed}")
    tally: dict[str, list[str]] = {"caught": [], "same": [], "silent": [], "crashes": []}
    for i in range(faults):
        damaged = tmp / f"d{out.suffix}"
        (shutil.copytree if out.is_dir() else shutil.copy)(out, damaged)
        where = _damage(damaged, FAULTS[i % len(FAULTS)], rng)
        for reader in readers if i == 0 else [r for r in readers if r != "loader"]:
            try:
                got = _rows_by_reader(damaged, reader)
            except ObsdeltaError:
                tally["caught"].append(f"{reader} {where}")
            except Exception as exc:
                tally["crashes"].append(f"{reader} {where}: {type(exc).__name__}: {exc}")
            else:
                wrong = got != references[reader]
                tally["silent" if wrong else "same"].append(f"{reader} {where}")
        (shutil.rmtree if damaged.is_dir() else Path.unlink)(damaged)
    return tally


def _readers(loader: bool) -> tuple[str, ...]:
    names = ["dataset", "slices"]
    if TORCHRL:
        names.append("storage")
    return (*names, "loader") if loader else tuple(names)


OUTPUTS = [(codec, pack) for codec in CODECS for pack in (False, True)]


@pytest.fixture(autouse=True)
def quick_worker_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DataLoader whose worker raised waits 5 s for each worker to stop (torch's own
    interval, whatever the dataset): the workers are stopped after a fifth of a second."""
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)


def _check(tally: dict[str, list[str]]) -> None:
    assert tally["crashes"] == [], tally["crashes"]
    assert tally["silent"] == [], tally["silent"]


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_outputs_give_the_original_rows_or_an_error(
    kind: str, hopper: TensorDictBase, tmp_path: Path
) -> None:
    """Three faults in each output of ``kind`` (plain and packed, ``exact`` and ``fp16``), every
    row read through ``open_dataset`` (random batches, and slices), the TorchRL storage and
    (first fault of each) a DataLoader's two workers: each read gives the original rows or an
    ObsdeltaError."""
    for codec, pack in OUTPUTS:
        tally = run_faults(kind, codec, pack, hopper, tmp_path, 3, _readers(True))
        _check(tally)
        readers = len(_readers(False)) + pack
        assert len(tally["caught"]) + len(tally["same"]) == 3 * readers + 1


@pytest.mark.slow
@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kind", KINDS)
def test_many_faults_give_the_original_rows_or_an_error(
    kind: str, codec: str, pack: bool, hopper: TensorDictBase, tmp_path: Path
) -> None:
    """45 faults in each of 24 outputs (1,080 in all), read as above."""
    tally = run_faults(kind, codec, pack, hopper, tmp_path, 45, _readers(True), seed="many")
    _check(tally)


@pytest.mark.parametrize("pack", [False, True], ids=["compressed", "packed"])
@pytest.mark.parametrize("reader", ["dataset", "storage"])
def test_a_leaf_lost_to_damage_is_an_error_not_a_key_left_out(
    hopper: TensorDictBase, tmp_path: Path, pack: bool, reader: str
) -> None:
    """A flipped bit in the type of a dataset's first header message made HDF5 take
    ``actions`` for a named datatype: the readers served every row without ``action``. They
    check that the file holds every leaf its manifest lists (as ``verify`` does)."""
    if reader == "storage" and not TORCHRL:
        pytest.skip("ObsdeltaStorage needs torchrl")
    src = WRITERS["d4rl-hdf5"](hopper[:600].clone(), tmp_path / "in")
    out = tmp_path / ("p.h5" if pack else "c.hdf5")
    compress(src, out, pack=pack)
    assert "action" in _rows_by_reader(out, reader)[0]
    with h5py.File(out, "r+") as f:
        del f["actions"]
        f["actions"] = np.dtype("<f4")  # what the damaged header reads as: a named datatype
    with pytest.raises(ObsdeltaError, match=r"actions.*missing"):
        _rows_by_reader(out, reader)
