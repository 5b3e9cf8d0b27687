"""How small a packed file of many short episodes can be while its library still reads it.

    python benchmarks/pack_floor.py [--out benchmarks/out] [--demos 1000] [--episodes 2000]
    python benchmarks/pack_floor.py --samples

robomimic's ``SequenceDataset`` and ``minari.load_dataset`` open each episode's datasets at
their paths (``data/demo_12/obs/object``), so a packed file they read holds every group and
dataset of the file as an HDF5 object, each with its own object header, however its values are
stored. For a robomimic low-dim file (``tests/realistic.py``'s ``write_robomimic_real``,
20-40 steps a demo, no cameras), a robomimic file with two 16x16 camera keys and a Minari file
(minari's ``DataCollector``, Hopper-v5 episodes), this prints, in bytes:

- the input and ``zstd -3 -T1`` of it;
- ``compress --pack`` (each dataset at its path) and ``compress --pack --flat`` (each family
  of datasets stored as one, which the libraries cannot read);
- the *floor*: the headers alone, an HDF5 file in the packed files' format version (v1.10 object
  headers of the minimum size, compact groups) holding every group and dataset of what
  ``--pack`` stores at their paths (the compressed file's: robomimic's ``next_obs`` removed),
  with their attributes, shapes and types and no values, plus the stored bytes of the flat
  file's families (every value, compressed together). No layout with every dataset at its path
  stores less, unless its values compress better than the flat families do.
- the *tightest* floor: the same headers copied by HDF5's object copy (which sizes every
  object header to its messages) into a file that shares its datatype, dataspace, fill value,
  filter and attribute messages (HDF5's shared object header messages), plus the families at
  the smaller of their stored bytes and zstd-19 of their byte-shuffled values: what no file the
  libraries read can go below, whatever its writer and filters.
- the floor *dataset by dataset*: a file laid out as ``--pack`` lays it out (each dataset's
  values in its own chunks, a dataset whose columns repeat another's virtual, its other
  columns kept apart), its headers the tightest (its objects outside obsdelta's group are
  the compressed file's, measured above), each dataset's values (and kept columns) at the
  smaller of their stored bytes and zstd-3 or zstd-19 of them alone, byte-shuffled or not,
  and nothing for the virtual datasets' mappings, obsdelta's manifest or its exception
  rows: what no file that keeps its values episode by episode goes below with zstd, the
  filter packed files use (each HDF5 chunk is compressed alone).

With ``--samples``, the same for every file of ``sample_data/`` (a packed file of each holds
its datasets at their paths, as ``PersistentTensorDict.from_h5`` reads them): the tightest
headers of the datasets ``--pack`` stores outside obsdelta's group, plus each one's values at
the smallest of its stored bytes, zstd-3 and zstd-19 (byte-shuffled or not), plus what
inflating the file back byte for byte needs beyond them: for a ``.pt``, the bytes of the
original archive that are not its tensors' (zip records and pickle), at zstd-19; and that
floor with the least manifest such a file would carry: the packed file's manifest without its
``pack`` entry (what a file that inflates straight from its datasets still records: format,
codecs, measured errors, hashes, a ``.pt``'s holes and records), compact JSON at zstd-19.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401  (the families' filters)
import numpy as np
from images import size_of, zstd3_of
from measure import remove
from objects import build
from run import PYTHON

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_minari(root: Path, episodes: int) -> Path:
    """A Minari dataset of at least ``episodes`` episodes, built unless cached; its
    ``main_data.hdf5``."""
    from tests.realistic import write_minari_dataset

    home = root / f"minari-{episodes}"
    found = list(home.rglob("main_data.hdf5"))
    if found and _episodes(found[0]) >= episodes:
        return found[0]
    remove(home)
    # The collector's Hopper-v5 episodes last 47 steps on average: rows for the episodes.
    main = write_minari_dataset(episodes * 60, home, "hopper/floor-v0")
    assert _episodes(main) >= episodes, f"{_episodes(main)} episodes"
    return main


def _episodes(main: Path) -> int:
    with h5py.File(main, "r") as f:
        return len(f)


def floor_bytes(src: Path, dst: Path) -> int:
    """Bytes of an HDF5 file (v1.10 headers of the minimum size, as packed files are written)
    holding every group and dataset of ``src`` but obsdelta's own, with their attributes, and
    no values."""
    from obsdelta_cli.filters import minimal_headers

    with h5py.File(src, "r") as s, h5py.File(dst, "w", libver=("v110", "v110")) as d:
        minimal_headers(d)

        def visit(name: str, obj: h5py.HLObject) -> None:
            if name == "obsdelta" or name.startswith("obsdelta/"):
                return
            if isinstance(obj, h5py.Dataset):
                made: h5py.HLObject = d.create_dataset(
                    name, shape=obj.shape, dtype=obj.dtype, track_times=False
                )
            else:
                made = d.require_group(name)
            for key, value in obj.attrs.items():
                made.attrs[key] = value

        for key, value in s.attrs.items():
            if key != "obsdelta":
                d.attrs[key] = value
        s.visititems(visit)
    return dst.stat().st_size


#: HDF5's kinds of shareable object header messages (``H5O_SHMESG_ALL_FLAG``): dataspace,
#: datatype, fill value, filter pipeline, attribute.
SHARED_MESSAGES = 0x02 | 0x08 | 0x10 | 0x20 | 0x40


def tightest_bytes(src: Path, dst: Path) -> int:
    """Bytes of ``src`` copied object by object by HDF5 (every object header sized to its
    messages, v1.10 headers), into a file sharing its repeated header messages or not,
    whichever is smaller (the table of shared messages costs more than it saves in a small
    file)."""
    return min(_copied_bytes(src, dst, shared) for shared in (False, True))


def _copied_bytes(src: Path, dst: Path, shared: bool) -> int:
    from obsdelta_cli.filters import hdf5_library, minimal_headers

    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    if shared:
        lib = hdf5_library()
        lib.H5Pset_shared_mesg_nindexes.argtypes = [ctypes.c_int64, ctypes.c_uint]
        lib.H5Pset_shared_mesg_index.argtypes = [ctypes.c_int64] + [ctypes.c_uint] * 3
        if lib.H5Pset_shared_mesg_nindexes(fcpl.id, 1) < 0:
            raise SystemExit("HDF5 refused shared object header messages")
        if lib.H5Pset_shared_mesg_index(fcpl.id, 0, SHARED_MESSAGES, 0) < 0:
            raise SystemExit("HDF5 refused shared object header messages")
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_V110)
    remove(dst)
    fid = h5py.h5f.create(str(dst).encode(), h5py.h5f.ACC_TRUNC, fapl=fapl, fcpl=fcpl)
    with h5py.File(src, "r") as s, h5py.File(fid) as d:
        minimal_headers(d)
        for key, value in s.attrs.items():
            d.attrs[key] = value
        for name in s:
            s.copy(name, d, name=name)
    return dst.stat().st_size


def best_zstd(values: np.ndarray) -> int:
    """Bytes of ``values`` at the smallest of zstd-3 and zstd-19, byte-shuffled or not."""
    import zstandard

    raw = np.ascontiguousarray(values)
    flat = raw.view(np.uint8).reshape(-1, raw.dtype.itemsize) if raw.size else raw.view(np.uint8)
    forms = [raw.tobytes()]
    if raw.dtype.itemsize > 1 and raw.size:
        forms.append(np.ascontiguousarray(flat.T).tobytes())
    return min(
        len(zstandard.ZstdCompressor(level=level).compress(form))
        for form in forms
        for level in (3, 19)
    )


def stored_bytes(path: Path, under: str, best: bool = False) -> int:
    """Bytes the datasets under ``under`` store (their chunks, as written), or with ``best``,
    each the smaller of that and :func:`best_zstd` of its values. Virtual datasets (whose
    values are another's, counted there) and obsdelta's group are left out."""
    total = 0
    with h5py.File(path, "r") as f:

        def visit(name: str, obj: h5py.HLObject) -> None:
            nonlocal total
            if not isinstance(obj, h5py.Dataset) or obj.is_virtual or name.startswith("obsdelta/"):
                return
            stored = obj.id.get_storage_size()
            total += min(stored, best_zstd(obj[()])) if best else stored

        f[under].visititems(visit)
    return total


#: Where a packed file keeps the columns of its virtual datasets that repeat no other's.
COLUMNS = "obsdelta/pack/columns"


def obsdelta(*args: str) -> None:
    run = subprocess.run([PYTHON, "-m", "obsdelta_cli", *args, "-q"], capture_output=True)
    if run.returncode:
        raise SystemExit(f"obsdelta {' '.join(args)}: {run.stderr.decode().strip()}")


def measure(src: Path, scratch: Path, compressible: bool) -> dict[str, int]:
    packed, flat, small, skeleton = (
        scratch / n for n in ("packed.h5", "flat.h5", "small.hdf5", "skeleton.h5")
    )
    zstd = subprocess.run(["zstd", "-3", "-T1", "-q", "-c", str(src)], capture_output=True)
    obsdelta("compress", str(src), "-o", str(packed), "--pack", "-f")
    obsdelta("compress", str(src), "-o", str(flat), "--pack", "--flat", "-f")
    if compressible:  # what --pack stores at the paths: the compressed file's objects
        obsdelta("compress", str(src), "-o", str(small), "-f")
    headers = floor_bytes(small if compressible else src, skeleton)
    tight = tightest_bytes(skeleton, scratch / "tight.h5")
    families = stored_bytes(flat, "obsdelta/pack/flat")
    best = stored_bytes(flat, "obsdelta/pack/flat", best=True)
    alone = stored_bytes(packed, "/", best=True)
    with h5py.File(packed, "r") as f:
        kept = COLUMNS in f
    alone += stored_bytes(packed, COLUMNS, best=True) if kept else 0
    sizes = {
        "input": src.stat().st_size,
        "zstd -3": len(zstd.stdout),
        "--pack": packed.stat().st_size,
        "--pack --flat": flat.stat().st_size,
        "headers": headers,
        "families": families,
        "floor": headers + families,
        "tightest headers": tight,
        "best families": best,
        "tightest floor": tight + best,
        "dataset by dataset": alone,
        "floor, dataset by dataset": tight + alone,
    }
    for path in (packed, flat, small, skeleton, scratch / "tight.h5"):
        remove(path)
    return sizes


def archive_rest(path: Path) -> bytes:
    """The bytes of a ``torch.save`` archive that are not its tensors' (zip records, the
    pickle, version records): what inflating it byte for byte needs beyond its tensors."""
    raw = path.read_bytes()
    kept, at = [], 0
    with zipfile.ZipFile(path) as z:
        for info in sorted(z.infolist(), key=lambda i: i.header_offset):
            if "/data/" not in info.filename:
                continue
            head = info.header_offset
            name_len, extra_len = np.frombuffer(raw[head + 26 : head + 30], dtype="<u2")
            start = head + 30 + int(name_len) + int(extra_len)
            kept.append(raw[at:start])
            at = start + info.file_size
    kept.append(raw[at:])
    return b"".join(kept)


def sample_floor(src: Path, scratch: Path) -> dict[str, int]:
    """A sample's bytes, ``zstd -3`` of it, ``--pack`` of it and its tightest floor."""
    import zstandard

    packed, skeleton = scratch / "packed.h5", scratch / "skeleton.h5"
    obsdelta("compress", str(src), "-o", str(packed), "--pack", "-f")
    floor_bytes(packed, skeleton)
    values = stored_bytes(packed, "/", best=True)
    rest = archive_rest(src) if src.suffix == ".pt" else b""
    sizes = {
        "input": size_of(src),
        "zstd -3": zstd3_of(src),
        "--pack": packed.stat().st_size,
        "tightest headers": tightest_bytes(skeleton, scratch / "tight.h5"),
        "values": values,
        "archive rest": len(zstandard.ZstdCompressor(level=19).compress(rest)) if rest else 0,
    }
    sizes["tightest floor"] = sizes["tightest headers"] + sizes["values"] + sizes["archive rest"]
    sizes["manifest"] = least_manifest(packed)
    sizes["floor with manifest"] = sizes["tightest floor"] + sizes["manifest"]
    for path in (packed, skeleton, scratch / "tight.h5"):
        remove(path)
    return sizes


def least_manifest(packed: Path) -> int:
    """Bytes of a packed file's manifest without its ``pack`` entry (what a file that inflates
    straight from its datasets, with no inner container to unpack, would still record: format,
    codecs, measured errors, hashes, a ``.pt``'s holes and records), compact JSON at zstd-19."""
    import zstandard

    from obsdelta_cli.formats.hdf5_meta import read_meta

    with h5py.File(packed, "r") as f:
        meta = read_meta(f, packed)
    assert meta is not None, packed
    text = json.dumps({k: v for k, v in meta.items() if k != "pack"}, separators=(",", ":"))
    return len(zstandard.ZstdCompressor(level=19).compress(text.encode()))


def table(
    rows: list[tuple[str, dict[str, int]]], cols: list[str], floor: str = "tightest floor"
) -> None:
    print("\n| file | " + " | ".join(cols) + f" | {floor} / zstd -3 |")
    print("|---|" + "---:|" * (len(cols) + 1))
    for name, sizes in rows:
        ratio = sizes[floor] / sizes["zstd -3"]
        print(f"| {name} | " + " | ".join(f"{sizes[c]:,}" for c in cols) + f" | {ratio:.2f}x |")


def samples(scratch: Path) -> None:
    rows = []
    for src in sorted((ROOT / "sample_data").iterdir()):
        if src.suffix in (".md", ".py"):
            continue
        sizes = sample_floor(src, scratch)
        print(src.name, sizes, flush=True)
        rows.append((src.name, sizes))
    cols = ["input", "zstd -3", "--pack", "tightest headers", "values", "archive rest"]
    table(rows, [*cols, "tightest floor"])
    least = ["zstd -3", "--pack", "tightest floor", "manifest"]
    table(rows, [*least, "floor with manifest"], "floor with manifest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("out"))
    parser.add_argument("--demos", type=int, default=1000)
    parser.add_argument("--camera-demos", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--samples", action="store_true", help="the files of sample_data/ instead")
    args = parser.parse_args()
    root, scratch = args.out.resolve() / "inputs", args.out.resolve() / "floor"
    remove(scratch)
    scratch.mkdir(parents=True)
    if args.samples:
        try:
            samples(scratch)
        finally:
            remove(scratch)
        return
    minari = build_minari(root, args.episodes)
    inputs = {
        f"robomimic low-dim, {args.demos:,} demos": (
            build(root, args.demos, cameras=False),
            True,
        ),
        f"robomimic, {args.camera_demos:,} demos, 2 cameras 16x16": (
            build(root, args.camera_demos, cameras=True),
            True,
        ),
        f"Minari, {_episodes(minari):,} episodes": (minari, False),
    }
    rows = []
    try:
        for name, (src, compressible) in inputs.items():
            sizes = measure(src, scratch, compressible)
            print(name, sizes, flush=True)
            rows.append((name, sizes))
    finally:
        remove(scratch)
    cols = ["input", "zstd -3", "--pack", "--pack --flat", "headers", "families", "floor"]
    table(rows, [*cols, "tightest headers", "best families", "tightest floor"])
    alone = ["zstd -3", "--pack", "tightest headers", "dataset by dataset"]
    table(rows, [*alone, "floor, dataset by dataset"], "floor, dataset by dataset")


if __name__ == "__main__":
    main()
