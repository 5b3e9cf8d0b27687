"""``compress --pack --flat``: each key's datasets of every episode of an HDF5 file stored as
one dataset, the file's structure in a skeleton; read by plain h5py, trained from, verified,
predicted by ``report --pack --flat`` and inflated back object for object."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
import xxhash
from tensordict import TensorDictBase
from torch.utils.data import DataLoader

from obsdelta_cli import collate, compress, inflate, open_dataset, report, verify
from obsdelta_cli.commands.pack import flattenable
from obsdelta_cli.errors import DataError, InputError, ObsdeltaError
from obsdelta_cli.formats import detect
from obsdelta_cli.formats.hdf5_meta import read_meta
from obsdelta_cli.formats.pack_flat import FLAT, SKELETON, family_of
from obsdelta_cli.formats.pack_leaves import NAME

from .conftest import SAMPLE, Cli, marked_h5py_only
from .manifests import manifest_of, rewrite_manifest
from .realistic import write_robomimic_real
from .test_cli_errors import expect_error
from .test_pack import SAMPLES, input_in, plain_h5py_reads, same_container, same_transitions
from .writers import WRITERS, write_minari


@pytest.fixture(params=marked_h5py_only(flattenable()))
def source(request: pytest.FixtureRequest, tmp_path: Path, hopper: TensorDictBase) -> Path:
    """A real Hopper rollout in each HDF5 layout ``--flat`` takes (copied: never written to)."""
    return input_in(request.param, tmp_path, hopper)


@pytest.fixture(autouse=True)
def private_tmp(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """Temporary files (a flat file's skeleton is read from one) go to a folder of the test's
    own, checked empty at the end. A short path: DataLoader workers put sockets there, whose
    paths may not exceed 107 bytes. pytest's own temporary folder is made first: made while
    this one stands in for the system's, it went with it at the end of the first test."""
    tmp_path_factory.getbasetemp()
    where = Path(tempfile.mkdtemp(prefix="odf-"))
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    try:
        yield where
        left = [p for p in where.iterdir() if p.name.startswith("obsdelta")]
        assert left == []
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("codec", ["auto", "fp16"])
def test_flat_round_trip_gives_the_original_file(source: Path, tmp_path: Path, codec: str) -> None:
    packed = tmp_path / "flat.h5"
    result = compress(source, packed, codec=codec, pack=True, flat=True)
    assert detect(packed).name == NAME
    assert result.bytes_after == packed.stat().st_size < result.bytes_before
    checked = verify(packed)
    assert [k.key for k in checked.keys] == [k.key for k in result.keys]
    back = tmp_path / f"back{source.suffix}"
    inflate(packed, back)
    reference = source
    if codec != "auto" and result.keys:  # lossy: what the same codec gives without --pack
        compress(source, tmp_path / f"small{source.suffix}", codec=codec)
        reference = tmp_path / f"ref{source.suffix}"
        inflate(tmp_path / f"small{source.suffix}", reference)
    same_container(reference, back)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_flat_file_holds_families_not_episodes(source: Path, tmp_path: Path) -> None:
    """Every dataset but obsdelta's own is gone from the file's tree: their rows are in the
    families, and a fresh interpreter with h5py and hdf5plugin reads every dataset."""
    packed = tmp_path / "flat.h5"
    compress(source, packed, pack=True, flat=True)
    with h5py.File(packed) as f:
        assert list(f) == ["obsdelta"]
        meta = read_meta(f, packed) or {}
        families = meta["pack"]["flat"]
        for family in families:
            ds = f[family["path"]]
            members = family["members"]
            assert ds.shape[0] == sum(h5py.File(source)[m].shape[0] for m in members)
    total, filtered = plain_h5py_reads(packed)
    assert total >= len(families) + 1 and filtered >= 1


def test_open_dataset_trains_from_a_flat_file(source: Path, tmp_path: Path) -> None:
    compress(source, tmp_path / "flat.h5", pack=True, flat=True)
    same_transitions(source, tmp_path / "flat.h5")  # closed: its skeleton's file goes too


def test_dataloader_workers_read_a_flat_file(tmp_path: Path, hopper: TensorDictBase) -> None:
    src = write_minari(hopper, tmp_path / "in")
    compress(src, tmp_path / "flat.h5", pack=True, flat=True)
    plain, data = open_dataset(src), open_dataset(tmp_path / "flat.h5")
    loader = DataLoader(data, batch_size=256, shuffle=False, collate_fn=collate, num_workers=2)
    rows = 0
    for batch in loader:
        want = plain[torch.arange(rows, rows + batch.batch_size[0])]
        for key in want.keys(True, True):
            assert torch.equal(want[key], batch[key]), key
        rows += batch.batch_size[0]
    assert rows == len(plain)
    data.close()


def test_report_pack_flat_predicts_the_size(source: Path, tmp_path: Path) -> None:
    predicted = report(source, pack=True, flat=True).bytes_after
    actual = compress(source, tmp_path / "flat.h5", pack=True, flat=True).bytes_after
    assert abs(predicted - actual) <= 0.05 * actual, (predicted, actual)


def test_many_short_episodes_pack_smaller_flat(tmp_path: Path) -> None:
    """robomimic low-dim, 150 demos of 20-40 steps: each demo's datasets packed alone cost
    an object header each and compress poorly; their rows together do not."""
    pytest.importorskip("gymnasium")  # the rollouts are real Hopper-v5 ones
    src = write_robomimic_real(tmp_path / "low.hdf5", demos=150, cameras=False)
    at_paths = compress(src, tmp_path / "paths.h5", pack=True).bytes_after
    flat = compress(src, tmp_path / "flat.h5", pack=True, flat=True).bytes_after
    assert flat < 0.8 * at_paths, (flat, at_paths)
    with h5py.File(src) as f:
        demos = len(f["data"])
    with h5py.File(tmp_path / "flat.h5") as f:
        members = {m for fam in manifest_of(f)["pack"]["flat"] for m in fam["members"]}
    assert len(members) >= 8 * demos  # actions, rewards, dones, states, obs/* of each demo


@pytest.mark.h5py_only
@pytest.mark.parametrize("kind", ["robomimic-hdf5", "minari-hdf5", "d4rl-hdf5"])
def test_pack_of_many_episodes_suggests_flat(
    kind: str, hopper: TensorDictBase, tmp_path: Path
) -> None:
    """``compress --pack`` and ``report --pack`` of a file of many episodes say that
    ``--flat`` exists, with the number of episodes, and that the dataset's own library cannot
    read its output; of a file of one episode group (D4RL), or with ``--flat``, they do not."""
    td = hopper.clone()
    td["next", "done"][:] = False
    td["next", "done"][49::50] = True  # 60 episodes of 50 steps
    src = WRITERS[kind](td, tmp_path / "in")
    notes = [
        compress(src, tmp_path / "p.h5", pack=True).note,
        report(src, pack=True).note,
    ]
    for note in notes:
        if kind == "d4rl-hdf5":
            assert "--flat" not in note
        else:
            assert "--flat would store the datasets of its 60 episodes together" in note
            assert "robomimic's and Minari's own readers do not" in note
    assert "--flat would" not in compress(src, tmp_path / "f.h5", pack=True, flat=True).note
    assert "--flat would" not in report(src, pack=True, flat=True).note


def test_family_of_blanks_the_numbers_of_groups_only() -> None:
    a = np.zeros((3, 2), np.float32)
    assert family_of("data/demo_3/obs/robot0_eef_pos", a) == (
        "data/demo_#/obs/robot0_eef_pos",
        "<f4",
        (2,),
    )
    assert family_of("episode_12/infos/x", a[:, 0])[0] == "episode_#/infos/x"


def _first_family(packed: Path) -> str:
    with h5py.File(packed) as f:
        families = (read_meta(f, packed) or {})["pack"]["flat"]
        stored = [e["path"] for e in families if not f[e["path"]].is_virtual]
    return sorted(stored, key=len)[0]


def test_verify_catches_a_changed_value(source: Path, tmp_path: Path) -> None:
    packed = tmp_path / "flat.h5"
    compress(source, packed, pack=True, flat=True)
    name = _first_family(packed)
    with h5py.File(packed, "r+") as f:
        ds = f[name]
        row = ds[len(ds) // 2]
        ds[len(ds) // 2] = row + 1 if row.dtype.kind != "b" else ~row
    with pytest.raises(DataError, match="checksum mismatch"):
        verify(packed)
    with pytest.raises(ObsdeltaError):
        inflate(packed, tmp_path / f"back{source.suffix}")
    assert not (tmp_path / f"back{source.suffix}").exists()


def _rewrite(packed: Path, change: Callable[[h5py.File, dict[str, Any]], None]) -> None:
    """Change a packed file's manifest (and what else ``change`` does), its hash made to
    match, as a hostile or careless writer would."""
    with h5py.File(packed, "r+") as f:
        meta = manifest_of(f)
        change(f, meta)
        rewrite_manifest(f, meta, rehash=True)


def _changed_skeleton_byte(f: h5py.File, meta: dict[str, Any]) -> None:
    data = bytearray(f[SKELETON][()].tobytes())
    data[len(data) // 2] ^= 0x10
    del f[SKELETON]
    f[SKELETON] = np.frombuffer(bytes(data), np.uint8).view("V1")


def _shifted_member(f: h5py.File, meta: dict[str, Any]) -> None:
    members = meta["pack"]["flat"][0]["members"]
    members.append(members.pop(0))  # the same rows, another order: each reads another's


def _member_in_no_family(f: h5py.File, meta: dict[str, Any]) -> None:
    meta["pack"]["flat"][0]["members"].pop()


def _family_outside_its_place(f: h5py.File, meta: dict[str, Any]) -> None:
    meta["pack"]["flat"][0]["path"] = "obsdelta/manifest"


CHANGES = {
    "skeleton byte": (_changed_skeleton_byte, "skeleton does not match its hash"),
    "members reordered": (_shifted_member, "checksum mismatch|does not match"),
    "member left out": (_member_in_no_family, "cover its rows|no family"),
    "family path": (_family_outside_its_place, "pack.flat is malformed"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_damaged_flat_file_is_one_error_line(cli: Cli, tmp_path: Path, change: str) -> None:
    src = tmp_path / "in.hdf5"
    shutil.copy2(SAMPLE / SAMPLES["robomimic-hdf5"], src)
    packed = tmp_path / "flat.h5"
    compress(src, packed, pack=True, flat=True)
    edit, says = CHANGES[change]
    if change == "members reordered":
        # Members of different lengths: moving one shifts every row of the others.
        with h5py.File(packed) as f:
            fam = (read_meta(f, packed) or {})["pack"]["flat"][0]["members"]
        with h5py.File(src) as f:
            assert len({f[m].shape[0] for m in fam}) > 1
    _rewrite(packed, edit)
    for command in (["verify", packed], ["inflate", packed, "-o", tmp_path / "back.hdf5"]):
        line = expect_error(cli, *command)
        assert any(s in line for s in says.split("|")), line
    if change != "members reordered":  # values are checked by verify and inflate, not reads
        with pytest.raises(InputError, match=says):
            open_dataset(packed)


def test_flat_is_refused_where_it_means_nothing(cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "hopper_ted"
    shutil.copytree(SAMPLE / "hopper_ted", src)
    out = tmp_path / "p.h5"
    expect_error(cli, "compress", src, "-o", out, "--pack", "--flat", code=2, says=["--flat"])
    d4rl = SAMPLE / SAMPLES["d4rl-hdf5"]
    out = tmp_path / "o.hdf5"
    expect_error(cli, "compress", d4rl, "-o", out, "--flat", code=2, says=["--pack"])
    expect_error(cli, "report", d4rl, "--flat", code=2, says=["--pack"])
    assert not (tmp_path / "p.h5").exists() and not (tmp_path / "o.hdf5").exists()


def test_cli_pack_flat(cli: Cli, tmp_path: Path) -> None:
    out = cli("compress", SAMPLE / SAMPLES["robomimic-hdf5"], "-o", tmp_path / "f.h5", "--pack",
              "--flat").stdout  # fmt: skip
    assert "--flat" in " ".join(out.split())
    with h5py.File(tmp_path / "f.h5") as f:
        assert FLAT in f and SKELETON in f


def test_a_skeleton_pointing_outside_itself_is_refused(cli: Cli, tmp_path: Path) -> None:
    """A skeleton with an external link, its hash made to match, is refused before anything
    follows the link, as any input would be."""
    src = tmp_path / "in.hdf5"
    shutil.copy2(SAMPLE / SAMPLES["robomimic-hdf5"], src)
    packed = tmp_path / "flat.h5"
    compress(src, packed, pack=True, flat=True)
    skeleton = tmp_path / "skeleton.h5"

    def link_outside(f: h5py.File, meta: dict[str, Any]) -> None:
        skeleton.write_bytes(f[SKELETON][()].tobytes())
        with h5py.File(skeleton, "r+") as s:
            s["data/elsewhere"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/x")
        data = skeleton.read_bytes()
        del f[SKELETON]
        f[SKELETON] = np.frombuffer(data, np.uint8).view("V1")
        meta["pack"]["skeleton"] = xxhash.xxh3_64_hexdigest(data)

    _rewrite(packed, link_outside)
    for command in (["verify", packed], ["inflate", packed, "-o", tmp_path / "back.hdf5"]):
        expect_error(cli, *command, says=["external link"])
    with pytest.raises(InputError, match="external link"):
        open_dataset(packed)
