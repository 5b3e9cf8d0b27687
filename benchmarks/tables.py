"""The machine description and the Markdown rendering of the results."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections.abc import Callable
from importlib import metadata
from typing import Any

GB = 10**9
MB = 10**6
PACKAGES = ("torch", "tensordict", "torchrl", "h5py", "numpy", "obsdelta")
COLUMNS = (
    "input",
    "command / baseline",
    "seconds",
    "MB/s",
    "ratio vs cp",
    "peak RSS MB",
    "peak anon MB",
    "output MB",
    "compression ratio",
    "max abs error",
    "notes",
)


def proc_field(path: str, name: str) -> str:
    """The value of the first ``name: value`` line of a /proc file."""
    with open(path) as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    return "unknown"


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def command_output(argv: list[str]) -> str | None:
    """What a command prints (stdout and stderr), or None if it cannot be run."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return (done.stdout + done.stderr).strip()


def tool_version(argv: list[str]) -> str:
    """First line printed by a ``--version`` call, or "not available"."""
    output = command_output(argv)
    if output is None:
        return "not available"
    return output.splitlines()[0] if output else "unknown"


def machine_info() -> dict[str, Any]:
    """CPU, memory, versions and date of this run."""
    mem_kib = int(proc_field("/proc/meminfo", "MemTotal").split()[0])
    return {
        "cpu": proc_field("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "ram_gb": round(mem_kib * 1024 / GB, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        **{name: package_version(name) for name in PACKAGES},
        "zstd": tool_version(["zstd", "-V"]),
        "h5repack": tool_version(["h5repack", "--version"]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def fixed(digits: int) -> Callable[[float], str]:
    return lambda value: f"{value:,.{digits}f}"


def general(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"


def times(value: float) -> str:
    return f"{value:,.2f}x"


FORMATS: dict[str, Callable[[float], str]] = {
    "seconds": fixed(2),
    "mb_per_s": fixed(0),
    "ratio_vs_cp": fixed(2),
    "peak_rss_mb": fixed(0),
    "peak_anon_mb": fixed(0),
    "output_bytes": lambda value: f"{value / MB:,.1f}",
    "compression_ratio": times,
    "max_abs_error": general,
}


def cells(row: dict[str, Any]) -> list[str]:
    """The table cells of one result row."""
    if row["status"] != "ok":
        return [row["input"], row["step"], row["status"], *["—"] * (len(COLUMNS) - 4), row["note"]]
    values = [
        "—" if row[field] is None else render(row[field]) for field, render in FORMATS.items()
    ]
    return [row["input"], row["step"], *values, row["note"]]


def table_line(values: list[str]) -> str:
    return "| " + " | ".join(value.replace("|", "\\|") for value in values) + " |"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [table_line(list(COLUMNS)), "|" + "---|" * len(COLUMNS)]
    lines += [table_line(cells(row)) for row in rows]
    return "\n".join(lines)


def machine_line(machine: dict[str, Any]) -> str:
    versions = ", ".join(f"{name} {machine[name]}" for name in PACKAGES)
    return (
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gb']} GB RAM, "
        f"Linux {machine['kernel']}; Python {machine['python']}, {versions}; "
        f"{machine['zstd']}; {machine['h5repack']}. Date: {machine['date']}."
    )


def inputs_lines(inputs: list[dict[str, Any]]) -> list[str]:
    return [
        f"- {item['label']}: `{item['name']}`, {item['rows']:,} rows, "
        f"{item['bytes'] / MB:,.1f} MB on disk"
        + (" (cached)" if item["cached"] else f" (built in {item['build_seconds']:.1f} s)")
        for item in inputs
    ]


def untiled_line(ratio: float | None) -> str:
    measured = "not available" if ratio is None else f"{ratio:.2f}x"
    return (
        f"zstd -1 on the untiled rollout (3,000 rows): {measured}. The inputs repeat every "
        "3,000 rows and zstd's window is larger than that period, so its ratios below are far "
        "above what it reaches on real data. gzip's 32 KB window is shorter than one period of "
        "the large datasets, and obsdelta's codecs never look further than the next row, so "
        "their ratios are those of real data."
    )


def render(results: dict[str, Any]) -> str:
    """results.md: header lines, the inputs, and one table row per input and command."""
    settings = results["settings"]
    return "\n".join(
        [
            "# obsdelta benchmark",
            "",
            machine_line(results["machine"]),
            "",
            f"obsdelta source measured: {results['obsdelta_source']}.",
            "",
            f"Command: `{settings['command']}`. Cache: {settings['cache_note']} "
            f"Repeats: {settings['repeat']} (seconds are the median). Load average "
            f"{settings['loadavg_start']} at the start, {settings['loadavg_end']} at the end. "
            f"Total run time {settings['total_seconds'] / 60:.1f} min.",
            "",
            f"obsdelta start-up (`--version`, median): {results['startup_seconds']:.2f} s, "
            "included in every obsdelta row.",
            "",
            untiled_line(results["untiled_zstd_ratio"]),
            "",
            "Inputs (the real Hopper rollout of `sample_data/hopper_ted`, tiled):",
            *inputs_lines(results["inputs"]),
            "",
            "MB = 10^6 bytes. MB/s = bytes of the uncompressed input dataset / seconds, for every "
            "row (inflate rows rebuild that many bytes). ratio vs cp = that throughput / cp's on "
            "the same input. Peak RSS = `ru_maxrss` of the command's largest process, which "
            "counts the pages of memory-mapped files it touched; peak anon = anonymous memory "
            "(heap) of the command's own process, sampled every 20 ms. Compression ratio = input "
            "bytes / output bytes. Details: `benchmarks/README.md`.",
            "",
            markdown_table(results["rows"]),
            "",
        ]
    )
