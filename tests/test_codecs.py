"""Every codec is registered, rebuilds from its stored config and keeps its promises, shown by
property-based round trips over shapes, dtypes and hostile values (±0, subnormals, NaN, ±inf,
magnitudes up to 1e30)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tensordict import TensorDict

import obsdelta_cli.codecs as codecs_pkg
from obsdelta_cli import compress, inflate
from obsdelta_cli.arrays import bfloat16, from_torch, is_float, to_torch
from obsdelta_cli.codecs import CODECS, Codec, codec_from_config, make_codec
from obsdelta_cli.errors import InputError, UsageError
from obsdelta_cli.stats import bit_equal_rows, by_row

from .conformance import (
    check_codec_config,
    check_codec_rebuild,
    check_codec_round_trip,
    needs_bound,
)


def _codec_classes() -> set[type[Codec]]:
    found = set()
    for info in pkgutil.iter_modules(codecs_pkg.__path__):
        module = importlib.import_module(f"{codecs_pkg.__name__}.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Codec) and not inspect.isabstract(obj) and "id" in obj.__dict__:
                found.add(obj)
    return found


def test_every_codec_is_registered() -> None:
    assert _codec_classes() == set(CODECS.values())
    assert all(CODECS[c.id] is c for c in _codec_classes())


@pytest.mark.parametrize("codec_id", list(CODECS))
def test_config_round_trip(codec_id: str) -> None:
    check_codec_config(codec_id)


@pytest.mark.parametrize("codec_id", list(CODECS))
def test_a_codec_that_rebuilds_as_the_successor_does(codec_id: str) -> None:
    check_codec_rebuild(codec_id)


@pytest.mark.parametrize("codec_id", list(CODECS))
def test_every_command_keeps_the_codec_s_promise(codec_id: str, tmp_path: Path) -> None:
    check_codec_round_trip(codec_id, tmp_path)


def test_unknown_ids_list_the_known_ones() -> None:
    with pytest.raises(UsageError, match="fp16"):
        make_codec("zstd-9000")
    with pytest.raises(InputError, match="upgrade obsdelta"):
        codec_from_config({"id": "from-the-future"})
    with pytest.raises(UsageError, match="max-abs-error"):
        make_codec("q8")


# ---------------------------------------------------------------------------------------------
# Property-based round trips through compress / inflate


HOSTILE = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e30, -1e30, 1e-40, 5e-324, 65504.0, 65520.0]
FLOATS = {
    "float16": np.dtype(np.float16),
    "bfloat16": bfloat16(),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
INTS = {"uint8": np.dtype(np.uint8), "int16": np.dtype(np.int16), "int64": np.dtype(np.int64)}


@st.composite
def trajectories(draw: st.DrawFn, dtypes: dict[str, np.dtype]) -> tuple[np.ndarray, ...]:
    """``(obs, next_obs)`` where most rows follow ``next[t] == obs[t+1]`` and some do not."""
    dtype = dtypes[draw(st.sampled_from(sorted(dtypes)))]
    t = draw(st.integers(1, 30))
    d = draw(st.integers(1, 4))
    if is_float(dtype):
        values = st.one_of(
            st.sampled_from(HOSTILE),
            st.floats(-1e30, 1e30, allow_nan=False, allow_infinity=False, width=64),
            st.floats(-10, 10, width=64),
        )
        frames = hnp.arrays(np.float64, (t + 1, d), elements=values)
    else:
        info = np.iinfo(dtype)
        frames = hnp.arrays(
            np.int64, (t + 1, d), elements=st.integers(int(info.min), int(info.max))
        )
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        raw = draw(frames).astype(dtype)
    obs, nxt = raw[:-1].copy(), raw[1:].copy()
    resets = draw(st.lists(st.integers(0, t - 1), max_size=t))
    for r in resets:  # an episode boundary: next_obs is not the following row's obs
        nxt[r] = raw[(r + 7) % (t + 1)]
    return obs, nxt


def _round_trip(obs: np.ndarray, nxt: np.ndarray, **options: object) -> tuple[np.ndarray, float]:
    td = TensorDict(
        {"observation": to_torch(obs), "next": {"observation": to_torch(nxt)}},
        batch_size=obs.shape[:1],
    )
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        torch.save(td, d / "in.pt")
        result = compress(d / "in.pt", d / "small.pt", keys=["observation"], **options)  # type: ignore[arg-type]
        inflate(d / "small.pt", d / "back.pt")
        back = from_torch(torch.load(d / "back.pt", weights_only=False)["next", "observation"])
    return back, result.keys[0].max_abs_error or 0.0


def _finite(a: np.ndarray) -> np.ndarray:
    return by_row(np.isfinite(a.astype(np.float64))).all(axis=1)


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=trajectories({**FLOATS, **INTS}))
def test_exact_is_bit_identical(data: tuple[np.ndarray, np.ndarray]) -> None:
    obs, nxt = data
    back, reported = _round_trip(obs, nxt, codec="exact")
    assert back.dtype == nxt.dtype and reported == 0
    assert bool(bit_equal_rows(back, nxt).all())


@SETTINGS
@given(data=trajectories(FLOATS), codec=st.sampled_from(["fp16", "bf16", "fp32"]))
def test_cast_codecs_never_invent_inf(data: tuple[np.ndarray, np.ndarray], codec: str) -> None:
    obs, nxt = data
    if codec == "fp32" and nxt.dtype.itemsize < 4:
        codec = "fp16"
    back, reported = _round_trip(obs, nxt, codec=codec)
    finite = _finite(obs) & _finite(nxt)
    # Rows whose source is not finite come back bit for bit; the others come back finite.
    assert bool(bit_equal_rows(back[~finite], nxt[~finite]).all())
    assert bool(_finite(back[finite]).all())
    err = np.abs(back[finite].astype(np.float64) - nxt[finite].astype(np.float64))
    assert float(err.max()) <= reported if err.size else True


@SETTINGS
@given(
    data=trajectories(FLOATS),
    codec=st.sampled_from([*CODECS, "auto"]),
    bound=st.sampled_from([0.0, 1e-6, 1e-3, 0.5]),
)
def test_bounded_codecs_never_exceed_the_bound(
    data: tuple[np.ndarray, np.ndarray], codec: str, bound: float
) -> None:
    obs, nxt = data
    if needs_bound(codec) and bound == 0:
        bound = 1e-3
    back, reported = _round_trip(obs, nxt, codec=codec, max_abs_error=bound)
    finite = _finite(nxt)
    assert bool(bit_equal_rows(back[~finite], nxt[~finite]).all())
    err = np.abs(back[finite].astype(np.float64) - nxt[finite].astype(np.float64))
    if err.size:
        assert float(err.max()) <= bound and float(err.max()) <= reported
    if bound == 0:
        assert bool(bit_equal_rows(back, nxt).all())
