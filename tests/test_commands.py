"""Round trips through compress / inflate on real rollouts.

Parametrised over codec x source dtype x shape (with nested keys) x container format."""

from __future__ import annotations

import importlib
import json
import math
import zipfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from obsdelta_cli import compress, inflate, report
from obsdelta_cli.arrays import from_torch, numpy_dtype, torch_dtype
from obsdelta_cli.codecs import CODECS, make_codec
from obsdelta_cli.errors import DataError, UsageError
from obsdelta_cli.inputs import open_input
from obsdelta_cli.manifest import FORMAT_VERSION
from obsdelta_cli.stats import bit_equal_rows

from .conftest import read_any, tree_hash
from .writers import WRITERS

DTYPES = [torch.float16, torch.float32, torch.float64]


def _ted(obs: torch.Tensor, nxt: torch.Tensor, batch_dims: int) -> TensorDict:
    """A TED TensorDict around an (obs, next obs) pair, with the usual companions."""
    batch = obs.shape[:batch_dims]
    return TensorDict(
        {
            "observation": obs,
            "action": torch.linspace(-1, 1, int(torch.Size(batch).numel()) * 2).reshape(*batch, 2),
            "done": torch.zeros(*batch, 1, dtype=torch.bool),
            "next": {
                "observation": nxt,
                "reward": torch.arange(torch.Size(batch).numel(), dtype=torch.float32).reshape(
                    *batch, 1
                ),
                "done": torch.ones(*batch, 1, dtype=torch.bool),
            },
        },
        batch_size=batch,
    )


def _case(
    shape: str,
    dtype: torch.dtype,
    hopper: TensorDictBase,
    cheetah: TensorDictBase,
    pong: TensorDictBase,
) -> TensorDict:
    if shape == "T,D":
        return _ted(hopper["observation"].to(dtype), hopper["next", "observation"].to(dtype), 1)
    if shape == "B,T,D":
        return _ted(cheetah["observation"].to(dtype), cheetah["next", "observation"].to(dtype), 2)
    if shape == "T,C,H,W":
        scale = 1 / 255
        return _ted(
            (pong["pixels"] * scale).to(dtype), (pong["next", "pixels"] * scale).to(dtype), 1
        )
    if shape == "nested":
        td = _ted(hopper["observation"].to(dtype), hopper["next", "observation"].to(dtype), 1)
        td["agent", "obs"] = hopper["observation"][:, :5].to(dtype) * 10
        td["next", "agent", "obs"] = hopper["next", "observation"][:, :5].to(dtype) * 10
        return td
    raise AssertionError(shape)


UNIT_ROUNDOFF = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
    torch.float64: 2.0**-53,
}


def _bound(obs: torch.Tensor, nxt: torch.Tensor, stored_dtype: torch.dtype) -> torch.Tensor:
    """Worst-case error of ``obs + cast(next - obs)`` evaluated in the source dtype: rounding of
    the subtraction, of the cast to the stored dtype and back to the source dtype, and of the
    addition, plus the smallest subnormal of the stored dtype."""
    work = torch.promote_types(nxt.dtype, stored_dtype)
    delta = (nxt.double() - obs.double()).abs()
    u = UNIT_ROUNDOFF
    tiny = torch.finfo(stored_dtype).smallest_normal * u[stored_dtype]
    rounding = u[stored_dtype] + u[work] + u[nxt.dtype]
    return (delta * rounding + nxt.double().abs() * u[nxt.dtype]) * 1.001 + tiny


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bool(
            bit_equal_rows(
                from_torch(a.reshape(max(1, a.shape[0]), -1)),
                from_torch(b.reshape(max(1, b.shape[0]), -1)),
            ).all()
        )
        if a.is_floating_point()
        else torch.equal(a, b)
    )


def _settings() -> list[tuple[str, float | None]]:
    """Every registered codec (with a bound where it needs one), and auto, lossless and bounded."""
    out: list[tuple[str, float | None]] = []
    for codec in CODECS:
        try:
            make_codec(codec)
            out.append((codec, None))
        except UsageError:
            out.append((codec, 1e-3))
    return [*out, ("auto", None), ("auto", 1e-3)]


@pytest.mark.parametrize("shape", ["T,D", "B,T,D", "T,C,H,W", "nested"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(("codec", "bound"), _settings(), ids=lambda v: str(v))
def test_round_trip(
    codec: str,
    bound: float | None,
    dtype: torch.dtype,
    shape: str,
    fmt: str,
    tmp_path: Path,
    hopper: TensorDictBase,
    cheetah: TensorDictBase,
    pong: TensorDictBase,
) -> None:
    original = _case(shape, dtype, hopper, cheetah, pong)
    src = WRITERS[fmt](original, tmp_path / "in")
    small, back = tmp_path / ("small" + src.suffix), tmp_path / ("back" + src.suffix)

    result = compress(src, small, codec=codec, max_abs_error=bound)
    names = {k.key: k for k in result.keys}
    pairs = [("observation",)] + ([("agent", "obs")] if shape == "nested" else [])
    assert sorted(names) == sorted("/".join(("next", *p)) for p in pairs)
    keys = [names["/".join(("next", *p))] for p in pairs]

    stored = read_any(small)
    plain = read_any(src)  # as the format stores it (a replay buffer adds rows and keys)
    for p, k in zip(pairs, keys, strict=True):
        if k.codec == "none":
            continue
        assert ("next", *p) not in stored.keys(True, True)
        if k.stored_dtype is not None:
            assert str(stored["next", "delta", *p].dtype) == f"torch.{k.stored_dtype}"
    # Every other leaf is byte-identical.
    rewritten = {("next", *p) for p, k in zip(pairs, keys, strict=True) if k.codec != "none"}
    for key, leaf in plain.items(True, True):
        key = key if isinstance(key, tuple) else (key,)
        if key not in rewritten:
            assert _bits_equal(stored[key], leaf), key

    restored = inflate(small, back)
    if fmt == "ted-pt":
        # The file saved comes back: byte for byte when lossless; else with the rebuilt values
        # (and their records' CRC-32), a zip file as sound as the original.
        if all(k.lossless for k in keys):
            assert back.read_bytes() == src.read_bytes()
        assert zipfile.ZipFile(back).testzip() is None
    out = read_any(back)
    assert list(out.keys(True, True)) == list(plain.keys(True, True))
    assert "delta" not in out["next"].keys()
    for key, leaf in plain.items(True, True):
        assert out[key].dtype == leaf.dtype and out[key].shape == leaf.shape, key
    valid = slice(None) if fmt != "torchrl-rb" else slice(0, original.numel())
    for p, k in zip(pairs, keys, strict=True):
        truth = plain["next", *p][valid]
        got = out["next", *p][valid]
        err = (got.double() - truth.double()).abs()
        # Never worse than the report says, and the report is the real figure.
        assert float(err.max()) <= k.max_abs_error
        assert float(err.max()) == pytest.approx(k.max_abs_error, rel=1e-12, abs=0)
        if bound is not None:
            assert float(err.max()) <= bound
        if codec == "exact" or (codec == "auto" and not bound):
            assert torch.equal(got, truth)
        if k.codec in ("fp16", "bf16", "fp32"):
            stored_dtype = torch_dtype(make_codec(k.codec).stored_dtype(numpy_dtype(dtype)))
            assert bool((err <= _bound(plain[p][valid], truth, stored_dtype)).all())
        if k.codec != "none":
            flat = (from_torch(got.reshape(k.rows, -1)), from_torch(truth.reshape(k.rows, -1)))
            assert k.exact_rows == int(bit_equal_rows(*flat).sum())
    assert sorted(k.max_abs_error for k in restored.keys) == sorted(
        k.max_abs_error for k in result.keys if k.codec != "none"
    )


def test_metadata_describes_the_file(tmp_path: Path, hopper: TensorDictBase) -> None:
    src = WRITERS["ted-memmap"](hopper, tmp_path / "in")
    compress(src, tmp_path / "small", codec="bf16")
    meta = json.loads((tmp_path / "small" / "obsdelta.json").read_text())
    assert meta["obsdelta_format"] == FORMAT_VERSION
    assert meta["format"] == "ted-memmap"
    (key,) = meta["keys"]
    assert key["codec"] == {"id": "bf16"}
    assert key["source_dtype"] == "float32" and key["stored_dtype"] == "bfloat16"
    assert key["delta_key"] == ["next", "delta", "observation"]
    assert key["rows"] == 3000 and key["max_abs_error"] > 0
    # The compressed folder is still an ordinary tensordict memmap.
    td = TensorDict.load_memmap(tmp_path / "small")
    assert td["next", "delta", "observation"].dtype == torch.bfloat16


def test_default_selection_depends_on_the_codec(
    tmp_path: Path, hopper: TensorDictBase, pong: TensorDictBase
) -> None:
    td = hopper[:200].clone()
    td["pixels"] = pong["pixels"]
    td["next", "pixels"] = pong["next", "pixels"]
    td["extra"] = torch.zeros(200, 4)
    td["next", "extra"] = torch.zeros(200, 5)  # twin of another shape: not a pair
    src = WRITERS["ted-memmap"](td, tmp_path / "in")
    # Cast codecs skip integer leaves (subtracting uint8 wraps); exact encodes them; bool flags
    # such as done/terminated are never observations.
    assert [k.key for k in compress(src, tmp_path / "a", codec="fp16").keys] == ["next/observation"]
    exact = compress(src, tmp_path / "b", codec="exact").keys
    assert [k.key for k in exact] == ["next/observation", "next/pixels"]
    lossless = compress(src, tmp_path / "c").keys  # the default
    assert [(k.key, k.codec, k.lossless) for k in lossless] == [
        ("next/observation", "exact", True),
        ("next/pixels", "exact", True),
    ]


def test_key_option_accepts_next_prefix(tmp_path: Path, hopper: TensorDictBase) -> None:
    src = WRITERS["ted-pt"](hopper, tmp_path / "in")
    a = compress(src, tmp_path / "a.pt", keys=["observation"])
    b = compress(src, tmp_path / "b.pt", keys=["next/observation"])
    assert [k.key for k in a.keys] == [k.key for k in b.keys] == ["next/observation"]


def test_overflow_becomes_exception_rows_or_is_refused(
    tmp_path: Path, hopper: TensorDictBase
) -> None:
    td = hopper.clone()
    td["next", "observation"][10:13] = 1e6
    src = WRITERS["ted-memmap"](td, tmp_path / "in")
    with pytest.raises(DataError, match=r"3 of 3000 rows .*beyond fp16's range.* --codec fp32"):
        compress(src, tmp_path / "out", codec="fp16", exceptions=False)
    assert not (tmp_path / "out").exists()
    (key,) = compress(src, tmp_path / "out", codec="fp16").keys
    assert key.exception_rows == 3
    stored = TensorDict.load_memmap(tmp_path / "out")["next", "delta", "observation"]
    assert bool(torch.isfinite(stored).all())
    inflate(tmp_path / "out", tmp_path / "back")
    back = TensorDict.load_memmap(tmp_path / "back")["next", "observation"]
    assert torch.equal(back[10:13], td["next", "observation"][10:13])


def test_report_dry_run_matches_compress(tmp_path: Path, cheetah: TensorDictBase) -> None:
    src = WRITERS["ted-pt"](cheetah, tmp_path / "in")
    dry = report(src, codec="fp16")
    (key,) = dry.keys
    assert key.auto_pick == "exact"
    assert {c.codec for c in key.candidates or []} == {"exact", "fp16", "bf16", "fp32"}
    for cand in key.candidates or []:
        real = compress(src, tmp_path / f"{cand.codec}.pt", codec=cand.codec).keys[0]
        assert (cand.bytes_after, cand.max_abs_error, cand.rmse, cand.exception_rows) == (
            real.bytes_after,
            real.max_abs_error,
            real.rmse,
            real.exception_rows,
        )
    compressed = report(tmp_path / "fp16.pt")
    assert compressed.compressed and compressed.keys[0].max_abs_error == key.max_abs_error
    bounded = report(src, max_abs_error=1e-2)
    assert {"q8", "q16"} <= {c.codec for c in bounded.keys[0].candidates or []}


@pytest.mark.parametrize("sample", ["hopper", "cheetah"])
def test_exact_stores_episode_boundaries_only(
    sample: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    td = request.getfixturevalue(sample)
    src = WRITERS["ted-memmap"](td, tmp_path / "in")
    (key,) = compress(src, tmp_path / "small", codec="exact").keys
    episodes_ends = int(td["next", "done"].sum()) + math.prod(td.batch_size[:-1])
    assert key.exception_rows <= episodes_ends
    assert key.bytes_after <= 0.03 * key.bytes_before
    inflate(tmp_path / "small", tmp_path / "back")
    back = TensorDict.load_memmap(tmp_path / "back")
    assert torch.equal(back["next", "observation"], td["next", "observation"])


def test_exact_on_shuffled_rows_stays_correct_and_bounded(
    tmp_path: Path, hopper: TensorDictBase
) -> None:
    shuffled = hopper[torch.randperm(hopper.shape[0], generator=torch.Generator().manual_seed(0))]
    src = WRITERS["ted-memmap"](shuffled, tmp_path / "in")
    (key,) = compress(src, tmp_path / "small", codec="exact").keys
    # Degrades gracefully: never more than the raw rows plus an 8-byte index per row.
    assert key.bytes_after <= key.bytes_before + 8 * key.rows
    inflate(tmp_path / "small", tmp_path / "back")
    back = TensorDict.load_memmap(tmp_path / "back")
    assert torch.equal(back["next", "observation"], shuffled["next", "observation"])
    # auto finds nothing smaller than raw losslessly, keeps the key and says so.
    (kept,) = compress(src, tmp_path / "auto", codec="auto").keys
    assert kept.codec == "none"
    assert ("next", "observation") in TensorDict.load_memmap(tmp_path / "auto").keys(True, True)


@pytest.mark.parametrize("fmt", ["ted-memmap", "d4rl-hdf5"])
def test_a_key_that_does_not_pay_is_kept_as_if_measured_first(
    tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """The default plans every key as paying for exact and lets the encoding pass find out.
    A key that does not (its next observations shuffled) makes the output written again with
    it kept as it is: its figures are those of measuring it first, and nothing of the first
    attempt is left."""
    module = importlib.import_module("obsdelta_cli.commands.compress")
    order = torch.randperm(hopper.shape[0], generator=torch.Generator().manual_seed(0))
    td = hopper.clone()
    if fmt == "ted-memmap":  # a second key, after the one that pays
        td["state"] = td["observation"] * 2
        td["next", "state"] = td["next", "observation"][order] * 2
    else:  # the one key of a D4RL file
        td["next", "observation"] = td["next", "observation"][order]
    src = WRITERS[fmt](td, tmp_path / "in")
    writers = []
    real = module._writer
    monkeypatch.setattr(module, "_writer", lambda *a: writers.append(1) or real(*a))
    there = set(tmp_path.iterdir())
    result = compress(src, tmp_path / "auto", codec="auto")
    assert set(tmp_path.iterdir()) - there == {tmp_path / "auto"}  # nothing else left
    assert len(writers) == 2  # written once as planned, then again
    kept = result.keys[-1]
    assert kept.codec == "none" and kept.bytes_after == kept.bytes_before
    fmt_, source = open_input(src)
    try:
        stream = module.stream_for(source, -1, 64)
        pairs = module.pairs_of(fmt_, source, None, lambda d: True)
        (group,) = [g for g in module.KeyGroup.group(source, pairs) if g.name == kept.key]
        _codecs, figures, _totals = module.measure_key(stream, source, group, 0.0)
    finally:
        fmt_.close(source)
    assert list(kept.candidates) == figures
    assert figures[0].bytes_after >= kept.bytes_before  # exact would store more
    inflate(tmp_path / "auto", tmp_path / "back")
    if fmt == "ted-memmap":
        assert tree_hash(tmp_path / "back") == tree_hash(src)
    else:  # the shuffled next observations kept as they were
        with h5py.File(tmp_path / "auto") as out:
            assert np.array_equal(out["next_observations"][:], td["next", "observation"].numpy())


def test_time_dim_finds_the_successor(tmp_path: Path, cheetah: TensorDictBase) -> None:
    time_first = cheetah.transpose(0, 1).contiguous()  # [T, B]
    src = WRITERS["ted-memmap"](time_first, tmp_path / "in")
    right = compress(src, tmp_path / "a", codec="exact", time_dim=0).keys[0]
    wrong = compress(src, tmp_path / "b", codec="exact").keys[0]
    assert right.exception_rows < 0.05 * right.rows < wrong.exception_rows
    for out in ("a", "b"):
        inflate(tmp_path / out, tmp_path / f"{out}-back")
        back = TensorDict.load_memmap(tmp_path / f"{out}-back")["next", "observation"]
        assert torch.equal(back, time_first["next", "observation"])


def test_small_chunks_give_the_same_bytes(tmp_path: Path, hopper: TensorDictBase) -> None:
    src = WRITERS["ted-memmap"](hopper, tmp_path / "in")
    for codec in ("fp16", "exact"):
        big = compress(src, tmp_path / f"big-{codec}", codec=codec)
        small = compress(src, tmp_path / f"small-{codec}", codec=codec, chunk_mb=0.01)
        assert big.keys == small.keys
        assert _tree_bytes(tmp_path / f"big-{codec}") == _tree_bytes(tmp_path / f"small-{codec}")
        inflate(tmp_path / f"small-{codec}", tmp_path / f"back-{codec}", chunk_mb=0.001)
        back = TensorDict.load_memmap(tmp_path / f"back-{codec}")
        assert torch.equal(back["observation"], hopper["observation"])


def _tree_bytes(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != "obsdelta.json"
    }


@pytest.mark.parametrize("codec", ["exact", "fp16"])
def test_observations_are_copied_in_the_encoding_pass(
    tmp_path: Path, hopper: TensorDictBase, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memmap folder's observations are read once, for encoding and for their copy; the copy
    is recorded and checked like any other (a changed byte fails verify)."""
    from obsdelta_cli import verify
    from obsdelta_cli.stream import Stream

    copied: list[tuple[int, ...]] = []
    plain_copy = Stream.copy

    def spy(self: Stream, src: object, dst: object, algorithm: str, *check: Any) -> str | None:
        if dst is not None:
            copied.append(tuple(getattr(src, "shape", ())))
        return plain_copy(self, src, dst, algorithm, *check)

    monkeypatch.setattr(Stream, "copy", spy)
    hopper.memmap(tmp_path / "in")
    compress(tmp_path / "in", tmp_path / "small", codec=codec)
    obs_shape = tuple(hopper["observation"].shape)
    assert copied and obs_shape not in copied  # the other leaves go through the plain copy
    inflate(tmp_path / "small", tmp_path / "back")
    assert (tmp_path / "back" / "observation.memmap").read_bytes() == (
        tmp_path / "in" / "observation.memmap"
    ).read_bytes()
    leaf = tmp_path / "small" / "observation.memmap"
    raw = bytearray(leaf.read_bytes())
    raw[len(raw) // 2] ^= 1
    leaf.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="observation"):
        verify(tmp_path / "small")


@pytest.mark.parametrize(
    "codec",
    [c for c in CODECS if make_codec(c, 0.05).stored_dtype(np.dtype(np.float32)) is not None],
)
def test_verify_reads_a_stored_leaf_once(
    tmp_path: Path, hopper: TensorDictBase, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored leaf is hashed from the very reads that rebuild the rows, and a damaged one
    still fails as stored data."""
    from obsdelta_cli import verify
    from obsdelta_cli.formats.leaf import FileLeaf

    hopper.memmap(tmp_path / "in")
    compress(tmp_path / "in", tmp_path / "small", codec=codec, max_abs_error=0.05)
    stored = next((tmp_path / "small" / "next" / "delta").glob("*.memmap"))
    rows: list[int] = []
    plain_read = FileLeaf.read

    def spy(self: FileLeaf, start: int, stop: int) -> np.ndarray:
        got = plain_read(self, start, stop)
        if Path(self.path) == stored:
            rows.append(len(got))
        return got

    monkeypatch.setattr(FileLeaf, "read", spy)
    verify(tmp_path / "small")
    assert sum(rows) == math.prod(hopper["observation"].shape[:-1])
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 3] ^= 1
    stored.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="stored data"):
        verify(tmp_path / "small")


@pytest.mark.parametrize("layout", ["ted-memmap", "robomimic-hdf5"])  # one pair a key; many
def test_the_lossless_default_reads_nothing_before_its_encoding_pass(
    layout: str, tmp_path: Path, hopper: TensorDictBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = WRITERS[layout](hopper, tmp_path / "in")
    module = importlib.import_module("obsdelta_cli.commands.compress")
    measure = module.measure_pairs
    measured: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        figures = measure(*args, **kwargs)
        measured.append(figures[0].rows)
        return figures

    monkeypatch.setattr(module, "measure_pairs", counted)
    keys = compress(src, tmp_path / "small", chunk_mb=0.01).keys
    # Nothing is read before encoding: the encoding pass finds out that exact pays (a sixth
    # of the rows was read twice when that was measured first).
    assert measured == []
    # Its figures in the result are still those of every row, as a full measurement gives.
    monkeypatch.setattr(module, "measure_pairs", measure)
    full = report(src, chunk_mb=0.01).keys
    assert [k.codec for k in keys] == ["exact"] * len(keys)
    exact = [[c for c in k.candidates or [] if c.codec == "exact"] for k in full]
    assert [k.candidates for k in keys] == exact  # report shows lossy ones for comparison
    assert all(c.exception_rows > 0 for k in keys for c in k.candidates or [])


def test_object_skip_names_stored_leaves_and_the_groups_made_for_them() -> None:
    from obsdelta_cli.commands.verify import object_skip

    deltas = {"next/delta/obs", "data/demo_1/next_obs_delta/x"}
    asked: list[str] = []

    def kept(name: str) -> bool:  # the input had these groups already
        asked.append(name)
        return name in {"data", "data/demo_1"}

    skip = object_skip(deltas, kept)
    made = {"next", "next/delta", "data/demo_1/next_obs_delta"}  # groups only the output has
    names = [*deltas, *made, "data", "data/demo_1", "data/demo_10", "nex", "next/delta/obs2"]
    assert {n for n in names if skip(n)} == deltas | made
    # Only groups above a stored leaf are looked up in the input (a lookup costs 90 µs).
    assert set(asked) == made | {"data", "data/demo_1"}


@pytest.mark.parametrize("preset", [None, 3], ids=["caller", "worker-share"])
def test_a_command_runs_with_one_torch_thread_and_gives_the_count_back(
    preset: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a command (and a command it calls), torch has one thread; after it, the caller's
    count: its own torch setting, or the share a ``--jobs`` worker was given."""
    from obsdelta_cli import arrays
    from obsdelta_cli.commands.common import one_thread

    monkeypatch.setattr(arrays, "torch_threads", preset)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[tuple[int, int | None]] = []

    @one_thread
    def inner() -> None:
        seen.append((torch.get_num_threads(), arrays.torch_threads))

    @one_thread
    def outer() -> None:
        inner()
        seen.append((torch.get_num_threads(), arrays.torch_threads))

    try:
        outer()
        assert seen == [(1, 1), (1, 1)]
        assert torch.get_num_threads() == (preset or 2)
        assert arrays.torch_threads == preset
    finally:
        torch.set_num_threads(before)


def test_report_says_when_a_file_would_train_faster_packed(
    tmp_path: Path, hopper: TensorDictBase
) -> None:
    """One line, for a plain or compressed D4RL file in gzip chunks of one column; none for
    its packed twin or for a file in chunks of whole rows."""
    from .test_chunk_cache import column_chunked_d4rl

    src = column_chunked_d4rl(hopper, tmp_path / "hopper.hdf5")
    compress(src, tmp_path / "small.hdf5")
    compress(src, tmp_path / "p.h5", pack=True)
    for path in (src, tmp_path / "small.hdf5"):
        note = report(path).note or ""
        assert note.startswith("faster to train with --pack: observations +"), path
        assert "\n" not in note
    assert report(tmp_path / "p.h5").note is None
    whole_rows = tmp_path / "rows.hdf5"
    with h5py.File(src, "r") as f, h5py.File(whole_rows, "w") as out:
        for name in ("observations", "next_observations", "actions", "rewards", "terminals"):
            values = f[name][()]
            out.create_dataset(
                name, data=values, chunks=(250, *values.shape[1:]), compression="gzip"
            )
    assert report(whole_rows).note is None
