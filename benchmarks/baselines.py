"""Baselines implemented in Python, each run in its own process by ``run.py``.

    python benchmarks/baselines.py h5gzip IN OUT [--level 1]
    python benchmarks/baselines.py zstd IN OUT [--level 1]
    python benchmarks/baselines.py torchrl PACKED ORIGINAL

Each prints one JSON object on stdout. Heavy modules are imported by the baseline that needs
them, so that a baseline's time and memory do not include the others' imports.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

OBS_KEY = "observation"
COPY_ROWS = 1 << 16
D4RL_DELTA = "obsdelta/delta/next_observations"  # where obsdelta stores the delta


def copy_rows(src: Any, target: Any, name: str, level: int) -> None:
    """One dataset rewritten with gzip, in its own chunk shape, by blocks of rows."""
    out = target.create_dataset(
        name,
        shape=src.shape,
        dtype=src.dtype,
        chunks=src.chunks or True,
        compression="gzip",
        compression_opts=level,
    )
    out.attrs.update(src.attrs)
    for start in range(0, src.shape[0], COPY_ROWS):
        out[start : start + COPY_ROWS] = src[start : start + COPY_ROWS]


def h5_gzip(src: Path, dst: Path, level: int) -> dict[str, Any]:
    """Rewrite an HDF5 file with every dataset gzip-compressed, streaming by blocks of rows."""
    import h5py

    with h5py.File(src, "r") as source, h5py.File(dst, "w") as target:

        def copy(name: str, obj: h5py.Group | h5py.Dataset) -> None:
            if isinstance(obj, h5py.Group):
                target.require_group(name).attrs.update(obj.attrs)
            elif not obj.shape:  # a scalar: no chunks, hence no filter
                target.create_dataset(name, data=obj[()]).attrs.update(obj.attrs)
            else:
                copy_rows(obj, target, name, level)

        target.attrs.update(source.attrs)
        source.visititems(copy)
    return {"level": level}


def zstd_python(src: Path, dst: Path, level: int) -> dict[str, Any]:
    """zstd through the ``zstandard`` module, for when the ``zstd`` program is missing.

    A folder is streamed as a tar archive, as ``tar -cf - DIR | zstd`` would.
    """
    import zstandard

    compressor = zstandard.ZstdCompressor(level=level)
    with dst.open("wb") as raw:
        if src.is_file():
            with src.open("rb") as source:
                compressor.copy_stream(source, raw)
        else:
            with (
                compressor.stream_writer(raw) as writer,
                tarfile.open(fileobj=writer, mode="w|") as archive,
            ):
                archive.add(src, arcname=src.name)
    return {"level": level}


def load_ted(path: Path) -> Any:
    """A TED memmap folder as an in-memory TensorDict."""
    from tensordict import TensorDict

    return TensorDict.load_memmap(path).to_tensordict()


def load_d4rl(path: Path, compressed: bool) -> Any:
    """A D4RL file as a TED TensorDict, with the delta leaf TorchRL reads if ``compressed``."""
    import h5py
    import torch
    from tensordict import TensorDict

    with h5py.File(path, "r") as handle:
        obs = torch.from_numpy(handle["observations"][()])
        nxt = torch.from_numpy(handle[D4RL_DELTA if compressed else "next_observations"][()])
    nested = {"delta": {OBS_KEY: nxt}} if compressed else {OBS_KEY: nxt}
    return TensorDict({OBS_KEY: obs, "next": nested}, batch_size=[obs.shape[0]])


def load(path: Path, compressed: bool) -> Any:
    """An input (file: D4RL, folder: TED) in memory."""
    return load_d4rl(path, compressed) if path.is_file() else load_ted(path)


def torchrl_forward(packed: Path, original: Path) -> dict[str, Any]:
    """TorchRL's ``NextObservationDelta`` forward over every row of ``PACKED``.

    ``PACKED`` is the output of ``obsdelta compress --codec fp16`` of ``ORIGINAL``.

    Loading is not timed; only the forward that rebuilds ``("next", "observation")``. The error
    against the original input is measured afterwards.
    """
    from torchrl.envs.transforms import NextObservationDelta

    data = load(packed, compressed=True)
    transform = NextObservationDelta(in_keys=[OBS_KEY])
    start = time.perf_counter()
    rebuilt = transform(data)["next", OBS_KEY]
    seconds = time.perf_counter() - start
    truth = load(original, compressed=False)["next", OBS_KEY]
    return {
        "forward_seconds": seconds,
        "rows": rebuilt.shape[0],
        "rebuilt_bytes": rebuilt.numel() * rebuilt.element_size(),
        "max_abs_error": float((rebuilt.double() - truth.double()).abs().max()),
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="baseline", required=True)
    for name in ("h5gzip", "zstd"):
        sub = commands.add_parser(name)
        sub.add_argument("src", type=Path)
        sub.add_argument("dst", type=Path)
        sub.add_argument("--level", type=int, default=1)
    sub = commands.add_parser("torchrl")
    sub.add_argument("packed", type=Path)
    sub.add_argument("original", type=Path)
    return parser.parse_args(argv)


COMPRESSORS: dict[str, Callable[[Path, Path, int], dict[str, Any]]] = {
    "h5gzip": h5_gzip,
    "zstd": zstd_python,
}


def main(argv: list[str]) -> None:
    args = parse(argv)
    if args.baseline == "torchrl":
        result = torchrl_forward(args.packed, args.original)
    else:
        result = COMPRESSORS[args.baseline](args.src, args.dst, args.level)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
