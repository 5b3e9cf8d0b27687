"""Raw copies of large contiguous HDF5 datasets (``formats/hdf5_copy.py``): which datasets take
them, that the copy is the object HDF5's own copy would make, and that a failed copy is one
error line with nothing left behind."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from obsdelta_cli import compress, inflate, verify
from obsdelta_cli.blocks import digests
from obsdelta_cli.checksum import block_rows
from obsdelta_cli.codecs import CODECS
from obsdelta_cli.errors import DataError
from obsdelta_cli.formats import detect, hdf5, hdf5_copy
from obsdelta_cli.formats.hdf5_copy import RawCopies, SpanLeaf, raw_copyable
from obsdelta_cli.formats.hdf5_objects import hash_objects
from obsdelta_cli.inputs import manifest_of

from .conftest import SAMPLE
from .test_cli_errors import expect_error
from .test_hdf5 import describe


def _dcpl(**kw: Any) -> Callable[[h5py.Group, str, np.ndarray], h5py.Dataset]:
    def make(f: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
        return f.create_dataset(name, data=data, **kw)

    return make


def _user_fill_ifset(f: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
    return f.create_dataset(name, data=data, fillvalue=7)


def _user_fill_never(f: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_fill_value(np.array(7, data.dtype))
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dcpl.set_obj_track_times(False)  # as h5py creates datasets
    space = h5py.h5s.create_simple(data.shape)
    tid = h5py.h5t.py_create(data.dtype)
    ds = h5py.Dataset(h5py.h5d.create(f.id, name.encode(), tid, space, dcpl=dcpl))
    ds[...] = data
    return ds


def _committed(f: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
    f["shared_type"] = data.dtype
    return f.create_dataset(name, data=data, dtype=f["shared_type"])


def _never_written(f: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
    return f.create_dataset(name, shape=data.shape, dtype=data.dtype)


BIG = np.arange(1 << 16, dtype=np.float32).reshape(-1, 4)  # 256 KiB
CASES: dict[str, tuple[Callable[..., h5py.Dataset], np.ndarray, bool]] = {
    "contiguous float32": (_dcpl(), BIG, True),
    "big-endian float64": (_dcpl(), BIG.astype(">f8"), True),
    "bool": (_dcpl(), np.ones((1 << 15, 2), bool), True),
    "user fill, never written on allocation": (_user_fill_never, BIG, True),
    "chunked": (_dcpl(chunks=(1024, 4)), BIG, False),
    "gzip": (_dcpl(compression="gzip"), BIG, False),
    "small": (_dcpl(), BIG[:1000], False),  # 16,000 bytes
    "compound": (_dcpl(), np.zeros(1 << 15, dtype=[("a", "f4"), ("b", "i4")]), False),
    "fixed strings": (_dcpl(), np.full(1 << 15, b"abcd", dtype="S4"), False),
    "user fill written on allocation": (_user_fill_ifset, BIG, False),
    "committed type": (_committed, BIG, False),
    "never written": (_never_written, BIG, False),
    "timestamps": (_dcpl(track_times=True), BIG, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_which_datasets_are_copied_raw(case: str, tmp_path: Path) -> None:
    make, data, expected = CASES[case]
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        make(f, "x", data)
    with h5py.File(path, "r") as f:
        assert raw_copyable(f["x"], path.stat().st_size) is expected


@pytest.fixture(autouse=True)
def small_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw copies from 16 KiB on, so that the D4RL sample's datasets take them."""
    monkeypatch.setattr(hdf5_copy, "RAW_COPY_MIN", 16 << 10)


def _d4rl_with_odd_objects(path: Path) -> Path:
    """The D4RL sample's rows in a file whose datasets carry what an object copy must keep:
    attributes of several types in creation order, big-endian values, a user fill value never
    written (and flags under 16 KiB, left to HDF5's object copy)."""
    with h5py.File(SAMPLE / "hopper_d4rl.hdf5", "r") as f:
        d = {name: f[name][()] for name in ("observations", "next_observations", "actions")}
        d |= {name: f[name][()] for name in ("rewards", "terminals", "timeouts")}
        qpos, qvel = f["infos/qpos"][()], f["infos/qvel"][()]
    with h5py.File(path, "w") as f:
        obs = f.create_dataset("observations", data=d["observations"])
        f.create_dataset("next_observations", data=d["next_observations"])
        f.create_dataset("actions", data=d["actions"].astype(">f8"))
        _user_fill_never(f.require_group("infos"), "qpos", qpos)
        f.create_dataset("infos/qvel", data=qvel, track_order=True)
        f.create_dataset("rewards", data=d["rewards"])
        f.create_dataset("terminals", data=d["terminals"])
        f.create_dataset("timeouts", data=d["timeouts"])
        obs.attrs["units"] = "rad"
        obs.attrs.create("scale", np.float16(0.5))
        obs.attrs["dims"] = np.arange(11, dtype=">i2")
        for i, name in enumerate(("z", "a", "m")):
            f["infos/qvel"].attrs[name] = i
    return path


def test_a_raw_copy_is_the_object_hdf5_would_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    added: list[str] = []
    original_add = RawCopies.add

    def spy(self: RawCopies, ds: h5py.Dataset, group: h5py.Group, name: str, **kw: Any) -> Any:
        added.append(ds.name)
        return original_add(self, ds, group, name, **kw)

    monkeypatch.setattr(RawCopies, "add", spy)
    out, back = tmp_path / "out.h5", tmp_path / "back.hdf5"
    compress(src, out, codec="exact")
    assert sorted(added) == ["/actions", "/infos/qpos", "/infos/qvel", "/observations", "/rewards"]
    copied = {name.lstrip("/") for name in added}
    # The same object as stored: type, dataspace, creation properties, raw bytes, attributes.
    with h5py.File(src, "r") as f, h5py.File(out, "r") as g:
        want = hash_objects(f, src, lambda n: n not in copied)
        got = hash_objects(g, out, lambda n: n not in copied)
        assert got == {k: v for k, v in want.items() if k != "@"} | {"@": got["@"]}
        for name in copied:
            a, b = f[name].id.get_create_plist(), g[name].id.get_create_plist()
            assert b.get_alloc_time() == a.get_alloc_time()
            assert b.get_fill_time() == a.get_fill_time()
            assert list(g[name].attrs) == list(f[name].attrs)
            assert g[name].id.get_type().equal(f[name].id.get_type())
    stored, original = describe(out), describe(src)
    assert all(stored[name] == original[name] for name in copied)
    verify(out)
    inflate(out, back)
    assert describe(back) == original
    with h5py.File(src, "r") as f, h5py.File(back, "r") as g:
        for name in copied | {"next_observations"}:
            assert g[name][()].tobytes() == f[name][()].tobytes(), name


def test_raw_copies_record_the_block_digests_readers_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block digests of raw-copied datasets are taken as their copies are hashed, not
    read again: they equal those of the leaves as a reader reads them (big-endian values,
    which obsdelta does not read, and flags excepted)."""
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    fed: dict[str, str] = {}
    original_wait = RawCopies.wait

    def spy(self: RawCopies) -> None:
        original_wait(self)
        fed.update(self.blocks)

    monkeypatch.setattr(RawCopies, "wait", spy)
    out = tmp_path / "out.h5"
    compress(src, out, codec="exact")
    assert sorted(fed) == ["infos/qpos", "infos/qvel", "rewards"]  # observations: encoded
    fmt = detect(out)
    source = fmt.open(out)
    try:
        manifest = manifest_of(source)
    finally:
        fmt.close(source)
    assert set(fed) < set(manifest.blocks)
    with h5py.File(out, "r") as f:
        for name in manifest.blocks:
            rows = f[name][()]
            block = block_rows(rows.shape, rows.dtype, manifest.hash_block_bytes)
            assert manifest.blocks[name] == digests(rows, block), name
    verify(out)


def test_without_kernel_copies_the_bytes_are_read_and_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    compress(src, tmp_path / "kernel.h5", codec="exact")
    calls: list[int] = []

    def cross_device(*args: Any) -> int:
        calls.append(1)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(hdf5_copy.os, "copy_file_range", cross_device)
    compress(src, tmp_path / "plain.h5", codec="exact")
    assert calls  # the kernel copy was tried, then the bytes went through pread and pwrite
    assert (tmp_path / "plain.h5").read_bytes() == (tmp_path / "kernel.h5").read_bytes()
    verify(tmp_path / "plain.h5")


def test_a_failed_raw_copy_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    out = tmp_path / "out.h5"

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(hdf5_copy.os, "copy_file_range", full)
    expect_error(cli, "compress", src, "-o", out, says=["no space left on device writing"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.hdf5"]


def test_a_dataset_linked_twice_stays_one_object(tmp_path: Path) -> None:
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    with h5py.File(src, "a") as f:
        f["infos/alias"] = f["infos/qvel"]  # a second hard link to the same dataset
    out, back = tmp_path / "out.h5", tmp_path / "back.hdf5"
    compress(src, out, codec="exact")
    inflate(out, back)
    for path in (out, back):
        with h5py.File(path, "r") as f:
            a, b = h5py.h5o.get_info(f["infos/alias"].id), h5py.h5o.get_info(f["infos/qvel"].id)
            assert a.addr == b.addr and a.rc == 2, path


@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
def test_a_dataset_linked_from_several_groups_stays_one_object(tmp_path: Path, pack: bool) -> None:
    # Links in a group that loses a dataset (the root), and from a group copied whole: each
    # link was copied as an object of its own, and the output failed its own check.
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    links = ["actions", "actions_again", "infos/alias", "metadata/actions"]
    with h5py.File(src, "a") as f:
        for link in links[1:]:
            f[link] = f["actions"]
    out, back = tmp_path / ("out.h5" if pack else "out.hdf5"), tmp_path / "back.hdf5"
    compress(src, out, pack=pack)
    verify(out)
    inflate(out, back)
    assert describe(back) == describe(src)
    with h5py.File(back, "r") as f:
        infos = [h5py.h5o.get_info(f[link].id) for link in links]
        assert {i.addr for i in infos} == {infos[0].addr} and infos[0].rc == len(links)
        with h5py.File(src, "r") as g:
            assert np.array_equal(f["actions"][()], g["actions"][()])


def test_the_same_input_gives_the_same_bytes(tmp_path: Path) -> None:
    """A dataset with timestamps (as the D4RL sample's) keeps HDF5's object copy, which keeps
    its times: compressed a second later, the output is the same file."""
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    with h5py.File(src, "a") as f:
        f.create_dataset("infos/stamped", data=f["infos/qvel"][()], track_times=True)
    outputs = []
    for name in ("a.h5", "b.h5"):
        compress(src, tmp_path / name, codec="exact")
        outputs.append((tmp_path / name).read_bytes())
        time.sleep(1.1)  # HDF5 stores times in seconds
    assert outputs[0] == outputs[1]


def _copied_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts: list[int] = []
    original = os.copy_file_range

    def count(src: int, dst: int, n: int, *rest: Any) -> int:
        done = original(src, dst, n, *rest)
        counts.append(done)
        return done

    monkeypatch.setattr(hdf5_copy.os, "copy_file_range", count)
    return counts


def test_observations_are_written_by_the_pass_that_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoding pass reads the observations whole: it writes their copy as it goes, and
    the kernel copies only the other datasets. The output is the file the kernel copy makes."""
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    with h5py.File(src, "r") as f:
        obs_bytes = f["observations"].id.get_storage_size()
    counts = _copied_bytes(monkeypatch)
    compress(src, tmp_path / "streamed.h5", codec="exact")
    streamed = sum(counts)
    counts.clear()
    monkeypatch.setattr(hdf5_copy, "streamable", lambda ds: False)
    compress(src, tmp_path / "copied.h5", codec="exact")
    assert sum(counts) - streamed == obs_bytes
    assert (tmp_path / "streamed.h5").read_bytes() == (tmp_path / "copied.h5").read_bytes()
    verify(tmp_path / "streamed.h5")


def test_only_native_numbers_are_streamed(tmp_path: Path) -> None:
    path = tmp_path / "kinds.h5"
    with h5py.File(path, "w") as f:
        for name, dtype in [("f4", "<f4"), ("be", ">f4"), ("u1", "u1"), ("b", "?")]:
            f.create_dataset(name, data=np.zeros(4, dtype))
        assert [hdf5_copy.streamable(f[n]) for n in ("f4", "be", "u1", "b")] == [
            True, False, True, False,
        ]  # fmt: skip


def test_a_failed_write_of_streamed_observations_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    out = tmp_path / "out.h5"

    def full(self: SpanLeaf, start: int, value: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SpanLeaf, "write", full)
    expect_error(cli, "compress", src, "-o", out, says=["no space left on device writing"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.hdf5"]


def test_streamed_observations_that_miss_rows_fail_verification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hash recorded for streamed observations is of the rows the pass read; a write that
    lost some is caught before the output is put in place."""
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    original = SpanLeaf.write

    def lossy(self: SpanLeaf, start: int, value: Any) -> None:
        original(self, start, value[1:] if start == 0 else value)

    monkeypatch.setattr(SpanLeaf, "write", lossy)
    with pytest.raises(DataError):
        compress(src, tmp_path / "out.h5", codec="exact")
    assert not (tmp_path / "out.h5").exists()


@pytest.mark.parametrize("codec", [c for c in CODECS if c != "exact"])
def test_new_datasets_written_in_place_are_the_files_h5py_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    """A stored delta (compress) and rebuilt next observations (inflate) go to their
    contiguous storage with pwrite; the files are byte for byte those h5py's writes make."""
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    spans: list[str] = []
    original = hdf5_copy.in_place

    def spy(out: h5py.File, datasets: list[tuple[str, Any]], fd: int) -> Any:
        leaves = original(out, datasets, fd)
        pairs = zip(datasets, leaves, strict=True)
        spans.extend(name for (name, _), leaf in pairs if leaf is not None)
        return leaves

    monkeypatch.setattr(hdf5, "in_place", spy)
    compress(src, tmp_path / "span.h5", codec=codec, max_abs_error=0.01)
    inflate(tmp_path / "span.h5", tmp_path / "span.hdf5")
    assert spans == ["/obsdelta/delta/next_observations", "/next_observations"]
    monkeypatch.setattr(hdf5, "in_place", lambda out, datasets, fd: [None] * len(datasets))
    compress(src, tmp_path / "h5py.h5", codec=codec, max_abs_error=0.01)
    inflate(tmp_path / "h5py.h5", tmp_path / "h5py.hdf5")
    for suffix in (".h5", ".hdf5"):
        ours, theirs = tmp_path / f"span{suffix}", tmp_path / f"h5py{suffix}"
        assert ours.read_bytes() == theirs.read_bytes()
    verify(tmp_path / "span.h5")


def test_inflate_writes_the_observations_in_the_pass_that_rebuilds_from_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inflate reads the observations to rebuild the next ones: it writes their copy from the
    same reads, and the kernel copies only the other datasets. The file is the one the
    kernel copy makes."""
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    small = tmp_path / "small.h5"
    compress(src, small, codec="fp16")
    with h5py.File(small, "r") as f:
        obs_bytes = f["observations"].id.get_storage_size()
    counts = _copied_bytes(monkeypatch)
    inflate(small, tmp_path / "streamed.hdf5")
    streamed = sum(counts)
    counts.clear()
    monkeypatch.setattr(hdf5_copy, "streamable", lambda ds: False)
    inflate(small, tmp_path / "copied.hdf5")
    assert sum(counts) - streamed == obs_bytes
    assert (tmp_path / "streamed.hdf5").read_bytes() == (tmp_path / "copied.hdf5").read_bytes()


def _flip_observation_byte(path: Path) -> None:
    with h5py.File(path, "r") as f:
        offset = f["observations"].id.get_offset() + f["observations"].id.get_storage_size() // 2
    with open(path, "r+b") as raw:
        raw.seek(offset)
        byte = raw.read(1)[0]
        raw.seek(offset)
        raw.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("codec", ["exact", "fp16"])
def test_damaged_observations_fail_the_inflate_that_copies_them(
    tmp_path: Path, cli: Any, codec: str
) -> None:
    """Observations copied by the rebuild pass are checked block by block as they pass: a
    flipped byte is one error line naming them and their damaged rows, and nothing is left
    behind."""
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    small = tmp_path / "small.h5"
    compress(src, small, codec=codec)
    _flip_observation_byte(small)
    out = tmp_path / "back.hdf5"
    says = ["key observations: rows", "do not match their checksum"]
    expect_error(cli, "inflate", small, "-o", out, says=says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.hdf5", "small.h5"]


def test_observation_attributes_are_checked_before_anything_is_copied(
    tmp_path: Path, cli: Any
) -> None:
    src = _d4rl_with_odd_objects(tmp_path / "in.hdf5")
    small = tmp_path / "small.h5"
    compress(src, small, codec="exact")
    with h5py.File(small, "a") as f:
        f["observations"].attrs["units"] = "deg"
    expect_error(cli, "inflate", small, "-o", tmp_path / "back.hdf5", says=["@observations"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.hdf5", "small.h5"]


def test_the_copy_follows_the_decisions_the_plan_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which groups the copy rebuilds is worked out once a command: the plan asks it (which
    observations the encoding pass copies) and the copy follows the same answers, each group's
    contents looked at once (a robomimic file has hundreds of demos under one group)."""
    made: list[hdf5_copy.CopyRule] = []
    scanned: list[str] = []
    decided: list[str] = []
    init, scan = hdf5_copy.CopyRule.__init__, hdf5_copy.CopyRule._scan
    walked = hdf5_copy.CopyRule._walked

    def counted_init(self: hdf5_copy.CopyRule, *args: Any) -> None:
        made.append(self)
        init(self, *args)

    def counted_scan(self: hdf5_copy.CopyRule, group: h5py.Group) -> tuple[bool, bool]:
        if group.name not in self._below:
            scanned.append(group.name)
        return scan(self, group)

    def counted_walked(self: hdf5_copy.CopyRule, group: h5py.Group) -> bool:
        decided.append(group.name)
        return walked(self, group)

    monkeypatch.setattr(hdf5_copy.CopyRule, "__init__", counted_init)
    monkeypatch.setattr(hdf5_copy.CopyRule, "_scan", counted_scan)
    monkeypatch.setattr(hdf5_copy.CopyRule, "_walked", counted_walked)
    compress(SAMPLE / "hopper_robomimic.hdf5", tmp_path / "out.hdf5", codec="exact")
    assert len(made) == 1
    assert scanned and len(scanned) == len(set(scanned))
    assert decided and len(decided) == len(set(decided))  # each group decided once
    verify(tmp_path / "out.hdf5")


@pytest.mark.parametrize("shape", [(), (5,), (4, 3, 2)])
@pytest.mark.parametrize("fill", [None, 7])
def test_allocate_writes_one_zero_and_leaves_the_fill_value(
    tmp_path: Path, shape: tuple[int, ...], fill: int | None
) -> None:
    """A new contiguous dataset gets its whole storage, its first element zero and every
    other the fill value, as h5py's ``ds[0, ..., 0] = 0`` gives it."""
    files = {}
    for how in ("allocate", "h5py"):
        files[how] = tmp_path / f"{how}.h5"
        with h5py.File(files[how], "w") as f:
            ds = f.create_dataset("x", shape=shape, dtype="<f4", fillvalue=fill)
            assert ds.id.get_offset() is None  # late allocation: nothing stored yet
            if how == "allocate":
                hdf5_copy.allocate(ds)
            else:
                ds[(0,) * ds.ndim] = np.zeros((), dtype=ds.dtype)
            assert ds.id.get_offset() is not None
            expected = np.full(shape, fill or 0, dtype="<f4")
            expected[(0,) * len(shape)] = 0
            np.testing.assert_array_equal(ds[()], expected)
    assert files["allocate"].read_bytes() == files["h5py"].read_bytes()
