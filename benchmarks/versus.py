"""The same commands on the same inputs from two revisions of the package, run in turn.

    python benchmarks/versus.py BASE [--rev REV] [--sizes 2] [--repeat 5] [--out benchmarks/out]
                                     [--publish]

For each input of ``run.py`` (a TED memmap folder and a D4RL HDF5 file of each size): compress
``--codec exact`` and ``--codec fp16``, then ``inflate`` and ``verify`` of the exact output.
Each command runs once untimed from each revision, then ``--repeat`` times from each in turn
(BASE, REV, BASE, REV, ...), warm, each revision writing its own outputs. Printed per command:
the medians of wall seconds and peak RSS of each revision, and the median over the pairs of
REV's seconds over BASE's (runs in turn keep that ratio fair when the machine's speed drifts).
Both revisions run as snapshots of the package (``python -m obsdelta_cli``); REV defaults to
HEAD. Writes OUT/versus.md; with ``--publish`` also benchmarks/VERSUS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from inputs import D4RL, TED, BenchInput, ensure_input
from measure import Run, remove, run_timed, warm_up
from run import PYTHON, SEEDS, loadavg, parse_sizes
from source import PACKAGE, compile_bytecode, export_snapshot, obsdelta_argv
from tables import machine_info

BENCH = Path(__file__).resolve().parent


def commands(item: BenchInput, work: Path) -> list[tuple[str, list[str], Path | None]]:
    """(name, arguments after ``obsdelta``, output to remove before each run) per command."""
    suffix = "" if item.path.is_dir() else ".hdf5"
    exact, fp16 = work / f"exact{suffix}", work / f"fp16{suffix}"
    back = work / f"inflated{suffix}"
    src = str(item.path)
    return [
        ("compress --codec exact", ["compress", src, "-o", str(exact), "--codec", "exact"], exact),
        ("compress --codec fp16", ["compress", src, "-o", str(fp16), "--codec", "fp16"], fp16),
        ("inflate (exact file)", ["inflate", str(exact), "-o", str(back)], back),
        ("verify (exact file)", ["verify", str(exact)], None),
    ]


def timed(argv: list[str], output: Path | None) -> Run:
    if output is not None:
        remove(output)
    run = run_timed(argv)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({run.returncode}):\n{run.stderr}")
    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the revision measured against (a commit)")
    parser.add_argument("--rev", default="HEAD", help="the revision measured (default HEAD)")
    parser.add_argument("--sizes", type=parse_sizes, default=[2.0], help="input sizes in GB")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per revision")
    parser.add_argument("--out", type=Path, default=BENCH / "out")
    parser.add_argument("--publish", action="store_true", help="copy versus.md to VERSUS.md")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    started, load_start = time.perf_counter(), loadavg()
    revisions = {}
    for rev in (args.base, args.rev):
        snapshot, commit = export_snapshot(out / "snapshot", rev)
        revisions[commit] = obsdelta_argv("", snapshot)
        compile_bytecode(revisions[commit])
    (base, base_argv), (new, new_argv) = revisions.items()
    rows = [
        f"| input | command | {base} s | {new} s | {new} / {base} (median of pairs) "
        f"| {base} peak RSS MB | {new} peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in args.sizes:
        for layout in (TED, D4RL):
            item = ensure_input(out / "inputs", layout, size, SEEDS[layout])
            warm_up(item.path)
            work = {rev: out / "versus" / rev / item.path.name for rev in (base, new)}
            for folder in work.values():
                remove(folder)
                folder.mkdir(parents=True)
            plans = {rev: commands(item, work[rev]) for rev in (base, new)}
            for i, (name, _, _) in enumerate(plans[base]):
                runs: dict[str, list[Run]] = {base: [], new: []}
                for turn in range(args.repeat + 1):
                    for rev, head in ((base, base_argv), (new, new_argv)):
                        _, rest, output = plans[rev][i]
                        run = timed([*head, *rest, "--json"], output)
                        if turn:  # the first of each is untimed
                            runs[rev].append(run)
                ratio = statistics.median(
                    n.seconds / b.seconds for b, n in zip(runs[base], runs[new], strict=True)
                )
                wall = {rev: statistics.median(r.seconds for r in runs[rev]) for rev in runs}
                rss = {rev: statistics.median(r.peak_rss_mb for r in runs[rev]) for rev in runs}
                label = f"{'TED memmap' if layout == TED else 'D4RL HDF5'} {size:g} GB"
                rows.append(
                    f"| {label} | {name} | {wall[base]:.2f} | {wall[new]:.2f} | {ratio:.3f}x "
                    f"| {rss[base]:.0f} | {rss[new]:.0f} |"
                )
                print(rows[-1], flush=True)
            for folder in work.values():
                remove(folder)
    m = machine_info(out)
    text = "\n".join(
        [
            f"# {new} against {base}",
            "",
            f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, Python {m['python']};"
            f" {m['date']}. Load average {load_start} at the start, {loadavg()} at the end;"
            f" {time.perf_counter() - started:.0f} s in all.",
            f"Command: `python benchmarks/versus.py {args.base} --rev {args.rev} "
            f"--sizes {','.join(f'{s:g}' for s in args.sizes)} --repeat {args.repeat}`. Both "
            f"run as `{PACKAGE}` snapshots under {Path(PYTHON).name}, {args.repeat} timed runs "
            "each in turn after one untimed, warm. Below 1x: the measured revision is faster.",
            "",
            *rows,
            "",
        ]
    )
    (out / "versus.md").write_text(text)
    if args.publish:
        (BENCH / "VERSUS.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
