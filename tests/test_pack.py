"""``compress --pack``: one HDF5 file from every input format, read by plain h5py, trained
from, verified, predicted by ``report --pack`` and inflated back to the original container."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress, inflate, open_dataset, report, verify
from obsdelta_cli.commands.pack import packable
from obsdelta_cli.errors import DataError, ObsdeltaError
from obsdelta_cli.filters import MIN_PACK_BYTES, ZSTD_FILTER, ZSTD_NAME, choose
from obsdelta_cli.formats import detect
from obsdelta_cli.formats.leaf import FileLeaf
from obsdelta_cli.formats.pack_io import HEAVY_INDEX
from obsdelta_cli.formats.pack_leaves import NAME, TRANSFORM_ATTR
from obsdelta_cli.inputs import open_input
from obsdelta_cli.manifest import FORMAT_VERSION
from obsdelta_cli.render import _size

from .conformance import check_slices
from .conftest import SAMPLE, Cli, marked_h5py_only, tree_hash
from .manifests import manifest_of
from .realistic import drifting_frames, offering_frame_deltas
from .writers import write_memmap, write_minari, write_pt, write_robomimic, write_ted_hdf5
from .zoo import differences

INPUTS = list(packable())
SAMPLES = {
    "ted-memmap": "hopper_ted",
    "ted-pt": "halfcheetah_ted.pt",
    "torchrl-rb": "hopper_rb",
    "d4rl-hdf5": "hopper_d4rl.hdf5",
    "robomimic-hdf5": "hopper_robomimic.hdf5",
}


@pytest.fixture(params=marked_h5py_only(INPUTS))
def source(request: pytest.FixtureRequest, tmp_path: Path, hopper: TensorDictBase) -> Path:
    """A real rollout in each input format --pack takes (copied: never written to): Hopper,
    and HalfCheetah [4, 250] as saved by torch.save."""
    return input_in(request.param, tmp_path, hopper)


def input_in(name: str, tmp_path: Path, hopper: TensorDictBase) -> Path:
    """An input of format ``name`` in ``tmp_path``: written from ``hopper``, or a copy of the
    sample of that format."""
    if name == "ted-hdf5":
        return write_ted_hdf5(hopper, tmp_path / "in")
    if name == "minari-hdf5":
        return write_minari(hopper, tmp_path / "in")
    src = SAMPLE / SAMPLES[name]
    dst = tmp_path / src.name
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)
    return dst


def h5_objects(path: Path) -> dict[str, object]:
    """Every object of an HDF5 file as h5py describes it: group attributes; dataset values,
    dtype, shape, maxshape, chunks, filters, fill value and attributes."""
    out: dict[str, object] = {"/": sorted((k, repr(v)) for k, v in h5py.File(path).attrs.items())}
    with h5py.File(path) as f:

        def visit(name: str, obj: object) -> None:
            attrs = sorted((k, repr(v)) for k, v in obj.attrs.items())  # type: ignore[attr-defined]
            if isinstance(obj, h5py.Dataset):
                dcpl = obj.id.get_create_plist()
                filters = [dcpl.get_filter(i)[:3] for i in range(dcpl.get_nfilters())]
                values = np.asarray(obj[()])
                out[name] = (
                    obj.dtype.str,
                    obj.shape,
                    obj.maxshape,
                    obj.chunks,
                    filters,
                    repr(obj.fillvalue),
                    attrs,
                    values.tobytes() if values.dtype.kind != "O" else repr(values.tolist()),
                )
            else:
                out[name] = ("group", attrs)

        f.visititems(visit)
    return out


def same_container(a: Path, b: Path) -> None:
    """Folders and ``.pt`` files byte for byte; HDF5 files object for object."""
    if a.is_dir():
        assert tree_hash(a) == tree_hash(b)
    elif a.suffix == ".pt":
        assert a.read_bytes() == b.read_bytes()
    else:
        assert h5_objects(a) == h5_objects(b)


@pytest.mark.parametrize("codec", ["auto", "fp16"])
def test_pack_round_trip_gives_the_original_container(
    source: Path, tmp_path: Path, codec: str
) -> None:
    packed = tmp_path / "packed.h5"
    result = compress(source, packed, codec=codec, pack=True)
    assert packed.is_file() and detect(packed).name == NAME
    assert result.bytes_after == packed.stat().st_size < result.bytes_before
    checked = verify(packed)
    assert checked.format == NAME and [k.key for k in checked.keys] == [k.key for k in result.keys]
    back = inflate(packed, tmp_path / f"back{source.suffix}")
    assert back.format == NAME
    # Lossless: the original itself. Lossy: what the same codec gives without --pack.
    reference = source
    if codec != "auto" and result.keys:  # with no key to encode, fp16 changes nothing
        compress(source, tmp_path / f"small{source.suffix}", codec=codec)
        reference = tmp_path / f"ref{source.suffix}"
        inflate(tmp_path / f"small{source.suffix}", reference)
    same_container(reference, tmp_path / f"back{source.suffix}")
    # Nothing of the work is left beside the outputs.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _deflated_by_another_zlib(path: Path) -> Path:
    """The D4RL sample with every dataset of rows in gzip chunks whose deflate streams another
    zlib chose (memory level 9, where HDF5's zlib uses 8): D4RL's files were written years
    ago, by the zlib of their day, and a zlib may encode the same values to other bytes."""
    with h5py.File(SAMPLE / SAMPLES["d4rl-hdf5"]) as src, h5py.File(path, "w") as dst:
        others = 0
        for name in ("observations", "actions", "rewards", "terminals", "infos/qpos"):
            values = np.ascontiguousarray(src[name][()])
            per = 1000
            ds = dst.create_dataset(
                name, shape=values.shape, dtype=values.dtype, chunks=(per, *values.shape[1:]),
                compression="gzip", compression_opts=4,
            )  # fmt: skip
            for start in range(0, len(values), per):
                chunk = np.zeros((per, *values.shape[1:]), values.dtype)  # the edge padded
                chunk[: len(values) - start] = values[start : start + per]
                deflate = zlib.compressobj(4, zlib.DEFLATED, 15, 9)
                raw = deflate.compress(chunk.tobytes()) + deflate.flush()
                others += raw != zlib.compress(chunk.tobytes(), 4)
                ds.id.write_direct_chunk((start, *[0] * (values.ndim - 1)), raw)
            assert np.array_equal(ds[()], values)
        assert others  # not the bytes this zlib writes: what the test is about
        src.copy("metadata", dst)
    return path


@pytest.mark.h5py_only
@pytest.mark.parametrize("flat", [False, True])
def test_gzip_chunks_another_zlib_wrote_inflate_from_a_packed_file(
    tmp_path: Path, flat: bool
) -> None:
    """A packed file holds a dataset's values, not the deflate streams of the original: inflate
    encodes them again with this machine's zlib. The original comes back object for object
    (values, chunks, filters), checked by its values and creation properties, where the
    bytes another zlib chose cannot be reproduced."""
    src = _deflated_by_another_zlib(tmp_path / "d4rl.hdf5")
    compress(src, tmp_path / "packed.h5", pack=True, flat=flat)
    verify(tmp_path / "packed.h5")
    inflate(tmp_path / "packed.h5", tmp_path / "back.hdf5")
    assert differences(str(src), str(tmp_path / "back.hdf5")) == []
    assert h5_objects(src) == h5_objects(tmp_path / "back.hdf5")


@pytest.mark.h5py_only
def test_a_changed_value_of_a_dataset_filtered_again_is_damage(tmp_path: Path) -> None:
    """Where its values stand for its raw chunks, a value changed in the packed file (its chunk
    written again through HDF5, so every chunk checksum holds) stops ``inflate``."""
    import hdf5plugin  # noqa: F401 - the packed file's filter, to write a chunk of it

    src = _deflated_by_another_zlib(tmp_path / "d4rl.hdf5")
    packed = tmp_path / "packed.h5"
    compress(src, packed, pack=True)
    with h5py.File(packed, "r+") as f:
        f["actions"][5, 1] += 1
    with pytest.raises(ObsdeltaError, match="actions"):
        inflate(packed, tmp_path / "back.hdf5")
    assert not (tmp_path / "back.hdf5").exists()


def test_packed_manifest_records_the_source_container(source: Path, tmp_path: Path) -> None:
    compress(source, tmp_path / "p.h5", pack=True)
    fmt = detect(tmp_path / "p.h5")
    opened = fmt.open(tmp_path / "p.h5")
    try:
        meta = opened.meta or {}
        assert meta["obsdelta_format"] == FORMAT_VERSION == 4
        assert meta["format"] == NAME
        assert meta["source_format"] == detect(source).name
        assert meta["pack"]["datasets"]  # every large dataset got a measured filter
        assert all(e["filter"] is None or e["values"] for e in meta["pack"]["datasets"].values())
    finally:
        fmt.close(opened)


def plain_h5py_reads(path: Path) -> tuple[int, int]:
    """Datasets, and filtered ones, that a fresh interpreter with nothing but h5py and
    hdf5plugin reads whole from ``path``."""
    script = (
        "import sys, h5py, hdf5plugin\n"
        "n = []\n"
        "def visit(name, obj):\n"
        "    if isinstance(obj, h5py.Dataset):\n"
        "        obj[()]; n.append(name)\n"
        "with h5py.File(sys.argv[1]) as f:\n"
        "    f.visititems(visit)\n"
        "    chunked = [k for k in n if f[k].chunks and f[k].compression]\n"
        "print(len(n), len(chunked))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    total, filtered = map(int, out.stdout.split())
    return total, filtered


def test_plain_h5py_reads_every_dataset(source: Path, tmp_path: Path) -> None:
    compress(source, tmp_path / "p.h5", pack=True)
    total, filtered = plain_h5py_reads(tmp_path / "p.h5")
    assert total > 0 and filtered > 0


def same_transitions(source: Path, packed_file: Path) -> None:
    """300 random transitions of ``packed_file`` (a chunk cache of 1 MB) equal the plain
    ``source``'s, key for key, bit for bit."""
    plain, packed = open_dataset(source), open_dataset(packed_file, cache_mb=1)
    assert len(plain) == len(packed)
    idx = torch.randperm(len(plain), generator=torch.Generator().manual_seed(0))[:300]
    want, got = plain[idx], packed[idx]
    assert set(want.keys(True, True)) == set(got.keys(True, True))
    for key in want.keys(True, True):
        assert torch.equal(want[key], got[key]), key
    packed.close()


def test_open_dataset_trains_from_a_packed_file(source: Path, tmp_path: Path) -> None:
    compress(source, tmp_path / "p.h5", pack=True)
    same_transitions(source, tmp_path / "p.h5")
    check_slices(tmp_path / "p.h5")


def test_report_pack_predicts_the_packed_size(source: Path, tmp_path: Path) -> None:
    predicted = report(source, pack=True).bytes_after
    actual = compress(source, tmp_path / "p.h5", pack=True).bytes_after
    assert abs(predicted - actual) <= 0.05 * actual, (predicted, actual)


def test_verify_catches_a_changed_value(source: Path, tmp_path: Path) -> None:
    packed = tmp_path / "p.h5"
    compress(source, packed, pack=True)
    with h5py.File(packed, "r") as f:
        name = sorted(_datasets(f))[0]
    with h5py.File(packed, "r+") as f:
        ds = f[name]
        row = ds[0]
        ds[0] = row + 1 if row.dtype.kind != "b" else ~row
    with pytest.raises(DataError, match="checksum mismatch"):
        verify(packed)
    with pytest.raises(ObsdeltaError):
        inflate(packed, tmp_path / f"back{source.suffix}")
    assert not (tmp_path / f"back{source.suffix}").exists()


@pytest.mark.parametrize("change", ["changed", "added", "removed"])
def test_verify_catches_a_changed_attribute_of_a_repacked_dataset(
    change: str, tmp_path: Path
) -> None:
    """A repacked dataset's attributes are checked with the file's other objects (their
    values, by the values' own hashes): one changed, added or removed is caught."""
    src = tmp_path / "in.hdf5"
    shutil.copy(SAMPLE / "hopper_d4rl.hdf5", src)
    with h5py.File(src, "r+") as f:
        f["rewards"].attrs["units"] = "reward per step"
        f["rewards"].attrs["scale"] = np.float32(1.0)
    packed = tmp_path / "p.h5"
    compress(src, packed, pack=True)
    verify(packed)
    with h5py.File(packed, "r") as f:
        assert "rewards" in manifest_of(f)["pack"]["datasets"]  # repacked, not copied
    with h5py.File(packed, "r+") as f:
        attrs = f["rewards"].attrs
        if change == "changed":
            attrs["scale"] = np.float32(2.0)
        elif change == "added":
            attrs["note"] = "edited"
        else:
            del attrs["units"]
    with pytest.raises(DataError, match="rewards"):
        verify(packed)
    with pytest.raises(ObsdeltaError):
        inflate(packed, tmp_path / "back.hdf5")
    assert not (tmp_path / "back.hdf5").exists()


def _datasets(f: h5py.File) -> list[str]:
    """Numeric, filtered datasets of rows (the ones --pack rewrote)."""
    out: list[str] = []

    def visit(name: str, obj: object) -> None:
        numeric = isinstance(obj, h5py.Dataset) and obj.dtype.kind in "fiu" and obj.ndim >= 1
        if numeric and obj.compression and not name.startswith("obsdelta/"):  # type: ignore[attr-defined]
            out.append(name)

    f.visititems(visit)
    return out


def test_torchrl_rebuilds_a_packed_ted(tmp_path: Path, hopper: TensorDictBase) -> None:
    """A packed TED with fp16 deltas opens with PersistentTensorDict.from_h5, and TorchRL's
    NextObservationDelta rebuilds the next observations within the reported error."""
    from tensordict import PersistentTensorDict

    from .test_torchrl_interop import _sample_all

    src = write_memmap(hopper, tmp_path / "in")
    (key,) = compress(src, tmp_path / "p.h5", codec="fp16", pack=True).keys
    opened = PersistentTensorDict.from_h5(tmp_path / "p.h5", batch_size=[hopper.shape[0]])
    local = opened.to_tensordict().exclude("obsdelta")
    opened.close()
    batch = _sample_all(local, [("observation",)], tmp_path / "scratch")
    index = batch["index"]
    err = (batch["next", "observation"] - hopper["next", "observation"][index]).abs().amax(-1)
    assert key.exception_rows == 0
    assert 0 < float(err.max()) <= key.max_abs_error


@pytest.fixture
def frame_deltas_of_0_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packing offers frames the frame-delta filter, as obsdelta 0.2 did: the files it wrote
    must still read exactly."""
    module = importlib.import_module("obsdelta_cli.filters")
    monkeypatch.setattr(module, "candidates", offering_frame_deltas(module.candidates))


def test_frames_are_stored_as_themselves(tmp_path: Path, pong: TensorDictBase) -> None:
    """uint8 frames whose frame deltas would compress far better are still stored as the
    frames: plain h5py reads them by name."""
    frames = drifting_frames(pong, 3)
    src = write_memmap(frames, tmp_path / "in")
    packed = tmp_path / "p.h5"
    compress(src, packed, pack=True)
    with h5py.File(packed) as f:
        assert TRANSFORM_ATTR not in f["pixels"].attrs
        assert f["pixels"].chunks[0] < f["pixels"].shape[0]
        assert np.array_equal(f["pixels"][()], frames["pixels"].numpy())
    data = open_dataset(packed, cache_mb=0)
    idx = torch.tensor([0, 5, 300, 301, 599])
    assert torch.equal(data[idx]["next", "pixels"], frames["next", "pixels"][idx])
    data.close()


@pytest.mark.usefixtures("frame_deltas_of_0_2")
def test_frame_deltas_of_0_2_read_exactly(tmp_path: Path, pong: TensorDictBase) -> None:
    """A file packed by 0.2 with frames as frame deltas: every read of obsdelta's undoes them."""
    frames = drifting_frames(pong, 3)
    src = write_memmap(frames, tmp_path / "in")
    packed = tmp_path / "p.h5"
    compress(src, packed, pack=True)
    with h5py.File(packed) as f:
        assert f["pixels"].attrs.get(TRANSFORM_ATTR) == "frame-delta"
        assert f["pixels"].chunks[0] < f["pixels"].shape[0]
    data = open_dataset(packed, cache_mb=0)
    idx = torch.tensor([0, 5, 300, 301, 599])
    assert torch.equal(data[idx]["pixels"], frames["pixels"][idx])
    assert torch.equal(data[idx]["next", "pixels"], frames["next", "pixels"][idx])
    verify(packed)
    inflate(packed, tmp_path / "back")
    assert tree_hash(src) == tree_hash(tmp_path / "back")


def test_cli_pack_and_report_pack(cli: Cli, tmp_path: Path) -> None:
    src = SAMPLE / "hopper_d4rl.hdf5"
    out = tmp_path / "p.h5"
    written = cli("compress", src, "-o", out, "--pack").stdout
    assert detect(out).name == NAME
    # The terminal shows the key table and the sizes, the packed one as written.
    assert "next_observations" in written and "exact" in written
    assert f"dataset on disk: {_size(src.stat().st_size)} -> {_size(out.stat().st_size)}" in written
    shown = cli("report", src, "--pack", "--json").stdout
    assert '"note": "--pack' in shown
    predicted = json.loads(shown)["bytes_after"]
    table = cli("report", src, "--pack").stdout
    assert f"-> {_size(predicted)}" in table and "predicted" in table
    cli("verify", out, "--quiet")
    cli("inflate", out, "-o", tmp_path / "back.hdf5", "--quiet")
    assert h5_objects(src) == h5_objects(tmp_path / "back.hdf5")


def test_pack_filters_a_dataset_with_no_next_observations(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase
) -> None:
    """A Minari file stores each observation once: compress refuses it, --pack packs it, says
    so, and shows the sizes; naming a key to encode is refused in one line."""
    src = write_minari(hopper, tmp_path / "in")
    refused = cli("compress", src, "-o", tmp_path / "c.h5", code=1)
    assert "--pack" in refused.stderr  # the hint names what can be done
    shown = cli("compress", src, "-o", tmp_path / "p.h5", "--pack").stdout
    assert "no next observations were removed" in " ".join(shown.split())
    size = (tmp_path / "p.h5").stat().st_size
    assert f"-> {_size(size)}" in shown and size < src.stat().st_size
    keyed = cli("compress", src, "-o", tmp_path / "k.h5", "--pack", "-k", "observations", code=1)
    assert "leave out --key" in keyed.stderr
    assert "Traceback" not in keyed.stderr and len(keyed.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "k.h5").exists()


def test_pack_refuses_an_existing_output(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "p.h5"
    out.write_bytes(b"keep me")
    result = cli("compress", SAMPLE / "hopper_ted", "-o", out, "--pack", code=1)
    assert "already exists" in result.stderr
    assert out.read_bytes() == b"keep me"


# ---------------------------------------------------------------------------------------------
# .pt inputs


def test_pack_of_a_pt_holds_every_tensor_at_its_key(
    tmp_path: Path, cheetah: TensorDictBase
) -> None:
    """Each tensor leaf of the compressed TensorDict is a dataset at its key's path with the
    leaf's values, the large ones chunked along the first dimension and filtered."""
    src = write_pt(cheetah, tmp_path / "in")
    compress(src, tmp_path / "p.h5", codec="fp16", pack=True)
    filtered = []
    with h5py.File(tmp_path / "p.h5") as f:
        for key, leaf in cheetah.items(True, True):
            if key == ("next", "observation"):
                key = ("next", "delta", "observation")
                leaf = (cheetah["next", "observation"] - cheetah["observation"]).half()
            name = "/".join(key if isinstance(key, tuple) else (key,))
            ds = f[name]
            assert ds.shape == tuple(leaf.shape)
            assert np.array_equal(ds[()], leaf.numpy()), key
            if ds.nbytes >= MIN_PACK_BYTES:
                assert ds.chunks[1:] == ds.shape[1:] and ds.compression, key
                filtered.append(name)
    assert {"observation", "next/delta/observation", "action"} <= set(filtered)


@pytest.mark.parametrize("where", ["pack skeleton", "original skeleton"])
def test_pack_of_a_pt_catches_a_changed_skeleton_byte(
    tmp_path: Path, cheetah: TensorDictBase, where: str
) -> None:
    """Both skeletons, the compressed .pt's (written back by inflate before anything else)
    and the original file's, are checked by verify and refused by inflate."""
    src = write_pt(cheetah, tmp_path / "in")
    packed = tmp_path / "p.h5"
    compress(src, packed, pack=True)
    with h5py.File(packed, "r+") as f:
        meta = manifest_of(f)
        index = meta["pack"]["arrays"].index("pt.skeleton")
        name = (
            "obsdelta/pack/skeleton"
            if where == "pack skeleton"
            else f"obsdelta/pack/files/f{index}"
        )
        raw = f[name][()]
        raw.view(np.uint8)[len(raw) // 2] ^= 4
        del f[name]
        f.create_dataset(name, data=raw)
    with pytest.raises(DataError, match="checksum mismatch"):
        verify(packed)
    with pytest.raises(ObsdeltaError):
        inflate(packed, tmp_path / "back.pt")
    assert not (tmp_path / "back.pt").exists()


@pytest.mark.parametrize("saved", ["consolidated", "view"])
def test_pack_of_a_pt_whose_leaves_share_a_storage(
    tmp_path: Path, cheetah: TensorDictBase, saved: str
) -> None:
    """Leaves that are views of one storage: a consolidated TensorDict (the storage holds
    their values only) comes back byte for byte; rows of a larger rollout (torch.save writes
    every row of the storage) come back as the same TensorDict, saved anew."""
    src = tmp_path / "in.pt"
    td = cheetah.consolidate() if saved == "consolidated" else cheetah[:, :100]
    torch.save(td, src)
    compress(src, tmp_path / "p.h5", pack=True)
    verify(tmp_path / "p.h5")
    inflate(tmp_path / "p.h5", tmp_path / "back.pt")
    assert (src.read_bytes() == (tmp_path / "back.pt").read_bytes()) == (saved == "consolidated")
    back = torch.load(tmp_path / "back.pt", weights_only=False)
    assert back.batch_size == td.batch_size
    assert list(back.keys(True, True)) == list(td.keys(True, True))
    for key, leaf in td.items(True, True):
        assert torch.equal(back[key], leaf), key


def test_the_packed_file_goes_to_disk_while_it_is_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from obsdelta_cli import atomic
    from obsdelta_cli.commands import pack

    events: list[tuple[str, str]] = []
    real_write_back, real_verify = atomic.write_back, pack.verify_written

    def write_back(path: Path) -> Any:
        events.append(("write back", path.name))
        return real_write_back(path)

    def verify_written(path: Path, chunk_mb: float) -> None:
        events.append(("verify", path.name))
        real_verify(path, chunk_mb)

    monkeypatch.setattr(pack, "write_back", write_back)
    monkeypatch.setattr(pack, "verify_written", verify_written)
    compress(SAMPLE / "hopper_d4rl.hdf5", tmp_path / "p.h5", pack=True)
    # Handed to the kernel's write-back first, then verified while the disk writes it.
    assert [e[0] for e in events] == ["write back", "verify"]
    assert events[0][1] == events[1][1] and events[0][1] != "p.h5"  # its temporary sibling


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_the_datasets_of_a_packed_file_share_its_descriptors(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each repacked dataset decoded outside HDF5 opened the file once: a robomimic file of a
    # thousand demos would run out of descriptors.
    from obsdelta_cli import filters
    from obsdelta_cli.formats import hdf5_chunks

    monkeypatch.setattr(filters, "CHUNK_BYTES", 512)  # several chunks a dataset
    monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", 0)  # all of them decoded outside HDF5
    packed = tmp_path / "packed.h5"
    compress(write_robomimic(hopper[:600], tmp_path / "demos.hdf5"), packed, pack=True)
    fmt, source = open_input(packed)
    try:
        before = _descriptors_of(packed)
        for leaf in source.leaves.values():
            if hasattr(leaf, "read"):
                leaf.read(0, leaf.shape[0])
        # One descriptor, and one more for reads past the page cache, for all of them.
        assert _descriptors_of(packed) - before <= 2
    finally:
        fmt.close(source)
    assert verify(packed).ok


@pytest.mark.parametrize("cache_mb", [None, 256])
def test_each_dataset_gets_the_chunk_cache_slots_it_needs(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch, cache_mb: int | None
) -> None:
    # HDF5 gives every open chunked dataset a table of its cache's slots, 8 bytes each: a packed
    # file read with 100,003 slots took 800 KB a dataset, 850 MB to verify a packed robomimic
    # file of 600 chunked datasets. Slots follow each dataset's chunk count instead, in packed
    # files and in the inputs they come from.
    from obsdelta_cli import filters
    from obsdelta_cli.formats.hdf5_walk import CACHE_SLOTS, objects_of

    monkeypatch.setattr(filters, "CHUNK_BYTES", 256)  # about 1,000 chunks in the largest
    inputs = [write_robomimic(hopper[:600], tmp_path / "demos.hdf5"), tmp_path / "d4rl.hdf5"]
    shutil.copy2(SAMPLE / "hopper_d4rl.hdf5", inputs[1])
    counts = []
    for src in inputs:
        packed = tmp_path / f"{src.stem}.h5"
        compress(src, packed, pack=True)
        for path in (packed, src):
            fmt, source = open_input(path, cache_mb=cache_mb)
            try:
                for _, ds in objects_of(source.handle):
                    if not isinstance(ds, h5py.Dataset) or ds.chunks is None:
                        continue
                    grid = zip(ds.shape, ds.chunks, strict=True)
                    count = int(np.prod([-(-n // c) for n, c in grid]))
                    slots, nbytes, _ = ds.id.get_access_plist().get_chunk_cache()
                    held = nbytes // (np.prod(ds.chunks) * ds.dtype.itemsize)
                    assert slots == max(CACHE_SLOTS, min(count, 100 * held)), ds.name
                    counts.append(count)
            finally:
                fmt.close(source)
        assert verify(packed).ok
    assert max(counts) > CACHE_SLOTS  # some dataset needed more than the file's slots
    assert sum(c <= CACHE_SLOTS for c in counts) > 20  # and others made do with them


def test_walks_leave_out_the_layout_twins(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repacked dataset whose creation properties no record gives back keeps an empty twin,
    read by path when unpacking (here every dataset, as in files packed before records): a
    walk opened each of them (verifying a packed robomimic file of 1,000 demos peaked at 4.1
    GB)."""
    from obsdelta_cli.formats.hdf5_walk import layout_twins, objects_of
    from obsdelta_cli.formats.pack_props import PropsCheck

    monkeypatch.setattr(PropsCheck, "run", lambda self: {})
    src = write_robomimic(hopper[:600], tmp_path / "demos.hdf5")
    packed = tmp_path / "packed.h5"
    compress(src, packed, pack=True)
    fmt, source = open_input(packed)
    try:
        twins: list[str] = []
        place = layout_twins()  # robomimic: obsdelta's group is /obsdelta
        source.handle[place].visit(twins.append)
        names = [name for name, _ in objects_of(source.handle)]
        assert len(twins) > 10 and names
        assert not [n for n in names if n == place or n.startswith(f"{place}/")]
    finally:
        fmt.close(source)
    inflate(packed, tmp_path / "back.hdf5")  # the twins, read by path, give the layouts back
    assert h5_objects(tmp_path / "back.hdf5") == h5_objects(src)


def _descriptors_of(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


def test_an_error_said_precisely_while_unpacking_is_not_rewritten() -> None:
    """Errors of obsdelta's own that are ValueErrors too (DataError, UsageError) pass through
    the guard that turns HDF5's read errors into damage to the packed file."""
    from obsdelta_cli.formats.hdf5_safety import reading_pack

    said = DataError("rows 3:4 do not match their hash", file=Path("p.h5"), key="k")
    with pytest.raises(DataError) as caught, reading_pack(Path("p.h5")):
        raise said
    assert caught.value is said
    with pytest.raises(ObsdeltaError, match="cannot read an object"), reading_pack(Path("p.h5")):
        raise OSError("address of object past end of allocation")


def test_no_header_of_a_packed_file_keeps_room_left_by_a_deleted_attribute(
    source: Path, tmp_path: Path
) -> None:
    """HDF5 never gives back the room a deleted attribute took in an object's header: the
    file packed has its manifest as a root attribute (tens of KB for a robomimic file), which
    the packed file must not copy and then delete (18.9 KB of the robomimic sample's root
    header stayed empty)."""
    packed = tmp_path / "p.h5"
    compress(source, packed, pack=True)
    free: dict[str, int] = {}
    with h5py.File(packed, "r") as f:
        free["/"] = h5py.h5o.get_info(f.id).hdr.space.free
        f.visititems(
            lambda name, obj: free.update({name: h5py.h5o.get_info(obj.id).hdr.space.free})
        )
    assert max(free.values()) < 256, sorted(free.items(), key=lambda kv: -kv[1])[:3]


def test_no_dataset_of_a_packed_file_keeps_a_heavy_chunk_index(
    source: Path, tmp_path: Path
) -> None:
    """A packed file indexes each dataset's chunks in the format it is written in: HDF5's copy
    of a compressed file's exception arrays kept their version-1 B-trees, 2 KB each however
    few their rows (12.3 KB of the robomimic sample's packed 161.8 KB)."""
    packed = tmp_path / "p.h5"
    compress(source, packed, pack=True)
    index: dict[str, int] = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            index[name] = h5py.h5o.get_info(obj.id).meta_size.obj.index_size

    with h5py.File(packed, "r") as f:
        f.visititems(visit)
    assert max(index.values(), default=0) <= HEAVY_INDEX, max(index.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("name", ["robomimic-hdf5", "d4rl-hdf5", "ted-hdf5"])
def test_exception_rows_of_a_packed_file_are_filtered(
    name: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    """The exception rows of an HDF5 file (each episode's last next observation, camera frames
    among them) are stored with the packed file's filters, as its datasets of data are: kept as
    the compressed file wrote them, unfiltered, they took 2.2 of the 30.2 MB of a packed
    robomimic file with two 84x84 cameras. Inflating them is tested with every input's round
    trip above."""
    packed = tmp_path / "p.h5"
    compress(input_in(name, tmp_path, hopper), packed, pack=True)
    arrays: dict[str, tuple[int, int, list[int]]] = {}

    def visit(path: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and "obsdelta/arrays/" in path:
            plist = obj.id.get_create_plist()
            codes = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
            arrays[path] = (obj.size * obj.dtype.itemsize, obj.id.get_storage_size(), codes)

    with h5py.File(packed, "r") as f:
        f.visititems(visit)
        large = {path: got for path, got in arrays.items() if got[0] >= MIN_PACK_BYTES}
        assert large, sorted(arrays)
        for path, (raw, stored, codes) in large.items():
            if ZSTD_FILTER in codes:
                assert stored < raw, (path, raw, stored)
            else:  # left as written only where no filter stores it smaller
                values = f[path][()]
                assert choose([values], len(values))[1] >= 1, path
    filtered = [path for path, (_, _, codes) in large.items() if ZSTD_FILTER in codes]
    if name == "robomimic-hdf5":  # camera frames among them
        assert filtered, large


def test_packed_datasets_name_their_zstd_filter_in_four_bytes(source: Path, tmp_path: Path) -> None:
    """HDF5 writes the registered name of a filter into each dataset's filter pipeline:
    hdf5plugin's Zstd filter calls itself in 107 characters, obsdelta's registration of the
    same filter ``zstd`` (read in a fresh interpreter without hdf5plugin, so that each name
    is the one stored; the values are read by hdf5plugin's own registration in
    ``test_pack_readers``)."""
    packed = tmp_path / "p.h5"
    compress(source, packed, pack=True)
    script = (
        "import sys, h5py\n"
        "names = []\n"
        "def visit(name, obj):\n"
        "    if isinstance(obj, h5py.Dataset):\n"
        "        plist = obj.id.get_create_plist()\n"
        "        for i in range(plist.get_nfilters()):\n"
        "            code, _, _, named = plist.get_filter(i)\n"
        f"            if code == {ZSTD_FILTER}: names.append(named.decode())\n"
        "with h5py.File(sys.argv[1], 'r') as f:\n"
        "    f.visititems(visit)\n"
        "print(' '.join(names))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(packed)], capture_output=True, text=True, check=True
    )
    names = out.stdout.split()
    assert names and set(names) == {ZSTD_NAME.decode()}, sorted(set(names))
    assert b"hdf5_plugins" not in packed.read_bytes()


#: The samples that pack smaller than zstd -3 of their bytes (``pong_pixels.pt`` is too small
#: to: see the README).
SMALLER_THAN_ZSTD = [
    "hopper_d4rl.hdf5",
    "hopper_robomimic.hdf5",
    "hopper_ted",
    "hopper_rb",
    "halfcheetah_ted.pt",
]


@pytest.mark.parametrize("name", SMALLER_THAN_ZSTD)
def test_samples_pack_smaller_than_zstd_3(name: str, tmp_path: Path) -> None:
    """A packed file's fixed costs (object headers, filter pipelines, manifest, metadata
    blocks) stay small enough that even a 260 KB replay-buffer dump of 17 files packs below
    ``tar | zstd -3`` of it."""
    import io
    import tarfile

    import zstandard

    src = SAMPLE / name
    if src.is_dir():
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(src, arcname=name)
        raw = buffer.getvalue()
    else:
        raw = src.read_bytes()
    zstd_3 = len(zstandard.ZstdCompressor(level=3).compress(raw))
    packed = tmp_path / "p.h5"
    compress(src, packed, pack=True)
    assert packed.stat().st_size < zstd_3


def _packed_both_ways(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[Path, Path, list[str]]:
    """``src`` packed as the inner container is written (a folder's kept leaves straight into
    the packed file) and, for comparison, from a complete inner container; and the keys the
    packing step read from the inner container in the first."""
    module = importlib.import_module("obsdelta_cli.formats.pack_io")
    read: list[str] = []
    real = module.pack_leaf
    monkeypatch.setattr(
        module, "pack_leaf", lambda leaf, key, *a: read.append(key) or real(leaf, key, *a)
    )
    compress(src, tmp_path / "early.h5", pack=True, **options)
    first = list(read)  # by the first only
    with monkeypatch.context() as m:
        m.setattr(type(detect(src)), "pack", "file")
        compress(src, tmp_path / "after.h5", pack=True, **options)
    return tmp_path / "early.h5", tmp_path / "after.h5", ["/".join(k) for k in first]


@pytest.mark.parametrize("name", packable("leaves"))
@pytest.mark.parametrize("codec", ["auto", "fp16"])
def test_a_folder_s_kept_leaves_go_straight_into_the_packed_file(
    name: str, codec: str, tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leaves a folder keeps unchanged are encoded into the packed file while the input is
    read, not written to the working copy and packed from there: the packed file holds the
    same objects either way, and gives the input back."""
    src = input_in(name, tmp_path, hopper)
    early, after, read = _packed_both_ways(src, tmp_path, monkeypatch, codec=codec)
    with h5py.File(early) as f:
        kept = [p for p in _datasets(f) if not p.startswith("obsdelta/") and "delta" not in p]
    assert kept and not set(kept) & set(read)
    assert h5_objects(early) == h5_objects(after)
    verify(early)
    inflate(early, tmp_path / "back")
    inflate(after, tmp_path / "reference")  # lossless: the input itself
    same_container(tmp_path / "reference", tmp_path / "back")
    if codec == "auto":
        same_container(src, tmp_path / "back")


def test_a_folder_packed_again_for_a_key_that_does_not_pay_rewrites_its_chunks_in_place(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key whose next observations do not follow its observations makes the inner container
    written again (see ``Unpaid``): each leaf going straight into the packed file is written
    again from its first row, its chunks in place: no chunk is stored twice (each here takes
    tens of KB; the files differ by the order their objects were made in)."""
    td = hopper.clone()
    order = torch.randperm(td.shape[0], generator=torch.Generator().manual_seed(0))
    td["state"] = td["observation"] * 2
    td["next", "state"] = td["next", "observation"][order] * 2
    src = write_memmap(td, tmp_path / "in")
    early, after, _read = _packed_both_ways(src, tmp_path, monkeypatch)
    assert h5_objects(early) == h5_objects(after)
    with h5py.File(early) as f:
        smallest = min(f[p].id.get_storage_size() for p in ("observation", "state"))
    assert smallest > 16 << 10
    assert early.stat().st_size <= after.stat().st_size + 4096
    assert [(k.key, k.codec) for k in report(early).keys] == [("next/observation", "exact")]
    verify(early)
    inflate(early, tmp_path / "back")
    assert tree_hash(tmp_path / "back") == tree_hash(src)


@pytest.mark.parametrize("block", [1, 7, 100, 101, 3000])
def test_rows_given_in_any_blocks_are_stored_as_a_whole_pass_stores_them(
    block: int, tmp_path: Path
) -> None:
    """A leaf written row block by row block (the blocks of a pass, not the chunks) is stored
    chunk for chunk as packing it whole stores it, with the same entry."""
    module = importlib.import_module("obsdelta_cli.formats.pack_io")
    writers = importlib.import_module("obsdelta_cli.formats.pack_writer")
    rows = np.random.default_rng(0).integers(0, 4, (1003, 21, 16), dtype=np.uint8).cumsum(0)
    rows = rows.astype(np.uint8)
    leaf = FileLeaf(_raw(tmp_path / "frames.memmap", rows), rows.dtype, rows.shape)
    try:
        with module.packed_output(tmp_path / "whole.h5") as f:
            whole = writers.pack_leaf(leaf, ("frames",), f, writers.Chooser())
        with module.packed_output(tmp_path / "blocks.h5") as f:
            early = writers.Early(f, writers.Chooser())
            writer = early(("frames",), leaf)
            for start in range(0, len(rows), block):
                writer.write(start, rows[start : start + block])
            (entry,) = early.entries().values()
    finally:
        leaf.close()
    assert entry == whole and entry["filter"]
    assert h5_objects(tmp_path / "blocks.h5") == h5_objects(tmp_path / "whole.h5")
    with h5py.File(tmp_path / "blocks.h5") as f:
        ds = f["frames"]
        chunks = [ds.id.read_direct_chunk((i, 0, 0)) for i in range(0, len(rows), ds.chunks[0])]
    with h5py.File(tmp_path / "whole.h5") as f:
        ds = f["frames"]
        assert chunks == [
            ds.id.read_direct_chunk((i, 0, 0)) for i in range(0, len(rows), ds.chunks[0])
        ]


def _raw(path: Path, rows: np.ndarray) -> Path:
    path.write_bytes(rows.tobytes())
    return path


@pytest.mark.usefixtures("frame_deltas_of_0_2")
def test_frames_read_in_order_are_decoded_ahead(tmp_path: Path, pong: TensorDictBase) -> None:
    """Reads of a frame-delta dataset in order have the chunks that follow decoded while the
    caller works (as ``verify`` and ``inflate`` read); random reads decode only what they ask."""
    gen = torch.Generator().manual_seed(1)
    steps = torch.randint(-1, 2, (3000, 1, 32, 32), generator=gen)
    pixels = ((torch.randint(0, 256, (1, 1, 32, 32), generator=gen) + steps.cumsum(0)) % 256).to(
        torch.uint8
    )
    frames = torch.cat([pong.clone()] * 15)
    frames["pixels"] = pixels
    frames["next", "pixels"] = torch.cat([pixels[1:], pixels[-1:]])
    src = write_memmap(frames, tmp_path / "in")
    compress(src, tmp_path / "p.h5", pack=True)
    fmt, source = open_input(tmp_path / "p.h5")
    try:
        leaf = source.leaves[("pixels",)]
        assert leaf.ds.attrs.get(TRANSFORM_ATTR) == "frame-delta" and leaf._direct is not None
        per, chunks = leaf.chunk_rows, -(-leaf.shape[0] // leaf.chunk_rows)
        assert chunks >= 3
        decoded: list[int] = []
        real = leaf._direct._whole
        leaf._direct._whole = lambda index, post: decoded.append(index) or real(index, post)
        for i in (chunks - 1, 0):  # random
            assert np.array_equal(leaf.read(i * per, i * per + 1), pixels[i * per].numpy()[None])
        assert decoded == [chunks - 1, 0]
        decoded.clear()
        leaf.cache.clear()
        for start in range(0, leaf.shape[0], per):  # in order
            block = leaf.read(start, start + per)
            assert np.array_equal(block, pixels[start : start + per].numpy())
            if 0 < start < (chunks - 1) * per:  # the next chunk asked for before it is read
                assert start // per + 1 in decoded
        assert sorted(decoded) == list(range(chunks))  # each once
    finally:
        fmt.close(source)


@pytest.mark.parametrize("pack", [False, True], ids=["compressed", "packed"])
def test_an_output_written_again_later_is_the_same_bytes(pack: bool, tmp_path: Path) -> None:
    """HDF5 outputs carry no times: written again two seconds later (HDF5 keeps times in
    seconds), they are the same bytes. A packed robomimic file's groups stored the times they
    were made, as did the outputs of an input whose groups store times."""
    src = tmp_path / "in.hdf5"
    with (
        h5py.File(SAMPLE / "hopper_robomimic.hdf5") as a,
        h5py.File(src, "w", libver="latest") as b,
    ):
        timed = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
        timed.set_obj_track_times(True)  # as HDF5's C library makes groups unless told not to

        def made(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Group):
                h5py.h5g.create(b.id, name.encode(), gcpl=timed)
                b[name].attrs.update(obj.attrs)
            else:
                b.create_dataset(name, data=obj[()], track_times=False)

        a.visititems(made)
        b.attrs.update(a.attrs)
        stamped = [n for n in ("data", "data/demo_0") if h5py.h5o.get_info(b.id, n.encode()).ctime]
    assert stamped
    for given in (src, SAMPLE / "hopper_robomimic.hdf5"):
        outputs = []
        for run in range(2):
            out = tmp_path / f"out-{given.stem}-{run}.hdf5"
            compress(given, out, pack=pack)
            outputs.append(out.read_bytes())
            time.sleep(2.0 if run == 0 else 0)
        assert outputs[0] == outputs[1], given.name
