"""Image datasets in packed files: what storing frames as themselves (every reader decodes them)
costs or gains against the frame deltas obsdelta 0.2 stored under the frames' own names.

    python benchmarks/images.py [--out benchmarks/out] [--demos 50]

For every sample of ``sample_data/``, a robomimic file with two 84x84 cameras
(``tests/realistic.py``'s ``write_robomimic_real``) and Pong's frames made to drift a step at a
time (``drifting_frames``): the input's bytes, ``zstd -3`` of them (a folder as a tar), the
packed file's size as 0.2 packed it (frames offered the frame-delta filter) and as packed now,
and the bytes of its uint8 image datasets each way. Then the filters measured for the frames
of the last two inputs: zstd levels, bzip2 and, where ``blosc2`` is importable, Blosc2 chunks
with its DELTA / BYTEDELTA filters (each checked to read back exactly through h5py and
hdf5plugin).
"""

from __future__ import annotations

import argparse
import importlib
import io
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from obsdelta_cli import compress  # noqa: E402
from obsdelta_cli.filters import chunk_rows, frame_delta  # noqa: E402
from tests import realistic as R  # noqa: E402
from tests.conftest import load_sample  # noqa: E402
from tests.writers import write_memmap  # noqa: E402

SAMPLES = ROOT / "sample_data"


def zstd3_of(path: Path) -> int:
    """``zstd -3`` of a file, or of a folder as a tar."""
    if path.is_dir():
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(path, arcname=path.name)
        raw = buffer.getvalue()
    else:
        raw = path.read_bytes()
    return len(zstandard.ZstdCompressor(level=3).compress(raw))


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def image_bytes(packed: Path) -> int:
    """Stored bytes of the packed file's uint8 datasets of three or more dimensions."""
    total = 0

    def visit(name: str, obj: Any) -> None:
        nonlocal total
        if isinstance(obj, h5py.Dataset) and obj.dtype == np.uint8 and obj.ndim >= 3:
            total += obj.id.get_storage_size()

    with h5py.File(packed, "r") as f:
        f.visititems(visit)
    return total


def pack_as_0_2(src: Path, out: Path) -> None:
    """``compress --pack`` with frames offered the frame-delta filter, as 0.2 offered it."""
    module = importlib.import_module("obsdelta_cli.filters")
    real = module.candidates
    module.candidates = R.offering_frame_deltas(real)
    try:
        compress(src, out, pack=True)
    finally:
        module.candidates = real


def inputs(tmp: Path, demos: int) -> Iterator[tuple[str, Path]]:
    for path in sorted(SAMPLES.iterdir()):
        if path.suffix in (".pt", ".hdf5") or path.is_dir():
            yield path.name, path
    robomimic = tmp / "robomimic_84.hdf5"
    yield (
        f"robomimic, {demos} demos, 2 cameras 84x84",
        R.write_robomimic_real(robomimic, demos=demos, image=84),
    )
    drifting = R.drifting_frames(load_sample("pong_pixels.pt"), 15)
    yield "Pong frames drifting a step at a time (3,000)", write_memmap(drifting, tmp / "drift")


def chunks_of(arrays: list[np.ndarray]) -> Iterator[np.ndarray]:
    """The chunks a packed file stores of each array (edge chunks padded with zeros)."""
    for a in arrays:
        per = chunk_rows(a.shape, 1)
        for i in range(0, len(a), per):
            c = np.zeros((per, *a.shape[1:]), np.uint8)
            c[: min(per, len(a) - i)] = a[i : i + per]
            yield c


def zstd_at(level: int, delta: bool = False) -> Callable[[np.ndarray], bytes]:
    z = zstandard.ZstdCompressor(level=level)
    return lambda c: z.compress((frame_delta(c) if delta else c).tobytes())


def blosc2_filters() -> dict[str, Callable[[np.ndarray], bytes]]:
    """Blosc2 chunks (b2nd frames, as hdf5plugin's Blosc2 filter stores them), if blosc2 is
    importable: zstd level 5, blocks of one frame or the whole chunk."""
    try:
        import blosc2
    except ImportError:
        return {}
    f = blosc2.Filter

    def b2(filters: list[Any], frame_blocks: bool) -> Callable[[np.ndarray], bytes]:
        def enc(c: np.ndarray) -> bytes:
            cp = blosc2.CParams(
                codec=blosc2.Codec.ZSTD,
                clevel=5,
                filters=filters,
                filters_meta=[0] * len(filters),
                nthreads=1,
                splitmode=blosc2.SplitMode.NEVER_SPLIT,
            )
            blocks = (1, *c.shape[1:]) if frame_blocks else c.shape
            return bytes(blosc2.asarray(c, chunks=c.shape, blocks=blocks, cparams=cp).to_cframe())

        return enc

    return {
        "blosc2 zstd-5, DELTA, a block per frame": b2([f.DELTA], True),
        "blosc2 zstd-5, BYTEDELTA, a block per frame": b2([f.SHUFFLE, f.BYTEDELTA], True),
        "blosc2 zstd-5, DELTA, one block": b2([f.DELTA], False),
        "blosc2 zstd-5, no filter, one block": b2([f.NOFILTER], False),
    }


def reads_back(encode: Callable[[np.ndarray], bytes], kwargs: dict, chunk: np.ndarray) -> bool:
    """Whether a chunk ``encode`` wrote reads back exactly through h5py and hdf5plugin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.h5"
        with h5py.File(path, "w") as f:
            ds = f.create_dataset("x", chunk.shape, np.uint8, chunks=chunk.shape, **kwargs)
            ds.id.write_direct_chunk((0,) * chunk.ndim, encode(chunk))
        with h5py.File(path, "r") as f:
            return bool(np.array_equal(f["x"][()], chunk))


def frames_of(path: Path) -> list[np.ndarray]:
    """The uint8 image datasets of an HDF5 input, or the pixels of a memmap folder."""
    if path.is_dir():
        return [np.fromfile(path / "pixels.memmap", np.uint8).reshape(-1, 1, 53, 40)]
    out: list[np.ndarray] = []

    def visit(name: str, obj: Any) -> None:
        # next_obs/ left out: compress drops it (next_obs[t] == obs[t + 1]).
        frames = isinstance(obj, h5py.Dataset) and obj.dtype == np.uint8 and obj.ndim >= 3
        if frames and "/next_obs/" not in name:
            out.append(obj[()])

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def filter_table(name: str, path: Path) -> None:
    arrays = frames_of(path)
    raw = sum(a.nbytes for a in arrays)
    print(f"\n{name}: frames {raw:,} B")
    print("| filter | bytes | x | h5py + hdf5plugin reads it |")
    print("|---|---:|---:|---|")
    zstd_kw, b2_kw = hdf5plugin.Zstd(), hdf5plugin.Blosc2()
    rows: list[tuple[str, Callable[[np.ndarray], bytes], dict | None]] = [
        ("frame deltas, zstd-3 (0.2)", zstd_at(3, True), None),
        ("zstd-3 (now)", zstd_at(3), zstd_kw),
        ("zstd-9", zstd_at(9), zstd_kw),
        ("zstd-19", zstd_at(19), zstd_kw),
        *((k, v, b2_kw) for k, v in blosc2_filters().items()),
    ]
    first = next(chunks_of(arrays))
    for label, encode, kwargs in rows:
        stored = sum(len(encode(c)) for c in chunks_of(arrays))
        ok = "no (differences)" if kwargs is None else str(reads_back(encode, kwargs, first))
        print(f"| {label} | {stored:,} | {raw / stored:.1f} | {ok} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out")
    parser.add_argument("--demos", type=int, default=50)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out) as tmp_name:
        tmp = Path(tmp_name)
        print("| input | bytes | zstd -3 | packed 0.2 | packed now | images 0.2 | images now |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        measured = []
        for i, (name, src) in enumerate(inputs(tmp, args.demos)):
            before, after = tmp / f"b{i}.h5", tmp / f"a{i}.h5"
            pack_as_0_2(src, before)
            compress(src, after, pack=True)
            print(
                f"| {name} | {size_of(src):,} | {zstd3_of(src):,} | {size_of(before):,} | "
                f"{size_of(after):,} | {image_bytes(before):,} | {image_bytes(after):,} |"
            )
            measured.append((name, src))
        for name, src in measured[-2:]:
            filter_table(name, src)


if __name__ == "__main__":
    main()
