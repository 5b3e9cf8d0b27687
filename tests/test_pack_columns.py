"""Columns stored once in a packed file: D4RL's ``infos/qpos`` and ``infos/qvel`` repeat columns
of ``observations`` (and robomimic's low-dim observations repeat ``states``); the packed file
maps them with HDF5 virtual datasets that plain h5py reads, and obsdelta rebuilds them from the
manifest's record, refusing a file whose mappings differ from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from obsdelta_cli import compress, inflate, open_dataset, report, verify
from obsdelta_cli.errors import DataError, ObsdeltaError
from obsdelta_cli.filters import MIN_PACK_BYTES, sample_rows
from obsdelta_cli.formats.hdf5_meta import read_meta
from obsdelta_cli.formats.hdf5_walk import OWN_IN_METADATA
from obsdelta_cli.formats.pack_columns import SAMPLE_ROWS, columns_root

from . import realistic as R
from .conftest import SAMPLE, Cli
from .manifests import manifest_of, rewrite_manifest
from .test_cli_errors import expect_error
from .test_pack import h5_objects
from .writers import write_ted_hdf5

ROWS = 5000
#: D4RL files have metadata: obsdelta's group is /metadata/obsdelta.
QPOS_KEPT = f"{columns_root(OWN_IN_METADATA)}/infos/qpos"
QVEL_KEPT = f"{columns_root(OWN_IN_METADATA)}/infos/qvel"
QS = ["qpos", "qvel"]


@pytest.fixture(scope="module")
def rollout() -> R.Rollout:
    """The D4RL sample's real Hopper-v5 steps with the state in float32, as hopper-medium-v2
    stores it: ``observations`` is ``concat(qpos[1:], clip(qvel, -10, 10))``, bit for bit."""
    with h5py.File(SAMPLE / "hopper_d4rl.hdf5", "r") as f:
        d = {name: f[name][()] for name in ("observations", "next_observations", "actions")}
        d |= {name: f[name][()] for name in ("rewards", "terminals", "timeouts")}
        qpos, qvel = (f[f"infos/{k}"][()].astype(np.float32) for k in QS)
    assert len(qpos) == ROWS and (d["observations"] == np.concatenate([qpos[:, 1:], qvel], 1)).all()
    # The log-likelihood of each action under a Gaussian policy around tanh of the state.
    mean = np.tanh(d["observations"][:, :3] * 0.5)
    log_probs = (-0.5 * (((d["actions"] - mean) / 0.3) ** 2).sum(1) - 0.6).astype(np.float32)
    ends = np.flatnonzero(d["terminals"] | d["timeouts"])
    starts = [0, *(int(e) + 1 for e in ends if e + 1 < ROWS)]
    return R.Rollout(**d, qpos=qpos, qvel=qvel, log_probs=log_probs, starts=starts)


def _packed(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "p.h5"
    compress(src, out, pack=True)
    return out


def _entries(packed: Path) -> dict[str, Any]:
    with h5py.File(packed, "r") as f:
        meta = read_meta(f, packed)  # a long manifest is stored compressed
    assert meta is not None
    return meta["pack"]["datasets"]


def _same_values_in_plain_h5py(packed: Path, original: Path, names: list[str]) -> None:
    """A fresh interpreter with nothing but h5py and hdf5plugin reads, through the virtual
    datasets, the original's values bit for bit."""
    script = (
        "import sys, h5py, hdf5plugin, numpy as np\n"
        "with h5py.File(sys.argv[1]) as p, h5py.File(sys.argv[2]) as o:\n"
        "    for name in sys.argv[3:]:\n"
        "        a, b = p[name][()], o[name][()]\n"
        "        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name\n"
        "        print(name, p[name].is_virtual)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(packed), str(original), *names],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(out.stdout.splitlines()) == len(names)


def _same_rows(a: Path, b: Path) -> None:
    plain, packed = open_dataset(a), open_dataset(b, cache_mb=1)
    try:
        idx = torch.randperm(len(plain), generator=torch.Generator().manual_seed(0))[:400]
        want, got = plain[idx], packed[idx]
        assert set(want.keys(True, True)) == set(got.keys(True, True))
        for key in want.keys(True, True):
            assert torch.equal(want[key], got[key]), key
    finally:
        plain.close()
        packed.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["medium", "medium-replay"])
def test_hopper_state_columns_are_stored_once(
    rollout: R.Rollout, tmp_path: Path, dtype: type
) -> None:
    src = R.write_d4rl_v2(rollout, tmp_path / "hopper.hdf5", dtype=dtype)
    packed = _packed(src, tmp_path)
    entries = _entries(packed)
    assert entries["infos/qvel"]["columns"] == [[0, 6, "observations", 5]]
    assert entries["infos/qpos"]["columns"] == [[0, 1, QPOS_KEPT, 0], [1, 6, "observations", 0]]
    assert "columns" not in entries["observations"] and "columns" not in entries["actions"]
    with h5py.File(packed, "r") as f:
        assert f["infos/qvel"].is_virtual and f["infos/qpos"].is_virtual
        assert f["infos/qvel"].id.get_storage_size() == 0
        assert f[QPOS_KEPT].shape == (ROWS, 1) and QVEL_KEPT not in f
        kept = f[QPOS_KEPT].id.get_storage_size()
        assert 0 < kept < f["observations"].id.get_storage_size() / 5
    verify(packed)
    _same_values_in_plain_h5py(packed, src, ["infos/qpos", "infos/qvel", "observations"])
    _same_rows(src, packed)
    inflate(packed, tmp_path / "back.hdf5")
    assert h5_objects(src) == h5_objects(tmp_path / "back.hdf5")


def _repeat(rollout: R.Rollout, row: int, qvel: float, observed: float) -> R.Rollout:
    """The rollout with ``qvel[row, 2]`` set to ``qvel`` and the observation's copy of it (and
    the previous step's next observation) to ``observed``."""
    obs, nxt, qv = (
        rollout.observations.copy(),
        rollout.next_observations.copy(),
        rollout.qvel.copy(),
    )
    before = obs[row].copy()
    qv[row, 2] = qvel
    obs[row, 7] = observed
    nxt[(nxt == before).all(1), 7] = observed
    return R.Rollout(**{**vars(rollout), "observations": obs, "next_observations": nxt, "qvel": qv})


@pytest.mark.parametrize("change", ["clipped", "negative-zero"])
@pytest.mark.parametrize("row", [1, 600], ids=["sampled-row", "unsampled-row"])
def test_a_column_differing_on_one_row_stays_stored(
    rollout: R.Rollout, tmp_path: Path, change: str, row: int
) -> None:
    """D4RL clips the velocities it observes to [-10, 10]: one clipped step keeps that column
    of ``infos/qvel`` stored. 0.0 and -0.0 compare equal as floats, not as bits."""
    sampled = any(sl.start <= row < sl.stop for sl in sample_rows(ROWS, SAMPLE_ROWS))
    assert sampled == (row == 1)  # the unsampled row is caught by the comparison of every row
    values = (25.0, 10.0) if change == "clipped" else (-0.0, 0.0)
    src = R.write_d4rl_v2(_repeat(rollout, row, *values), tmp_path / "hopper.hdf5")
    packed = _packed(src, tmp_path)
    assert _entries(packed)["infos/qvel"]["columns"] == [
        [0, 2, "observations", 5],
        [2, 3, QVEL_KEPT, 0],
        [3, 6, "observations", 8],
    ]
    verify(packed)
    _same_values_in_plain_h5py(packed, src, ["infos/qvel", "observations"])
    inflate(packed, tmp_path / "back.hdf5")
    assert h5_objects(src) == h5_objects(tmp_path / "back.hdf5")


def _remap(f: h5py.File, name: str, source: str, columns: slice, file: str = ".") -> None:
    """Replace dataset ``name`` by a virtual dataset mapping ``columns`` of ``source``."""
    shape, dtype = f[name].shape, f[name].dtype
    del f[name]
    layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
    layout[:] = h5py.VirtualSource(file, source, shape=(shape[0], 11), dtype=dtype)[:, columns]
    f.create_virtual_dataset(name, layout)


def _tamper(packed: Path, kind: str) -> str:
    """Change how ``packed`` stores ``infos/qvel``; return what the refusal says."""
    with h5py.File(packed, "r+") as f:
        if kind == "shifted":  # h5py would read observations' columns 4:10
            _remap(f, "infos/qvel", "/observations", slice(4, 10))
            return "dataset /infos/qvel is a virtual dataset not mapped as recorded"
        if kind == "outside":
            _remap(f, "infos/qvel", "x", slice(5, 11), file="outside.h5")
            return "dataset /infos/qvel is a virtual dataset mapping outside.h5"
        if kind == "stored":  # a plain dataset with other values, where a mapping was recorded
            values = f["infos/qvel"][()] + 1
            del f["infos/qvel"]
            f["infos/qvel"] = values
            return "/infos/qvel is not the virtual dataset the metadata records"
        if kind == "unrecorded":
            layout = h5py.VirtualLayout(shape=(ROWS, 6), dtype="f4")
            layout[:] = h5py.VirtualSource(".", "/observations", shape=(ROWS, 11))[:, 0:6]
            f.create_virtual_dataset("infos/extra", layout)
            return "dataset /infos/extra is a virtual dataset not mapped as recorded"
        assert kind == "chain"  # recorded, but mapping another virtual dataset
        meta = manifest_of(f)
        meta["pack"]["datasets"]["infos/qpos"]["columns"] = [[0, 6, "infos/qvel", 0]]
        rewrite_manifest(f, meta)
        shape = f["infos/qpos"].shape
        del f["infos/qpos"]
        layout = h5py.VirtualLayout(shape=shape, dtype="f4")
        layout[:] = h5py.VirtualSource(".", "/infos/qvel", shape=(ROWS, 6))[:, 0:6]
        f.create_virtual_dataset("infos/qpos", layout)
        return "dataset /infos/qpos maps /infos/qvel, which is not a stored dataset"


@pytest.mark.parametrize("kind", ["shifted", "outside", "stored", "unrecorded", "chain"])
def test_a_mapping_other_than_the_recorded_one_is_refused(
    rollout: R.Rollout, tmp_path: Path, cli: Cli, kind: str
) -> None:
    """h5py users would read wrong values (or another file's): verify, inflate and training
    refuse the file before reading anything, and never open the file pointed at."""
    (tmp_path / "outside.h5").mkdir()  # were it opened, h5py would fail with its own message
    src = R.write_d4rl_v2(rollout, tmp_path / "hopper.hdf5")
    packed = _packed(src, tmp_path)
    says = _tamper(packed, kind)
    for command in ("verify", "inflate", "report"):
        out = [] if command != "inflate" else ["-o", tmp_path / "back.hdf5"]
        line = expect_error(cli, command, packed, *out, says=[packed, says])
        assert "unable to" not in line.lower(), line
    with pytest.raises(ObsdeltaError, match=says.lstrip("/")):
        open_dataset(packed)
    assert not (tmp_path / "back.hdf5").exists()


@pytest.mark.parametrize("name", ["observations", QPOS_KEPT])
def test_verify_catches_a_changed_value(rollout: R.Rollout, tmp_path: Path, name: str) -> None:
    """A value changed in a source of shared columns or in the columns kept: the values hash
    of the original dataset no longer matches."""
    src = R.write_d4rl_v2(rollout, tmp_path / "hopper.hdf5")
    packed = _packed(src, tmp_path)
    with h5py.File(packed, "r+") as f:
        f[name][10, 0] = f[name][10, 0] + 1
    with pytest.raises(DataError, match="checksum mismatch"):
        verify(packed)
    with pytest.raises(ObsdeltaError):
        inflate(packed, tmp_path / "back.hdf5")
    assert not (tmp_path / "back.hdf5").exists()


def test_report_pack_predicts_a_file_with_shared_columns(
    rollout: R.Rollout, tmp_path: Path
) -> None:
    src = R.write_d4rl_v2(rollout, tmp_path / "hopper.hdf5")
    predicted = report(src, pack=True).bytes_after
    actual = compress(src, tmp_path / "p.h5", pack=True).bytes_after
    assert abs(predicted - actual) <= 0.05 * actual, (predicted, actual)


def test_robomimic_sample_maps_its_states(tmp_path: Path) -> None:
    """The sample's states are ``[qpos, qvel]`` beside ``obs/qpos`` and ``obs/qvel``: every demo
    long enough to be filtered maps them (the round trip is in test_pack)."""
    src = SAMPLE / "hopper_robomimic.hdf5"
    entries = _entries(_packed(src, tmp_path))
    mapped = {k: e["columns"] for k, e in entries.items() if "columns" in e}
    with h5py.File(src, "r") as f:
        long = [d for d in f["data"] if f[f"data/{d}/obs/qpos"].nbytes >= MIN_PACK_BYTES]
    assert long and sorted(mapped) == sorted(f"data/{d}/obs/{k}" for d in long for k in QS)
    for name, columns in mapped.items():
        states = name.rsplit("/obs/", 1)[0] + "/states"
        assert columns == [[0, 6, states, 6 * QS.index(name.rsplit("/", 1)[1])]]


@pytest.mark.parametrize("layout", ["ted-hdf5", "d4rl-sample"])
def test_no_column_repeated_no_mapping(layout: str, tmp_path: Path, hopper: Any) -> None:
    """Layouts whose datasets share no column (the D4RL sample keeps qpos in float64, unlike
    its float32 observations) are packed without any virtual dataset."""
    sources = {
        "ted-hdf5": lambda: write_ted_hdf5(hopper, tmp_path / "in"),
        "d4rl-sample": lambda: SAMPLE / "hopper_d4rl.hdf5",
    }
    packed = _packed(sources[layout](), tmp_path)
    assert all("columns" not in e for e in _entries(packed).values())
    virtual: list[str] = []
    with h5py.File(packed, "r") as f:
        f.visititems(lambda n, o: virtual.append(n) if getattr(o, "is_virtual", False) else None)
    assert virtual == []
