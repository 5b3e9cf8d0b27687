"""Error figures and row flags against direct definitions, over the dtypes and row widths met."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obsdelta_cli.arrays import bfloat16
from obsdelta_cli.stats import ErrorStats, all_finite, bit_equal_rows, column_max, rows_without

FLOATS = [np.dtype(np.float16), bfloat16(), np.dtype(np.float32), np.dtype(np.float64)]
DTYPES = [*FLOATS, np.dtype(np.uint8), np.dtype(np.int64)]
# Short rows take the matrix-product path, wide ones the per-row reduction.
WIDTHS = [1, 3, 11, 255, 256, 700]


def _naive_equal(a: np.ndarray, b: np.ndarray) -> list[bool]:
    """Row by row, whether the bytes are the same."""
    raw_a = np.ascontiguousarray(a).view(np.uint8).reshape(len(a), -1)
    raw_b = np.ascontiguousarray(b).view(np.uint8).reshape(len(b), -1)
    return [x.tobytes() == y.tobytes() for x, y in zip(raw_a, raw_b, strict=True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("every", [5, 1], ids=["few-rows-differ", "every-row-differs"])
def test_bit_equal_rows_is_byte_equality(dtype: np.dtype, width: int, every: int) -> None:
    a = (np.random.default_rng(width).random((64, width)) * 100).astype(dtype)
    b = a.copy()
    # One element changed in some rows, at varying places (first, last, middle); with every
    # row changed, more elements than rows are set (the reduction over whole rows).
    for row in range(0, 64, every):
        for col in {(row * 7) % width, (row * 3 + 1) % width}:
            b[row, col] = b[row, col] + 1 if dtype != np.uint8 else b[row, col] ^ 1
    got = bit_equal_rows(a, b)
    assert got.tolist() == _naive_equal(a, b)
    assert got.tolist() == [row % every != 0 for row in range(64)]


@pytest.mark.parametrize("dtype", [np.dtype(np.uint8), np.dtype(np.float16)])
@pytest.mark.parametrize("layout", ["contiguous", "strided-columns", "strided-rows", "mixed"])
def test_bit_equal_rows_in_words_is_byte_equality(dtype: np.dtype, layout: str) -> None:
    """Rows compared a word at a time (their bytes divide into 8, 4 or 2) or, where either
    array is not contiguous, element by element: byte equality either way, a difference in
    any one byte of a word found."""
    a = (np.random.default_rng(3).random((48, 48)) * 100).astype(dtype)
    b = a.copy()
    for row in range(0, 48, 3):
        b.view(np.uint8).reshape(48, -1)[row, row % (48 * dtype.itemsize)] ^= 1
    x, y = {
        "contiguous": (a, b),
        "strided-columns": (a[:, ::2], b[:, ::2]),
        "strided-rows": (a[::2], b[::2]),
        "mixed": (a[:, :24], np.ascontiguousarray(b[:, :24])),
    }[layout]
    assert bit_equal_rows(x, y).tolist() == _naive_equal(x, y)
    assert not all(_naive_equal(x, y))


def test_bit_equal_rows_tells_signed_zeros_and_nan_payloads_apart() -> None:
    a = np.array([[0.0, 1.0], [float("nan"), 1.0], [2.0, 3.0]], dtype=np.float32)
    b = a.copy()
    b[0, 0] = -0.0
    b.view(np.int32)[1, 0] ^= 1  # another NaN
    assert bit_equal_rows(a, b).tolist() == [False, False, True]
    assert bit_equal_rows(a[:0], b[:0]).tolist() == []


@given(st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_rows_without_matches_any(rows: list[list[bool]]) -> None:
    mask = np.array(rows)
    assert rows_without(mask).tolist() == [not any(r) for r in rows]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), float("-inf")])
def test_all_finite(dtype: np.dtype, bad: float | None) -> None:
    t = np.linspace(-5, 5, 1000).astype(dtype).reshape(100, 10)
    if bad is not None:
        t[57, 3] = bad
    assert all_finite(t) is (bad is None)
    assert all_finite(t[:0])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [float("-nan"), float("-inf"), float("inf")])
@pytest.mark.parametrize("where", [0, 65_535, 65_536, 199_999])
def test_all_finite_sees_one_bad_value_anywhere_in_a_large_array(
    dtype: np.dtype, bad: float, where: int
) -> None:
    t = np.linspace(-60000, 60000, 200_000).astype(dtype)
    assert all_finite(t)
    t[where] = bad
    assert not all_finite(t)
    assert not all_finite(t.reshape(400, 500)[:, ::-1])  # not contiguous


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (64, 11), (1000, 11), (5, 300)])
def test_column_max_is_the_maximum_over_rows(shape: tuple[int, int]) -> None:
    values = np.random.default_rng(sum(shape)).normal(size=shape)
    np.testing.assert_array_equal(column_max(values), values.max(axis=0))


@pytest.mark.parametrize("dtype", FLOATS)
def test_figures_equal_their_definitions_in_float64(dtype: np.dtype) -> None:
    rng = np.random.default_rng(3)
    truth = (rng.standard_normal((500, 11)) * 10).astype(dtype)
    truth[::17, 2] = 0  # zero originals: no relative error there
    rebuilt = (truth.astype(np.float64) + rng.standard_normal((500, 11)) * 1e-2).astype(dtype)
    rebuilt[::3] = truth[::3]  # a third of the rows bit for bit
    rebuilt[::17, 2] = 0.5  # an error where the original is zero
    stats = ErrorStats()
    for start in range(0, 500, 100):  # chunks of whole blocks of 20 rows
        sl = slice(start, start + 100)
        stats.update(truth[sl], rebuilt[sl], exceptions=0, block=20)
    truth64 = truth.astype(np.float64)
    err = np.abs(rebuilt.astype(np.float64) - truth64)
    nonzero = truth64 != 0
    assert stats.rows == 500
    assert stats.exact_rows == sum(_naive_equal(truth, rebuilt))
    assert stats.max_abs_error == float(err.max())
    assert stats.max_rel_error == float((err[nonzero] / np.abs(truth64)[nonzero]).max())
    assert stats.rmse == pytest.approx(math.sqrt(float((err**2).sum()) / err.size), rel=1e-12)
    assert stats.feature_max_abs is not None and stats.feature_max_abs.dtype == np.float64
    np.testing.assert_array_equal(stats.feature_max_abs, err.max(axis=0), strict=True)


def test_relative_error_to_a_subnormal_original_stays_a_finite_figure() -> None:
    truth = np.array([[5e-324, 1.0]], dtype=np.float64)
    rebuilt = np.array([[1e10, 1.0]], dtype=np.float64)
    stats = ErrorStats()
    stats.update(truth, rebuilt, exceptions=0, block=1)
    assert stats.max_rel_error == sys.float_info.max
    assert stats.max_abs_error == 1e10
