"""Nothing lost: verify catches damage, outputs appear whole or not at all, even under SIGTERM
and SIGKILL, and temporaries of killed runs are cleaned up."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from obsdelta_cli import compress, verify
from obsdelta_cli.errors import DataError
from obsdelta_cli.formats import FORMATS, packed
from obsdelta_cli.manifest import FORMAT_VERSION
from obsdelta_cli.stream import Stream

from .conftest import SAMPLE, Cli, finish, in_the_foreground, marked_h5py_only, tree_hash
from .test_cli_errors import expect_error
from .writers import WRITERS

# Input formats: a packed file is an output only (see test_pack).
COMPRESSIBLE = [f for f in FORMATS if FORMATS[f].nothing_to_do is None and f in WRITERS]


@pytest.mark.parametrize("codec", ["exact", "fp16", "bf16"])
@pytest.mark.parametrize("fmt", marked_h5py_only(COMPRESSIBLE))
def test_verify_accepts_what_compress_wrote(
    cli: Cli, fmt: str, codec: str, tmp_path: Path, hopper: TensorDictBase
) -> None:
    src = WRITERS[fmt](hopper[:600], tmp_path / "in")
    out = tmp_path / ("small" + src.suffix)
    cli("compress", src, "-o", out, "--codec", codec, "--quiet")
    line = json.loads(cli("verify", out, "--json").stdout)
    assert line["command"] == "verify" and line["compressed"]
    assert "verified" in cli("verify", out).stdout


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def _memmap_case(tmp_path: Path, hopper: TensorDictBase, codec: str) -> Path:
    td = hopper.clone()
    td["next", "observation"][5] = 1e6  # an exception row for fp16
    td.memmap(tmp_path / "in")
    compress(tmp_path / "in", tmp_path / "small", codec=codec)
    return tmp_path / "small"


@pytest.mark.parametrize(
    ("codec", "target", "says"),
    [
        ("fp16", "next/delta/observation.memmap", ["next/delta/observation", "checksum"]),
        ("fp16", "obsdelta.arrays/k0.rows.bin", ["exception rows of next/observation", "checksum"]),
        ("exact", "obsdelta.arrays/k0.index.bin", ["next/observation", "index is not increasing"]),
        ("exact", "action.memmap", ["key action", "checksum mismatch"]),
        ("exact", "next/reward.memmap", ["key next/reward", "checksum mismatch"]),
        ("exact", "observation.memmap", ["key observation", "checksum mismatch in the copied"]),
    ],
)
def test_verify_names_the_damaged_leaf(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase, codec: str, target: str, says: list[str]
) -> None:
    small = _memmap_case(tmp_path, hopper, codec)
    _flip(small / target, 17)
    expect_error(cli, "verify", small, says=[small, *says])
    expect_error(cli, "inflate", small, "-o", tmp_path / "back", says=[small])


@pytest.mark.parametrize("codec", ["exact", "fp16"])
def test_verify_decodes_packed_observations_once(
    tmp_path: Path, hopper: TensorDictBase, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _memmap_case(tmp_path, hopper, codec)
    small = tmp_path / "packed.h5"
    compress(tmp_path / "in", small, codec=codec, pack=True)
    copied: list[tuple[int, ...]] = []
    real = Stream.copy

    def copy(self: Stream, src: Any, dst: Any, algorithm: str, *check: Any) -> str | None:
        copied.append(tuple(getattr(src, "shape", ())))
        return real(self, src, dst, algorithm, *check)

    monkeypatch.setattr(Stream, "copy", copy)
    assert verify(small).ok
    # Every other leaf is hashed on its own; the observations, which a packed file stores
    # filtered, only from the reads that rebuild the next ones.
    assert copied and tuple(hopper["observation"].shape) not in copied
    # And their damage is still found, and named.
    with h5py.File(small, "r+") as f:
        ds = f["observation"]
        ds[7] = ds[7] + 1.0
    with pytest.raises(DataError, match=r"observation.*checksum mismatch in the copied data"):
        verify(small)


@pytest.mark.parametrize("codec", ["exact", "fp16"])
def test_verify_decodes_the_observations_of_a_packed_hdf5_file_once(
    tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = tmp_path / "packed.h5"
    compress(SAMPLE / "hopper_d4rl.hdf5", small, codec=codec, pack=True)
    with h5py.File(small, "r") as f:
        observations = f["observations"].shape
    hashed: list[tuple[int, ...]] = []
    real = packed.values_hash

    def values_hash(ds: Any, rows: int, step: int) -> str:
        hashed.append(tuple(ds.shape))
        return real(ds, rows, step)

    monkeypatch.setattr(packed, "values_hash", values_hash)
    assert verify(small).ok
    # Every other repacked dataset is hashed as an object; the observations, from the reads
    # that rebuild the next ones, against the same recorded hash of their values.
    assert hashed and observations not in hashed
    with h5py.File(small, "r+") as f:
        ds = f["observations"]
        ds[7] = ds[7] + 1.0
    with pytest.raises(DataError, match=r"observations.*checksum mismatch in the copied data"):
        verify(small)


def test_verify_damaged_hdf5(cli: Cli, tmp_path: Path) -> None:
    compress(SAMPLE / "hopper_d4rl.hdf5", tmp_path / "s.h5", codec="fp16")
    with h5py.File(tmp_path / "s.h5", "r+") as f:
        f["metadata/obsdelta/delta/next_observations"][7, 3] += np.float16(0.5)
    says = ["metadata/obsdelta/delta/next_observations"]
    expect_error(cli, "verify", tmp_path / "s.h5", says=says)


@pytest.mark.parametrize("filters", [{}, {"compression": "gzip"}, {"shuffle": True}])
@pytest.mark.parametrize("row", [0, 299])
def test_damaged_observations_never_inflate(
    cli: Cli, tmp_path: Path, hopper: TensorDictBase, filters: dict[str, Any], row: int
) -> None:
    """Observations a container copies whole (chunked: HDF5 copies them object for object)
    are checked before inflate copies them. Row 0 matters most: no rebuilt next observation
    is made from it, so only that check sees it; the damage here leaves every chunk valid."""
    src = tmp_path / "in.hdf5"
    flat = hopper[:300]
    with h5py.File(src, "w") as f:
        obs, nxt = flat["observation"].numpy(), flat["next", "observation"].numpy()
        f.create_dataset("observations", data=obs, chunks=(64, obs.shape[1]), **filters)
        f.create_dataset("next_observations", data=nxt, chunks=(64, obs.shape[1]), **filters)
        f["actions"] = flat["action"].numpy()
        f["rewards"] = flat["next", "reward"].numpy().reshape(-1)
        f["terminals"] = flat["next", "terminated"].numpy().reshape(-1)
        f["timeouts"] = flat["next", "truncated"].numpy().reshape(-1)
    small = tmp_path / "small.h5"
    compress(src, small, codec="exact")
    with h5py.File(small, "r+") as f:
        f["observations"][row, 0] += 0.5
    says = [small, "observations", "checksum mismatch"]
    expect_error(cli, "inflate", small, "-o", tmp_path / "back.hdf5", says=says)
    assert not (tmp_path / "back.hdf5").exists()
    expect_error(cli, "verify", small, says=says)


def test_verify_refuses_plain_and_unknown_versions(cli: Cli, tmp_path: Path) -> None:
    expect_error(cli, "verify", SAMPLE / "hopper_ted", says=["not compressed by obsdelta"])
    compress(SAMPLE / "hopper_ted", tmp_path / "s")
    meta = json.loads((tmp_path / "s/obsdelta.json").read_text())
    (tmp_path / "s/obsdelta.json").write_text(
        json.dumps({**meta, "obsdelta_format": FORMAT_VERSION + 1})
    )
    expect_error(cli, "verify", tmp_path / "s", says=["upgrade obsdelta"])


def test_output_is_checked_before_it_is_put_in_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hopper: TensorDictBase
) -> None:
    """A write that went wrong on its way to disk is caught before OUTPUT appears."""
    from obsdelta_cli.formats.ted_memmap import TedMemmap

    finish = TedMemmap.finish

    def finish_then_damage(self: TedMemmap, path: Path, sink: object, meta: object) -> None:
        finish(self, path, sink, meta)  # type: ignore[arg-type]
        _flip(path / "next/delta/observation.memmap", 3)

    monkeypatch.setattr(TedMemmap, "finish", finish_then_damage)
    hopper.memmap(tmp_path / "in")
    with pytest.raises(DataError, match="failed verification"):
        compress(tmp_path / "in", tmp_path / "out", codec="fp16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    compress(
        tmp_path / "in", tmp_path / "out", codec="fp16", verify=False
    )  # the check is what caught it
    assert (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# Signals


def _big_input(tmp_path: Path, hopper: TensorDictBase, tiles: int) -> Path:
    """A TED memmap of ``tiles`` copies of the Hopper rollout (real data, ~0.5 MB a tile)."""
    td = torch.cat([hopper] * tiles)
    td.memmap(tmp_path / "big")
    return tmp_path / "big"


def _start(src: Path, out: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-X", "faulthandler", "-m", "obsdelta_cli", "compress", str(src)]
    return subprocess.Popen(
        [*argv, "-o", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=in_the_foreground,
    )


def _traces(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".obsdelta-" in p.name)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_leave_nothing(
    signum: int, tmp_path: Path, hopper: TensorDictBase
) -> None:
    # 240 MB: compress writes for about 0.3 s once its temporary output appears, where 60 MB
    # gave 0.08 s, short enough for a busy machine to deliver the signal after the rename.
    src = _big_input(tmp_path, hopper, 480)
    before = tree_hash(src)
    out = tmp_path / "out"
    proc = _start(src, out)
    _wait_for_writing(proc, tmp_path)
    assert proc.poll() is None, "finished before it could be interrupted; use a bigger input"
    proc.send_signal(signum)
    stderr = finish(proc, 60)[2]
    assert proc.returncode == (143 if signum == signal.SIGTERM else 130)
    assert stderr.strip().startswith("obsdelta: ") and len(stderr.strip().splitlines()) == 1
    assert not out.exists() and _traces(tmp_path) == []
    assert tree_hash(src) == before


def _wait_for_writing(proc: subprocess.Popen[str], folder: Path) -> float:
    """Block until ``proc`` has started writing its output; return when that was."""
    deadline = time.monotonic() + 60
    while not _traces(folder) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return time.monotonic()


def test_sigkill_at_random_moments(tmp_path: Path, hopper: TensorDictBase) -> None:
    """20 runs killed at random moments while writing, verifying or renaming: OUTPUT is always
    absent or complete and sound, and the next run cleans up what a killed run left."""
    src = _big_input(tmp_path, hopper, 120)
    before = tree_hash(src)
    timing = _start(src, tmp_path / "timing")
    began = _wait_for_writing(timing, tmp_path)
    timing.communicate(timeout=120)
    window = time.monotonic() - began  # writing, verifying and renaming
    rng = random.Random(20261121)
    outcomes = {"absent": 0, "complete": 0}
    for trial in range(20):
        out = tmp_path / f"out{trial}"
        proc = _start(src, out)
        _wait_for_writing(proc, tmp_path)
        time.sleep(rng.uniform(0, 1.2) * window)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        if out.exists():
            verify(out)  # raises if anything is wrong
            outcomes["complete"] += 1
        else:
            outcomes["absent"] += 1
    print(f"SIGKILL trials over a {window:.2f} s write window: {outcomes}")
    assert sum(outcomes.values()) == 20 and outcomes["absent"] > 0
    assert tree_hash(src) == before
    # Stale temporaries of the killed runs are removed by the next run for the same output.
    for trial in range(20):
        compress(src, tmp_path / f"out{trial}", force=True, verify=False)
    assert _traces(tmp_path) == []
