"""Fault injection: random bit flips in compressed and packed outputs of every kind.

A flip must never give wrong data silently: ``inflate`` either fails with one clear error
(an :class:`ObsdeltaError`, never another exception) or gives back exactly what the undamaged
file gives, and ``verify`` fails on every flip that changes what ``inflate`` returns. The fast
slice runs in CI; ``-m slow`` runs more than 1,000 flips.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from tensordict import TensorDictBase

from obsdelta_cli import compress, inflate, verify
from obsdelta_cli.errors import ObsdeltaError
from obsdelta_cli.formats import hdf5_chunks
from obsdelta_cli.manifest import content_hash

from .conftest import marked_h5py_only
from .writers import WRITERS

KINDS = ["ted-memmap", "torchrl-rb", "ted-pt", "d4rl-hdf5", "robomimic-hdf5", "ted-hdf5"]
CODECS = ["exact", "fp16"]


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def _content(path: Path) -> str:
    """What a reader gets back: file names and bytes; for HDF5, every object's values, dtype,
    shape and attributes (the bytes of an HDF5 file may differ where nothing reads them)."""
    h = hashlib.sha256()
    if path.is_file() and path.suffix in (".hdf5", ".h5"):
        with h5py.File(path, "r") as f:

            def visit(name: str, obj: object) -> None:
                h.update(name.encode())
                for key in sorted(obj.attrs):  # type: ignore[attr-defined]
                    h.update(key.encode() + repr(obj.attrs[key]).encode())  # type: ignore[attr-defined]
                if isinstance(obj, h5py.Dataset):
                    h.update(f"{obj.dtype}{obj.shape}{obj.chunks}{obj.compression}".encode())
                    h.update(np.ascontiguousarray(obj[()]).tobytes())

            f.visititems(visit)
        return h.hexdigest()
    for f in _files(path):
        h.update(str(f.relative_to(path) if f != path else "").encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _flip(path: Path, rng: random.Random) -> str:
    files = _files(path)
    sizes = [f.stat().st_size for f in files]
    at = rng.randrange(sum(sizes))
    for f, size in zip(files, sizes, strict=True):
        if at < size:
            data = bytearray(f.read_bytes())
            data[at] ^= 1 << rng.randrange(8)
            f.write_bytes(bytes(data))
            return f"{f.name}@{at}"
        at -= size
    raise AssertionError("unreachable")


def run_flips(
    kind: str,
    codec: str,
    hopper: TensorDictBase,
    tmp: Path,
    flips: int,
    *,
    pack: bool = False,
    flat: bool = False,
    seed: str = "",
) -> dict:
    # A copy of the rows, as saved on their own (torch.save of a view writes the whole storage).
    src = WRITERS[kind](hopper[:600].clone(), tmp / "in")
    small = tmp / ("small.h5" if pack else f"small{src.suffix}")
    compress(src, small, codec=codec, pack=pack, flat=flat)
    inflate(small, tmp / f"ref{src.suffix}")
    reference = _content(tmp / f"ref{src.suffix}")
    rng = random.Random(f"{kind}-{codec}{seed and '-'}{seed}")
    tally = {"caught": 0, "harmless": 0, "silent": [], "missed_by_verify": [], "crashes": []}
    for i in range(flips):
        damaged = tmp / f"d{i}{small.suffix}"
        (shutil.copytree if small.is_dir() else shutil.copy)(small, damaged)
        where = _flip(damaged, rng)
        verified = True
        try:
            verify(damaged)
        except ObsdeltaError:
            verified = False
        except Exception as exc:  # a traceback for a user
            tally["crashes"].append(f"verify {where}: {type(exc).__name__}: {exc}")
            verified = False
        back = tmp / f"b{i}{src.suffix}"
        try:
            inflate(damaged, back)
        except ObsdeltaError:
            tally["caught"] += 1
            assert not back.exists(), f"partial output after a failed inflate ({where})"
        except Exception as exc:
            tally["crashes"].append(f"inflate {where}: {type(exc).__name__}: {exc}")
        else:
            if _content(back) == reference:
                tally["harmless"] += 1
            else:
                tally["silent"].append(where)
            if verified and _content(back) != reference:
                tally["missed_by_verify"].append(where)
        for p in (damaged, back):
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    return tally


def _check(tally: dict) -> None:
    assert tally["crashes"] == [], tally["crashes"]
    assert tally["silent"] == [], tally["silent"]
    assert tally["missed_by_verify"] == [], tally["missed_by_verify"]


#: Outputs: as compressed, and packed with its chunks decoded by HDF5 or by obsdelta (the
#: small chunks of these files are left to HDF5 unless the floor is lifted).
OUTPUTS = ["compressed", "packed", "packed-direct"]


@pytest.fixture(params=OUTPUTS)
def output(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "packed-direct":
        monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", 0)
    return str(request.param)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kind", marked_h5py_only(KINDS))
def test_bit_flips_are_caught(
    kind: str, codec: str, output: str, hopper: TensorDictBase, tmp_path: Path
) -> None:
    pack = output != "compressed"
    tally = run_flips(kind, codec, hopper, tmp_path, flips=8, pack=pack, seed=output)
    _check(tally)
    assert tally["caught"] + tally["harmless"] == 8


@pytest.mark.parametrize("direct", [False, True], ids=["packed", "packed-direct"])
@pytest.mark.parametrize("flips", [8, pytest.param(180, marks=pytest.mark.slow)])
def test_bit_flips_in_a_packed_file_with_nothing_encoded_are_caught(
    direct: bool,
    flips: int,
    hopper: TensorDictBase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Minari file packs with no key (compress refuses it): its values are checked by their
    hashes alone."""
    if direct:
        monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", 0)
    seed = "direct" if direct else "hdf5"
    tally = run_flips("minari-hdf5", "exact", hopper, tmp_path, flips=flips, pack=True, seed=seed)
    _check(tally)
    assert tally["caught"] + tally["harmless"] == flips


def test_a_header_hdf5_would_crash_copying_fails_inflate_with_one_line(
    hopper: TensorDictBase, tmp_path: Path
) -> None:
    """A bit flipped in the first message type of a kept dataset's header (HDF5's oldest
    object header format) makes HDF5 take the dataset for a named datatype, which hashing
    passes over and whose object copy crashed the process: inflate of the packed file finds
    the recorded dataset missing before it copies anything, and says the file is damaged."""
    src = WRITERS["minari-hdf5"](hopper[:600].clone(), tmp_path / "in")
    packed = tmp_path / "small.h5"
    compress(src, packed, pack=True)
    with h5py.File(packed, "r") as f:
        kept = [
            name
            for name in ("episode_3/actions", "episode_6/actions")
            if f[name].chunks is None and f[name].id.get_create_plist().get_nfilters() == 0
        ]
        assert kept, "the test needs a dataset the pack kept as it was"
        address = h5py.h5o.get_info(f[kept[0]].id).addr
    data = bytearray(packed.read_bytes())
    data[address + 17] ^= 0x08  # the high byte of the first message's type
    packed.write_bytes(bytes(data))
    with h5py.File(packed, "r") as f:
        assert isinstance(f[kept[0]], h5py.Datatype)  # what HDF5 now makes of it
    out = tmp_path / "back.hdf5"
    done = subprocess.run(
        [sys.executable, "-m", "obsdelta_cli", "inflate", str(packed), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    says = f"object {kept[0]} is missing"
    assert len(lines) == 1 and says in lines[0] and "damaged" in lines[0], lines
    assert not out.exists()


#: HDF5 inputs, which ``--pack --flat`` takes.
FLAT_KINDS = ["d4rl-hdf5", "robomimic-hdf5", "ted-hdf5", "minari-hdf5"]


@pytest.mark.parametrize("direct", [False, True], ids=["flat", "flat-direct"])
@pytest.mark.parametrize("flips", [12, pytest.param(150, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", marked_h5py_only(FLAT_KINDS))
def test_bit_flips_in_a_flat_packed_file_are_caught(
    kind: str,
    flips: int,
    direct: bool,
    hopper: TensorDictBase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--pack --flat``: a flip in a family dataset, the skeleton (an HDF5 file's bytes read
    from a temporary file) or the manifest is caught or harmless, for verify and inflate."""
    if direct:
        monkeypatch.setattr(hdf5_chunks, "MIN_CHUNK_BYTES", 0)
    seed = f"flat-{'direct' if direct else 'hdf5'}"
    tally = run_flips(kind, "exact", hopper, tmp_path, flips=flips, pack=True, flat=True, seed=seed)
    _check(tally)
    assert tally["caught"] + tally["harmless"] == flips


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("kind", KINDS)
def test_many_bit_flips_are_caught(
    kind: str, codec: str, output: str, hopper: TensorDictBase, tmp_path: Path
) -> None:
    pack = output != "compressed"
    # 12 x 90 = 1,080 flips per kind of output
    tally = run_flips(kind, codec, hopper, tmp_path, flips=90, pack=pack, seed=output)
    _check(tally)


@pytest.mark.parametrize(
    ("kind", "pack", "names"),
    [
        ("ted-hdf5", True, [b"obsdelta_dtype", b"obsdelta"]),
        pytest.param("d4rl-hdf5", True, [b"obsdelta", b"note"], marks=pytest.mark.h5py_only),
        pytest.param("d4rl-hdf5", False, [b"note"], marks=pytest.mark.h5py_only),
        pytest.param("robomimic-hdf5", False, [b"env_args"], marks=pytest.mark.h5py_only),
    ],
)
def test_damaged_headers_are_reported(
    kind: str, pack: bool, names: list[bytes], hopper: TensorDictBase, tmp_path: Path
) -> None:
    """Every byte around the first attributes of objects, flipped in turn: object headers and
    attribute messages that no longer parse are one error, never an exception from HDF5, nor
    a crash of it (a string attribute read as a sequence of another type was a segmentation
    fault as its objects were hashed, and inflate of a packed file copied objects whole before
    checking them)."""
    src = WRITERS[kind](hopper[:600].clone(), tmp_path / "in")
    small = tmp_path / ("small.h5" if pack else f"small{src.suffix}")
    compress(src, small, codec="exact", pack=pack)
    inflate(small, tmp_path / f"ref{src.suffix}")
    reference = _content(tmp_path / f"ref{src.suffix}")
    data = small.read_bytes()
    crashes, silent = [], []
    for name in names:
        at = data.find(name)
        assert at > 0, name
        for offset in range(at - 16, at + len(name) + 8):
            damaged, back = tmp_path / f"d{small.suffix}", tmp_path / f"b{src.suffix}"
            raw = bytearray(data)
            raw[offset] ^= 0xFF
            damaged.write_bytes(bytes(raw))
            for step in ("verify", "inflate"):
                try:
                    verify(damaged) if step == "verify" else inflate(damaged, back)
                except ObsdeltaError:
                    assert not back.exists()
                except Exception as exc:  # a traceback for a user
                    crashes.append(f"{step} @{offset}: {type(exc).__name__}: {exc}")
                else:
                    if step == "inflate":
                        if _content(back) != reference:
                            silent.append(offset)
                        back.unlink()
    assert crashes == [] and silent == [], (crashes, silent)


def _peak_rss_kb(*args: str) -> tuple[int, int]:
    """Exit code and peak RSS (KB) of an obsdelta command run in a fresh process."""
    code = (
        "import resource, subprocess, sys; "
        f"r = subprocess.run([sys.executable, '-m', 'obsdelta_cli', *{list(args)!r}], "
        "capture_output=True); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rc, kb = out.stdout.split()
    return int(rc), int(kb)


@pytest.mark.parametrize("kind", ["ted-memmap", "d4rl-hdf5"])
def test_tampered_file_takes_no_more_memory(
    kind: str, hopper: TensorDictBase, tmp_path: Path
) -> None:
    """A file claiming far more rows than it holds is refused before anything is allocated:
    peak memory stays within the untampered run's plus twice the file's size."""
    src = WRITERS[kind](hopper, tmp_path / "in")
    small = tmp_path / f"small{src.suffix}"
    compress(src, small, codec="fp16", max_abs_error=1e-4)  # exception rows too
    rc, sound = _peak_rss_kb("verify", str(small))
    assert rc == 0
    size_kb = sum(f.stat().st_size for f in _files(small)) // 1024
    tampered = tmp_path / f"tampered{src.suffix}"
    (shutil.copytree if small.is_dir() else shutil.copy)(small, tampered)
    claims = {"rows": 2**40, "exception_rows": 2**33, "exact_rows": 2**40}
    if tampered.is_dir():
        meta = json.loads((tampered / "obsdelta.json").read_text())
        meta["keys"][0].update(claims)
        meta["manifest_hash"] = content_hash(
            {k: v for k, v in meta.items() if k != "manifest_hash"}
        )
        (tampered / "obsdelta.json").write_text(json.dumps(meta))
    else:
        with h5py.File(tampered, "r+") as f:
            meta = json.loads(f.attrs["obsdelta"])
            meta["keys"][0].update(claims)
            body = {k: v for k, v in meta.items() if k != "manifest_hash"}
            meta["manifest_hash"] = content_hash(body)
            f.attrs["obsdelta"] = json.dumps(meta)
    for command in ("verify", "report"):
        rc, peak = _peak_rss_kb(command, str(tampered))
        assert rc == 1
        assert peak <= sound + 2 * size_kb, (command, peak, sound, size_kb)


#: Runs obsdelta's CLI with the time limits on reads run apart at 10 s, so that a hang shows
#: as one error line (or the subprocess timeout) within a test's time.
_CLI_QUICK_LIMITS = (
    "import obsdelta_cli.formats.hdf5_objects as o, obsdelta_cli.formats.hdf5_safety as s, "
    "obsdelta_cli.formats.hdf5_meta as m; "
    "o.SILENCE_SECONDS = s.SILENCE_SECONDS = m.META_SECONDS = 10.0; "
    "from obsdelta_cli.__main__ import main; main()"
)


def _cli(*args: str | Path) -> tuple[int | str, str]:
    """Exit code (``"hang"`` past 90 s, a negative number for a signal) and stderr of the CLI
    in a process of its own: a crash or an endless read of HDF5 shows, not only an exception."""
    argv = [sys.executable, "-c", _CLI_QUICK_LIMITS, *map(str, args)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return "hang", ""
    return done.returncode, done.stderr


#: Every kind compressed and packed, a Minari file, which only ``--pack`` takes, and every
#: HDF5 kind packed ``--flat``.
PAGE_CASES = (
    [(kind, "compressed") for kind in KINDS]
    + [(kind, "packed") for kind in [*KINDS, "minari-hdf5"]]
    + [(kind, "flat") for kind in FLAT_KINDS]
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "output"), PAGE_CASES, ids=[f"{kind}-{output}" for kind, output in PAGE_CASES]
)
def test_zeroed_pages_and_truncations_are_caught(
    kind: str, output: str, hopper: TensorDictBase, tmp_path: Path
) -> None:
    """A zeroed 4 KiB page or a truncation of any file of an output, through the CLI: one error
    line and exit 1, or exactly the original; never a crash, a hang, a traceback or a partial
    output. (A zeroed page of the heap holding variable-length strings made HDF5 loop.)"""
    pack = output != "compressed"
    src = WRITERS[kind](hopper[:600].clone(), tmp_path / "in")
    small = tmp_path / ("small.h5" if pack else f"small{src.suffix}")
    compress(src, small, codec="exact", pack=pack, flat=output == "flat")
    inflate(small, tmp_path / f"ref{src.suffix}")
    reference = _content(tmp_path / f"ref{src.suffix}")
    rng = random.Random(f"pages-{kind}-{'flat' if output == 'flat' else pack}")
    bad = []
    for i in range(12):
        damaged, back = tmp_path / f"d{small.suffix}", tmp_path / f"b{src.suffix}"
        (shutil.copytree if small.is_dir() else shutil.copy)(small, damaged)
        target = rng.choice(_files(damaged))
        size = target.stat().st_size
        page = rng.randrange(max(1, -(-size // 4096)))
        if i % 2 == 0:
            with open(target, "r+b") as f:
                f.seek(page * 4096)
                f.write(bytes(min(4096, size - page * 4096)))
        else:
            os.truncate(target, page * 4096 if page else rng.randrange(size))
        where = f"{'zeroed' if i % 2 == 0 else 'cut at'} {target.name} page {page}"
        verified, _ = _cli("verify", damaged)
        code, stderr = _cli("inflate", damaged, "-o", back)
        for step, rc in (("verify", verified), ("inflate", code)):
            if rc not in (0, 1):
                bad.append(f"{where}: {step} gave {rc}")
        if code == 1:
            lines = stderr.strip().splitlines()
            if len(lines) != 1 or "Traceback" in stderr or back.exists():
                bad.append(f"{where}: inflate said {stderr!r}")
        elif code == 0 and _content(back) != reference:
            bad.append(f"{where}: inflate gave other data" + (", verify passed" * (verified == 0)))
        for p in (damaged, back):
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    assert bad == []


def _twins(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return [n for n in names if n.startswith("obsdelta/layout/")]


@pytest.mark.parametrize("pack", [False, True])
def test_a_changed_twin_of_a_replaced_dataset_is_caught(
    pack: bool, hopper: TensorDictBase, tmp_path: Path
) -> None:
    """``inflate`` recreates each replaced next-observation dataset from its empty twin: a twin
    whose creation properties changed (here its gzip filter dropped, by a flipped bit in its
    header in the fault runs) would give the dataset back uncompressed, values intact."""
    src = WRITERS["robomimic-hdf5"](hopper[:600].clone(), tmp_path / "in")
    small = tmp_path / ("small.h5" if pack else "small.hdf5")
    compress(src, small, codec="fp16", pack=pack)
    with h5py.File(small, "r+") as f:
        name = _twins(f)[0]
        twin = f[name]
        assert twin.compression == "gzip"  # as the input's next observations
        shape, dtype, maxshape, chunks = twin.shape, twin.dtype, twin.maxshape, twin.chunks
        attrs = dict(twin.attrs)
        del f[name]
        plain = f.create_dataset(name, shape=shape, dtype=dtype, maxshape=maxshape, chunks=chunks)
        plain.attrs.update(attrs)
    with pytest.raises(ObsdeltaError, match="obsdelta/layout/"):
        verify(small)
    with pytest.raises(ObsdeltaError, match="obsdelta/layout/"):
        inflate(small, tmp_path / "back.hdf5")
    assert not (tmp_path / "back.hdf5").exists()


def test_damaged_objects_are_reported_before_the_damaged_leaves_they_explain(
    hopper: TensorDictBase, tmp_path: Path
) -> None:
    """Where an HDF5 file's objects and a leaf are both damaged, ``verify`` reports the
    objects, which explain the rest; the leaf's damage alone is reported as the leaf's."""
    src = WRITERS["d4rl-hdf5"](hopper.clone(), tmp_path / "in")
    small = tmp_path / "small.hdf5"
    compress(src, small)
    verify(small)
    with h5py.File(small, "r+") as f:
        f["actions"].attrs["units"] = "changed"  # an object's attributes
        f["observations"][3] += 1  # and a leaf's values
    with pytest.raises(ObsdeltaError) as raised:
        verify(small)
    assert raised.value.key == "@actions", str(raised.value)
    with h5py.File(small, "r+") as f:
        del f["actions"].attrs["units"]  # the leaf's damage alone
    with pytest.raises(ObsdeltaError) as raised:
        verify(small)
    assert raised.value.key == "observations", str(raised.value)
