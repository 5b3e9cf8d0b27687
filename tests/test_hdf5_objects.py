"""Hashes of HDF5 objects: what a dataset is, asked of HDF5 once, reads as h5py's own
properties read it (a hash that differed would call every file written before damaged)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest

from obsdelta_cli import compress
from obsdelta_cli.formats import detect, hdf5_objects
from obsdelta_cli.formats.base import Ahead
from obsdelta_cli.formats.hdf5 import HDF5Format
from obsdelta_cli.formats.hdf5_leaves import META_ATTR
from obsdelta_cli.formats.hdf5_objects import (
    Facts,
    HashesAhead,
    begin_hashes,
    dataset_props,
    hash_objects_apart,
    hashes_ahead,
    header_hash,
)
from obsdelta_cli.formats.hdf5_walk import OWN, object_names
from obsdelta_cli.formats.packed import Packed
from obsdelta_cli.manifest import parse

from .conftest import SAMPLE
from .test_apart import _children
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


@pytest.fixture(scope="module")
def compressed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A robomimic file with stored delta leaves and replaced twins (obsdelta's own group)."""
    out = tmp_path_factory.mktemp("objects") / "fp16.hdf5"
    compress(SAMPLE / "hopper_robomimic.hdf5", out, codec="fp16")
    return out


def _ahead_cases(f: h5py.File) -> list[tuple[dict[str, int], set[str], set[str]]]:
    """(deferred, skipped, known) triples: nothing left out; every dataset's values left out,
    small ones too, with some skipped and some known; only large ones left out."""
    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    every = dict.fromkeys(names, 0)
    half = set(names[::2])
    return [
        ({}, set(), set()),
        (every, half, set(names[1::4])),
        (dict.fromkeys(names, 1 << 30), set(), half),
    ]


@pytest.mark.parametrize("which", ["zoo", "compressed"])
def test_hashes_begun_ahead_are_the_hashes_of_a_walk(
    which: str, zoo_file: Path, compressed: Path
) -> None:
    """Whatever is left out as the hashes are begun, and whatever the check then skips or
    knows, they equal one walk's hashes with the same skip and known."""
    path = zoo_file if which == "zoo" else compressed
    with h5py.File(path) as f:
        cases = _ahead_cases(f)
        recorded = json.loads(f.attrs[META_ATTR])["objects"] if META_ATTR in f.attrs else {}
        for deferred, skipped, named in cases:
            known = {n: f"known-{n}" for n in named}
            ahead = HashesAhead(f, path, deferred, recorded, OWN)
            found = ahead.hashes(skipped.__contains__, known)
            walked = hash_objects_apart(f, path, skipped.__contains__, known, recorded, OWN)
            assert found == walked
            assert list(found) == list(walked)  # in the walk's order, as manifests list them
            assert set(walked) - set(skipped) - {f"@{n}" for n in skipped}
            if not recorded:  # else a known hash not recorded is looked at anew, as a walk does
                used = any(h.startswith("known-") for h in found.values())
                assert used == bool(named - skipped)


def test_a_format_opened_to_check_begins_its_hashes_and_ends_them_unasked(
    compressed: Path,
) -> None:
    """Opened for a check, a compressed file's object hashes equal a walk's; opened and closed
    before the check, it leaves no child behind; records other than those it began with are
    hashed anew."""
    fmt = detect(compressed)
    assert isinstance(fmt, HDF5Format)
    fmt.hash_ahead = "objects"
    before = _children()
    source = fmt.open(compressed)
    try:
        recorded = dict(parse(source.meta, file=compressed).objects)
        found = fmt.object_hashes(source, lambda n: False, None, recorded)
        plain = hash_objects_apart(source.handle, compressed, lambda n: False, None, recorded)
        assert found == plain
        fmt.hash_ahead = "objects-but-observations"
    finally:
        fmt.close(source)
    source = fmt.open(compressed)
    fmt.close(source)
    assert _children() == before
    fmt.hash_ahead = "objects"
    source = fmt.open(compressed)
    try:
        other = {"@": "0"}
        found = fmt.object_hashes(source, lambda n: False, None, other)
        plain = hash_objects_apart(source.handle, compressed, lambda n: False, None, other)
        assert found == plain
    finally:
        fmt.close(source)


def test_metadata_recording_no_objects_begins_no_hashes(compressed: Path) -> None:
    """Metadata of the first format version records no objects, whose check never asks for
    the hashes: no child is started for them."""
    before = _children()
    with h5py.File(compressed) as f:
        for meta in ({"keys": []}, {"keys": [], "objects": {}}, {"objects": ["@"]}):
            assert hashes_ahead(f, compressed, meta, OWN, "objects") is None
        assert _children() == before


@pytest.mark.parametrize("sample", ["hopper_robomimic.hdf5", "hopper_d4rl.hdf5"])
@pytest.mark.parametrize("ahead", ["objects", "objects-but-observations"])
def test_a_packed_file_opened_to_check_begins_its_hashes(
    sample: str, ahead: Ahead, tmp_path: Path
) -> None:
    """A packed file's objects, begun as it is opened, hash as a walk after the open does,
    whatever the check skips; opened and closed before the check, it leaves no child."""
    packed = tmp_path / "packed.h5"
    compress(SAMPLE / sample, packed, pack=True)
    fmt = detect(packed)
    assert isinstance(fmt, Packed)
    with h5py.File(packed) as f:
        names: list[str] = []
        f.visit(names.append)
    skips: list[Callable[[str], bool]] = [lambda n: False, set(names[::3]).__contains__]
    before = _children()
    for skip in skips:
        found = {}
        for begun in (ahead, None):
            fmt.hash_ahead = begun
            source = fmt.open(packed)
            try:
                assert ("ahead" in source.memo) == (begun is not None)
                found[begun] = fmt.object_hashes(source, skip, None, None)
            finally:
                fmt.close(source)
        assert found[ahead] == found[None]
        assert list(found[ahead]) == list(found[None])
        assert len(found[None]) > 3
    fmt.hash_ahead = ahead
    fmt.close(fmt.open(packed))
    assert _children() == before


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("which", ["zoo", "compressed"])
def test_hashes_split_among_children_are_the_hashes_of_a_walk(
    which: str, parts: int, zoo_file: Path, compressed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's objects hashed by several children, each a run of the walk, give one walk's
    hashes, in its order (as manifests list them), the file's attributes among them; no
    child is left behind."""
    path = zoo_file if which == "zoo" else compressed
    with h5py.File(path) as f:
        names = object_names(f)
        monkeypatch.setattr(hdf5_objects, "PART_OBJECTS", len(names) // parts)
        monkeypatch.setattr(hdf5_objects, "workers", lambda: parts)
        skipped = set(names[1::3])
        skip = lambda n: n.encode() in skipped  # noqa: E731
        known = {names[2].decode(): "known"}
        before = _children()
        collect = begin_hashes(f, path, skip, known, OWN)
        assert len(_children() - before) == parts
        found = collect()
        walked = hash_objects_apart(f, path, skip, known, None, OWN)
    assert list(found.items()) == list(walked.items())
    assert "@" in found and found[names[2].decode()] == "known"
    assert not _children() - before
