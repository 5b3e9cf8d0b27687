"""Hostile inputs: files built to make a reader run code or read outside themselves.

A ``.pt`` whose pickle would call a function is refused before anything in it runs, and an HDF5
file that points outside itself (external links, soft links, external raw storage, virtual
datasets) is refused before anything follows the pointer. Each ends like any bad input: exit 1,
one line on stderr naming the file, nothing written.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import xxhash
from tensordict import TensorDict, TensorDictBase

from obsdelta_cli import compress, inflate
from obsdelta_cli.errors import InputError
from obsdelta_cli.formats.pack_leaves import is_packed
from obsdelta_cli.formats.ted_pt import load

from .conftest import SAMPLE, Cli, tree_hash
from .manifests import manifest_of, rewrite_manifest
from .test_cli_errors import expect_error
from .writers import write_d4rl

COMMANDS = ["report", "compress", "inflate", "verify"]


def _args(command: str, src: Path, tmp_path: Path) -> list[str | Path]:
    if command in ("compress", "inflate"):
        return [command, src, "-o", tmp_path / f"out{src.suffix}"]
    return [command, src]


# ---------------------------------------------------------------------------------------------
# .pt: no pickle runs


class _Touch:
    """Unpickling this creates ``marker``: what a malicious checkpoint would do, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile_pt(kind: str, folder: Path, marker: Path) -> Path:
    path = folder / f"{kind}.pt"
    if kind == "object":  # torch.save of the object itself
        torch.save(_Touch(marker), path)
    elif kind == "legacy":  # torch's pre-1.6 format
        torch.save(_Touch(marker), path, _use_new_zipfile_serialization=False)
    elif kind == "raw-pickle":
        path.write_bytes(pickle.dumps(_Touch(marker), protocol=2))
    else:  # inside an otherwise genuine TED TensorDict, as a non-tensor leaf
        td = TensorDict(
            {"observation": torch.zeros(8, 3), "next": {"observation": torch.ones(8, 3)}}, [8]
        )
        if kind == "in-tensordict":
            td.set_non_tensor("info", _Touch(marker))
        else:  # in a compressed file's own metadata entry
            td.set_non_tensor("_obsdelta", {"meta": "{}", "arrays": {"x": _Touch(marker)}})
        torch.save(td, path)
    assert not marker.exists()
    return path


@pytest.mark.parametrize("kind", ["object", "legacy", "raw-pickle", "in-tensordict", "in-meta"])
@pytest.mark.parametrize("command", COMMANDS)
def test_pickle_with_code_is_refused(cli: Cli, tmp_path: Path, kind: str, command: str) -> None:
    marker = tmp_path / "MARKER"
    src = _hostile_pt(kind, tmp_path, marker)
    says = [src, "posix.system", "does not load", "if you trust this file"]
    expect_error(cli, *_args(command, src, tmp_path), says=says)
    assert not marker.exists(), "the pickle ran"


@pytest.mark.parametrize("kind", ["object", "legacy", "raw-pickle", "in-tensordict", "in-meta"])
@pytest.mark.parametrize("command", ["compress", "report"])
def test_pickle_with_code_is_refused_by_pack(
    cli: Cli, tmp_path: Path, kind: str, command: str
) -> None:
    marker = tmp_path / "MARKER"
    src = _hostile_pt(kind, tmp_path, marker)
    out = ["-o", tmp_path / "out.h5"] if command == "compress" else []
    says = [src, "posix.system", "does not load", "if you trust this file"]
    expect_error(cli, command, src, "--pack", *out, says=says)
    assert not marker.exists(), "the pickle ran"
    assert not (tmp_path / "out.h5").exists()


def test_packed_pt_with_code_in_its_pickle_is_refused(
    cli: Cli, tmp_path: Path, cheetah: TensorDictBase
) -> None:
    """A packed file whose compressed .pt pickle was replaced by one that calls a function,
    with every hash made to match, is written back and then refused unrun by inflate."""
    src = tmp_path / "in.pt"
    torch.save(cheetah, src)
    packed = tmp_path / "p.h5"
    compress(src, packed, pack=True)
    marker = tmp_path / "MARKER"
    with h5py.File(packed, "r+") as f:
        meta = manifest_of(f)
        skeleton = bytearray(f["obsdelta/pack/skeleton"][()].tobytes())
        # The pickle is the first record's data: same length, so every offset stays valid.
        name_len, extra_len = struct.unpack_from("<HH", skeleton, 26)
        start = 30 + name_len + extra_len
        end = skeleton.index(b"PK\x07\x08", start)
        hostile = pickle.dumps(_Touch(marker), protocol=2)
        assert len(hostile) <= end - start
        skeleton[start : start + len(hostile)] = hostile
        del f["obsdelta/pack/skeleton"]
        f["obsdelta/pack/skeleton"] = np.frombuffer(bytes(skeleton), np.uint8).view("V1")
        meta["pack"]["skeleton"] = xxhash.xxh3_64_hexdigest(bytes(skeleton))
        rewrite_manifest(f, meta, rehash=True)
    says = ["posix.system", "does not load", "if you trust this file"]
    expect_error(cli, "inflate", packed, "-o", tmp_path / "back.pt", says=says)
    assert not marker.exists(), "the pickle ran"


def test_a_real_pickle_would_have_run(tmp_path: Path) -> None:
    """The hostile files above are live: a plain ``torch.load`` runs them."""
    marker = tmp_path / "MARKER"
    torch.load(_hostile_pt("in-tensordict", tmp_path, marker), weights_only=False)
    assert marker.exists()


def test_memmap_tensordict_pickle_is_refused(tmp_path: Path, hopper: TensorDictBase) -> None:
    """torch.save of a memory-mapped TensorDict pickles file paths and getattr: refused."""
    td = hopper[:50].clone().memmap(tmp_path / "mm")
    torch.save(td, tmp_path / "mm.pt")
    with pytest.raises(InputError, match=r"getattr.*does not load"):
        load(tmp_path / "mm.pt")


def _variants(td: TensorDictBase, tmp_path: Path) -> dict[str, Path]:
    """How users save TensorDicts: plain, locked, consolidated, with a string leaf."""
    out = {}
    for name in ("plain", "locked", "consolidated", "non-tensor"):
        t = td.clone()
        if name == "locked":
            t.lock_()
        elif name == "consolidated":
            t = t.consolidate()
        elif name == "non-tensor":
            t.set_non_tensor("env_name", "Hopper-v5")
        out[name] = tmp_path / f"{name}.pt"
        torch.save(t, out[name])
    return out


@pytest.mark.parametrize("data", ["hopper", "cheetah"])
def test_genuine_tensordict_pt_round_trips(
    request: pytest.FixtureRequest, tmp_path: Path, data: str
) -> None:
    """Batch [T] and [B, T]; plain, locked, consolidated; compressed files load the same way.
    A lossless round trip gives back the file saved, byte for byte."""
    td: TensorDictBase = request.getfixturevalue(data)
    for name, src in _variants(td, tmp_path).items():
        for codec in ("exact", "fp16"):
            small, back = tmp_path / f"{name}-{codec}-s.pt", tmp_path / f"{name}-{codec}-b.pt"
            compress(src, small, codec=codec)
            assert "_obsdelta" in load(small).keys()
            inflate(small, back)
            got = load(back)
            assert got.batch_size == td.batch_size
            assert (got["next", "observation"] - td["next", "observation"]).abs().max() <= (
                0 if codec == "exact" else 1e-2
            ), (name, codec)
            assert torch.equal(got["observation"], td["observation"])
            if codec == "exact":
                assert back.read_bytes() == src.read_bytes(), name


def test_cli_on_genuine_pt(cli: Cli, tmp_path: Path) -> None:
    src = SAMPLE / "halfcheetah_ted.pt"
    cli("compress", src, "-o", tmp_path / "s.pt", "--codec", "exact", "--quiet")
    cli("verify", tmp_path / "s.pt", "--quiet")
    cli("inflate", tmp_path / "s.pt", "-o", tmp_path / "b.pt", "--quiet")
    assert "next/observation" in cli("report", tmp_path / "s.pt").stdout
    back = load(tmp_path / "b.pt")
    orig = torch.load(src, weights_only=False)
    assert torch.equal(back["next", "observation"], orig["next", "observation"])


# ---------------------------------------------------------------------------------------------
# HDF5: nothing outside the file is opened

D4RL_KEYS = ("observations", "next_observations", "actions", "rewards", "terminals", "timeouts")


def _outside(folder: Path, state: str) -> Path:
    """The file a hostile HDF5 points at: real data, missing, or a path that fails to open."""
    target = folder / "outside.h5"
    if state == "directory":
        target.mkdir()
    elif state == "present":
        with h5py.File(target, "w") as g:
            g.create_dataset("x", data=np.full((300, 11), 7, "f4"))
        (folder / "outside.bin").write_bytes(np.full((300, 11), 7, "f4").tobytes())
    return target


def _hostile_h5(kind: str, folder: Path, hopper: TensorDictBase) -> tuple[Path, str]:
    """A genuine D4RL file (real Hopper rows) with one object pointing outside it."""
    src = write_d4rl(hopper[:300], folder / "plain")
    path = folder / f"{kind}.hdf5"
    path.write_bytes(src.read_bytes())
    src.unlink()
    with h5py.File(path, "r+") as f:
        assert set(D4RL_KEYS) <= set(f.keys())
        del f["next_observations"]
        if kind == "external-link":
            f["next_observations"] = h5py.ExternalLink("outside.h5", "/x")
            return path, "object /next_observations is an external link to outside.h5:/x"
        if kind == "soft-through-external":
            f["infos/ext"] = h5py.ExternalLink("outside.h5", "/")
            f["next_observations"] = h5py.SoftLink("/infos/ext/x")
            return path, "object /infos/ext is an external link to outside.h5:/"
        if kind == "external-storage":
            f.create_dataset(
                "next_observations",
                shape=(300, 11),
                dtype="f4",
                external=[(str(folder / "outside.bin"), 0, 300 * 11 * 4)],
            )
            return path, "dataset /next_observations stores its data in the external file"
        if kind == "virtual":
            layout = h5py.VirtualLayout(shape=(300, 11), dtype="f4")
            layout[:] = h5py.VirtualSource("outside.h5", "x", shape=(300, 11))
            f.create_virtual_dataset("next_observations", layout)
            return path, "dataset /next_observations is a virtual dataset mapping outside.h5"
        if kind == "dangling-soft-link":
            f["next_observations"] = f["observations"][...] + 1
            f["infos/qpos"] = h5py.SoftLink("/infos/nowhere")
            return path, "object /infos/qpos is a soft link to /infos/nowhere, which does not exist"
        assert kind == "soft-link"
        f["next_observations"] = h5py.SoftLink("/observations")
        return path, "object /next_observations is a soft link to /observations"


HOSTILE_H5 = [
    "external-link",
    "soft-through-external",
    "external-storage",
    "virtual",
    "dangling-soft-link",
    "soft-link",
]


@pytest.mark.parametrize("kind", HOSTILE_H5)
@pytest.mark.parametrize("command", COMMANDS)
def test_hdf5_pointing_outside_is_refused(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase, kind: str, command: str
) -> None:
    _outside(tmp_path, "present")
    src, says = _hostile_h5(kind, tmp_path, hopper)
    expect_error(cli, *_args(command, src, tmp_path), says=[src, says])


@pytest.mark.parametrize("state", ["missing", "directory"])
@pytest.mark.parametrize("kind", ["external-link", "external-storage", "virtual"])
def test_the_outside_file_is_never_opened(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase, kind: str, state: str
) -> None:
    """Were the pointer followed, h5py would fail on the target with its own message; the
    refusal is ours, so it came first."""
    _outside(tmp_path, state)
    (tmp_path / "outside.bin").mkdir(exist_ok=True)  # external raw storage: a folder, unreadable
    src, says = _hostile_h5(kind, tmp_path, hopper)
    line = expect_error(cli, *_args("compress", src, tmp_path), says=[src, says])
    assert "unable to" not in line.lower() and "errno" not in line.lower(), line


@pytest.mark.parametrize("kind", ["external-link", "external-storage", "virtual"])
def test_the_hostile_files_are_live(tmp_path: Path, hopper: TensorDictBase, kind: str) -> None:
    """h5py follows every one of these pointers on read, which is why obsdelta checks first."""
    _outside(tmp_path, "present")
    src, _ = _hostile_h5(kind, tmp_path, hopper)
    with h5py.File(src, "r") as f:
        assert (f["next_observations"][...] == 7).all()


def test_compressed_hdf5_with_an_external_delta(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase
) -> None:
    small = tmp_path / "small.hdf5"
    compress(write_d4rl(hopper[:300], tmp_path / "plain"), small, codec="fp16")
    delta = "metadata/obsdelta/delta/next_observations"  # a D4RL file with metadata
    with h5py.File(small, "r+") as f:
        del f[delta]
        f[delta] = h5py.ExternalLink("/nonexistent/x.h5", "/x")
    says = [small, f"/{delta} is an external link"]
    for command in ("inflate", "verify", "report"):
        expect_error(cli, *_args(command, small, tmp_path), says=says)


def test_self_contained_hdf5_still_works(cli: Cli, tmp_path: Path) -> None:
    """Hard links only, as every D4RL, robomimic and tensordict file has."""
    for name in ("hopper_d4rl.hdf5", "hopper_robomimic.hdf5"):
        before = tree_hash(SAMPLE / name)
        cli("compress", SAMPLE / name, "-o", tmp_path / name, "--quiet")
        cli("verify", tmp_path / name, "--quiet")
        assert tree_hash(SAMPLE / name) == before


def test_a_manifest_outside_the_file_is_never_read(cli: Cli, tmp_path: Path) -> None:
    """Detection reads a file's manifest before anything else: a manifest dataset reached
    through a link is not read, though the file it names holds a genuine packed manifest."""
    packed = tmp_path / "p.h5"
    compress(SAMPLE / "hopper_d4rl.hdf5", packed, pack=True)
    with h5py.File(packed, "r+") as f:
        text = json.dumps(manifest_of(f)).encode()
        assert json.loads(text)["format"] == "packed-hdf5"
        f.attrs["obsdelta"] = json.dumps({"manifest": "obsdelta/manifest"})
        if "obsdelta/manifest" in f:  # packed files keep it in the attribute: none to remove
            del f["obsdelta/manifest"]
        f["obsdelta/manifest"] = h5py.ExternalLink("outside.h5", "/x")
    with h5py.File(tmp_path / "outside.h5", "w") as g:
        raw = np.frombuffer(zlib.compress(bytes(text)), np.uint8)
        g.create_dataset("x", data=raw.view(h5py.opaque_dtype(np.dtype("V1"))))
    assert not is_packed(packed)
    says = [packed, "object /obsdelta/manifest is an external link to outside.h5:/x"]
    for command in COMMANDS:
        expect_error(cli, *_args(command, packed, tmp_path), says=says)


@pytest.mark.parametrize("own", ["observations", "metadata", "metadata/../obsdelta", 7])
def test_a_manifest_placing_obsdeltas_group_elsewhere_is_refused(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase, own: object
) -> None:
    """The manifest names where obsdelta's group is (``own``): only the places obsdelta
    writes it are taken, so a crafted manifest cannot make a dataset of the user's read as
    exception rows, nor leave one out of the checks."""
    small = tmp_path / "small.h5"
    compress(write_d4rl(hopper[:300], tmp_path / "plain"), small)
    with h5py.File(small, "r+") as f:
        meta = manifest_of(f)
        assert meta["own"] == "metadata/obsdelta"
        rewrite_manifest(f, {**meta, "own": own}, rehash=True)
    says = [small, "places obsdelta's group at", "where obsdelta never writes it"]
    for command in ("inflate", "verify", "report"):
        expect_error(cli, *_args(command, small, tmp_path), says=says)
