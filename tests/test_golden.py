"""Committed compressed fixtures still inflate, bit for bit, to what they inflated to when made,
and training reads give the same rows; those of every format version obsdelta has written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from obsdelta_cli import inflate, open_dataset, verify
from obsdelta_cli.codecs import CODECS
from obsdelta_cli.errors import ObsdeltaError
from obsdelta_cli.manifest import FORMAT_VERSION

from .conftest import h5py_only_marks
from .golden_data import FORMATS, NEW_CODECS, leaf_hashes, version_dir

#: Fixtures by format version (2 up to the current one), by name.
EXPECTED = {
    v: json.loads((version_dir(v) / "expected.json").read_text())
    for v in range(2, FORMAT_VERSION + 1)
}
CASES = [
    pytest.param(
        v,
        name,
        id=f"v{v}-{name}",
        marks=h5py_only_marks(fixtures[name]["format"]),
    )
    for v, fixtures in EXPECTED.items()
    for name in sorted(fixtures)
]


def test_every_format_and_codec_has_a_fixture() -> None:
    assert {(v["format"], v["codec"]) for v in EXPECTED[2].values()} == {
        (f, c) for f in FORMATS for c in CODECS
    }
    for version in range(3, FORMAT_VERSION + 1):
        found = {(v["format"], v["codec"]) for v in EXPECTED[version].values()}
        assert found == {(f, c) for f in FORMATS for c in NEW_CODECS}


@pytest.mark.parametrize(("version", "name"), CASES)
def test_golden_fixture_inflates_to_recorded_bytes(version: int, name: str, tmp_path: Path) -> None:
    fixture = version_dir(version) / name
    verify(fixture)
    back = tmp_path / name
    inflate(fixture, back)
    assert leaf_hashes(back) == EXPECTED[version][name]["inflated"]


@pytest.mark.parametrize(("version", "name"), CASES)
def test_golden_fixture_reads_as_it_inflates(version: int, name: str, tmp_path: Path) -> None:
    """Every row read through ``open_dataset`` (its checks included) is the inflated row."""
    back = tmp_path / name
    inflate(version_dir(version) / name, back)
    data, plain = open_dataset(version_dir(version) / name), open_dataset(back)
    try:
        got, want = data[0 : len(data)], plain[0 : len(plain)]
        assert set(got.keys(True, True)) == set(want.keys(True, True))
        for key in want.keys(True, True):
            assert _bytes(got[key]) == _bytes(want[key]), key
    finally:
        data.close()
        plain.close()


def _bytes(values: torch.Tensor) -> bytes:
    return values.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(
    ("name", "leaf"),
    [
        ("ted-memmap-exact", "observation.memmap"),
        ("ted-memmap-fp16", "next/delta/observation.memmap"),
        ("torchrl-rb-fp16", "storage/action.memmap"),
    ],
)
def test_a_damaged_format_2_leaf_is_an_error_on_its_first_read(
    name: str, leaf: str, tmp_path: Path
) -> None:
    """Format 2 recorded one hash per leaf: the first read of any of its rows checks it whole."""
    copy = tmp_path / name
    shutil.copytree(version_dir(2) / name, copy)
    path = copy / leaf
    data = bytearray(path.read_bytes())
    data[len(data) // 4] ^= 0x04
    path.write_bytes(bytes(data))
    dataset = open_dataset(copy)
    try:
        with pytest.raises(ObsdeltaError, match="do not match their checksum"):
            dataset[torch.arange(len(dataset))]
    finally:
        dataset.close()
