"""A ``torch.save`` file as a skeleton with holes: written back byte for byte from the skeleton
and the tensors, by ``inflate`` of a compressed ``.pt``; damage to either is caught."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress, inflate, verify
from obsdelta_cli.arrays import from_torch
from obsdelta_cli.errors import DataError, InputError, ObsdeltaError
from obsdelta_cli.formats.ted import leaves_of
from obsdelta_cli.formats.ted_pt import PT_FILE, SKELETON, array_bytes, load
from obsdelta_cli.formats.zip_skeleton import Hole, Layout, find, write
from obsdelta_cli.manifest import content_hash

VARIANTS = ["plain", "consolidated", "non-tensor", "dtypes", "no-crc", "empty-leaf", "many-equal"]


def _saved(td: TensorDictBase, variant: str, path: Path) -> Path:
    """``td`` saved by torch.save as users save TensorDicts."""
    td = td.clone()
    if variant == "consolidated":
        td = td.consolidate()
    elif variant == "non-tensor":
        td.set_non_tensor("env_name", "HalfCheetah-v5")
    elif variant == "dtypes":
        td["pixels"] = (td["observation"] * 40).to(torch.uint8)
        td["next", "pixels"] = (td["next", "observation"] * 40).to(torch.uint8)
        td["observation"] = td["observation"].to(torch.bfloat16)
    elif variant == "empty-leaf":
        td["mask"] = torch.zeros(*td.batch_size, 0)
    elif variant == "many-equal":  # evenly spaced records of one size: one mapping only
        for i in range(300):
            td["extra", f"k{i}"] = td["action"] + i
    if variant == "no-crc":  # torch can be told not to compute CRC-32s (faster saves)
        torch.serialization.set_crc32_options(False)
    try:
        torch.save(td, path)
    finally:
        torch.serialization.set_crc32_options(True)
    return path


def _tensors(path: Path) -> dict:
    """The leaves of the ``.pt`` file, loaded as obsdelta loads them: each tensor as an array
    sharing its memory."""
    leaves = leaves_of(load(path))
    return {k: from_torch(v) if isinstance(v, torch.Tensor) else v for k, v in leaves.items()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_skeleton_and_tensors_give_the_file_back(
    tmp_path: Path, cheetah: TensorDictBase, variant: str
) -> None:
    src = _saved(cheetah, variant, tmp_path / "in.pt")
    tensors = _tensors(src)
    found = find(src, tensors)
    assert found is not None
    layout, skeleton = found
    data = sum(t.nbytes for t in tensors.values() if isinstance(t, np.ndarray))
    assert len(skeleton) == layout.skeleton_bytes == layout.size - data
    assert len(skeleton) < (8 << 10) + 256 * len(tensors)  # the pickle and zip headers
    layout = Layout.from_json(json.loads(json.dumps(layout.to_json())), src)
    write(tmp_path / "out.pt", layout, skeleton, lambda h: [array_bytes(tensors[h.ref])])
    assert (tmp_path / "out.pt").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("variant", ["plain", "consolidated", "no-crc"])
def test_changed_values_keep_a_sound_zip(
    tmp_path: Path, cheetah: TensorDictBase, variant: str
) -> None:
    """A tensor whose bytes changed (a lossy rebuild) gets its record's CRC-32 computed
    again, unless torch wrote none."""
    src = _saved(cheetah, variant, tmp_path / "in.pt")
    tensors = _tensors(src)
    layout, skeleton = find(src, tensors) or pytest.fail("no layout")
    key = ("next", "observation")
    changed = {**tensors, key: tensors[key] + 0.5}
    out = tmp_path / "out.pt"
    write(out, layout, skeleton, lambda h: [array_bytes(changed[h.ref])], frozenset([key]))
    assert np.array_equal(from_torch(load(out)[key]), changed[key])
    with zipfile.ZipFile(out) as zf:
        bad = zf.testzip()
        assert bad is None if variant != "no-crc" else bad is not None  # no CRC: none to check
    assert len(out.read_bytes()) == len(src.read_bytes())


@pytest.mark.parametrize("saved", ["view", "overlapping", "legacy"])
def test_files_that_do_not_map_one_to_one(
    tmp_path: Path, cheetah: TensorDictBase, saved: str
) -> None:
    """Storages holding more than the leaves' values, or no zip records at all: no layout."""
    src = tmp_path / "in.pt"
    td = cheetah.clone()
    if saved == "view":  # torch.save writes every row of the storage
        torch.save(td[:, :100], src)
    elif saved == "overlapping":  # next observations as a view one row on
        flat = td.reshape(-1)[:-1].clone()
        rows = td["observation"].reshape(-1, 17)
        flat["observation"], flat["next", "observation"] = rows[:-1], rows[1:]
        torch.save(flat, src)
    else:
        torch.save(td, src, _use_new_zipfile_serialization=False)
    assert find(src, _tensors(src)) is None


def _layout(tmp_path: Path, cheetah: TensorDictBase) -> tuple[Path, dict]:
    src = _saved(cheetah, "plain", tmp_path / "in.pt")
    layout, _ = find(src, _tensors(src)) or pytest.fail("no layout")
    return src, layout.to_json()


@pytest.mark.parametrize(
    "damage",
    ["holes out of order", "hole outside the records", "CRC-32 field inside", "not a key"],
)
def test_a_malformed_layout_is_refused(
    tmp_path: Path, cheetah: TensorDictBase, damage: str
) -> None:
    src, data = _layout(tmp_path, cheetah)
    if damage == "holes out of order":
        data["holes"][0], data["holes"][1] = data["holes"][1], data["holes"][0]
    elif damage == "hole outside the records":
        data["records"] = data["records"][1:]
    elif damage == "CRC-32 field inside":
        data["records"][0][2] = [data["holes"][0][0]]
    else:
        data["holes"][0][2] = "observation"
    with pytest.raises(InputError, match=r"recorded layout of the \.pt file"):
        Layout.from_json(data, src)


def test_a_tensor_of_another_size_is_refused(tmp_path: Path, cheetah: TensorDictBase) -> None:
    src, data = _layout(tmp_path, cheetah)
    layout = Layout.from_json(data, src)
    tensors = _tensors(src)
    _, skeleton = find(src, tensors) or pytest.fail("no layout")

    def short(h: Hole) -> list:
        return [array_bytes(tensors[h.ref])[:-1]]

    with pytest.raises(InputError, match=r"bytes where the \.pt file had"):
        write(tmp_path / "out.pt", layout, skeleton, short)
    with pytest.raises(InputError, match="skeleton is"):
        write(tmp_path / "out.pt", layout, skeleton[:-1], short)


# ---------------------------------------------------------------------------------------------
# compress / verify / inflate of a .pt


def _pt_meta(path: Path) -> dict:
    return json.loads(load(path).get_non_tensor("_obsdelta")["meta"])


def test_compressed_pt_keeps_the_skeleton(tmp_path: Path, cheetah: TensorDictBase) -> None:
    src = _saved(cheetah, "plain", tmp_path / "in.pt")
    compress(src, tmp_path / "small.pt")
    meta = _pt_meta(tmp_path / "small.pt")
    layout = Layout.from_json(meta[PT_FILE], tmp_path / "small.pt")
    assert layout.size == src.stat().st_size and SKELETON in meta["objects"]
    inflate(tmp_path / "small.pt", tmp_path / "back.pt")
    assert (tmp_path / "back.pt").read_bytes() == src.read_bytes()


def test_a_changed_skeleton_byte_is_caught(tmp_path: Path, cheetah: TensorDictBase) -> None:
    src = _saved(cheetah, "plain", tmp_path / "in.pt")
    _, skeleton = find(src, _tensors(src)) or pytest.fail("no layout")
    small = tmp_path / "small.pt"
    compress(src, small)
    raw = bytearray(small.read_bytes())
    at = raw.find(skeleton)  # the skeleton array's storage, in the compressed file
    assert at > 0
    raw[at + len(skeleton) // 2] ^= 0x10
    small.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=f"key {SKELETON}: checksum mismatch"):
        verify(small)
    with pytest.raises(DataError, match="checksum mismatch"):
        inflate(small, tmp_path / "back.pt")
    assert not (tmp_path / "back.pt").exists()


def test_a_layout_naming_another_leaf_is_refused(tmp_path: Path, cheetah: TensorDictBase) -> None:
    """A layout edited (its manifest hash made to match) to put one leaf's bytes where
    another's were: refused before anything is written."""
    src = _saved(cheetah, "plain", tmp_path / "in.pt")
    small = tmp_path / "small.pt"
    compress(src, small)
    td = torch.load(small, weights_only=False)
    entry = td.get_non_tensor("_obsdelta")
    meta = json.loads(entry["meta"])
    holes = meta[PT_FILE]["holes"]
    big = max(range(len(holes)), key=lambda i: holes[i][1])
    holes[big][2] = ["done"]
    meta["manifest_hash"] = content_hash({k: v for k, v in meta.items() if k != "manifest_hash"})
    td.set_non_tensor("_obsdelta", {"meta": json.dumps(meta), "arrays": entry["arrays"]})
    torch.save(td, small)
    with pytest.raises(ObsdeltaError, match="not a tensor of that size"):
        inflate(small, tmp_path / "back.pt")
    assert not (tmp_path / "back.pt").exists()
