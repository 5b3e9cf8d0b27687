"""Creation properties recorded in a packed file's manifest: what the record gives back is what
the layout twin gave back, checked when packing; a record that would not keeps its twin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from tensordict import TensorDictBase

from obsdelta_cli import compress, inflate, verify
from obsdelta_cli.formats.hdf5_create import create_dataset
from obsdelta_cli.formats.hdf5_walk import layout_twins
from obsdelta_cli.formats.pack_props import PropsCheck, maxshape_of, props_of, twin_props

from .test_pack import h5_objects
from .writers import write_robomimic

#: Datasets as h5py and the libraries write them: contiguous and chunked, every filter HDF5
#: has built in, fill values of each kind, extendible, attribute creation order tracked.
LAYOUTS: dict[str, dict[str, Any]] = {
    "contiguous": {},
    "chunked": {"chunks": (16, 3)},
    "gzip": {"chunks": (40, 3), "compression": "gzip", "compression_opts": 9},
    "shuffle-gzip-fletcher32": {
        "chunks": (8, 3),
        "compression": "gzip",
        "shuffle": True,
        "fletcher32": True,
    },
    "lzf-extendible": {"chunks": (50, 3), "compression": "lzf", "maxshape": (None, 3)},
    "extendible-both": {"chunks": (100, 1), "maxshape": (None, None)},
    "fill-nan": {"fillvalue": np.nan},
    "fill-user-chunked": {"chunks": (10, 3), "fillvalue": -2.5},
    "track-order": {"chunks": (10, 3), "track_order": True},
}


def _written(tmp_path: Path) -> Path:
    """Each of :data:`LAYOUTS` as a (100, 3) float32 dataset written by h5py, and one
    allocated early (HDF5's low-level call: h5py has no keyword for it)."""
    path = tmp_path / "layouts.h5"
    with h5py.File(path, "w") as f:
        for name, kw in LAYOUTS.items():
            f.create_dataset(name, data=np.arange(300, dtype="f4").reshape(100, 3), **kw)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((25, 3))
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        create_dataset(f, "early", np.dtype("f4"), (100, 3), (100, 3), dcpl)
    return path


def test_every_layout_h5py_writes_is_recorded(tmp_path: Path) -> None:
    with h5py.File(_written(tmp_path), "r") as f:
        check = PropsCheck(f.libver)
        for name in f:
            check.add(name, f[name])
        recorded = check.run()
    assert sorted(recorded) == sorted([*LAYOUTS, "early"])


def test_a_record_gives_what_the_twin_gives(tmp_path: Path) -> None:
    """The datasets made from each record and from each twin's properties, in a file of the
    source's format version, read back with equal creation properties and maximum shapes."""
    src = _written(tmp_path)
    out = tmp_path / "made.h5"
    with h5py.File(src, "r") as f, h5py.File(out, "w", libver=f.libver) as g:
        check = PropsCheck(f.libver)
        for name in f:
            check.add(name, f[name])
        for name, record in check.run().items():
            ds = f[name]
            made = props_of(record, ds.dtype)
            # The allocation time is the manifest entry's, which unpacking sets after the record.
            made.set_alloc_time(ds.id.get_create_plist().get_alloc_time())
            create_dataset(g, f"r-{name}", ds.dtype, ds.shape, maxshape_of(record), made)
            props = twin_props(ds.id.get_create_plist())
            create_dataset(g, f"t-{name}", ds.dtype, ds.shape, ds.maxshape, props)
    with h5py.File(out, "r") as g:
        for name in [*LAYOUTS, "early"]:
            made, twin = g[f"r-{name}"], g[f"t-{name}"]
            assert made.maxshape == twin.maxshape, name
            assert made.id.get_create_plist().equal(twin.id.get_create_plist()), name


def test_a_filter_stored_under_another_name_keeps_its_twin(tmp_path: Path) -> None:
    """hdf5plugin's Zstd filter, stored under hdf5plugin's own name: a record would give it
    the name registered in this process, so the dataset keeps its twin."""
    pytest.importorskip("hdf5plugin")
    path = tmp_path / "zstd.h5"
    script = (
        "import sys, h5py, hdf5plugin, numpy as np\n"
        "with h5py.File(sys.argv[1], 'w') as f:\n"
        "    f.create_dataset('z', data=np.arange(1000.0), chunks=(100,), **hdf5plugin.Zstd())\n"
        "    f.create_dataset('g', data=np.arange(1000.0), chunks=(100,), compression='gzip')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True)
    import obsdelta_cli.formats.hdf5  # noqa: F401 - registers Zstd under its short name

    with h5py.File(path, "r") as f:
        check = PropsCheck(f.libver)
        for name in f:
            check.add(name, f[name])
        assert sorted(check.run()) == ["g"]


def test_packed_robomimic_file_keeps_no_twin_and_unpacks_exactly(
    tmp_path: Path, hopper: TensorDictBase
) -> None:
    """A robomimic file of Hopper demos (hundreds of repacked datasets): every one recorded,
    no twin and no group of twins written; inflate gives every object back."""
    src = write_robomimic(hopper[:600], tmp_path / "demos.hdf5")
    packed = tmp_path / "packed.h5"
    compress(src, packed, pack=True)
    with h5py.File(packed, "r") as f:
        assert layout_twins() not in f
    assert verify(packed).ok
    inflate(packed, tmp_path / "back.hdf5")
    compress(src, tmp_path / "plain.hdf5")
    inflate(tmp_path / "plain.hdf5", tmp_path / "plain-back.hdf5")
    assert h5_objects(tmp_path / "back.hdf5") == h5_objects(tmp_path / "plain-back.hdf5")
    with h5py.File(tmp_path / "back.hdf5") as a, h5py.File(tmp_path / "plain-back.hdf5") as b:
        names: list[str] = []
        a.visit(names.append)
        for name in names:
            if isinstance(a[name], h5py.Dataset):
                assert a[name].id.get_create_plist().equal(b[name].id.get_create_plist()), name
