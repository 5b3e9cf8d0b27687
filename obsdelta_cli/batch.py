"""Many inputs in one command: outputs in a folder, worker processes or a Dask cluster, and one
outcome per input whatever happens to the others.

>>> outputs_for([Path("a/run1"), Path("b/run2")], Path("out"), folder=True)
[PosixPath('out/run1'), PosixPath('out/run2')]
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from . import interrupts
from .atomic import clean_after_killed, release_locks
from .errors import ObsdeltaError, OutputError, UsageError
from .names import PACKED_SUFFIX
from .options import Options
from .report import DatasetResult


@dataclass(frozen=True)
class Job:
    """One command on one input: the command is that of its options."""

    input: Path
    output: Path | None
    options: Options

    @property
    def command(self) -> str:
        """The command's name, as the command line spells it."""
        return self.options.command


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
    try:
        result = job.options.run(job.input, job.output)
    except ObsdeltaError as exc:
        if exc.output is not None:
            job = replace(job, output=exc.output)
        return Outcome(job, None, str(exc), exc.exit_code, time.perf_counter() - start)
    return Outcome(job, result, None, 0, time.perf_counter() - start)


#: Names that say "HDF5 file".
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


def packed_name(input: Path) -> str:
    """The name of ``input``'s packed file in a folder of outputs: an HDF5 file by its name.

    >>> packed_name(Path("runs/hopper_ted")), packed_name(Path("a.pt")), packed_name(Path("b.hdf5"))
    ('hopper_ted.h5', 'a.pt.h5', 'b.hdf5')
    """
    if input.suffix.lower() in HDF5_SUFFIXES:
        return input.name
    return input.name + PACKED_SUFFIX


def outputs_for(
    inputs: Sequence[Path],
    output: Path | None,
    *,
    folder: bool,
    name: Callable[[Path], str] = lambda p: p.name,
) -> list[Path | None]:
    """Where each input's output goes: ``output`` itself for one input, else
    ``output/<name(input)>`` (the input's own name by default)."""
    if output is None:
        return [None] * len(inputs)
    if not folder:
        return [output]
    names = [name(p) for p in inputs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(
            f"several inputs are named {', '.join(repeated)}, so their outputs would collide",
            file=output,
            hint="run them in separate commands or rename them",
        )
    return [output / name for name in names]


_BUSY = False


def _init_worker(threads: int, parent: int) -> None:
    # Ctrl-C reaches the whole process group: the parent decides what happens to each worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by _spawn
    signal.signal(signal.SIGTERM, _worker_sigterm)
    interrupts.quiet_in_finalizers()
    _die_with(parent)
    from . import arrays  # numpy: not for --version and --help, which import this module

    # Workers share the cores: one pool of torch threads each (where a codec imports torch for
    # its casts) would oversubscribe them.
    arrays.torch_threads = threads


_PR_SET_PDEATHSIG = 1
#: How often a worker checks that its parent lives, where the kernel cannot tell it.
PARENT_POLL_SECONDS = 0.2


def _die_with(parent: int) -> None:
    """Stop this worker as the parent's SIGTERM would (the output it is writing removed, not
    put in place) once the process ``parent`` is gone: killed with SIGKILL, it can stop no
    worker itself, and they would go on writing outputs nobody waits for. The kernel sends
    the signal where it can (Linux ``PR_SET_PDEATHSIG``); a thread watching the parent PID
    does elsewhere, and here too if the parent died before this ran."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="obsdelta-parent", daemon=True).start()


def _worker_sigterm(signum: int, frame: object) -> None:
    if not _BUSY:
        os._exit(128 + signum)
    # As in the main process: Terminated, so the command removes its temporary output on the
    # way out; a second SIGTERM (the pool stops every worker when one exits) only remembered.
    interrupts.on_signal(signum, frame)


def _pool_job(job: Job) -> Outcome:
    """:func:`run_job` in a worker; stopped by the parent with SIGTERM, it leaves no output."""
    global _BUSY
    _BUSY = True
    try:
        outcome = run_job(job)
    except KeyboardInterrupt:
        _exit(143)
    finally:
        _BUSY = False
    if interrupts.received:  # stopped, but the exception was swallowed: the output is complete
        _exit(143)
    return outcome


def _exit(code: int) -> NoReturn:
    """End a worker now, the output it was writing removed: no lock file left either."""
    release_locks()
    os._exit(code)


def _spawn(pool: ProcessPoolExecutor, jobs: Sequence[Job]) -> list[Future[Outcome]]:
    """Submit every job. SIGINT is blocked while the workers start: they inherit the mask and
    ignore SIGINT before unblocking it, so a Ctrl-C while they start cannot print a traceback
    from them; here it is delivered once they have started."""
    blocked = {signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        return [pool.submit(_pool_job, job) for job in jobs]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now: each removes the output it was writing, then exits."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    for process in workers:
        if process.is_alive():
            process.terminate()
    for process in workers:
        process.join(timeout=30)
        if process.is_alive():  # stuck: the next run for its output removes the temporary
            process.kill()
            process.join()
    pool.shutdown(wait=True, cancel_futures=True)


def _input_bytes(job: Job) -> int:
    """Bytes of a job's input (a file, or the files under a folder); links not followed."""
    path = job.input
    if path.is_symlink() or not path.exists():
        return 0
    if not path.is_dir():
        return path.stat().st_size
    return sum(
        os.lstat(os.path.join(root, name)).st_size
        for root, _, names in os.walk(path)
        for name in names
    )


def run_all(
    jobs: Sequence[Job], *, workers: int = 1, scheduler: str | None = None
) -> Generator[Outcome, None, None]:
    """Run ``jobs``, yielding outcomes as they complete: here, in ``workers`` processes, or on
    the Dask cluster whose scheduler listens at ``scheduler``."""
    if scheduler is not None:
        yield from _run_on_dask(jobs, scheduler)
    elif workers > 1 and len(jobs) > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(workers, context, _init_worker, (threads, os.getpid()))
        try:
            # Largest first: a big input started last would leave the other workers idle.
            ordered = sorted(jobs, key=_input_bytes, reverse=True)
            futures = dict(zip(_spawn(pool, ordered), ordered, strict=True))
            for future in as_completed(futures):
                yield _outcome(future, futures[future])
        except BaseException:  # Ctrl-C, SIGTERM, or the caller stopped listening
            _stop(pool)
            raise
        pool.shutdown()
    else:
        for job in jobs:
            yield run_job(job)


def _outcome(future: Future[Outcome], job: Job) -> Outcome:
    """A worker's outcome; if the worker was killed (by a signal, or by the system when memory
    ran out), the pool is broken: this job and every one not yet done fail, and what the
    killed worker left beside its output is removed."""
    try:
        return future.result()
    except BrokenProcessPool:
        if job.output is not None:
            clean_after_killed(job.output)
        lost = OutputError(
            "not done: a worker process was killed (by a signal, or by the system when memory "
            "ran out); nothing was written for this input",
            file=job.input,
            hint="run it again, with fewer --jobs if memory is short",
        )
        return Outcome(job, None, str(lost), lost.exit_code, 0.0)


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
