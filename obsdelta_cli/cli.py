"""The ``obsdelta`` command line: a thin Typer layer over :mod:`obsdelta_cli.pipeline`.

Commands only parse options, build jobs and print. Every expected failure is an
:class:`~obsdelta_cli.errors.ObsdeltaError`; :func:`_run` turns it into one line on stderr and an
exit code, the only place that does so.
"""

from __future__ import annotations

import json
import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from .batch import Job, Outcome, outputs_for, run_all
from .codecs import AUTO, CODECS, DEFAULT_CODEC
from .commands import DEFAULT_CHUNK_MB
from .errors import ObsdeltaError, UsageError
from .formats.hdf5 import H5_COMPRESSIONS
from .plot import check_plotting, plot_report
from .progress import Progress, RichProgress, showing
from .report import SCHEMA, render

# Enums let Typer validate choices (exit code 2) and list them in --help.
CodecName = Enum("CodecName", {c: c for c in [*CODECS, AUTO]}, type=str)  # type: ignore[misc]
H5Compression = Enum("H5Compression", {c: c for c in H5_COMPRESSIONS}, type=str)  # type: ignore[misc]
DEFAULT = CodecName(DEFAULT_CODEC)

app = typer.Typer(
    name="obsdelta",
    help="Store the next observation of trajectory datasets as a compact delta, and back.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

InputsArg = Annotated[
    list[Path],
    typer.Argument(
        help="Datasets: TED memmap folders, .pt files, replay-buffer dumps, or D4RL / robomimic "
        "/ TED HDF5 files (detected from content). Several may be given.",
    ),
]
OutputOpt = Annotated[
    str,  # kept as typed: a trailing "/" asks for a folder
    typer.Option(
        "--output",
        "-o",
        help="Where to write the result; with several inputs (or a path ending in /), a folder "
        "that receives one output per input, under the input's name.",
    ),
]
CodecOpt = Annotated[
    CodecName,
    typer.Option(
        "--codec",
        help="How next observations are stored: "
        + "; ".join(f"{c.id}: {c.summary}" for c in CODECS.values())
        + f"; {AUTO}: per key, the smallest codec within --max-abs-error (default 0: lossless)",
    ),
]
KeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--key",
        "-k",
        help="Observation to encode, by name (e.g. observation, agent/obs, next_observations, "
        "obs/agentview_image); repeat for more. Default: every one the codec can encode.",
    ),
]
BoundOpt = Annotated[
    float | None,
    typer.Option(
        "--max-abs-error",
        "-e",
        min=0.0,
        help="Error bound E: every rebuilt value is within E of the original; rows a codec "
        "cannot store within E are kept exactly as exception rows.",
    ),
]
TimeDimOpt = Annotated[
    int, typer.Option("--time-dim", help="Batch dimension that is time (default: the last).")
]
ForceOpt = Annotated[bool, typer.Option("--force", "-f", help="Replace OUTPUT if it exists.")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON object per input on stdout, nothing else.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success.")]
ChunkOpt = Annotated[
    float,
    typer.Option("--chunk-mb", min=0.001, help="Memory budget per chunk of rows, in MiB."),
]
JobsOpt = Annotated[
    int, typer.Option("--jobs", "-j", min=1, help="Worker processes for several inputs.")
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        help="Address of a Dask distributed scheduler (e.g. tcp://10.0.0.5:8786) to run the "
        "inputs on; paths must be reachable from its workers.",
    ),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"obsdelta {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Store the next observation of trajectory datasets as a compact delta, and back.

    Example: obsdelta compress sample_data/hopper_ted -o hopper_small
    """


def _console(stderr: bool = False) -> Console:
    # Pipes get Rich's 80 columns otherwise; tables are wider than that.
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(width=120, stderr=stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that partial output is cleaned up the same way."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def _error_line(outcome: Outcome) -> str:
    """The JSON line of a failed input, so that scripts see every input's fate on stdout."""
    job = outcome.job
    line = {
        "schema": SCHEMA,
        "command": job.command,
        "input": str(job.input),
        "output": None if job.output is None else str(job.output),
        "ok": False,
        "error": outcome.error,
    }
    return json.dumps(line)


def _summary(outcomes: list[Outcome], console: Console) -> None:
    table = Table(title="summary", title_justify="left")
    for name in ("input", "status", "before", "after", "seconds"):
        table.add_column(name, justify="left" if name in ("input", "status") else "right")
    for o in outcomes:
        r = o.result
        status = "[green]ok[/green]" if r else f"[red]failed ({o.exit_code})[/red]"
        before = f"{r.bytes_before:,}" if r else ""
        after = f"{r.bytes_after:,}" if r else ""
        table.add_row(str(o.job.input), status, before, after, f"{o.seconds:.2f}")
    console.print(table)


def _run(
    command: str,
    inputs: list[Path],
    output_arg: str | None,
    options: dict[str, Any],
    *,
    as_json: bool,
    quiet: bool,
    jobs: int = 1,
    scheduler: str | None = None,
    plot: Path | None = None,
) -> None:
    """Run a command on every input; print each result, or its error as one line on stderr.

    The exit code is 0 if every input succeeded, else the highest of the failures' codes.
    """
    outcomes: list[Outcome] = []
    try:
        if plot is not None:
            if len(inputs) != 1:
                raise UsageError("--plot takes one input", hint="run report once per input")
            check_plotting(plot)
        output = None if output_arg is None else Path(output_arg)
        folder = output_arg is not None and (len(inputs) > 1 or output_arg.endswith("/"))
        outputs = outputs_for(inputs, output, folder=folder)
        if folder and output is not None:
            output.mkdir(exist_ok=True)
        todo = [Job(command, i, o, options) for i, o in zip(inputs, outputs, strict=True)]
        bars = not (as_json or quiet) and _console(stderr=True).is_terminal
        with showing(RichProgress(command) if bars else Progress()):
            for outcome in run_all(todo, workers=jobs, scheduler=scheduler):
                outcomes.append(outcome)
                _show(outcome, as_json=as_json, quiet=quiet)
        if plot is not None and outcomes[0].result is not None:
            plot_report(outcomes[0].result, plot)
    except ObsdeltaError as exc:
        print(f"obsdelta: error: {exc}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt as exc:
        name = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"obsdelta: {name}; no partial output was left", file=sys.stderr)
        raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None
    if len(outcomes) > 1 and not (as_json or quiet):
        _summary(outcomes, _console())
    code = max((o.exit_code for o in outcomes), default=0)
    if code:
        raise typer.Exit(code)


def _show(outcome: Outcome, *, as_json: bool, quiet: bool) -> None:
    if outcome.result is None:
        print(f"obsdelta: error: {outcome.error}", file=sys.stderr)
        if as_json:
            sys.stdout.write(_error_line(outcome) + "\n")
    elif as_json:
        sys.stdout.write(outcome.result.to_json() + "\n")
    elif not quiet:
        render(outcome.result, _console())
    sys.stdout.flush()


@app.command()
def compress(
    input: InputsArg,
    output: OutputOpt,
    codec: CodecOpt = DEFAULT,
    key: KeyOpt = None,
    max_abs_error: BoundOpt = None,
    no_exceptions: Annotated[
        bool,
        typer.Option(
            "--no-exceptions",
            help="Refuse a key rather than store exception rows, so that every row is rebuilt "
            "from the delta leaf alone (as TorchRL's NextObservationDelta does).",
        ),
    ] = False,
    time_dim: TimeDimOpt = -1,
    h5_compression: Annotated[
        H5Compression | None,
        typer.Option(
            "--h5-compression",
            help="HDF5 only: lossless filter for the stored datasets (zstd and blosc need "
            "hdf5plugin). Default: the filter of the dataset each replaces.",
        ),
    ] = None,
    force: ForceOpt = False,
    no_verify: Annotated[
        bool,
        typer.Option(
            "--no-verify", help="Skip re-reading and checking the output before it is put in place."
        ),
    ] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    chunk_mb: ChunkOpt = DEFAULT_CHUNK_MB,
    jobs: JobsOpt = 1,
    scheduler: SchedulerOpt = None,
) -> None:
    """Replace each ("next", k) with a delta ("next", "delta", k) and write a new dataset.

    Example: obsdelta compress rollouts/ -o rollouts_small/ --codec auto --max-abs-error 1e-4
    """
    options = {
        "codec": codec.value,
        "keys": key,
        "max_abs_error": max_abs_error,
        "exceptions": not no_exceptions,
        "time_dim": time_dim,
        "force": force,
        "chunk_mb": chunk_mb,
        "options": {"h5_compression": h5_compression and h5_compression.value},
        "verify": not no_verify,
    }
    _run(
        "compress",
        input,
        output,
        options,
        as_json=as_json,
        quiet=quiet,
        jobs=jobs,
        scheduler=scheduler,
    )


@app.command()
def inflate(
    input: InputsArg,
    output: OutputOpt,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    chunk_mb: ChunkOpt = DEFAULT_CHUNK_MB,
    jobs: JobsOpt = 1,
    scheduler: SchedulerOpt = None,
) -> None:
    """Rebuild ("next", k) from its delta, in the original dtype, layout and key order.

    Example: obsdelta inflate rollouts_small/ -o rollouts_full/
    """
    options = {"force": force, "chunk_mb": chunk_mb}
    _run(
        "inflate",
        input,
        output,
        options,
        as_json=as_json,
        quiet=quiet,
        jobs=jobs,
        scheduler=scheduler,
    )


@app.command()
def report(
    input: InputsArg,
    codec: Annotated[
        CodecName,
        typer.Option("--codec", help="Codec whose estimate is marked and totalled (dry run)."),
    ] = DEFAULT,
    key: KeyOpt = None,
    max_abs_error: BoundOpt = None,
    time_dim: TimeDimOpt = -1,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Also draw sizes per key and codec and the error per dimension to this PNG "
            "(needs matplotlib; one input).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    chunk_mb: ChunkOpt = DEFAULT_CHUNK_MB,
    jobs: JobsOpt = 1,
    scheduler: SchedulerOpt = None,
) -> None:
    """Sizes and round-trip errors: all codecs on a plain dataset, or what a compressed one holds.

    Example: obsdelta report rollouts/ --max-abs-error 1e-3 --json
    """
    options = {
        "codec": codec.value,
        "keys": key,
        "max_abs_error": max_abs_error,
        "time_dim": time_dim,
        "chunk_mb": chunk_mb,
    }
    _run(
        "report",
        input,
        None,
        options,
        as_json=as_json,
        quiet=False,
        jobs=jobs,
        scheduler=scheduler,
        plot=plot,
    )


@app.command()
def verify(
    input: InputsArg,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    chunk_mb: ChunkOpt = DEFAULT_CHUNK_MB,
    jobs: JobsOpt = 1,
    scheduler: SchedulerOpt = None,
) -> None:
    """Check a compressed dataset: metadata, every checksum, and a full rebuild of each key.

    Example: obsdelta verify rollouts_small/ && echo sound
    """
    _run(
        "verify",
        input,
        None,
        {"chunk_mb": chunk_mb},
        as_json=as_json,
        quiet=quiet,
        jobs=jobs,
        scheduler=scheduler,
    )


def main() -> None:
    """Console-script entry point."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="obsdelta")
