"""Time obsdelta against zstd on non-repeating inputs, and check each figure against its target.

    python benchmarks/run.py [--sizes 2] [--out benchmarks/out] [--repeat N]
                             [--cache auto|drop|fadvise] [--snapshot [REV]] [--publish]

Writes OUT/results.json and OUT/results.md (with --publish also benchmarks/RESULTS.md); see
benchmarks/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inputs import D4RL, TED, BenchInput, ensure_input
from measure import (
    Run,
    can_drop_caches,
    cold_cache,
    dataset_bytes,
    remove,
    run_timed,
    warm_up,
)
from source import (
    PACKAGE,
    compile_bytecode,
    export_snapshot,
    obsdelta_argv,
    package_state,
    working_tree_revision,
)
from tables import machine_info, render

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
MB = 10**6
SEEDS = {TED: 1, D4RL: 2}  # one stream per layout; the --jobs inputs use 101..108
JOBS_INPUTS = 8
STARTUP_REPEAT = 5
WARM_IMPORTS = (
    "import torch, tensordict, h5py, numpy, xxhash, typer, rich, obsdelta_cli.cli, "
    "obsdelta_cli.dataset, obsdelta_cli.commands.compress, obsdelta_cli.commands.inflate, "
    # What --pack loads besides: HDF5's filter plugins (hdf5plugin loads them all) and
    # zstandard.
    "obsdelta_cli.commands.pack, hdf5plugin, zstandard"
)
RSS_LIMIT_MB = 512
ZSTD = 'zstd -1 -T1 -q "$1" -o "$2" && sync'
ZSTD_TAR = 'set -o pipefail; tar -cf - -C "$1" "$2" | zstd -1 -T1 -q -o "$3" && sync'
UNZSTD = 'zstd -d -T1 -q "$1" -o "$2" && sync'
UNZSTD_TAR = 'set -o pipefail; mkdir "$2" && zstd -d -T1 -q -c "$1" | tar -xf - -C "$2" && sync'


@dataclass
class Timing:
    """One timed command (median of the repeats)."""

    input: str
    name: str
    command: str
    input_bytes: int
    status: str = "ok"
    seconds: float | None = None
    seconds_all: list[float] | None = None
    peak_rss_mb: float | None = None
    peak_anon_mb: float | None = None
    output_bytes: int | None = None
    compression_ratio: float | None = None
    stdout: str = ""


class Bench:
    """Runs commands in the chosen cache state and keeps every timing."""

    def __init__(self, obsdelta: list[str], drop_all: bool, repeat: int, scratch: Path) -> None:
        compile_bytecode(obsdelta)
        self.obsdelta = obsdelta
        self.drop_all = drop_all
        self.repeat = repeat
        self.scratch = scratch
        self.timings: list[Timing] = []
        self.inputs_zstd: dict[str, float | None] = {}  # input name -> zstd -1 ratio

    def warm_programs(self) -> None:
        """Load the programs and libraries the commands use (not their inputs) into the cache:
        obsdelta's start-up and the modules its commands import, and the zstd and tar binaries."""
        subprocess.run([*self.obsdelta, "--version"], capture_output=True, check=True)
        subprocess.run([PYTHON, "-c", WARM_IMPORTS], check=False)
        subprocess.run(["zstd", "-V"], capture_output=True, check=False)
        subprocess.run(["tar", "--version"], capture_output=True, check=False)

    def time(
        self,
        item: BenchInput,
        name: str,
        argv: list[str],
        reads: list[Path],
        output: Path | None,
        cold: bool = True,
        keep: bool = True,
    ) -> Timing:
        """Run ``argv`` ``repeat`` times with ``reads`` cold (or warm); median seconds."""
        (timing,) = self.alternating([Command(item, name, argv, reads, output, cold, keep)])
        return timing

    def alternating(self, commands: list[Command]) -> list[Timing]:
        """Run each command in turn, ``repeat`` rounds: commands whose ratio is a target
        sample the same stretches of a machine whose speed drifts; median seconds of each."""
        runs: list[list[Run]] = [[] for _ in commands]
        timings = [Timing(c.item.label, c.name, shlex.join(c.argv), c.item.bytes) for c in commands]
        for _ in range(self.repeat):
            for command, timing, done in zip(commands, timings, runs, strict=True):
                if timing.status == "ok":
                    done.append(self._run(command))
                    if done[-1].returncode != 0:
                        timing.status = f"failed: {done[-1].error_line}"
        for command, timing, done in zip(commands, timings, runs, strict=True):
            self._finish(command, timing, done)
        return timings

    def _run(self, command: Command) -> Run:
        if command.output is not None:
            remove(command.output)
        if command.cold:
            cold_cache(command.reads, self.drop_all)
            self.warm_programs()
        else:
            os.sync()
            for path in command.reads:
                warm_up(path)
        return run_timed(command.argv)

    def _finish(self, command: Command, timing: Timing, runs: list[Run]) -> None:
        item, output = command.item, command.output
        if timing.status == "ok":
            timing.seconds_all = [run.seconds for run in runs]
            timing.seconds = statistics.median(timing.seconds_all)
            timing.peak_rss_mb = max(run.peak_rss_mb for run in runs)
            timing.peak_anon_mb = max(run.peak_anon_mb for run in runs)
            timing.stdout = runs[-1].stdout
            if output is not None and output.exists():
                timing.output_bytes = dataset_bytes(output)
                timing.compression_ratio = item.bytes / timing.output_bytes
        if output is not None and not command.keep:
            remove(output)
        print(
            f"[{item.label}] {timing.name}: "
            + (f"{timing.seconds:.2f} s" if timing.seconds else timing.status),
            file=sys.stderr,
            flush=True,
        )
        self.timings.append(timing)


@dataclass
class Command:
    """One command to time: what :meth:`Bench.time` takes."""

    item: BenchInput
    name: str
    argv: list[str]
    reads: list[Path]
    output: Path | None
    cold: bool = True
    keep: bool = True


def check(
    name: str,
    obsdelta: str,
    baseline: str,
    value: float | None,
    target: str,
    ok: bool | None,
    measured: str | None = None,
) -> dict[str, Any]:
    shown = measured or ("—" if value is None else f"{value:.2f}x")
    return {
        "name": name,
        "obsdelta": obsdelta,
        "baseline": baseline,
        "value": value,
        "measured": shown,
        "target": target,
        "ok": ok,
    }


def seconds(timing: Timing) -> str:
    return "failed" if timing.seconds is None else f"{timing.seconds:.2f} s"


def ratio_check(
    name: str, ours: Timing, theirs: Timing, floor: float | None = None
) -> dict[str, Any]:
    """``theirs``' seconds over ``ours`` (above 1: ours is faster), against ``floor``; without
    one, a row for reference."""
    value = theirs.seconds / ours.seconds if ours.seconds and theirs.seconds else None
    if floor is None:
        return check(name, seconds(ours), seconds(theirs), value, "reference", None)
    ok = None if value is None else value >= floor
    return check(name, seconds(ours), seconds(theirs), value, f">= {floor}x", ok)


def rss_check(timing: Timing) -> dict[str, Any]:
    value = timing.peak_rss_mb
    ok = None if value is None else value <= RSS_LIMIT_MB
    shown = "—" if value is None else f"{value:,.0f} MB"
    return check(
        f"{timing.input}: peak RSS of {timing.name}",
        shown,
        "",
        value,
        f"<= {RSS_LIMIT_MB} MB",
        ok,
        shown,
    )


def layout_checks(
    bench: Bench, item: BenchInput, work: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """compress (exact, fp16) and inflate vs zstd, cold; then training reads, warm."""
    src = item.path
    folder = src.is_dir()
    suffix = "" if folder else src.suffix
    zst = work / "zstd.zst"
    if folder:
        zstd_argv = ["bash", "-c", ZSTD_TAR, "zstd", str(src.parent), src.name, str(zst)]
    else:
        zstd_argv = ["bash", "-c", ZSTD, "zstd", str(src), str(zst)]
    zstd = bench.time(item, "zstd -1 -T1 + sync", zstd_argv, [src], zst)
    item_zstd = zstd.compression_ratio
    packed: dict[str, Path] = {}
    compress: dict[str, Timing] = {}
    for codec in ("exact", "fp16"):
        packed[codec] = work / f"{codec}{suffix}"
        argv = [*bench.obsdelta, "compress", str(src), "-o", str(packed[codec])]
        compress[codec] = bench.time(
            item,
            f"obsdelta compress --codec {codec}",
            [*argv, "--codec", codec, "--json"],
            [src],
            packed[codec],
            keep=codec == "exact",
        )
    unzstd_out = work / f"unzstd{suffix}"
    unzstd_argv = ["bash", "-c", UNZSTD_TAR if folder else UNZSTD, "unzstd", str(zst)]
    unzstd = bench.time(
        item, "zstd -d -T1 + sync", [*unzstd_argv, str(unzstd_out)], [zst], unzstd_out, keep=False
    )
    inflated = work / f"inflated{suffix}"
    inflate = bench.time(
        item,
        "obsdelta inflate (exact file)",
        [*bench.obsdelta, "inflate", str(packed["exact"]), "-o", str(inflated), "--json"],
        [packed["exact"]],
        inflated,
        keep=False,
    )
    checks = [
        ratio_check(
            f"{item.label}: compress --codec {codec} vs zstd -1", compress[codec], zstd, 1.0
        )
        for codec in ("exact", "fp16")
    ]
    checks.append(ratio_check(f"{item.label}: inflate (exact) vs zstd -d", inflate, unzstd, 0.8))
    checks += [rss_check(t) for t in (compress["exact"], compress["fp16"], inflate)]
    checks += read_checks(item, packed["exact"], args)
    remove(zst)
    remove(packed["exact"])
    bench.inputs_zstd[item.path.name] = item_zstd
    return checks


def read_checks(item: BenchInput, packed: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Random batches and a BC loop, warm cache, compressed (exact) vs plain."""
    if not packed.exists():
        return [check(f"{item.label}: training reads", "", "", None, "", None, "no exact file")]
    os.sync()
    warm_up(item.path)
    warm_up(packed)
    argv = [
        PYTHON,
        str(BENCH / "reads.py"),
        item.layout,
        str(item.path),
        str(packed),
        "--batches",
        str(args.batches),
        "--bc-steps",
        str(args.bc_steps),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    print(f"[{item.label}] training reads: exit {done.returncode}", file=sys.stderr, flush=True)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["?"])[-1]
        return [check(f"{item.label}: training reads", "", "", None, "", None, f"failed: {error}")]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    plain_name = "TensorDict.load_memmap" if item.layout == TED else "sorted h5py fancy reads"
    # Reads checked block by block must still serve rows at least as fast as the plain reader.
    floor = 1.0
    ratio = doc["packed_rows_per_s"] / doc["plain_rows_per_s"]
    bc = doc["packed_bc_seconds"] / doc["plain_bc_seconds"]
    storage = []
    if "storage_rows_per_s" in doc:
        through = doc["storage_rows_per_s"] / doc["plain_rows_per_s"]
        storage.append(
            check(
                f"{item.label}: random batches of 256, TorchRL ObsdeltaStorage.get (exact file) "
                f"vs {plain_name} (rows/s ratio, warm)",
                f"{doc['storage_rows_per_s']:,.0f} rows/s",
                f"{doc['plain_rows_per_s']:,.0f} rows/s",
                through,
                f">= {floor}x",
                through >= floor,
            )
        )
    return [
        check(
            f"{item.label}: random batches of 256, open_dataset (exact file) vs {plain_name} "
            "(rows/s ratio, warm)",
            f"{doc['packed_rows_per_s']:,.0f} rows/s",
            f"{doc['plain_rows_per_s']:,.0f} rows/s",
            ratio,
            f">= {floor}x",
            ratio >= floor,
        ),
        check(
            f"{item.label}: BC loop, {doc['bc_steps']} steps of 256, compressed / plain time",
            f"{doc['packed_bc_seconds']:.2f} s",
            f"{doc['plain_bc_seconds']:.2f} s",
            bc,
            "<= 1.1x",
            bc <= 1.1,
        ),
        *storage,
        *first_read_checks(item.label, plain_name, doc),
    ]


def first_read_checks(label: str, plain_name: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """For reference, what checking costs where it happens: one epoch of random batches
    through a reader opened for it (each block checked on its first read), then the same
    epoch again, against the plain reader; and a whole-file read through a new reader."""
    if "checked_epochs_seconds" not in doc:
        return []
    plain = doc["plain_epoch_seconds"]
    rows = []
    readers = [("open_dataset", doc["checked_epochs_seconds"])]
    if "storage_epochs_seconds" in doc:
        readers.append(("TorchRL ObsdeltaStorage.get", doc["storage_epochs_seconds"]))
    for reader, (first, again) in readers:
        for which, seconds in (("first epoch (every block checked)", first), ("again", again)):
            rows.append(
                check(
                    f"{label}: {reader}, {which}, vs {plain_name} (random batches of 256, "
                    "one epoch or at most 1,024 batches)",
                    f"{seconds:.2f} s",
                    f"{plain:.2f} s",
                    plain / seconds,
                    "reference",
                    None,
                )
            )
    first, again = doc["whole_seconds"]
    rows.append(
        check(
            f"{label}: whole file through a new open_dataset (data[0:len]): first read, every "
            "block checked / read again",
            f"{first:.2f} s",
            f"{again:.2f} s",
            again / first,
            "reference",
            None,
        )
    )
    return rows


def median_seconds(argv: list[str], count: int) -> float:
    run_timed(argv)  # loads the libraries into the page cache and compiles the sources
    return statistics.median(run_timed(argv).seconds for _ in range(count))


def startup_checks(bench: Bench, root: Path) -> tuple[list[dict[str, Any]], list[BenchInput]]:
    """``--version``, and a 2 MB compress vs ``import torch`` + 0.5 s; libraries cached."""
    small = ensure_input(root, D4RL, 0.002, 3)
    version = median_seconds([*bench.obsdelta, "--version"], STARTUP_REPEAT)
    torch_import = median_seconds([PYTHON, "-c", "import torch"], STARTUP_REPEAT)
    target = bench.scratch / "small.hdf5"
    argv = [*bench.obsdelta, "compress", str(small.path), "-o", str(target), "-f", "-q"]
    argv += ["--codec", "exact"]
    small_compress = median_seconds(argv, STARTUP_REPEAT)
    remove(target)
    limit = torch_import + 0.5
    return [
        check(
            "start-up: obsdelta --version (warm, median of 5)",
            f"{version:.2f} s",
            "",
            version,
            "<= 0.3 s",
            version <= 0.3,
            f"{version:.2f} s",
        ),
        check(
            f"start-up: compress --codec exact of a {small.bytes / MB:.1f} MB D4RL file vs "
            "python -c 'import torch' + 0.5 s (warm, median of 5)",
            f"{small_compress:.2f} s",
            f"{torch_import:.2f} + 0.5 = {limit:.2f} s",
            small_compress,
            "<= import torch + 0.5 s",
            small_compress <= limit,
            f"{small_compress:.2f} s",
        ),
    ], [small]


def jobs_checks(
    bench: Bench, root: Path, size_gb: float
) -> tuple[list[dict[str, Any]], list[BenchInput]]:
    """``compress --jobs 2`` vs ``--jobs 1`` of 8 D4RL inputs of size/8, cold."""
    each = size_gb / JOBS_INPUTS
    items = [
        ensure_input(root, D4RL, each, 101 + i, f"d4rl-{each:g}GB-jobs{i}")
        for i in range(JOBS_INPUTS)
    ]
    total = sum(item.bytes for item in items)
    label = BenchInput(D4RL, size_gb, items[0].path, 0, total, 0.0, True, 0)
    commands = []
    for jobs in (1, 2):
        out = bench.scratch / f"jobs{jobs}"
        argv = [*bench.obsdelta, "compress", *(str(i.path) for i in items), "-o", f"{out}/"]
        argv += ["--codec", "exact", "--jobs", str(jobs), "--json"]
        name = f"obsdelta compress --jobs {jobs} ({JOBS_INPUTS} files)"
        commands.append(Command(label, name, argv, [i.path for i in items], out, keep=False))
    # In turn, round after round: the ratio's two sides see the same stretches of the run.
    timings = dict(zip((1, 2), bench.alternating(commands), strict=True))
    for timing in timings.values():
        timing.input = f"{JOBS_INPUTS} D4RL HDF5 files of {each:g} GB"
    result = ratio_check(
        f"{JOBS_INPUTS} D4RL files of {each:g} GB: compress --jobs 2 vs --jobs 1",
        timings[2],
        timings[1],
        1.4,
    )
    return [result, *disk_alone(bench, label, items, timings), rss_check(timings[2])], items


def disk_alone(
    bench: Bench, label: BenchInput, items: list[BenchInput], timings: dict[int, Timing]
) -> list[dict[str, Any]]:
    """For reference: the bytes ``--jobs`` reads and writes, moved by 1 and by 2 processes with
    nothing computed and no interpreter start-up (``disk_alone.py``): what a second process
    gains on this disk, in the same run, with the bytes moved in obsdelta's order (each output
    written to the page cache as its input is read, flushed, then dropped from the cache)."""
    written = timings[1].output_bytes
    if not written:
        return [check("--jobs: the disk alone", "—", "—", None, "", None)]
    commands = []
    for procs in (1, 2):
        out = bench.scratch / f"disk-alone{procs}"
        argv = [PYTHON, str(BENCH / "disk_alone.py"), "--procs", str(procs)]
        argv += ["--out-per-in", f"{written / label.bytes:.4f}", "--out", str(out)]
        argv += [str(i.path) for i in items]
        what = "1 process" if procs == 1 else f"{procs} processes"
        name = f"the disk alone, {what}: the same bytes read (O_DIRECT) and written (fsync)"
        commands.append(Command(label, name, argv, [i.path for i in items], out, keep=False))
    alone = dict(zip((1, 2), bench.alternating(commands), strict=True))
    for timing in alone.values():
        timing.input = timings[2].input
    name = timings[2].input
    return [
        ratio_check(
            f"{name}: compress --jobs 2 vs the same bytes read and written by 2 processes, "
            "nothing computed (for reference)",
            timings[2],
            alone[2],
        ),
        ratio_check(
            f"{name}: the same bytes read and written by 2 processes vs 1, nothing computed "
            "(what a second process gains on this disk, for reference)",
            alone[2],
            alone[1],
        ),
    ]


def parse_sizes(text: str) -> list[float]:
    sizes = [float(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive numbers of GB, not {text!r}")
    return sizes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=parse_sizes, default=[2.0], help="input sizes in GB (10^9 bytes); default 2"
    )
    parser.add_argument("--out", type=Path, default=BENCH / "out")
    parser.add_argument("--repeat", type=int, default=1, help="runs per timed command (median)")
    parser.add_argument(
        "--cache",
        choices=["auto", "drop", "fadvise"],
        default="auto",
        help="cold inputs by drop_caches (root) or posix_fadvise; auto: drop where permitted",
    )
    parser.add_argument("--batches", type=int, default=1000, help="random batches timed per reader")
    parser.add_argument("--bc-steps", type=int, default=500, help="steps of the BC loop")
    parser.add_argument(
        "--snapshot",
        nargs="?",
        const="HEAD",
        metavar="REV",
        help="measure the package as committed at REV (default HEAD), not the working tree",
    )
    parser.add_argument("--publish", action="store_true", help="copy results.md to RESULTS.md")
    return parser.parse_args(argv)


def loadavg() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out: Path = args.out.resolve()
    started, loadavg_start = time.perf_counter(), loadavg()
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("zstd") is None:
        raise SystemExit("zstd is needed: apt-get update && apt-get install -y zstd")
    state = package_state()
    if args.snapshot is None:
        snapshot, source = None, working_tree_revision()
    else:
        snapshot, commit = export_snapshot(out / "snapshot", args.snapshot)
        source = f"commit {commit}, run from a snapshot of the package (python -m {PACKAGE})"
    installed = shutil.which("obsdelta", path=str(Path(PYTHON).parent)) or shutil.which("obsdelta")
    if installed is None:
        raise SystemExit("obsdelta is not installed: pip install -e . first")
    drop_all = args.cache == "drop" or (args.cache == "auto" and can_drop_caches())
    root, scratch = out / "inputs", out / "work"
    remove(scratch)
    scratch.mkdir(parents=True)
    bench = Bench(obsdelta_argv(installed, snapshot), drop_all, args.repeat, scratch)
    checks, inputs = startup_checks(bench, root)
    for reference in (TED, D4RL):  # the simulated pool, untouched: zstd's ratio on real data
        real = ensure_input(root, reference, 1.0, None, f"{reference}-real")
        inputs.append(real)
        command = ["bash", "-c", ZSTD_TAR if real.path.is_dir() else ZSTD, "zstd"]
        command += (
            [str(real.path.parent), real.path.name] if real.path.is_dir() else [str(real.path)]
        )
        ratio = bench.time(
            real,
            "zstd -1 -T1 + sync (reference)",
            [*command, str(scratch / "r.zst")],
            [real.path],
            scratch / "r.zst",
            cold=False,
            keep=False,
        )
        bench.inputs_zstd[real.path.name] = ratio.compression_ratio
    for size in args.sizes:
        for layout in (TED, D4RL):
            item = ensure_input(root, layout, size, SEEDS[layout])
            inputs.append(item)
            work = scratch / item.path.name.removesuffix(".hdf5")
            work.mkdir(parents=True)
            checks += layout_checks(bench, item, work, args)
            remove(work)
        more, jobs_items = jobs_checks(bench, root, size)
        checks += more
        inputs += jobs_items
    if snapshot is None and package_state() != state:
        source = (
            f"changed during the run: {source} at the start, {working_tree_revision()} at the end"
        )
    cache_note = (
        "cold input: before each timed command, `sync`, then `echo 3 > /proc/sys/vm/drop_caches` "
        "(every clean page of the machine)"
        if drop_all
        else "cold input: before each timed command, `sync`, then the files it reads are evicted "
        "with `posix_fadvise(POSIX_FADV_DONTNEED)`"
    ) + (
        "; then `obsdelta --version`, one `python -c 'import torch, tensordict, h5py, ..., "
        "obsdelta_cli...'` and `zstd -V` load the programs and libraries again, so start-up is "
        "warm and only the input is cold. Baselines end with `&& sync`; obsdelta fsyncs its own "
        "output. Start-up and training reads are measured warm."
    )
    records = []
    for item in inputs:
        record = {**asdict(item), "path": str(item.path), "name": item.path.name}
        record["label"] = item.label if item.seed >= 0 else f"{item.label.split(' ')[0]} real pool"
        record["zstd_ratio"] = bench.inputs_zstd.get(item.path.name)
        records.append(record)
    results = {
        "machine": machine_info(out),
        "settings": {
            "command": shlex.join(["python", "benchmarks/run.py", *(argv or sys.argv[1:])]),
            "sizes_gb": args.sizes,
            "cache": "drop_caches" if drop_all else "fadvise",
            "cache_note": cache_note,
            "repeat": args.repeat,
            "loadavg_start": loadavg_start,
            "loadavg_end": loadavg(),
            "total_seconds": time.perf_counter() - started,
        },
        "obsdelta_source": source,
        "inputs": records,
        "checks": checks,
        "timings": [asdict(t) for t in bench.timings],
        "notes": [
            "zstd ratio of an input = its bytes / the bytes of the `zstd -1 -T1` output "
            "(tar stream for a memmap folder).",
        ],
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    markdown = out / "results.md"
    markdown.write_text(render(results))
    print(f"wrote {markdown} and {out / 'results.json'}", file=sys.stderr)
    remove(scratch)
    if args.publish:
        published = BENCH / "RESULTS.md"
        kept = other_sections(published.read_text()) if published.exists() else ""
        published.write_text(markdown.read_text().rstrip("\n") + "\n" + kept)


def other_sections(text: str) -> str:
    """The sections of a published RESULTS.md that another script of this folder wrote (a
    heading naming it, as ``## ... (`gzip_reads.py`)``): a new run of this one keeps them.

    >>> other_sections("# run\\n## Targets\\nx\\n## Reads (`gzip_reads.py`)\\ny\\n")
    '\\n## Reads (`gzip_reads.py`)\\ny\\n'
    """
    found = re.search(r"^## .*\(`(?!run\.py)\w+\.py`\)$", text, flags=re.M)
    return "" if found is None else "\n" + text[found.start() :]


if __name__ == "__main__":
    main()
