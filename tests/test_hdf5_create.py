"""Creating groups and datasets with another's creation properties (``formats/hdf5_create``)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from obsdelta_cli.formats.hdf5_create import gcpl_like


def test_a_group_like_a_dense_one_takes_copies_in_a_file_of_another_format(
    tmp_path: Path,
) -> None:
    """A group of many links keeps them in a fractal heap, whose address HDF5 puts in the
    group's own creation property list: a group created from that list in a file of the 1.8
    format failed the copies made into it. One made by ``gcpl_like`` takes them, with the
    source's settings."""
    with h5py.File(tmp_path / "dense.h5", "w", libver=("v110", "v110")) as f:
        g = f.create_group("g", track_order=True)
        for i in range(40):
            g[f"d{i}"] = np.arange(i + 1)
    with (
        h5py.File(tmp_path / "dense.h5", "r") as f,
        h5py.File(tmp_path / "out.h5", "w", libver=("v108", "v110")) as out,
    ):
        made = gcpl_like(f["g"])
        assert (
            made.get_link_creation_order() == f["g"].id.get_create_plist().get_link_creation_order()
        )
        group = h5py.Group(h5py.h5g.create(out.id, b"g", gcpl=made))
        for name in f["g"]:
            f["g"].copy(f["g"][name], group, name=name)
    with h5py.File(tmp_path / "out.h5", "r") as out:
        assert list(out["g"]) == [f"d{i}" for i in range(40)]  # creation order, as tracked
        for i in range(40):
            assert np.array_equal(out["g"][f"d{i}"][()], np.arange(i + 1))
