"""A new codec or HDF5 layout is one class and one registry line: each defined here, in test
code alone, runs through the checks every registered one passes (``tests/conformance.py``)."""

from __future__ import annotations

from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401 - the packed file's filters
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress
from obsdelta_cli.codecs import CODECS, Codec
from obsdelta_cli.formats import FORMATS, Key, Pair, Source, detect
from obsdelta_cli.formats.hdf5 import OWN, HDF5Format

from .conformance import (
    bits_equal,
    check_codec_config,
    check_codec_rebuild,
    check_codec_round_trip,
    check_layout,
    everything,
)
from .writers import WRITERS


class XorNext(Codec):
    """Lossless: the bits of each next observation XOR those of its successor, zero wherever
    the two are equal (every row inside an episode)."""

    id = "xor-test"
    summary = "next observation's bits XOR its successor's"
    uses_successor = True
    lossless = True

    def supports(self, dtype: np.dtype) -> bool:
        return dtype.kind == "f" and dtype.itemsize in (4, 8)

    def stored_dtype(self, source: np.dtype) -> np.dtype:
        return np.dtype(f"u{source.itemsize}")

    def encode(
        self, obs: np.ndarray, next_obs: np.ndarray, successor: np.ndarray | None
    ) -> np.ndarray:
        assert successor is not None
        bits = self.stored_dtype(next_obs.dtype)
        return np.ascontiguousarray(next_obs).view(bits) ^ np.ascontiguousarray(successor).view(
            bits
        )

    def decode(
        self,
        obs: np.ndarray,
        stored: np.ndarray | None,
        successor: np.ndarray | None,
        restore_dtype: np.dtype,
    ) -> np.ndarray:
        assert stored is not None and successor is not None
        same = np.ascontiguousarray(successor.astype(restore_dtype, copy=False))
        return (stored ^ same.view(stored.dtype)).view(restore_dtype)


class StateHDF5(HDF5Format):
    """Flat ``state`` / ``next_state`` datasets, one row per step."""

    name = "state-hdf5"
    summary = "flat state / next_state datasets"

    @classmethod
    def matches(cls, f: h5py.File) -> bool:
        # Not ``next_state``: a compressed file may hold none (``exact`` rebuilds it).
        return isinstance(f.get("state"), h5py.Dataset)

    def pairs(self, source: Source) -> list[Pair]:
        return [Pair(("state",), ("next_state",), (OWN, "delta", "next_state"), "next_state")]

    @classmethod
    def ted_name(cls, key: Key) -> Key:
        """Training reads give TorchRL's names."""
        names = {"state": ("observation",), "next_state": ("next", "observation")}
        return names.get(key[0], key) if len(key) == 1 else key


@pytest.fixture
def xor_codec(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(CODECS, XorNext.id, XorNext)  # the one registry line
    return XorNext.id


@pytest.fixture
def state_layout(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(FORMATS, StateHDF5.name, StateHDF5)  # the one registry line
    return StateHDF5.name


def write_state(td: TensorDictBase, path: Path) -> Path:
    """``td``'s transitions as a file of :class:`StateHDF5`'s layout, in chunks and gzip as
    h5py users often write them, with the rest of a transition beside them."""
    with h5py.File(path, "w") as f:
        f.create_dataset("state", data=td["observation"].numpy(), chunks=True, compression="gzip")
        f.create_dataset("next_state", data=td["next", "observation"].numpy())
        f.create_dataset("action", data=td["action"].numpy())
        f.create_dataset("reward", data=td["next", "reward"].numpy())
        f.attrs["env"] = "Hopper-v5"
    return path


def test_a_codec_registered_by_test_code_passes_the_codec_checks(
    xor_codec: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    check_codec_config(xor_codec)
    check_codec_rebuild(xor_codec)
    check_codec_round_trip(xor_codec, tmp_path)
    # ... and the layout checks, in a container of each family.
    for fmt in ("ted-memmap", "ted-pt", "d4rl-hdf5"):
        work = tmp_path / fmt
        work.mkdir()
        check_layout(WRITERS[fmt](hopper[:700], work / "in"), work, xor_codec)


def test_an_hdf5_layout_registered_by_test_code_passes_the_layout_checks(
    state_layout: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    src = write_state(hopper[:900], tmp_path / "in.h5")
    assert detect(src).name == state_layout
    # Training reads name its leaves as the layout says, compressed or not.
    rows = everything(src)
    for key in (("observation",), ("next", "observation"), ("action",)):
        assert torch.equal(rows[key], hopper[:900][key]), key
    for codec in ("exact", "fp16"):
        work = tmp_path / codec
        work.mkdir()
        check_layout(src, work, codec)
    # --pack takes it as it takes every HDF5 layout, and its files read as the original.
    packed = tmp_path / "packed.h5"
    compress(src, packed, pack=True)
    bits_equal(everything(packed), everything(src))
    with h5py.File(src) as a, h5py.File(packed) as b:
        for name in ("state", "action", "reward"):
            np.testing.assert_array_equal(a[name][()], b[name][()])
        assert dict(a.attrs) == {k: v for k, v in b.attrs.items() if k != "obsdelta"}
