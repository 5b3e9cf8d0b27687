"""Hashes of HDF5 objects: what a dataset is, asked of HDF5 once, reads as h5py's own
properties read it (a hash that differed would call every file written before damaged)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest

from obsdelta_cli.formats.hdf5_objects import Facts, dataset_props, header_hash

from .zoo import plant, zoo_names

#: Creation properties beyond the zoo's (which has gzip with the shuffle): every filter h5py
#: names, one of a plugin, resizable and unlimited dimensions.
MORE: dict[str, dict[str, Any]] = {
    "lzf": {"chunks": (3, 2), "compression": "lzf"},
    "fletcher32": {"chunks": (4, 2), "fletcher32": True},
    "scaleoffset-int": {"chunks": (4, 2), "scaleoffset": 0, "dtype": "<i4"},
    "scaleoffset-float": {"chunks": (4, 2), "scaleoffset": 3},
    "zstd-plugin": dict(chunks=(4, 2), shuffle=True, **hdf5plugin.Zstd(clevel=3)),
    "unlimited": {"chunks": (2, 2), "maxshape": (None, 2)},
    "resizable": {"chunks": (2, 2), "maxshape": (40, 7)},
    "gzip-9": {"chunks": (5, 1), "compression": "gzip", "compression_opts": 9},
}


def _h5py_props(ds: h5py.Dataset) -> tuple[Any, ...]:
    props = (ds.dtype.str, ds.shape, ds.maxshape, ds.chunks, ds.compression, ds.compression_opts)
    return (props, ds.shuffle, ds.fletcher32, ds.scaleoffset)


@pytest.fixture(scope="module")
def zoo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("objects") / "zoo.hdf5"
    with h5py.File(path, "w") as f:
        plant(f.create_group("zoo"))
        for name, given in MORE.items():
            kwargs = dict(given)
            values = np.arange(20, dtype=kwargs.pop("dtype", "<f4")).reshape(10, 2)
            f.create_dataset(f"more/{name}", data=values, **kwargs)
    return path


def _datasets() -> list[str]:
    return [f"zoo/{n}" for n in zoo_names()] + [f"more/{n}" for n in MORE]


def test_dataset_props_read_as_h5py_reads_them(zoo_file: Path) -> None:
    with h5py.File(zoo_file) as f:
        names = _datasets()
        assert len(names) > 100
        for name in names:
            ds = f[name]
            assert dataset_props(Facts(ds.id)) == _h5py_props(ds), name


def test_header_hash_tells_creation_properties_apart(zoo_file: Path) -> None:
    """Two datasets that differ only in their largest shape hash apart."""
    with h5py.File(zoo_file) as f:
        a, b = f["more/resizable"], f["more/unlimited"]
        assert header_hash(a).hexdigest() != header_hash(b).hexdigest()
