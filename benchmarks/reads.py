"""Training reads: random batches from a compressed dataset vs the same rows of the plain one.

    python benchmarks/reads.py ted|d4rl PLAIN COMPRESSED [--batches N] [--bc-steps N]

Run by ``run.py`` in its own process, with both datasets already in the page cache (warm).
Prints one JSON object:

- ``reads``: rows per second of ``--batches`` random batches of 256 rows (indices drawn once
  with ``torch.randint``, the same for both sides), read with
  ``obsdelta_cli.open_dataset(COMPRESSED)[idx]`` (every key, next observations rebuilt) and
  with the plain reader: ``TensorDict.load_memmap(PLAIN)[idx]`` for a TED memmap folder, or
  ``f[name][np.unique(idx)]`` for each of the six D4RL datasets (h5py needs increasing indices
  without repeats: the sorted, de-duplicated batch).
- ``storage``: the same batches through ``ObsdeltaStorage(COMPRESSED).get(idx)``, what a
  TorchRL replay buffer's ``sample`` calls (when torchrl is installed).
- The readers take turns, ``--read-block`` batches each, so that a drift of the machine's speed
  falls on all of them alike.
- Reads of a compressed file are checked: each block of a leaf the first time the process
  reads it (see ``obsdelta_cli.blocks``). The figures above are of warm checks: each reader
  reads the same batches once, untimed, before they are timed, so every block it serves was
  checked before. ``checked_epochs_seconds`` (``open_dataset``) and
  ``storage_epochs_seconds``: seconds of one epoch (every row once, in random batches of 256,
  up to ``EPOCH_BATCHES`` batches) through a reader opened for it, whose first read of each
  block checks it, then of the same epoch again through the same reader;
  ``plain_epoch_seconds``: the epoch through the plain reader. ``whole_seconds``: seconds of
  ``data[0:len(data)]`` through a new ``open_dataset`` (every block checked), then again.
- ``bc``: seconds of a behaviour-cloning loop (MLP 11-256-256-3, Adam, mean squared error on
  the action, batches of 256, ``--bc-steps`` steps) fed by each reader, after 20 untimed steps
  of each. The two loops run side by side, each with its own model: ``--bc-block`` steps of
  one, then the same steps of the other, the one going first changing from block to block, the
  seconds of each loop summed. This machine's speed drifts by up to 2x within seconds (whole
  loops of one reader, then the other, gave ratios from 0.84x to 1.21x on the same files), so
  each side must sample the same moments. Reported: the median of ``--bc-rounds`` such runs.

torch runs on one thread (as obsdelta does): on a loaded 2-core machine, two-thread parallel
regions made the same loop 10 to 50 times slower and the figures unrepeatable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

BATCH = 256
#: Batches of an epoch timed at most (sorted h5py reads of a whole 2 GB D4RL file take minutes).
EPOCH_BATCHES = 1024
Reader = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def plain_ted(path: Path) -> tuple[int, Reader]:
    from tensordict import TensorDict

    data = TensorDict.load_memmap(path)

    def read(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = data[idx]
        return batch["observation"], batch["action"]

    return data.shape[0], read


def plain_d4rl(path: Path) -> tuple[int, Reader]:
    import h5py

    handle = h5py.File(path, "r")
    rows = handle["observations"].shape[0]
    # The top-level datasets of the transitions (a D4RL v2 file also has groups: infos/,
    # metadata/), each read with the batch's sorted rows.
    names = [
        name
        for name, obj in handle.items()
        if isinstance(obj, h5py.Dataset) and obj.shape[:1] == (rows,)
    ]

    def read(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.unique(idx.numpy())
        batch = {name: handle[name][rows] for name in names}
        return torch.from_numpy(batch["observations"]), torch.from_numpy(batch["actions"])

    return rows, read


def compressed(path: Path) -> tuple[int, Reader]:
    from obsdelta_cli import open_dataset

    data = open_dataset(path)

    def read(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = data[idx]
        return batch["observation"], batch["action"]

    return len(data), read


def torchrl_storage(path: Path) -> tuple[int, Reader] | None:
    """``ObsdeltaStorage(path).get(idx)``, what a TorchRL replay buffer's sample calls; ``None``
    without torchrl."""
    from obsdelta_cli.errors import UsageError
    from obsdelta_cli.storage import ObsdeltaStorage

    try:
        storage = ObsdeltaStorage(path)
    except UsageError:  # torchrl is not installed
        return None

    def read(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = storage.get(idx)
        return batch["observation"], batch["action"]

    return len(storage), read


def rows_per_second(readers: list[Reader], batches: list[torch.Tensor], block: int) -> list[float]:
    """Rows per second of ``batches`` through each of ``readers``, warm: one untimed pass over
    the same batches first, so that every reader has checked the blocks it serves before it is
    timed (first reads are timed apart, in :func:`first_reads`). The readers take turns, ``block``
    batches at a time, the one going first rotating from block to block, so that each samples
    the same moments of a machine whose speed drifts (one reader's whole run, then the other's,
    gave ratios from 0.66x to 1.29x on the same files)."""
    for read in readers:
        for idx in batches:
            read(idx)
    seconds = [0.0] * len(readers)
    rows = [0] * len(readers)
    for number, first in enumerate(range(0, len(batches), block)):
        turn = number % len(readers)
        for which in [*range(turn, len(readers)), *range(turn)]:
            read = readers[which]
            start = time.perf_counter()
            for idx in batches[first : first + block]:
                obs, _ = read(idx)
                rows[which] += obs.shape[0]
            seconds[which] += time.perf_counter() - start
    return [n / s for n, s in zip(rows, seconds, strict=True)]


class BcLoop:
    """A behaviour-cloning loop fed by one reader, run a few steps at a time."""

    def __init__(self, read: Reader) -> None:
        torch.manual_seed(0)  # both readers' loops start from the same model
        self.read = read
        self.model = torch.nn.Sequential(
            torch.nn.Linear(11, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 3),
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.seconds = 0.0

    def run(self, steps: list[torch.Tensor]) -> None:
        start = time.perf_counter()
        for idx in steps:
            obs, action = self.read(idx)
            loss = torch.nn.functional.mse_loss(self.model(obs.float()), action.float())
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        self.seconds += time.perf_counter() - start


def bc_side_by_side(
    plain: Reader, packed: Reader, steps: list[torch.Tensor], block: int
) -> tuple[float, float]:
    """A BC loop fed by each reader, run side by side in blocks of ``block`` steps (the one
    going first alternating): ``(plain seconds, compressed seconds)``."""
    loops = BcLoop(plain), BcLoop(packed)
    for warm in loops:  # first calls: set-up, not training
        warm.run(steps[:20])
        warm.seconds = 0.0
    for number, start in enumerate(range(0, len(steps), block)):
        for loop in loops if number % 2 == 0 else loops[::-1]:
            loop.run(steps[start : start + block])
    return loops[0].seconds, loops[1].seconds


def epoch_seconds(read: Reader, epoch: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    for idx in epoch:
        read(idx)
    return time.perf_counter() - start


def first_reads(
    path: Path, plain: Reader, rows: int, storage: bool
) -> dict[str, float | list[float]]:
    """Seconds of the first, checked reads of the compressed file (see the module)."""
    import tensordict  # noqa: F401 - imported on a dataset's first read: not a read's cost

    from obsdelta_cli import open_dataset

    order = torch.randperm(rows, generator=torch.Generator().manual_seed(1))
    epoch = list(order.split(BATCH))[:EPOCH_BATCHES]
    out: dict[str, float | list[float]] = {"plain_epoch_seconds": epoch_seconds(plain, epoch)}
    _, fresh = compressed(path)
    out["checked_epochs_seconds"] = [epoch_seconds(fresh, epoch) for _ in range(2)]
    made = torchrl_storage(path) if storage else None
    if made is not None:
        out["storage_epochs_seconds"] = [epoch_seconds(made[1], epoch) for _ in range(2)]
    data = open_dataset(path)
    whole = []
    for _ in range(2):
        start = time.perf_counter()
        data[0 : len(data)]
        whole.append(time.perf_counter() - start)
    out["whole_seconds"] = whole
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("layout", choices=["ted", "d4rl"])
    parser.add_argument("plain", type=Path)
    parser.add_argument("packed", type=Path)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--bc-steps", type=int, default=1000)
    parser.add_argument("--bc-rounds", type=int, default=5)
    parser.add_argument("--bc-block", type=int, default=20)
    parser.add_argument("--read-block", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plain_rows, plain = (plain_ted if args.layout == "ted" else plain_d4rl)(args.plain)
    packed_rows, packed = compressed(args.packed)
    if plain_rows != packed_rows:
        raise SystemExit(f"{plain_rows} plain rows but {packed_rows} compressed rows")
    generator = torch.Generator().manual_seed(0)

    def draw(count: int) -> list[torch.Tensor]:
        return [torch.randint(plain_rows, (BATCH,), generator=generator) for _ in range(count)]

    batches, steps = draw(args.batches), draw(args.bc_steps)
    for idx in batches[:20]:  # same rows, same values
        rows = idx.unique()  # sorted
        assert torch.equal(plain(rows)[0], packed(rows)[0]), "the readers disagree"
    rounds = [bc_side_by_side(plain, packed, steps, args.bc_block) for _ in range(args.bc_rounds)]
    result = {
        "rows": plain_rows,
        "batch": BATCH,
        "batches": args.batches,
        "bc_steps": args.bc_steps,
        "bc_block": args.bc_block,
        "plain_bc_seconds": statistics.median(a for a, _ in rounds),
        "packed_bc_seconds": statistics.median(b for _, b in rounds),
        "bc_rounds": rounds,
        "threads": torch.get_num_threads(),
    }
    storage = torchrl_storage(args.packed)
    readers = [plain, packed] + ([] if storage is None else [storage[1]])
    rates = rows_per_second(readers, batches, args.read_block)
    result["plain_rows_per_s"], result["packed_rows_per_s"] = rates[:2]
    if storage is not None:
        result["storage_rows_per_s"] = rates[2]
    result.update(first_reads(args.packed, plain, plain_rows, storage is not None))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
