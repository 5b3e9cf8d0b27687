"""HDF5 layouts: every untouched object comes out exactly as it went in, next observations within
the recorded error, obsdelta's own objects gone after inflate, streaming in bounded memory."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress, inflate, report, verify
from obsdelta_cli.arrays import bfloat16
from obsdelta_cli.errors import InputError
from obsdelta_cli.formats import hdf5_leaves, hdf5_walk
from obsdelta_cli.formats.hdf5 import H5_COMPRESSIONS, read_meta
from obsdelta_cli.formats.hdf5_leaves import H5Arrays, leaves_of
from obsdelta_cli.formats.hdf5_objects import hash_objects, hash_objects_apart
from obsdelta_cli.formats.hdf5_walk import object_at, objects_of
from obsdelta_cli.manifest import FORMAT_VERSION

from .conftest import SAMPLE, Cli, load_sample, marked_h5py_only, tree_hash
from .test_cli_errors import expect_error
from .test_pack import h5_objects, same_transitions
from .writers import write_d4rl, write_minari, write_robomimic, write_ted_hdf5


def _props(obj: Any) -> dict[str, Any]:
    """Everything about an HDF5 object that must survive a round trip, data aside."""
    attrs = {k: (repr(obj.attrs[k]), str(obj.attrs.get_id(k).dtype)) for k in obj.attrs}
    if isinstance(obj, h5py.Group):
        return {"kind": "group", "attrs": attrs}
    return {
        "kind": "dataset",
        "dtype": str(obj.dtype),
        "shape": obj.shape,
        "chunks": obj.chunks,
        "filters": repr(obj._filters),
        "fillvalue": repr(obj.fillvalue),
        "maxshape": obj.maxshape,
        "attrs": attrs,
    }


def describe(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r") as f:
        out["/"] = {"kind": "root", "attrs": {k: repr(f.attrs[k]) for k in f.attrs}}
        f.visititems(lambda name, obj: out.__setitem__(name, _props(obj)))
    return out


def data(path: Path, name: str) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[name][()]


def _next_paths(path: Path) -> list[str]:
    with h5py.File(path, "r") as f:
        if "data" in f:
            return [f"data/{d}/next_obs/{k}" for d in f["data"] for k in f["data"][d]["next_obs"]]
        return ["next_observations"] if "observations" in f else ["next/observation"]


LAYOUTS = {
    "d4rl-sample": lambda tmp, hopper, cheetah: SAMPLE / "hopper_d4rl.hdf5",
    "robomimic-sample": lambda tmp, hopper, cheetah: SAMPLE / "hopper_robomimic.hdf5",
    "d4rl-written": lambda tmp, hopper, cheetah: write_d4rl(cheetah, tmp / "d4rl"),
    "robomimic-written": lambda tmp, hopper, cheetah: write_robomimic(hopper, tmp / "robo"),
    "ted-hdf5": lambda tmp, hopper, cheetah: write_ted_hdf5(cheetah, tmp / "ted"),
}
SETTINGS = [("exact", None), ("fp16", None), ("bf16", None), ("auto", 1e-3), ("q8", 1e-2)]


@pytest.mark.parametrize(("codec", "bound"), SETTINGS, ids=lambda v: str(v))
@pytest.mark.parametrize("layout", marked_h5py_only(LAYOUTS, set(LAYOUTS) - {"ted-hdf5"}))
def test_round_trip_keeps_every_object(
    layout: str,
    codec: str,
    bound: float | None,
    tmp_path: Path,
    hopper: TensorDictBase,
    cheetah: TensorDictBase,
) -> None:
    src = LAYOUTS[layout](tmp_path, hopper, cheetah)
    before = tree_hash(src)
    small, back = tmp_path / "small.h5", tmp_path / "back.h5"
    result = compress(src, small, codec=codec, max_abs_error=bound)
    original, stored = describe(src), describe(small)
    encoded = [k.key for k in result.keys if k.codec != "none"]
    nexts = [n for n in _next_paths(src) if any(n == k or n.endswith("/" + k) for k in encoded)]
    # Every object that was not rewritten is exactly as it was: properties, attributes, data.
    for name, props in original.items():
        if name in nexts:
            assert name not in stored, name
            continue
        if props["kind"] == "group" and name not in stored:
            # A group left with nothing but rewritten datasets, and no attributes, is dropped;
            # inflate recreates it.
            inside = [n for n, p in original.items() if n.startswith(name + "/")]
            assert not props["attrs"] and all(
                n in nexts for n in inside if original[n]["kind"] == "dataset"
            )
            continue
        if name == "/":
            assert {k: v for k, v in stored["/"]["attrs"].items() if k != "obsdelta"} == props[
                "attrs"
            ]
            continue
        assert stored[name] == props, name
        if props["kind"] == "dataset":
            a, b = data(small, name), data(src, name)
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), name
    with h5py.File(small, "r") as f:
        meta = read_meta(f, small)
    assert meta is not None
    assert meta["format"] == result.format and meta["obsdelta_format"] == FORMAT_VERSION

    inflate(small, back)
    restored = describe(back)
    assert restored == original  # same objects, dtypes, chunks, filters, fill values, attributes
    errors = {k.key: k.max_abs_error for k in result.keys}
    for name in nexts:
        got, want = data(back, name), data(src, name)
        err = (
            float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) if got.size else 0
        )
        limit = max(errors.values())
        assert err <= limit
        if bound is not None:
            assert err <= bound
        if codec == "exact" or (codec == "auto" and not bound):
            assert np.array_equal(got, want)
    assert tree_hash(src) == before


def test_robomimic_report_adds_demos_up() -> None:
    result = report(SAMPLE / "hopper_robomimic.hdf5")
    with h5py.File(SAMPLE / "hopper_robomimic.hdf5", "r") as f:
        total = int(f["data"].attrs["total"])
        demos = len(f["data"])
        names = sorted(f["data/demo_0/obs"])
    assert sorted(k.key for k in result.keys) == [f"next_obs/{n}" for n in names]
    for key in result.keys:
        assert key.rows == total and key.shape[0] == total
        assert key.auto_pick == "exact"
        exact = next(c for c in key.candidates or [] if c.codec == "exact")
        assert exact.exception_rows == demos  # one final frame per demo
    pixels = next(k for k in result.keys if k.key == "next_obs/camera_image")
    assert pixels.dtype == "uint8"


def test_exact_stores_d4rl_next_observations_in_under_3_percent(tmp_path: Path) -> None:
    (key,) = compress(SAMPLE / "hopper_d4rl.hdf5", tmp_path / "s.h5", codec="exact").keys
    assert key.bytes_after <= 0.03 * key.bytes_before
    with h5py.File(tmp_path / "s.h5", "r") as f:
        arrays = f["metadata/obsdelta/arrays"]  # D4RL keeps obsdelta's group under its metadata
        on_disk = sum(arrays[n].id.get_storage_size() for n in arrays)
    assert on_disk <= 0.03 * key.bytes_before


@pytest.mark.parametrize("name", H5_COMPRESSIONS)
def test_h5_compression_of_deltas(name: str, tmp_path: Path) -> None:
    if name in ("zstd", "blosc"):
        pytest.importorskip("hdf5plugin")
    src = SAMPLE / "hopper_d4rl.hdf5"
    result = compress(src, tmp_path / "s.h5", codec="fp16", options={"h5_compression": name})
    with h5py.File(tmp_path / "s.h5", "r") as f:
        delta = f["metadata/obsdelta/delta/next_observations"]
        filters = set(delta._filters)
        stored = delta.id.get_storage_size()
    expected = {"gzip": "gzip", "lzf": "lzf", "zstd": "32015", "blosc": "32001"}.get(name)
    assert (expected in filters) if expected else not filters
    raw = result.keys[0].bytes_after  # the float16 values
    if name in ("gzip", "zstd", "blosc"):
        assert stored < raw
    elif name == "none":
        assert stored == raw  # chunks of whole rows: no padding
    # The report on the compressed file shows the effect: bytes as stored on disk.
    assert report(tmp_path / "s.h5").keys[0].bytes_after == stored
    inflate(tmp_path / "s.h5", tmp_path / "b.h5")
    assert describe(tmp_path / "b.h5") == describe(src)


def test_minari_is_explained_not_compressed(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase
) -> None:
    src = write_minari(hopper, tmp_path / "main_data")
    out = cli("report", src, "--json").stdout
    line = json.loads(out)
    assert (
        line["format"] == "minari-hdf5"
        and "observations once" in line["note"]
        and line["keys"] == []
    )
    assert "observations once" in cli("report", src).stdout
    expect_error(
        cli, "compress", src, "-o", tmp_path / "o.h5", says=[src, "Minari", "observations once"]
    )


def test_minari_is_explained_before_its_leaves_are_walked(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of thousands of episodes took 4 s to be walked for leaves it has no use for."""
    src = write_minari(hopper, tmp_path / "main_data")
    walked: list[Path] = []
    real = hdf5_leaves.leaves_of

    def counted(f: h5py.File, file: Path, *args: Any, **kwargs: Any) -> Any:
        walked.append(file)
        return real(f, file, *args, **kwargs)

    monkeypatch.setattr("obsdelta_cli.formats.hdf5.leaves_of", counted)
    note = report(src).note
    assert note is not None and "observations once" in note
    with pytest.raises(InputError, match="observations once"):
        compress(src, tmp_path / "o.h5")
    assert walked == [] and not (tmp_path / "o.h5").exists()
    report(src, pack=True)  # packed, it is read
    assert walked


def _d4rl_copy(tmp_path: Path, edit: Any) -> Path:
    path = tmp_path / "d.hdf5"
    path.write_bytes((SAMPLE / "hopper_d4rl.hdf5").read_bytes())
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def _replace(name: str, value: np.ndarray) -> Any:
    def edit(f: h5py.File) -> None:
        del f[name]
        f.create_dataset(name, data=value)

    return edit


@pytest.mark.parametrize("command", ["compress", "report"])
@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("truncated", ["cannot open as HDF5"]),
        ("flipped", ["next_observations", "damaged"]),
        ("shape", ["next_observations", "differs"]),
        ("empty", ["next_observations", "no rows"]),
        ("no-layout", ["no layout obsdelta reads"]),
        ("big-endian", ["needs observations, which is stored big-endian (>f4)"]),
        ("reference-attr", ["attribute ref of /actions holds HDF5 object references"]),
        ("reference-dataset", ["dataset /infos/refs holds HDF5 object references"]),
    ],
)
def test_bad_hdf5_inputs(
    cli: Cli, tmp_path: Path, command: str, case: str, says: list[str]
) -> None:
    sample = SAMPLE / "hopper_d4rl.hdf5"
    if case == "truncated":
        src = tmp_path / "t.hdf5"
        src.write_bytes(sample.read_bytes()[: sample.stat().st_size // 2])
    elif case == "flipped":
        src = _d4rl_copy(tmp_path, lambda f: None)
        with h5py.File(src, "r") as f:
            offset = f["next_observations"].id.get_chunk_info(1).byte_offset
        raw = bytearray(src.read_bytes())
        raw[offset + 10 : offset + 400] = bytes(390)  # zero a compressed chunk's bytes
        src.write_bytes(bytes(raw))
    elif case == "shape":
        src = _d4rl_copy(tmp_path, _replace("next_observations", np.zeros((5000, 10), np.float32)))
    elif case == "empty":
        edit = _replace("next_observations", np.zeros((0, 11), np.float32))
        src = _d4rl_copy(
            tmp_path,
            lambda f: (edit(f), _replace("observations", np.zeros((0, 11), np.float32))(f)),
        )
    elif case == "big-endian":  # the observations only: the pair needs both

        def big(f: h5py.File) -> None:
            _replace("observations", f["observations"][()].astype(">f4"))(f)

        src = _d4rl_copy(tmp_path, big)
    elif case.startswith("reference"):  # copied as stored, they would point nowhere

        def refer(f: h5py.File) -> None:
            if case == "reference-attr":
                f["actions"].attrs["ref"] = f["rewards"].ref
            else:
                f.create_dataset("infos/refs", data=[f["rewards"].ref], dtype=h5py.ref_dtype)

        src = _d4rl_copy(tmp_path, refer)
    else:
        src = tmp_path / "other.h5"
        with h5py.File(src, "w") as f:
            f["weights/layer0"] = np.zeros((3, 3))
    extra = ["--key", "observations"] if case == "shape" else []
    args = [command, src, *(["-o", tmp_path / "out.h5"] if command == "compress" else []), *extra]
    expect_error(cli, *args, says=[src, *says])


@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("dtype", ["f4", "i4"])
def test_scale_offset_datasets_round_trip(tmp_path: Path, pack: bool, dtype: str) -> None:
    # HDF5 2.0 overran a buffer copying a scale-offset dataset whose chunks were in its chunk
    # cache, as they are once a pair's observations have been read: the process aborted
    # (malloc(): invalid size). Commands run in processes of their own, so an abort shows.
    def scaled(f: h5py.File) -> None:
        for name in ("observations", "next_observations"):
            value = (f[name][()] * (1000 if dtype == "i4" else 1)).astype(dtype)
            del f[name]
            # The observations only: rebuilt next observations go back through their filter.
            kept = {"chunks": (64, value.shape[1]), "scaleoffset": 3} if name[0] == "o" else {}
            f.create_dataset(name, data=value, **kept)

    src = _d4rl_copy(tmp_path, scaled)
    small = tmp_path / ("small.h5" if pack else "small.hdf5")
    back = tmp_path / "back.hdf5"
    for argv in (
        ["compress", src, "-o", small, *(["--pack"] if pack else [])],
        ["verify", small],
        ["inflate", small, "-o", back],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "obsdelta_cli", *map(str, argv), "--quiet"],
            capture_output=True,
            text=True,
        )
        assert (done.returncode, done.stderr) == (0, ""), argv
    assert describe(back) == describe(src)
    for name in ("observations", "next_observations", "actions"):
        assert np.array_equal(data(back, name), data(src, name)), name


@pytest.mark.parametrize("command", ["compress", "report"])
def test_a_scale_offset_next_observation_is_not_rebuilt(tmp_path: Path, command: str) -> None:
    # Written back through the filter, rebuilt values are rounded again: not the ones stored.
    def scaled(f: h5py.File) -> None:
        value = f["next_observations"][()]
        del f["next_observations"]
        f.create_dataset("next_observations", data=value, chunks=(64, 11), scaleoffset=3)

    src = _d4rl_copy(tmp_path, scaled)
    says = [src, "next_observations is stored with HDF5's scale-offset filter", "exactly"]
    out = [] if command == "report" else ["-o", tmp_path / "small.hdf5"]
    expect_error(Cli(), command, src, *out, says=says)


def _peak_rss_mb(src: Path, out: Path) -> float:
    code = (
        "import resource, sys\n"
        "from obsdelta_cli import compress\n"
        "compress(sys.argv[1], sys.argv[2], codec='fp16', chunk_mb=2)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip())


def test_peak_memory_does_not_grow_with_the_file(tmp_path: Path, hopper: TensorDictBase) -> None:
    """Streaming: a file 4x larger costs no more memory (both far above the 2 MiB budget)."""
    obs = hopper["observation"].numpy()
    nxt = hopper["next", "observation"].numpy()
    peaks = []
    for tiles in (150, 600):  # about 40 MB and 160 MB of observations
        src = tmp_path / f"big{tiles}.hdf5"
        with h5py.File(src, "w") as f:
            for name, block in (("observations", obs), ("next_observations", nxt)):
                ds = f.create_dataset(
                    name, shape=(tiles * len(block), 11), dtype=np.float32, chunks=(8192, 11)
                )
                for i in range(tiles):
                    ds[i * len(block) : (i + 1) * len(block)] = block
        peaks.append(_peak_rss_mb(src, tmp_path / f"out{tiles}.h5"))
        src.unlink()
    small, big = peaks
    print(f"peak RSS: {small:.0f} MB (40 MB file), {big:.0f} MB (160 MB file)")
    assert big - small < 24, peaks


@pytest.mark.parametrize("codec", ["exact", "fp16", "q8"])
def test_compressed_ted_hdf5_opens_with_from_h5(
    tmp_path: Path, cheetah: TensorDictBase, codec: str
) -> None:
    """obsdelta's own arrays are opaque and its layout copies have the batch shape, so
    tensordict's reader accepts the compressed file with the batch size of the data."""
    from tensordict import PersistentTensorDict

    td = cheetah.reshape(-1).clone()
    td["next", "observation"][7] = 1e6  # an exception row for every codec
    src = write_ted_hdf5(td, tmp_path / "in")
    small = tmp_path / "small.h5"
    result = compress(src, small, codec=codec, max_abs_error=1e-2 if codec == "q8" else None)
    assert result.keys[0].exception_rows >= 1
    opened = PersistentTensorDict.from_h5(small, batch_size=[td.shape[0]])
    local = opened.to_tensordict()
    assert torch.equal(local["observation"], td["observation"])
    assert (("next", "delta", "observation") in local.keys(True, True)) == (codec != "exact")
    opened.close()


@pytest.mark.parametrize(
    "layout",
    ["contiguous", "chunked", "gzip", "bf16", "written"],
)
def test_rows_read_at_their_offset_are_the_rows_hdf5_reads(tmp_path: Path, layout: str) -> None:
    """Contiguous datasets of a file open read-only are read with ``preadv``; everything else
    (chunked, filtered, a file open for writing) through HDF5: the same rows."""
    from obsdelta_cli.formats.hdf5_leaves import BF16_ATTR, H5Leaf

    values = np.random.default_rng(0).normal(size=(1000, 7)).astype(np.float32)
    options: dict[str, Any] = {
        "chunked": {"chunks": (64, 7)},
        "gzip": {"compression": "gzip"},
    }.get(layout, {})
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        bits = values.astype(bfloat16()).view(np.int16)
        data = bits if layout == "bf16" else values
        ds = f.create_dataset("x", data=data, **options)
        if layout == "bf16":
            ds.attrs[BF16_ATTR] = "bfloat16"
    with h5py.File(path, "r+" if layout == "written" else "r") as f:
        leaf = H5Leaf(f["x"], path)
        raw = leaf._raw_rows(10, 990)
        assert (raw is not None) == (layout in ("contiguous", "bf16"))
        got = leaf.read(10, 990)
        expect = np.ascontiguousarray(f["x"][10:990]).astype("=" + f["x"].dtype.str[1:])
        if layout == "bf16":
            expect = expect.view(bfloat16())
        assert isinstance(got, np.ndarray) and got.dtype == expect.dtype
        assert np.array_equal(got.view(np.uint8), expect.view(np.uint8))
        assert leaf.read(995, 2000).shape == (5, 7)  # past the end: the rows there are


def _descriptors_of(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_the_datasets_of_a_file_share_its_descriptors(tmp_path: Path) -> None:
    # Hundreds of robomimic datasets each opened the file twice (and mapped it) before.
    path = tmp_path / "demos.hdf5"
    values = np.arange(40 * 1000 * 11, dtype=np.float32).reshape(40, 1000, 11)
    with h5py.File(path, "w") as f:
        for i in range(40):
            f.create_dataset(f"data/demo_{i}/obs", data=values[i])
    with h5py.File(path, "r") as f:
        leaves = leaves_of(f, path)
        before = _descriptors_of(path)
        for i in range(40):
            rows = leaves[("data", f"demo_{i}", "obs")].read(0, 1000)
            assert rows.dtype == values.dtype and np.array_equal(rows, values[i])
        # One descriptor, and one more for reads past the page cache, for all 40.
        assert _descriptors_of(path) - before <= 2
        del leaves, rows
    assert _descriptors_of(path) == 0


def test_exception_arrays_are_found_once_when_read_only_and_afresh_when_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "arrays.hdf5"
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    f32 = np.dtype(np.float32)
    with h5py.File(path, "w") as f:
        arrays = H5Arrays(f, path)
        arrays.append("k0.rows", rows)
        assert arrays.get("k0.rows", f32, (4, 3))[:].shape[0] == 4
        arrays.append("k0.rows", rows)  # a writer sees what it appended
        assert np.array_equal(arrays.get("k0.rows", f32, (8, 3))[4:], rows)
    with h5py.File(path, "r") as f:
        arrays = H5Arrays(f, path)
        first = arrays.get("k0.rows", f32, (8, 3))
        assert arrays.get("k0.rows", f32, (8, 3)) is first
        with pytest.raises(InputError, match="not of shape"):
            arrays.get("k0.rows", f32, (9, 3))  # still checked for each question


@pytest.mark.parametrize("small", [8 << 20, 0], ids=["read-whole", "read-by-rows"])
def test_exception_arrays_read_whole_or_by_rows_rebuild_alike(
    small: int, hopper: TensorDictBase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small exception array is read whole once; a large one a pair's rows at a time: both
    give verify, inflate and open_dataset the same rows (robomimic: many pairs share each)."""
    monkeypatch.setattr(hdf5_leaves, "SMALL_ARRAY", small)
    src = write_robomimic(hopper, tmp_path / "in")
    out = tmp_path / "c.hdf5"
    compress(src, out, codec="exact")
    with h5py.File(out, "r") as f:
        arrays = H5Arrays(f, out)
        found = arrays.get("k0.index", np.dtype(np.int64), f["obsdelta/arrays/k0.index"].shape)
        assert isinstance(found, np.ndarray) == bool(small)
    verify(out)
    inflate(out, tmp_path / "back.hdf5")
    assert h5_objects(src) == h5_objects(tmp_path / "back.hdf5")
    same_transitions(src, out)


@pytest.mark.parametrize("track_order", [False, True])
def test_copy_attrs_keeps_every_kind_of_attribute(tmp_path: Path, track_order: bool) -> None:
    """Values, stored types (string padding, charset, byte order, enums, compounds, variable
    lengths), dataspaces (scalar, arrays, empty) and h5py's order of attributes."""
    with h5py.File(tmp_path / "a.h5", "w", track_order=track_order) as f:
        src, dst = f.create_group("src"), f.create_group("dst")
        a = src.attrs
        a["z_int"], a["s"], a["arr"] = 3, "ünï", np.arange(5.0)
        a["bytes"], a["empty"] = np.bytes_(b"xyz"), h5py.Empty("f4")
        a["vlen_utf8"] = np.array(["a", "bb"], dtype=h5py.string_dtype())
        a["vlen_ascii"] = np.array([b"a", b"bb"], dtype=h5py.string_dtype("ascii"))
        a["bool"], a["bools"] = np.bool_(True), np.array([True, False])
        a["compound"] = np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")])
        a["enum"] = np.array([0, 1], dtype=h5py.enum_dtype({"A": 0, "B": 1}, basetype="i1"))
        a["vlen_int"] = np.array([np.arange(3), np.arange(2)], dtype=h5py.vlen_dtype("i4"))
        a["big_endian"], a["2d"] = np.arange(3, dtype=">f8"), np.ones((2, 3), dtype="u2")
        a.create("fixed", np.bytes_(b"abc"), dtype=h5py.string_dtype("ascii", 5))
        a.create("fixed_utf8", "é".encode(), dtype=h5py.string_dtype("utf-8", 8))
        hdf5_leaves.copy_attrs(src, dst)
        assert list(dst.attrs) == list(src.attrs)
        for name in src.attrs:
            want, got = src.attrs.get_id(name), dst.attrs.get_id(name)
            assert got.get_type().equal(want.get_type()), name
            assert got.shape == want.shape, name
            assert repr(dst.attrs[name]) == repr(src.attrs[name]), name


@pytest.mark.parametrize("mode", ["r", "r+"])
def test_the_walk_gives_what_h5py_visits(tmp_path: Path, mode: str) -> None:
    # objects_of makes the objects with h5py's low-level calls: the same names, kinds, objects
    # and read-only flags as visititems, for every kind of object and name.
    path = tmp_path / "kinds.h5"
    with h5py.File(path, "w") as f:
        f["a/b/values"] = np.arange(6.0).reshape(3, 2)
        f["a/twice"] = f["a/b/values"]  # one object, two links: visited once
        f["types/t"] = np.dtype("<f4")  # a committed datatype
        f.create_group(b"caf\xe9")  # a name that is not UTF-8
        f.create_dataset("chunked", data=np.zeros((100, 3)), chunks=(10, 3))
    with h5py.File(path, mode) as f:
        expected: list[tuple[Any, Any]] = []
        f.visititems(lambda name, obj: expected.append((name, obj)))
        got = list(objects_of(f))
        assert [(n, type(o), o.id) for n, o in got] == [(n, type(o), o.id) for n, o in expected]
        assert b"caf\xe9" in [n for n, _ in got]
        assert any(isinstance(o, h5py.Datatype) for _, o in got)
        for (_, mine), (_, theirs) in zip(got, expected, strict=True):
            if isinstance(mine, h5py.Dataset):
                assert mine._readonly == theirs._readonly == (mode == "r")
                assert np.array_equal(mine[()], theirs[()])


def test_a_file_open_read_only_is_walked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening a file's leaves, hashing its objects and packing it each walk it: once for a
    # robomimic file's thousands of objects.
    path = write_robomimic(load_sample("hopper_ted")[:300], tmp_path / "demos.hdf5")
    walks: list[str] = []
    real = hdf5_walk._names

    def names(f: h5py.File) -> Any:
        walks.append(f.name)
        return real(f)

    monkeypatch.setattr(hdf5_walk, "_names", names)
    with h5py.File(path, "r") as f:
        expected: list[tuple[str, Any]] = []
        f.visititems(lambda name, obj: expected.append((name, obj)))
        leaves = leaves_of(f, path)
        hashes = hash_objects(f, path, lambda name: False)
        # What h5py's own walk gives, in its order, as objects of the same kinds and ids.
        assert [(n, type(o), o.id) for n, o in objects_of(f)] == [
            (n, type(o), o.id) for n, o in expected
        ]
        assert object_at(f, "data/demo_0/obs") == f["data/demo_0/obs"]
        assert walks == ["/"] and leaves and hashes
    with h5py.File(path, "r") as f:  # another File: walked afresh
        assert [name for name, _ in objects_of(f)] == [n for n, _ in expected]
        assert len(walks) == 2
        key = id(f)
    del f
    gc.collect()
    assert key not in hdf5_walk._SHARED  # the walk went with its File
    with h5py.File(path, "r+") as f:  # open for writing: objects may change, walked each time
        list(objects_of(f))
        f.create_group("added")
        assert "added" in [name for name, _ in objects_of(f)] and len(walks) == 4


def _open_objects(f: h5py.File) -> int:
    return int(h5py.h5f.get_obj_count(f.id, h5py.h5f.OBJ_DATASET | h5py.h5f.OBJ_GROUP))


def test_a_file_of_many_objects_is_read_with_few_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HDF5 keeps about 12.5 KB for each open object: a robomimic file of 2,000 demos (34,000
    # objects) held 424 MB open once walked, and its leaves 150 MB more. Now at most HELD are.
    path = write_robomimic(load_sample("hopper_ted")[:300], tmp_path / "demos.hdf5")
    monkeypatch.setattr(hdf5_walk, "HELD", 4)
    with h5py.File(path, "r") as f:
        assert sum(1 for _ in objects_of(f)) > 4 * 4 and _open_objects(f) <= 4
        leaves = leaves_of(f, path)
        assert len(leaves) > 4 and _open_objects(f) <= 4
        for key, leaf in leaves.items():  # each read gives the values, however few are open
            name = "/".join(key)
            assert np.array_equal(leaf.read(0, leaf.shape[0]), f[name][()])
            assert leaf.ds.name == f"/{name}" and _open_objects(f) <= 4 + 1  # f[name]'s own
    out = tmp_path / "out.hdf5"
    compress(path, out)
    verify(out)
    inflate(out, tmp_path / "back.hdf5")
    assert h5_objects(tmp_path / "back.hdf5") == h5_objects(path)


def test_a_second_pass_over_a_file_of_many_objects_finds_most_of_them_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every pass asks for a file's objects in the same order: with only the most recently used
    # kept, a file of more objects than HELD had each closed just before it was asked for again.
    path = write_robomimic(load_sample("hopper_ted")[:300], tmp_path / "demos.hdf5")
    monkeypatch.setattr(hdf5_walk, "HELD", 8)
    opened: list[bytes] = []
    real = hdf5_walk._open

    def counted(f: h5py.File, raw: bytes, *rest: Any) -> Any:
        opened.append(raw)
        return real(f, raw, *rest)

    monkeypatch.setattr(hdf5_walk, "_open", counted)
    with h5py.File(path, "r") as f:
        names = [name for name, _ in objects_of(f)]
        assert len(names) > 3 * 8 and len(opened) == len(names)
        opened.clear()
        assert [name for name, _ in objects_of(f)] == names
        assert len(opened) == len(names) - 7  # the first 7 stay open, 1 place for the rest
        assert _open_objects(f) <= 8


def _streams_case(path: Path, layout: str) -> Path:
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((20000, 17)).astype(np.float32)  # 1.4 MB: copied raw if contiguous
    nxt = np.concatenate([obs[1:], obs[:1]])
    chunks = (500, 17) if layout == "chunked" else None
    with h5py.File(path, "w") as f:
        if layout == "group-with-a-second-link":  # robomimic's layout
            demo = f.create_group("data/demo_0")
            demo.attrs["num_samples"] = len(obs)
            demo["obs/state"], demo["next_obs/state"] = obs, nxt
            demo["actions"], demo["rewards"] = obs[:, :3], obs[:, 0]
            demo["dones"] = np.zeros(len(obs), np.int64)
            demo["obs/twice"] = np.arange(4)
            demo["obs/again"] = demo["obs/twice"]  # one object, two links: one copy, relinked
            return path
        f.create_dataset("observations", data=obs, chunks=chunks, track_times=False)
        f.create_dataset("next_observations", data=nxt, chunks=chunks, track_times=False)
        f.create_dataset("actions", data=obs[:, :3], track_times=False)
        f.create_dataset("rewards", data=obs[:, 0], track_times=False)
        f.create_dataset("terminals", data=np.zeros(len(obs), bool), track_times=False)
        f.create_dataset("timeouts", data=np.arange(len(obs)) % 1000 == 999, track_times=False)
    return path


@pytest.mark.parametrize("layout", ["contiguous", "chunked", "group-with-a-second-link"])
def test_the_plan_streams_exactly_what_the_copy_leaves_to_the_encoding_pass(
    layout: str, tmp_path: Path
) -> None:
    """Observations are checked by the pass that copies them, so the plan's streamed set and
    what the HDF5 copy leaves to the encoding pass must be the same set (one rule): one the copy
    took whole, yet planned as streamed, was checked by neither."""
    from obsdelta_cli.commands.common import streamed_observations
    from obsdelta_cli.formats import LeafSpec, Plan
    from obsdelta_cli.inputs import open_input, stream_for

    src = _streams_case(tmp_path / "in.hdf5", layout)
    fmt, source = open_input(src)
    try:
        pairs = [p for p in fmt.pairs(source) if p.next_key in source.leaves]
        assert len(pairs) == 1
        stream = stream_for(source, source.batch_dims - 1, 1.0)
        order = [k for k in source.leaves if k != pairs[0].next_key]
        new: dict[Any, LeafSpec] = {}
        streamed = streamed_observations(fmt, source, stream, pairs, order, new)
        plan = Plan(order, new, [pairs[0].next_key], {}, streamed)
        sink = fmt.create(tmp_path / "out.h5", source, plan)
        try:
            assert set(sink.streamed) == set(plan.streamed)
        finally:
            fmt.discard(sink)
    finally:
        fmt.close(source)
    # Contiguous observations are copied raw, so streamed, in a group walked object by object
    # (one holding a second link is too); chunked ones are copied whole by HDF5.
    assert (plan.streamed == {pairs[0].obs_key}) == (layout != "chunked")


@pytest.mark.parametrize("name", ["hopper_d4rl.hdf5", "hopper_robomimic.hdf5"])
def test_objects_hashed_apart_are_hashed_alike(name: str) -> None:
    path = SAMPLE / name
    with h5py.File(path, "r") as f:
        skip = lambda n: n.endswith("actions")  # noqa: E731
        assert hash_objects_apart(f, path, skip, {"rewards": "x"}) == hash_objects(
            f, path, skip, {"rewards": "x"}
        )
