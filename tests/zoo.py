"""Every datatype h5py stores, in every storage layout, with and without a fill value, as
datasets and as attributes: objects to plant in a dataset file, and an object-for-object
comparison of two files that knows nothing of obsdelta."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np

ROWS = 4
_UTF8_12 = h5py.string_dtype("utf-8", 12)


def _compound_vlen() -> np.ndarray:
    a = np.zeros(ROWS, np.dtype([("n", "<i4"), ("name", h5py.string_dtype())]))
    a["n"] = np.arange(ROWS)
    a["name"] = ["", "walk", "ünï", "x" * 70]
    return a


def _nested() -> np.ndarray:
    dt = np.dtype([("a", "<i4"), ("b", [("x", ">f8"), ("y", "u1", (3,))]), ("s", "S4")])
    a = np.zeros(ROWS, dt)
    a["a"] = [-1, 0, 1, 2**31 - 1]
    a["b"]["x"] = [np.pi, -0.0, np.inf, 1e300]
    a["b"]["y"] = np.arange(ROWS * 3).reshape(ROWS, 3)
    a["s"] = [b"ab", b"", b"wxyz", b"\x00q"]
    return a


def _objects(values: list[Any], dtype: Any) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.astype(dtype)


#: name -> (dtype, values of ROWS rows, a fill value, or None where h5py cannot write one: a
#: variable-length array or a compound holding one, whose fill h5py stores as pointers).
TYPES: dict[str, tuple[Any, Callable[[], np.ndarray], Any]] = {
    "float16": (np.dtype("<f2"), lambda: np.array([0.5, -0.0, np.inf, 65504], "<f2"), 1.5),
    "float64_be": (np.dtype(">f8"), lambda: np.array([np.pi, -1e-300, np.nan, 2.0], ">f8"), -1),
    "int32_be": (np.dtype(">i4"), lambda: np.array([-(2**31), -1, 0, 7], ">i4"), 3),
    "uint64": (np.dtype("<u8"), lambda: np.array([0, 1, 2**63, 2**64 - 1], "<u8"), 9),
    "complex64": (np.dtype("<c8"), lambda: np.array([1j, -1, 2 + 3j, 0], "<c8"), 1 + 1j),
    "complex128": (np.dtype("<c16"), lambda: np.array([1e-9j, -1, 2 + 3j, 0], "<c16"), 2j),
    "bool": (np.dtype(np.bool_), lambda: np.array([True, False, True, True]), True),
    "enum": (
        h5py.enum_dtype({"LOW": 0, "MID": 1, "HIGH": 5}, basetype="i2"),
        lambda: np.array([0, 5, 1, 5], "i2"),
        1,
    ),
    "fixed_ascii": (np.dtype("S8"), lambda: np.array([b"SAC", b"", b"12345678", b"a\x00b"]), b"?"),
    "fixed_utf8": (
        _UTF8_12,
        lambda: np.array([b"CQL", "ünï".encode(), b"", b"x" * 12], _UTF8_12),
        np.array("ø".encode(), _UTF8_12),
    ),
    "vlen_ascii": (
        h5py.string_dtype("ascii"),
        lambda: _objects([b"SAC", b"", b"halfcheetah-medium-v2", b"q"], h5py.string_dtype("ascii")),
        b"none",
    ),
    "vlen_utf8": (
        h5py.string_dtype(),
        lambda: _objects(["SAC", "", "Ünïcode ✓", "y" * 300], h5py.string_dtype()),
        "none",
    ),
    "vlen_array": (
        h5py.vlen_dtype(np.dtype("<i4")),
        lambda: _objects(
            [np.arange(n, dtype="<i4") * (n + 1) for n in (0, 1, 5, 1200)],
            h5py.vlen_dtype(np.dtype("<i4")),
        ),
        None,
    ),
    "compound_nested": (_nested().dtype, _nested, _nested()[3]),
    "compound_vlen": (_compound_vlen().dtype, _compound_vlen, None),
    "opaque": (
        np.dtype("V6"),
        lambda: np.frombuffer(bytes(range(6 * ROWS)), "V6").copy(),
        np.void(b"zzzzzz"),
    ),
    # HDF5's array type (each row a 2x3 block); h5py writes no fill value for it.
    "array_type": (
        np.dtype(("<f4", (2, 3))),
        lambda: np.arange(ROWS * 6, dtype="<f4").reshape(ROWS, 2, 3),
        None,
    ),
}

LAYOUTS = ("compact", "contiguous", "chunked-gzip")
FILLS = ("no-fill", "fill")


def zoo_names() -> list[str]:
    """Every dataset :func:`plant` writes (paths under the group it is given)."""
    names = [f"{t}/{layout}/{fill}" for t, layout, fill in _combinations()]
    return [*names, "scalar/vlen_utf8", "scalar/float64_be", "scalar/compound_nested", "empty"]


def _combinations() -> list[tuple[str, str, str]]:
    return [
        (name, layout, fill)
        for name, layout, fill in itertools.product(TYPES, LAYOUTS, FILLS)
        if fill == "no-fill" or TYPES[name][2] is not None
    ]


def plant(group: h5py.Group) -> None:
    """Write the zoo into ``group``: every type x layout x fill value as a dataset, scalars,
    an empty (null dataspace) dataset, and every type as an attribute of ``group``."""
    for name, layout, fill_mode in _combinations():
        dtype, make, fill = TYPES[name]
        path = f"{name}/{layout}/{fill_mode}"
        kwargs: dict[str, Any] = {}
        if layout == "compact":
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            kwargs["dcpl"] = dcpl
        elif layout == "chunked-gzip":
            kwargs.update(chunks=(2,), compression="gzip", compression_opts=4, shuffle=True)
        if fill_mode == "fill":
            kwargs["fillvalue"] = fill
        group.create_dataset(path, shape=(ROWS,), dtype=dtype, **kwargs)[...] = make()
        group.attrs.create(f"zoo_{name}", make(), dtype=dtype)
    group["scalar/vlen_utf8"] = "SAC"  # what h5py writes for a Python str
    group["scalar/float64_be"] = np.array(2.5, ">f8")
    group["scalar/compound_nested"] = _nested()[1]
    group.create_dataset("empty", data=h5py.Empty("<f4"))
    group.attrs["zoo_str"] = "SAC"
    group.attrs["zoo_empty"] = h5py.Empty("<i8")
    group.attrs["zoo_str_list"] = ["a", "ü", ""]


def differences(a_path: str, b_path: str) -> list[str]:
    """Where two HDF5 files differ, object for object: names, object kinds, stored types,
    dataspaces, layouts, chunk shapes, filters, fill values, values and attributes."""
    out: list[str] = []
    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        names_a, names_b = _names(a), _names(b)
        out += [f"{n}: only in {a_path}" for n in sorted(names_a - names_b)]
        out += [f"{n}: only in {b_path}" for n in sorted(names_b - names_a)]
        for name in sorted(names_a & names_b):
            x, y = (a[name], b[name]) if name else (a, b)
            out += [f"{name or '/'}: {d}" for d in _object_differences(x, y)]
    return out


def _names(f: h5py.File) -> set[str]:
    names = {""}
    f.visit(names.add)
    return names


def _object_differences(x: Any, y: Any) -> list[str]:
    out: list[str] = []
    if type(x) is not type(y):
        return [f"{type(x).__name__} against {type(y).__name__}"]
    if sorted(x.attrs) != sorted(y.attrs):
        out.append(f"attributes {sorted(x.attrs)} against {sorted(y.attrs)}")
    for key in set(x.attrs) & set(y.attrs):
        if x.attrs.get_id(key).get_type() != y.attrs.get_id(key).get_type():
            out.append(f"attribute {key}: stored type differs")
        if not same_values(x.attrs[key], y.attrs[key]):
            out.append(f"attribute {key}: {x.attrs[key]!r} against {y.attrs[key]!r}")
    if not isinstance(x, h5py.Dataset):
        return out
    if x.id.get_type() != y.id.get_type():
        out.append("stored type differs")
    px, py = x.id.get_create_plist(), y.id.get_create_plist()
    checks = {
        "shape": (x.shape, y.shape),
        "layout": (px.get_layout(), py.get_layout()),
        "chunks": (x.chunks, y.chunks),
        "filters": (
            [px.get_filter(i)[:3] for i in range(px.get_nfilters())],
            [py.get_filter(i)[:3] for i in range(py.get_nfilters())],
        ),
        "fill defined": (px.fill_value_defined(), py.fill_value_defined()),
    }
    out += [f"{k}: {u!r} against {v!r}" for k, (u, v) in checks.items() if u != v]
    if px.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED and not same_values(
        x.fillvalue, y.fillvalue
    ):
        out.append(f"fill value {x.fillvalue!r} against {y.fillvalue!r}")
    if x.shape is not None and not same_values(x[()], y[()]):
        out.append("values differ")
    return out


def same_values(u: Any, v: Any) -> bool:
    """Equal values, bit for bit for numbers (NaN equals NaN; -0.0 does not equal 0.0),
    element by element for variable-length ones."""
    if isinstance(u, h5py.Empty) or isinstance(v, h5py.Empty):
        return isinstance(u, h5py.Empty) and isinstance(v, h5py.Empty) and u.dtype == v.dtype
    u, v = np.asarray(u), np.asarray(v)
    if u.dtype != v.dtype or u.shape != v.shape:
        return False
    if not u.dtype.hasobject:
        return np.ascontiguousarray(u).tobytes() == np.ascontiguousarray(v).tobytes()
    if u.dtype.names:
        return all(same_values(u[n], v[n]) for n in u.dtype.names)
    return all(
        same_values(p, q) if isinstance(p, np.ndarray) else p == q
        for p, q in zip(u.reshape(-1), v.reshape(-1), strict=True)
    )
