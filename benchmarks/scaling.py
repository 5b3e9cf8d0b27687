"""Time and memory of obsdelta across input sizes, and the Dask speed-up on many shards.

    python benchmarks/scaling.py [--sizes 1,2,4] [--shards 16] [--out benchmarks/out]

Part 1 compresses TED-memmap inputs of the given sizes (the tiled Hopper rollout, as in
``run.py``) with ``--codec fp16`` and ``--codec exact`` and records wall seconds and peak RSS,
to show time linear and memory flat in the input size. Part 2 splits one input into shards and
compresses them all through a Dask ``LocalCluster`` on loopback, with 1 and then 2 worker
processes, to show the speed-up of ``--scheduler``. Writes ``scaling.md`` and ``scaling.json``
to the output folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from inputs import TED, ensure_input, load_sample
from measure import CacheMode, dataset_bytes, prepare_cache, remove, run_timed

MB = 10**6


def obsdelta(*args: str) -> list[str]:
    return [sys.executable, "-m", "obsdelta_cli", *args]


def size_rows(out: Path, sizes: list[float]) -> list[dict[str, Any]]:
    sample = load_sample()
    rows = []
    for size in sizes:
        item = ensure_input(out / "inputs", TED, size, sample)
        for codec in ("fp16", "exact"):
            target = out / "work" / f"scaling-{codec}"
            remove(target)
            prepare_cache(item.path, CacheMode.COLD)
            run = run_timed(
                obsdelta("compress", str(item.path), "-o", str(target), "--codec", codec, "--quiet")
            )
            rows.append(
                {
                    "size_gb": size,
                    "codec": codec,
                    "input_mb": item.bytes / MB,
                    "seconds": run.seconds,
                    "mb_per_s": item.bytes / MB / run.seconds,
                    "peak_rss_mb": run.peak_rss_mb,
                    "peak_anon_mb": run.peak_anon_mb,
                    "ok": run.returncode == 0,
                }
            )
            print(rows[-1], flush=True)
            remove(target)
    return rows


def shard_rows(out: Path, shards: int) -> list[dict[str, Any]]:
    import torch
    from distributed import LocalCluster

    sample = load_sample()
    folder = out / "work" / "shards"
    remove(folder)
    folder.mkdir(parents=True)
    per = torch.cat([sample] * 20)  # 60,000 rows, about 5 MB a shard
    paths = []
    for i in range(shards):
        per.memmap(folder / f"shard{i:03d}")
        paths.append(str(folder / f"shard{i:03d}"))
    total = sum(dataset_bytes(Path(p)) for p in paths)
    rows = []
    for workers in (1, 2):
        with LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster:
            # Warm the workers' imports so that both runs measure the work, not start-up.
            target = out / "work" / f"sharded-{workers}"
            remove(target)
            run_timed(
                obsdelta("report", paths[0], "--scheduler", cluster.scheduler_address, "--json")
            )
            start = time.perf_counter()
            run = run_timed(
                obsdelta(
                    "compress",
                    *paths,
                    "-o",
                    str(target),
                    "--scheduler",
                    cluster.scheduler_address,
                    "--codec",
                    "exact",
                    "--quiet",
                )
            )
            rows.append(
                {
                    "workers": workers,
                    "shards": shards,
                    "input_mb": total / MB,
                    "seconds": run.seconds,
                    "ok": run.returncode == 0,
                    "wall_incl_client": time.perf_counter() - start,
                }
            )
            print(rows[-1], flush=True)
            remove(target)
    return rows


def markdown(sizes: list[dict[str, Any]], shards: list[dict[str, Any]]) -> str:
    lines = [
        "| input | codec | MB | seconds | MB/s | peak RSS MB | peak anon MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sizes:
        lines.append(
            f"| ted {r['size_gb']:g} GB | {r['codec']} | {r['input_mb']:,.0f} | "
            f"{r['seconds']:.1f} | {r['mb_per_s']:.0f} | {r['peak_rss_mb']:,.0f} | "
            f"{r['peak_anon_mb']:,.0f} |"
        )
    if shards:
        base = shards[0]["seconds"]
        lines += [
            "",
            "| Dask workers | shards | MB | seconds | speed-up |",
            "|---|---|---|---|---|",
        ]
        for r in shards:
            lines.append(
                f"| {r['workers']} | {r['shards']} | {r['input_mb']:,.0f} | "
                f"{r['seconds']:.1f} | {base / r['seconds']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",") if s]
    size_table = size_rows(args.out, sizes)
    shard_table = shard_rows(args.out, args.shards) if args.shards else []
    (args.out / "scaling.json").write_text(
        json.dumps({"sizes": size_table, "shards": shard_table}, indent=1)
    )
    text = markdown(size_table, shard_table)
    (args.out / "scaling.md").write_text(text)
    print(text)
    if not all(r["ok"] for r in [*size_table, *shard_table]):
        sys.exit(1)


if __name__ == "__main__":
    main()
