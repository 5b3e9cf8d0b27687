"""Benchmark inputs: the real Hopper rollout of ``sample_data/hopper_ted``, tiled to a size.

Row ``i`` of an input is row ``i % T`` of the rollout (T = 3000), so the data are real simulator
states, not noise. Each tile gets its own trajectory ids, and the last step of each tile is
marked truncated (a time-limit end), because the next tile starts again from the rollout's first
state. Inputs are written block by block into datasets created at full size, so memory stays
bounded whatever the size, and are cached between runs.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch
from measure import dataset_bytes, remove
from tensordict import TensorDict, TensorDictBase

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data" / "hopper_ted"
RECIPE = 1  # bump when the way inputs are built changes: cached inputs are then rebuilt
BLOCK_ROWS = 1 << 16  # rows generated and written at a time; also the HDF5 chunk length
GB = 10**9
TED, D4RL = "ted", "d4rl"
LAYOUTS = (TED, D4RL)
SEAM_KEYS = (("next", "truncated"), ("next", "done"))
D4RL_KEYS: dict[str, tuple[str, ...]] = {
    "observations": ("observation",),
    "next_observations": ("next", "observation"),
    "actions": ("action",),
    "rewards": ("next", "reward"),
    "terminals": ("next", "terminated"),
    "timeouts": ("next", "truncated"),
}

BlockWriter = Callable[[int, int, TensorDictBase], None]


@dataclass(frozen=True)
class BenchInput:
    """One input dataset on disk."""

    layout: str
    size_gb: float
    path: Path
    rows: int
    bytes: int
    build_seconds: float
    cached: bool

    @property
    def label(self) -> str:
        return f"{self.layout} {self.size_gb:g} GB"


def load_sample() -> TensorDictBase:
    """The Hopper rollout, in memory."""
    return TensorDict.load_memmap(SAMPLE).to_tensordict()


def tile_block(sample: TensorDictBase, start: int, stop: int) -> TensorDictBase:
    """Rows ``start:stop`` of the sample tiled end to end."""
    length = sample.shape[0]
    rows = torch.arange(start, stop)
    block = sample[rows % length]
    traj_stride = int(sample["collector", "traj_ids"].max()) + 1
    block["collector", "traj_ids"] += (rows // length) * traj_stride
    seam = (rows % length == length - 1).unsqueeze(-1)
    for key in SEAM_KEYS:
        block.get(key).logical_or_(seam)
    return block


def d4rl_columns(td: TensorDictBase) -> dict[str, np.ndarray]:
    """D4RL's flat datasets for TED rows; per-step scalars become 1-D."""
    columns = {}
    for name, key in D4RL_KEYS.items():
        array = td.get(key).numpy()
        columns[name] = array[:, 0] if array.ndim == 2 and array.shape[1] == 1 else array
    return columns


def row_bytes(sample: TensorDictBase, layout: str) -> float:
    """Bytes one row takes in ``layout``."""
    if layout == TED:
        leaves = sample.values(include_nested=True, leaves_only=True)
        total = sum(leaf.numel() * leaf.element_size() for leaf in leaves)
    else:
        total = sum(array.nbytes for array in d4rl_columns(sample).values())
    return total / sample.shape[0]


def rows_for(sample: TensorDictBase, layout: str, size_gb: float) -> int:
    """Whole tiles of the sample, enough to reach ``size_gb`` on disk."""
    tile_bytes = row_bytes(sample, layout) * sample.shape[0]
    return math.ceil(size_gb * GB / tile_bytes) * sample.shape[0]


def fill(sample: TensorDictBase, rows: int, write: BlockWriter) -> None:
    """Hand ``write`` every block of the tiled input, in order."""
    for start in range(0, rows, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, rows)
        write(start, stop, tile_block(sample, start, stop))


def write_ted(sample: TensorDictBase, path: Path, rows: int) -> None:
    """A ``td.memmap(path)`` folder: full-size memmaps created empty, then filled."""
    out = sample[:1].expand(rows).memmap_like(path)

    def write(start: int, stop: int, block: TensorDictBase) -> None:
        out[start:stop] = block

    fill(sample, rows, write)


def write_d4rl(sample: TensorDictBase, path: Path, rows: int) -> None:
    """A D4RL-layout HDF5 file: chunked datasets without compression."""
    with h5py.File(path, "w") as handle:
        datasets = {
            name: handle.create_dataset(
                name,
                shape=(rows, *array.shape[1:]),
                dtype=array.dtype,
                chunks=(min(BLOCK_ROWS, rows), *array.shape[1:]),
            )
            for name, array in d4rl_columns(sample[:1]).items()
        }

        def write(start: int, stop: int, block: TensorDictBase) -> None:
            for name, array in d4rl_columns(block).items():
                datasets[name][start:stop] = array

        fill(sample, rows, write)


WRITERS: dict[str, Callable[[TensorDictBase, Path, int], None]] = {
    TED: write_ted,
    D4RL: write_d4rl,
}


def input_path(root: Path, layout: str, size_gb: float) -> Path:
    suffix = ".hdf5" if layout == D4RL else ""
    return root / f"{layout}-{size_gb:g}GB{suffix}"


def read_marker(marker: Path) -> dict[str, float]:
    try:
        return dict(json.loads(marker.read_text()))
    except (OSError, ValueError):
        return {}


def ensure_input(root: Path, layout: str, size_gb: float, sample: TensorDictBase) -> BenchInput:
    """The input for ``layout`` and ``size_gb`` under ``root``, built unless cached.

    A sibling ``<name>.json`` marks a complete input; it is written last.
    """
    path = input_path(root, layout, size_gb)
    marker = path.with_name(path.name + ".json")
    rows = rows_for(sample, layout, size_gb)
    recorded = read_marker(marker)
    cached = recorded.get("recipe") == RECIPE and recorded.get("rows") == rows and path.exists()
    if not cached:
        remove(marker)
        remove(path)
        root.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        WRITERS[layout](sample, path, rows)
        os.sync()
        recorded = {"recipe": RECIPE, "rows": rows, "build_seconds": time.perf_counter() - start}
        marker.write_text(json.dumps(recorded))
    return BenchInput(
        layout=layout,
        size_gb=size_gb,
        path=path,
        rows=rows,
        bytes=dataset_bytes(path),
        build_seconds=float(recorded["build_seconds"]),
        cached=cached,
    )


def iter_inputs(root: Path, sizes: list[float]) -> Iterator[BenchInput]:
    """Every (size, layout) input, built or taken from the cache."""
    sample = load_sample()
    for size_gb in sizes:
        for layout in LAYOUTS:
            yield ensure_input(root, layout, size_gb, sample)
