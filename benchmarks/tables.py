"""The machine description and the Markdown rendering of the results."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

GB = 10**9
MB = 10**6
PACKAGES = ("torch", "tensordict", "h5py", "numpy", "gymnasium", "mujoco", "obsdelta")


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


def tool_version(argv: list[str]) -> str:
    """First line printed by a ``--version`` call, or "not available"."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError:
        return "not available"
    output = (done.stdout + done.stderr).strip()
    return output.splitlines()[0] if output else "unknown"


def machine_info(out: Path) -> dict[str, Any]:
    """CPU, cores, memory, free disk where the inputs are, versions and date of this run."""
    mem_kib = int(proc_field("/proc/meminfo", "MemTotal").split()[0])
    return {
        "cpu": proc_field("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "ram_gb": round(mem_kib * 1024 / GB, 1),
        "disk_free_gb": round(shutil.disk_usage(out).free / GB, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        **{name: package_version(name) for name in PACKAGES},
        "zstd": tool_version(["zstd", "-V"]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def machine_line(machine: dict[str, Any]) -> str:
    versions = ", ".join(f"{name} {machine[name]}" for name in PACKAGES)
    return (
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gb']} GB RAM, "
        f"{machine['disk_free_gb']} GB free on the benchmark disk, Linux {machine['kernel']}; "
        f"Python {machine['python']}, {versions}; {machine['zstd']}. Date: {machine['date']}."
    )


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(values: list[str]) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    return [line(header), "|" + "---|" * len(header), *map(line, rows)]


def number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def check_rows(checks: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for check in checks:
        verdict = "—" if check["ok"] is None else ("yes" if check["ok"] else "**no**")
        rows.append(
            [
                check["name"],
                check["obsdelta"],
                check["baseline"],
                check["measured"],
                check["target"],
                verdict,
            ]
        )
    return rows


def timing_rows(timings: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for item in timings:
        if item["status"] != "ok":
            rows.append([item["input"], item["name"], item["status"], *["—"] * 5, item["command"]])
            continue
        ratio = item.get("compression_ratio")
        rows.append(
            [
                item["input"],
                item["name"],
                number(item["seconds"]),
                number(item["input_bytes"] / MB / item["seconds"], 0),
                number(item["peak_rss_mb"], 0),
                number(item["peak_anon_mb"], 0),
                number(item["output_bytes"] / MB, 1) if item.get("output_bytes") else "—",
                f"{ratio:.3f}x" if ratio else "—",
                f"`{item['command']}`",
            ]
        )
    return rows


def render(results: dict[str, Any]) -> str:
    """RESULTS.md: machine, method, inputs, the checks against their targets, every timing."""
    settings = results["settings"]
    inputs = [
        f"- {item['label']}: `{item['name']}`, {item['rows']:,} rows, "
        f"{item['bytes'] / MB:,.1f} MB"
        + (" (cached)" if item["cached"] else f" (built in {item['build_seconds']:.1f} s)")
        + (f"; zstd -1 -T1: {item['zstd_ratio']:.3f}x" if item.get("zstd_ratio") else "")
        for item in results["inputs"]
    ]
    return "\n".join(
        [
            "# obsdelta benchmark",
            "",
            machine_line(results["machine"]),
            "",
            f"obsdelta source measured: {results['obsdelta_source']}.",
            "",
            f"Command: `{settings['command']}`. Repeats: {settings['repeat']} (median). Load "
            f"average {settings['loadavg_start']} at the start, {settings['loadavg_end']} at the "
            f"end. Total run time {settings['total_seconds'] / 60:.1f} min.",
            "",
            f"Cache: {settings['cache_note']}",
            "",
            "Inputs (non-repeating Hopper-v5 transitions, see `benchmarks/README.md`; "
            "`real` = the simulated pool itself, untouched, for comparison of zstd's ratio):",
            *inputs,
            "",
            "## Targets",
            "",
            "ratio = baseline seconds / obsdelta seconds (above 1 = obsdelta faster), except "
            "where the row says otherwise.",
            "",
            *table(
                ["check", "obsdelta", "baseline", "measured", "target", "met"],
                check_rows(results["checks"]),
            ),
            "",
            "## Every timed command",
            "",
            "Wall seconds from spawn to exit. MB/s = bytes of the plain input / seconds. Peak "
            "RSS = `ru_maxrss` from `wait4` (largest process; counts the pages of memory-mapped "
            "files touched); peak anon = sampled `RssAnon` of the command's own process. "
            "Compression ratio = input bytes / output bytes.",
            "",
            *table(
                [
                    "input",
                    "command",
                    "seconds",
                    "MB/s",
                    "peak RSS MB",
                    "peak anon MB",
                    "output MB",
                    "compression",
                    "command line",
                ],
                timing_rows(results["timings"]),
            ),
            "",
            *[f"- {line}" for line in results["notes"]],
            "",
        ]
    )
