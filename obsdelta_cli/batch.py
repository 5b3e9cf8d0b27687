"""Many inputs in one command: outputs in a folder, worker processes or a Dask cluster, and one
outcome per input whatever happens to the others.

>>> outputs_for([Path("a/run1"), Path("b/run2")], Path("out"), folder=True)
[PosixPath('out/run1'), PosixPath('out/run2')]
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import commands
from .errors import ObsdeltaError, UsageError
from .report import DatasetResult

COMMANDS: dict[str, Callable[..., DatasetResult]] = {
    "compress": commands.compress,
    "inflate": commands.inflate,
    "report": commands.report,
    "verify": commands.verify,
}


@dataclass(frozen=True)
class Job:
    """One command on one input."""

    command: str
    input: Path
    output: Path | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What became of a job: its result, or the one-line error and its exit code."""

    job: Job
    result: DatasetResult | None
    error: str | None
    exit_code: int
    seconds: float


def run_job(job: Job) -> Outcome:
    """Run a job, turning an expected failure into an :class:`Outcome` (never raising one)."""
    start = time.perf_counter()
    args: tuple[Path, ...] = (job.input,) if job.output is None else (job.input, job.output)
    try:
        result = COMMANDS[job.command](*args, **job.options)
    except ObsdeltaError as exc:
        return Outcome(job, None, str(exc), exc.exit_code, time.perf_counter() - start)
    return Outcome(job, result, None, 0, time.perf_counter() - start)


def outputs_for(inputs: Sequence[Path], output: Path | None, *, folder: bool) -> list[Path | None]:
    """Where each input's output goes: ``output`` itself for one input, else ``output/<name>``."""
    if output is None:
        return [None] * len(inputs)
    if not folder:
        return [output]
    names = [p.name for p in inputs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(
            f"several inputs are named {', '.join(repeated)}, so their outputs would collide",
            file=output,
            hint="run them in separate commands or rename them",
        )
    return [output / name for name in names]


def _init_worker(threads: int) -> None:
    import torch

    # Workers share the cores: one pool of threads each would oversubscribe them.
    torch.set_num_threads(threads)


def run_all(
    jobs: Sequence[Job], *, workers: int = 1, scheduler: str | None = None
) -> Iterator[Outcome]:
    """Run ``jobs``, yielding outcomes as they complete: here, in ``workers`` processes, or on
    the Dask cluster whose scheduler listens at ``scheduler``."""
    if scheduler is not None:
        yield from _run_on_dask(jobs, scheduler)
    elif workers > 1 and len(jobs) > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, context, _init_worker, (threads,)) as pool:
            futures = [pool.submit(run_job, job) for job in jobs]
            for future in as_completed(futures):
                yield future.result()
    else:
        for job in jobs:
            yield run_job(job)


def _run_on_dask(jobs: Sequence[Job], scheduler: str) -> Iterator[Outcome]:
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise UsageError(
            "--scheduler needs dask.distributed", hint="pip install 'obsdelta[dask]'"
        ) from None
    try:
        client = Client(scheduler, timeout=10)
    except (OSError, TimeoutError) as exc:
        raise UsageError(
            f"cannot reach the Dask scheduler at {scheduler} ({exc})",
            hint="check the address, e.g. tcp://127.0.0.1:8786",
        ) from None
    with client:
        futures = client.map(run_job, list(jobs), pure=False)
        for future in dask_completed(futures):
            yield future.result()
