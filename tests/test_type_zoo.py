"""Every datatype h5py stores (tests/zoo.py: type x layout x fill value, as datasets and as
attributes) planted inside every HDF5 container format, plain and packed: ``compress``,
``verify`` and ``inflate`` each run in a process of its own, and the inflated file holds every
object exactly as the original did."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import h5py
import pytest
from tensordict import TensorDictBase

from . import zoo
from .conftest import SAMPLE
from .writers import write_ted_hdf5


def _d4rl(base: Path, hopper: TensorDictBase) -> tuple[Path, str]:
    path = shutil.copy(SAMPLE / "hopper_d4rl.hdf5", base / "d4rl.hdf5")
    with h5py.File(path, "a") as f:
        del f["metadata/algorithm"]
        f["metadata/algorithm"] = "SAC"  # a Python str: a variable-length string
    return Path(path), "metadata/zoo"


def _robomimic(base: Path, hopper: TensorDictBase) -> tuple[Path, str]:
    return Path(shutil.copy(SAMPLE / "hopper_robomimic.hdf5", base / "robomimic.hdf5")), "zoo"


def _ted_hdf5(base: Path, hopper: TensorDictBase) -> tuple[Path, str]:
    return write_ted_hdf5(hopper[:500], base / "ted"), "zoo"


def _minari(base: Path, hopper: TensorDictBase) -> tuple[Path, str]:
    pytest.importorskip("minari")
    from . import realistic

    return realistic.write_minari_dataset(300, base / "datasets", "zoo/hopper-v0"), "episode_0/zoo"


CONTAINERS: dict[str, Callable[[Path, TensorDictBase], tuple[Path, str]]] = {
    "d4rl": _d4rl,
    "robomimic": _robomimic,
    "ted-hdf5": _ted_hdf5,
    "minari": _minari,
}
#: Formats with nothing to remove: only packing applies (compress says so and writes nothing).
PACK_ONLY = {"minari"}
#: Files h5py writes and obsdelta reads with h5py alone (see the ``h5py_only`` marker); the
#: Minari one is written by minari, installed with torchrl.
H5PY_ONLY = {"d4rl", "robomimic"}


def run(*args: str | Path) -> str:
    """One obsdelta command in a process of its own; its stderr if it failed."""
    proc = subprocess.run(
        [sys.executable, "-m", "obsdelta_cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize(
    ("container", "mode"),
    [
        pytest.param(c, m, marks=[pytest.mark.h5py_only] if c in H5PY_ONLY else [])
        for c in sorted(CONTAINERS)
        for m in ("plain", "packed")
        if m == "packed" or c not in PACK_ONLY
    ],
)
def test_every_h5py_type_comes_back_exactly(
    tmp_path: Path, hopper: TensorDictBase, container: str, mode: str
) -> None:
    src, where = CONTAINERS[container](tmp_path, hopper)
    with h5py.File(src, "a") as f:
        zoo.plant(f.require_group(where))
        zoo.plant(f)  # the root too: its attributes, and datasets beside the layout's own
    original = tmp_path / f"original{src.suffix}"
    shutil.copy(src, original)
    out = tmp_path / f"out{src.suffix}"
    run("compress", src, "-o", out, *(["--pack"] if mode == "packed" else []))
    run("verify", out)
    back = tmp_path / f"back{src.suffix}"
    run("inflate", out, "-o", back)
    assert zoo.differences(str(original), str(back)) == []
    assert zoo.differences(str(original), str(src)) == []  # the input untouched
    with h5py.File(out, "r") as f:
        present = {n for n in zoo.zoo_names() if f"{where}/{n}" in f}
    assert present == set(zoo.zoo_names())  # the output holds them as they are, by name


def test_the_zoo_holds_what_it_says(tmp_path: Path) -> None:
    """Every type, layout and fill value is really there, as the names say."""
    path = tmp_path / "zoo.h5"
    with h5py.File(path, "w") as f:
        zoo.plant(f)
    layouts = {"compact": h5py.h5d.COMPACT, "contiguous": h5py.h5d.CONTIGUOUS}
    with h5py.File(path, "r") as f:
        assert set(zoo.zoo_names()) <= set(_datasets(f))
        for name in zoo.zoo_names():
            if name.count("/") != 2:
                continue
            dcpl = f[name].id.get_create_plist()
            _, layout, fill = name.split("/")
            assert dcpl.get_layout() == layouts.get(layout, h5py.h5d.CHUNKED), name
            user = dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED
            assert user == (fill == "fill"), name
        assert f["scalar/vlen_utf8"].dtype.kind == "O" and f["empty"].shape is None
        assert zoo.differences(str(path), str(path)) == []


def test_the_comparison_sees_a_changed_object(tmp_path: Path) -> None:
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    for path in (a, b):
        with h5py.File(path, "w") as f:
            zoo.plant(f)
    with h5py.File(b, "a") as f:
        f["vlen_utf8/contiguous/no-fill"][2] = "changed"
        f.attrs["zoo_vlen_array"] = f.attrs["zoo_vlen_array"][::-1]
    found = zoo.differences(str(a), str(b))
    assert len(found) == 2, found
    assert found[0].startswith("/: attribute zoo_vlen_array: ")
    assert found[1] == "vlen_utf8/contiguous/no-fill: values differ"


def _datasets(f: h5py.File) -> list[str]:
    out: list[str] = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return out


def test_hashes_agree_across_processes(tmp_path: Path) -> None:
    """The hash of an object holds nothing that depends on the process (a pointer in a
    variable-length value's memory): two processes hash the same file the same."""
    path = tmp_path / "zoo.h5"
    with h5py.File(path, "w") as f:
        zoo.plant(f)
    code = (
        "import sys, json, h5py\n"
        "from pathlib import Path\n"
        "from obsdelta_cli.formats.hdf5_objects import hash_objects\n"
        "f = h5py.File(sys.argv[1], 'r')\n"
        "print(json.dumps(hash_objects(f, Path(sys.argv[1]), lambda n: False)))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert len(runs[0]) > 1000  # every object, not an empty answer
