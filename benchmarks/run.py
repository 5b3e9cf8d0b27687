"""Benchmark obsdelta on tiled real rollouts against cp, zstd, gzip and TorchRL's transform.

    python benchmarks/run.py [--sizes 0.25,1] [--out benchmarks/out] [--quick]
                             [--cache auto|cold|warm] [--repeat N] [--publish]

Writes OUT/results.json and OUT/results.md; see benchmarks/README.md for what is measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from inputs import D4RL, SAMPLE, BenchInput, iter_inputs
from measure import CacheMode, Run, can_evict, dataset_bytes, prepare_cache, remove, run_timed
from source import PACKAGE, export_snapshot, obsdelta_argv, working_tree_revision
from tables import machine_info, render

BENCH = Path(__file__).resolve().parent
BASELINES = BENCH / "baselines.py"
PYTHON = sys.executable
DEFAULT_SIZES = [0.25, 1.0]
QUICK_SIZES = [0.05]
CODECS = ("fp16", "exact")
OK, NOT_AVAILABLE = "ok", "not available"
MB = 10**6
ZSTD_TAR = 'set -o pipefail; tar -cf - -C "$1" "$2" | zstd -1 -q -o "$3"'
WRITE_NOTE = (
    "Outputs are written to the page cache: the timer stops when the command exits, before "
    "write-back, except for what a command syncs itself."
)
CACHE_NOTES = {
    CacheMode.COLD: (
        "cold input: before each command, pending writes are flushed (sync) and the files the "
        "command reads are evicted from the page cache (posix_fadvise DONTNEED); programs and "
        "libraries stay cached. " + WRITE_NOTE
    ),
    CacheMode.WARM: (
        "warm input: before each command, pending writes are flushed (sync) and the files the "
        "command reads are read once. " + WRITE_NOTE
    ),
}


class Kind(StrEnum):
    """What a step is, which decides how its result is read."""

    COPY = "copy"
    COMPRESSOR = "compressor"
    OBSDELTA = "obsdelta"
    TORCHRL = "torchrl"


@dataclass(frozen=True)
class Step:
    """One command to time on one input."""

    name: str
    kind: Kind
    argv: list[str] | None  # None: the tool is not available here
    reads: Path  # the dataset the command reads, put in the cache state before each run
    output: Path | None = None
    keep: bool = False  # later steps read the output
    note: str = ""


@dataclass
class Row:
    """One line of the results table."""

    input: str
    step: str
    kind: str
    command: str
    input_bytes: int
    status: str = OK
    seconds: float | None = None
    seconds_all: list[float] = field(default_factory=list)
    mb_per_s: float | None = None
    ratio_vs_cp: float | None = None
    peak_rss_mb: float | None = None
    peak_anon_mb: float | None = None
    output_bytes: int | None = None
    compression_ratio: float | None = None
    max_abs_error: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Details:
    """What a step's own output says beyond time and memory."""

    compression_ratio: float | None = None
    max_abs_error: float | None = None
    note: str = ""
    seconds: list[float] | None = None  # timings that replace the wall time


@dataclass(frozen=True)
class Tools:
    obsdelta: list[str]  # how to start obsdelta
    zstd: str | None
    h5repack: str | None
    zstandard: bool


def find_tools(snapshot: Path | None) -> Tools:
    venv_bin = str(Path(PYTHON).parent)
    installed = shutil.which("obsdelta", path=venv_bin) or shutil.which("obsdelta")
    if installed is None:
        raise SystemExit("obsdelta is not installed: pip install -e . first")
    return Tools(
        obsdelta=obsdelta_argv(installed, snapshot),
        zstd=shutil.which("zstd"),
        h5repack=shutil.which("h5repack"),
        zstandard=importlib.util.find_spec("zstandard") is not None,
    )


def compressor(
    name: str, argv: list[str] | None, src: Path, dst: Path, note: str = "", install: str = ""
) -> Step:
    """A lossless baseline; with no ``argv`` (tool missing), a row saying how to install it."""
    if argv is None:
        return Step(name, Kind.COMPRESSOR, None, src, note=f"to run it: {install}")
    return Step(name, Kind.COMPRESSOR, argv, src, dst, note=note)


def zstd_step(src: Path, dst: Path, tools: Tools) -> Step:
    """zstd -1 of the input: a folder is piped through tar, as one would archive it."""
    if tools.zstd and src.is_dir():
        argv = ["bash", "-c", ZSTD_TAR, "zstd", str(src.parent), src.name, str(dst)]
        return compressor("zstd -1", argv, src, dst, "tar | zstd, 1 thread")
    if tools.zstd:
        return compressor(
            "zstd -1", [tools.zstd, "-1", "-q", str(src), "-o", str(dst)], src, dst, "1 thread"
        )
    if tools.zstandard:
        argv = [PYTHON, str(BASELINES), "zstd", str(src), str(dst)]
        return compressor("zstd -1", argv, src, dst, "python zstandard, 1 thread")
    return compressor("zstd -1", None, src, dst, install="apt-get install -y zstd")


def gzip_steps(src: Path, work: Path, tools: Tools) -> list[Step]:
    """HDF5 rewrites with every dataset gzip level 1 (D4RL input only)."""
    repacked, rewritten = work / "h5repack.hdf5", work / "h5py-gzip.hdf5"
    repack = [tools.h5repack, "-f", "GZIP=1", str(src), str(repacked)] if tools.h5repack else None
    rewrite = [PYTHON, str(BASELINES), "h5gzip", str(src), str(rewritten)]
    return [
        compressor(
            "h5repack -f GZIP=1", repack, src, repacked, install="apt-get install -y hdf5-tools"
        ),
        compressor("h5py rewrite, gzip level 1", rewrite, src, rewritten, "streamed by rows"),
    ]


def obsdelta_steps(src: Path, work: Path, tools: Tools) -> list[Step]:
    """compress and inflate with each codec, report, and TorchRL's rebuild of the fp16 file."""
    suffix = src.suffix if src.is_file() else ""
    packed = {codec: work / f"{codec}{suffix}" for codec in CODECS}

    def obsdelta(*args: str | Path) -> list[str]:
        return [*tools.obsdelta, *map(str, args), "--json"]

    compress = [
        Step(
            f"obsdelta compress --codec {codec}",
            Kind.OBSDELTA,
            obsdelta("compress", src, "-o", path, "--codec", codec),
            src,
            path,
            keep=True,
        )
        for codec, path in packed.items()
    ]
    inflate = [
        Step(
            f"obsdelta inflate ({codec} file)",
            Kind.OBSDELTA,
            obsdelta("inflate", path, "-o", work / f"{codec}-inflated{suffix}"),
            path,
            work / f"{codec}-inflated{suffix}",
        )
        for codec, path in packed.items()
    ]
    report = Step("obsdelta report", Kind.OBSDELTA, obsdelta("report", src), src)
    torchrl = Step(
        "TorchRL NextObservationDelta forward (fp16 file, in memory)",
        Kind.TORCHRL,
        [PYTHON, str(BASELINES), "torchrl", str(packed["fp16"]), str(src)],
        packed["fp16"],
    )
    return [*compress, *inflate, report, torchrl]


def plan(item: BenchInput, work: Path, tools: Tools) -> list[Step]:
    """Every step for one input, baselines first; cp is the reference for the others."""
    src = item.path
    copied = work / "cp"
    copy = Step("cp -r (I/O floor)", Kind.COPY, ["cp", "-r", str(src), str(copied)], src, copied)
    gzip = gzip_steps(src, work, tools) if item.layout == D4RL else []
    zstd = zstd_step(src, work / "zstd.zst", tools)
    return [copy, zstd, *gzip, *obsdelta_steps(src, work, tools)]


def last_json(run: Run) -> dict[str, Any]:
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def lossless_details(runs: list[Run], item: BenchInput, output_bytes: int | None) -> Details:
    ratio = item.bytes / output_bytes if output_bytes else None
    return Details(compression_ratio=ratio, max_abs_error=0.0)


def obsdelta_details(runs: list[Run], item: BenchInput, output_bytes: int | None) -> Details:
    doc = last_json(runs[-1])
    keys = doc["keys"]
    error = max((key["max_abs_error"] for key in keys), default=None)
    exceptions = sum(key["exception_rows"] for key in keys)
    note = f"{exceptions:,} exception rows" if exceptions else ""
    if doc["command"] == "inflate":
        return Details(max_abs_error=error, note=note)
    if doc["command"] == "report":
        note = "dry run of every codec; ratio and error of fp16"
    return Details(doc["bytes_before"] / doc["bytes_after"], error, note)


def torchrl_details(runs: list[Run], item: BenchInput, output_bytes: int | None) -> Details:
    docs = [last_json(run) for run in runs]
    seconds = [doc["forward_seconds"] for doc in docs]
    median = statistics.median(seconds)
    rows_per_s = docs[-1]["rows"] / median
    rebuilt_mb_per_s = docs[-1]["rebuilt_bytes"] / median / MB
    note = (
        f"forward only: {rows_per_s / 1e6:,.1f} M rows/s, {rebuilt_mb_per_s:,.0f} MB/s of next "
        "observations; RSS includes the data loaded"
    )
    return Details(max_abs_error=docs[-1]["max_abs_error"], note=note, seconds=seconds)


DETAILS: dict[Kind, Callable[[list[Run], BenchInput, int | None], Details]] = {
    Kind.COPY: lossless_details,
    Kind.COMPRESSOR: lossless_details,
    Kind.OBSDELTA: obsdelta_details,
    Kind.TORCHRL: torchrl_details,
}


def execute(step: Step, mode: CacheMode, repeat: int) -> list[Run] | None:
    """Run a step ``repeat`` times (stopping at a failure); None if its tool is missing."""
    if step.argv is None:
        return None
    runs: list[Run] = []
    for _ in range(repeat):
        if step.output is not None:
            remove(step.output)
        prepare_cache(step.reads, mode)
        runs.append(run_timed(step.argv))
        if runs[-1].returncode != 0:
            break
    return runs


def make_row(step: Step, item: BenchInput, runs: list[Run] | None) -> Row:
    row = Row(item.label, step.name, step.kind, shlex.join(step.argv or []), item.bytes)
    row.note = step.note
    if runs is None:
        row.status = NOT_AVAILABLE
        return row
    if runs[-1].returncode != 0:
        row.status = f"failed: {runs[-1].error_line}"
        return row
    if step.output is not None and step.output.exists():
        row.output_bytes = dataset_bytes(step.output)
    try:
        details = DETAILS[step.kind](runs, item, row.output_bytes)
    except (ValueError, KeyError, IndexError) as exc:
        row.status = f"failed: unreadable output ({exc!r})"
        return row
    row.seconds_all = details.seconds or [run.seconds for run in runs]
    row.seconds = statistics.median(row.seconds_all)
    row.mb_per_s = item.bytes / row.seconds / MB
    row.peak_rss_mb = max(run.peak_rss_mb for run in runs)
    row.peak_anon_mb = max(run.peak_anon_mb for run in runs)
    row.compression_ratio = details.compression_ratio
    row.max_abs_error = details.max_abs_error
    row.note = "; ".join(text for text in (step.note, details.note) if text)
    return row


def add_ratio_vs_cp(rows: list[Row]) -> None:
    copy = next((row for row in rows if row.kind == Kind.COPY and row.seconds), None)
    for row in rows:
        if copy is not None and copy.seconds and row.seconds:
            row.ratio_vs_cp = copy.seconds / row.seconds


def log(row: Row) -> None:
    timing = f"{row.seconds:.2f} s" if row.seconds is not None else row.status
    print(f"[{row.input}] {row.step}: {timing}", file=sys.stderr, flush=True)


def bench_input(item: BenchInput, steps: list[Step], mode: CacheMode, repeat: int) -> list[Row]:
    """Time every step on one input; outputs are deleted once no later step needs them."""
    rows = []
    for step in steps:
        row = make_row(step, item, execute(step, mode, repeat))
        if step.output is not None and not step.keep:
            remove(step.output)
        log(row)
        rows.append(row)
    add_ratio_vs_cp(rows)
    return rows


def choose_cache_mode(requested: str) -> CacheMode:
    if requested != "auto":
        return CacheMode(requested)
    return CacheMode.COLD if can_evict(SAMPLE) else CacheMode.WARM


def startup_seconds(tools: Tools, repeat: int) -> float:
    """Wall time of ``obsdelta --version`` (interpreter and imports), libraries cached."""
    argv = [*tools.obsdelta, "--version"]
    run_timed(argv)  # loads the libraries into the page cache and compiles the sources
    return statistics.median(run_timed(argv).seconds for _ in range(repeat))


def untiled_zstd_ratio(tools: Tools, scratch: Path) -> float | None:
    """zstd -1's ratio on the rollout itself, one tile: what it reaches without repetition."""
    step = zstd_step(SAMPLE, scratch / "untiled.zst", tools)
    runs = execute(step, CacheMode.WARM, 1)
    if step.output is None or not runs or runs[-1].returncode != 0:
        return None
    ratio = dataset_bytes(SAMPLE) / dataset_bytes(step.output)
    remove(step.output)
    return ratio


def check_complete(markdown: Path, rows: list[Row], planned: int) -> None:
    """Fail unless results.md has one successful row per planned step."""
    text = markdown.read_text()
    problems = [f"{len(rows)} rows for {planned} planned steps"] if len(rows) != planned else []
    for row in rows:
        if f"| {row.input} | {row.step} |" not in text:
            problems.append(f"no row for {row.input} / {row.step}")
        if row.status not in (OK, NOT_AVAILABLE):
            problems.append(f"{row.input} / {row.step}: {row.status}")
    if problems:
        raise SystemExit(f"{markdown} is incomplete:\n" + "\n".join(problems))
    print(f"check: {markdown} has all {planned} rows", file=sys.stderr)


def parse_sizes(text: str) -> list[float]:
    sizes = [float(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive numbers of GB, not {text!r}")
    return sizes


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return int(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        help="input sizes in GB (10^9 bytes), comma-separated; default 0.25,1 (--quick: 0.05)",
    )
    parser.add_argument(
        "--out", type=Path, help="default benchmarks/out (--quick: benchmarks/out/quick)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small inputs; fail unless every row is there"
    )
    parser.add_argument("--cache", choices=["auto", *CacheMode], default="auto")
    parser.add_argument("--repeat", type=positive_int, default=1, help="runs per command (median)")
    parser.add_argument(
        "--snapshot",
        nargs="?",
        const="HEAD",
        metavar="REV",
        help="measure the package as committed at REV (default HEAD), not the working tree",
    )
    parser.add_argument(
        "--publish", action="store_true", help="also copy results.md to benchmarks/RESULTS.md"
    )
    return parser.parse_args(argv)


def input_record(item: BenchInput) -> dict[str, Any]:
    return {**asdict(item), "path": str(item.path), "name": item.path.name, "label": item.label}


def choose_source(rev: str | None, out: Path) -> tuple[Path | None, str]:
    """The snapshot to run (None: the installed working tree), and how to name the source."""
    if rev is None:
        return None, working_tree_revision()
    snapshot, commit = export_snapshot(out / "snapshot", rev)
    return snapshot, f"commit {commit}, run from a snapshot of the package (python -m {PACKAGE})"


def bench_all(
    out: Path, sizes: list[float], tools: Tools, mode: CacheMode, repeat: int
) -> tuple[list[BenchInput], list[Row], int]:
    """Build (or reuse) every input and time every step on it; also count the planned steps."""
    inputs: list[BenchInput] = []
    rows: list[Row] = []
    planned = 0
    for item in iter_inputs(out / "inputs", sizes):
        work = out / "work" / item.path.name
        remove(work)
        work.mkdir(parents=True)
        steps = plan(item, work, tools)
        planned += len(steps)
        rows += bench_input(item, steps, mode, repeat)
        remove(work)
        inputs.append(item)
    return inputs, rows, planned


def loadavg() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    out: Path = args.out or (BENCH / "out" / "quick" if args.quick else BENCH / "out")
    started, loadavg_start = time.perf_counter(), loadavg()
    out.mkdir(parents=True, exist_ok=True)
    snapshot, source = choose_source(args.snapshot, out)
    mode, tools = choose_cache_mode(args.cache), find_tools(snapshot)
    startup, untiled = startup_seconds(tools, args.repeat), untiled_zstd_ratio(tools, out)
    inputs, rows, planned = bench_all(out, sizes, tools, mode, args.repeat)
    end = working_tree_revision() if snapshot is None else source
    if end != source:
        source = f"changed during the run: {source} at the start, {end} at the end"
    settings = {
        "command": shlex.join(["python", "benchmarks/run.py", *(argv or sys.argv[1:])]),
        "sizes_gb": sizes,
        "cache": mode.value,
        "cache_note": CACHE_NOTES[mode],
        "repeat": args.repeat,
        "loadavg_start": loadavg_start,
        "loadavg_end": loadavg(),
        "total_seconds": time.perf_counter() - started,
    }
    results = {
        "machine": machine_info(),
        "settings": settings,
        "obsdelta_source": source,
        "startup_seconds": startup,
        "untiled_zstd_ratio": untiled,
        "inputs": [input_record(item) for item in inputs],
        "rows": [asdict(row) for row in rows],
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    markdown = out / "results.md"
    markdown.write_text(render(results))
    print(f"wrote {markdown} and {out / 'results.json'}", file=sys.stderr)
    if args.quick:
        check_complete(markdown, rows, planned)
    if args.publish:
        shutil.copyfile(markdown, BENCH / "RESULTS.md")


if __name__ == "__main__":
    main()
