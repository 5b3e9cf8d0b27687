"""The ``obsdelta`` command line: a thin Typer layer over the library commands.

Commands only parse options, build jobs and print. Every expected failure is an
:class:`~obsdelta_cli.errors.ObsdeltaError`; :func:`_run` turns it into one line on stderr and an
exit code, the only place that does so.

Nothing here imports torch, tensordict or h5py: the commands are imported when one runs (by
:mod:`obsdelta_cli.batch`), so ``--version`` and ``--help`` start fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from . import __version__, interrupts
from .batch import Job, Outcome, outputs_for, packed_name, run_all
from .errors import ObsdeltaError, UsageError
from .names import AUTO, CODECS, DEFAULT_CHUNK_MB, DEFAULT_CODEC, H5_COMPRESSIONS
from .options import CompressOptions, InflateOptions, Options, ReportOptions, VerifyOptions
from .plot import check_plotting, plot_report
from .progress import Progress, RichProgress, showing
from .render import render, render_summary
from .report import SCHEMA

# Enums let Typer validate choices (exit code 2) and list them in --help.
CodecName = Enum("CodecName", {c: c for c in [*CODECS, AUTO]}, type=str)  # type: ignore[misc]
H5Compression = Enum("H5Compression", {c: c for c in H5_COMPRESSIONS}, type=str)  # type: ignore[misc]
DEFAULT = CodecName(DEFAULT_CODEC)

CODEC_PANEL, OUTPUT_PANEL, BATCH_PANEL, ADVANCED_PANEL = "Codec", "Output", "Batch runs", "Advanced"


def _flags_as_flags(command: Any, ctx: Any) -> None:
    """Show on/off options as ``--force``, not ``--force <bool>`` (recent Typer prints a type
    for every option in its rich help, flags included; an empty metavar prints none)."""
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


class _Group(TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        _flags_as_flags(self, ctx)
        super().format_help(ctx, formatter)


class _Command(TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        _flags_as_flags(self, ctx)
        super().format_help(ctx, formatter)


app = typer.Typer(
    name="obsdelta",
    cls=_Group,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

InputsArg = Annotated[
    list[Path],
    typer.Argument(
        metavar="INPUT",
        show_default=False,
        help="Datasets: TED memmap folders, .pt files, replay-buffer dumps, or D4RL / robomimic "
        "/ TED HDF5 files (detected from content). Several may be given.",
    ),
]
OutputOpt = Annotated[
    str,  # kept as typed: a trailing "/" asks for a folder
    typer.Option(
        "--output",
        "-o",
        metavar="PATH",
        rich_help_panel=OUTPUT_PANEL,
        help="Where to write the result; with several inputs (or a path ending in /), a folder "
        "that receives one output per input, under the input's name.",
    ),
]
CodecOpt = Annotated[
    CodecName,
    typer.Option(
        "--codec",
        metavar="CODEC",
        rich_help_panel=CODEC_PANEL,
        help="How next observations are stored: "
        + "; ".join(f"{c}: {escape(summary)}" for c, summary in CODECS.items())
        + f"; {AUTO}: per key, the smallest codec within --max-abs-error (default 0: lossless)",
    ),
]
KeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--key",
        "-k",
        metavar="KEY",
        rich_help_panel=CODEC_PANEL,
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
        metavar="E",
        rich_help_panel=CODEC_PANEL,
        help="Error bound E: every rebuilt value is within E of the original; rows a codec "
        "cannot store within E are kept exactly as exception rows.",
    ),
]
TimeDimOpt = Annotated[
    int,
    typer.Option(
        "--time-dim",
        metavar="N",
        rich_help_panel=ADVANCED_PANEL,
        help="Batch dimension that is time (default: the last).",
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", "-f", rich_help_panel=OUTPUT_PANEL, help="Replace OUTPUT if it exists."
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        rich_help_panel=OUTPUT_PANEL,
        help="Print one JSON object per input on stdout, nothing else.",
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", rich_help_panel=OUTPUT_PANEL, help="Print nothing on success."),
]
FlatOpt = Annotated[
    bool,
    typer.Option(
        "--flat",
        rich_help_panel=OUTPUT_PANEL,
        help="With --pack, HDF5 files of many episodes (robomimic, Minari): each key's "
        "datasets of every episode stored as one, which packs smaller and faster; h5py, "
        "open_dataset and inflate read the file, robomimic's and Minari's own readers do not.",
    ),
]
ChunkOpt = Annotated[
    float,
    typer.Option(
        "--chunk-mb",
        min=0.001,
        metavar="MIB",
        rich_help_panel=ADVANCED_PANEL,
        help="Memory budget per chunk of rows, in MiB.",
    ),
]
JobsOpt = Annotated[
    int,
    typer.Option(
        "--jobs",
        "-j",
        min=1,
        metavar="N",
        rich_help_panel=BATCH_PANEL,
        help="Worker processes for several inputs.",
    ),
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="ADDRESS",
        rich_help_panel=BATCH_PANEL,
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
    # The width is the terminal's, or COLUMNS, or 80: tables fit it (see render.py).
    return Console(stderr=stderr)


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


def _interrupted(
    exc: KeyboardInterrupt, command: str, total: int, outcomes: list[Outcome], folder: Path | None
) -> str:
    """The one line for Ctrl-C or SIGTERM: what was stopped and what is left."""
    done = sum(o.result is not None for o in outcomes)
    line = f"obsdelta: {command} {interrupts.describe(exc)}"
    if total > 1:
        line += f" after {done} of {total} inputs"
        if done and folder is not None:
            line += f"; the finished outputs are in {folder}"
    return line + "; no partial output was left"


def _namer(options: Options) -> Callable[[Path], str]:
    """How an input's output is named in a folder of outputs: after the input, a packed file
    as an HDF5 file (``inflate`` of a packed file drops what that added again)."""
    if isinstance(options, CompressOptions) and options.pack:
        return packed_name
    return lambda p: p.name


def _run(
    options: Options,
    inputs: list[Path],
    output_arg: str | None,
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
    made: Path | None = None  # an output folder created here, removed again if left empty
    output = None if output_arg is None else Path(output_arg)
    folder = output is not None and (len(inputs) > 1 or str(output_arg).endswith("/"))
    try:
        if plot is not None:
            if len(inputs) != 1:
                raise UsageError("--plot takes one input", hint="run report once per input")
            check_plotting(plot)
        outputs = outputs_for(inputs, output, folder=folder, name=_namer(options))
        if folder and isinstance(options, InflateOptions):
            options = replace(options, named_after_input=True)
        if folder and output is not None and not output.exists():
            with interrupts.deferred():  # a Ctrl-C between the two would leave the folder
                output.mkdir()
                made = output
        todo = [Job(i, o, options) for i, o in zip(inputs, outputs, strict=True)]
        bars = not (as_json or quiet) and _console(stderr=True).is_terminal
        with (
            showing(RichProgress(options.command) if bars else Progress()) as progress,
            closing(run_all(todo, workers=jobs, scheduler=scheduler)) as results,
        ):
            # Workers' own bars stay in their processes: here, the inputs done so far.
            apart = (jobs > 1 or scheduler is not None) and len(todo) > 1
            counted = progress.inputs(len(todo)) if apart else None
            for outcome in results:
                outcomes.append(outcome)
                _show(outcome, as_json=as_json, quiet=quiet)
                if counted is not None:
                    progress.advance(counted, 1)
                interrupts.check()
        if plot is not None and outcomes[0].result is not None:
            plot_report(outcomes[0].result, plot)
    except ObsdeltaError as exc:
        print(f"obsdelta: error: {exc}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt as exc:
        where = output if folder else None
        line = _interrupted(exc, options.command, len(inputs), outcomes, where)
        print(line, file=sys.stderr)
        interrupts.reported.append(line)
        raise typer.Exit(interrupts.exit_code(exc)) from None
    finally:
        if made is not None and made.is_dir() and not any(made.iterdir()):
            made.rmdir()
    if len(outcomes) > 1 and not (as_json or quiet):
        render_summary(outcomes, _console())
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


@app.command(cls=_Command)
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
            rich_help_panel=CODEC_PANEL,
            help="Refuse a key rather than store exception rows, so that every row is rebuilt "
            "from the delta leaf alone (as TorchRL's NextObservationDelta does).",
        ),
    ] = False,
    time_dim: TimeDimOpt = -1,
    h5_compression: Annotated[
        H5Compression | None,
        typer.Option(
            "--h5-compression",
            metavar="FILTER",
            rich_help_panel=OUTPUT_PANEL,
            help="HDF5 only: lossless filter for the stored datasets: "
            + ", ".join(H5_COMPRESSIONS)
            + " (zstd and blosc need hdf5plugin). Default: the filter of the dataset each "
            "replaces.",
        ),
    ] = None,
    pack: Annotated[
        bool,
        typer.Option(
            "--pack",
            rich_help_panel=OUTPUT_PANEL,
            help="Write one HDF5 file, every dataset chunked along time and compressed with "
            "the hdf5plugin filter that measured smallest for its key; h5py reads it, "
            "open_dataset trains from it, inflate gives back the original container. Takes "
            "datasets with no next observations too (Minari): every dataset filtered.",
        ),
    ] = False,
    flat: FlatOpt = False,
    force: ForceOpt = False,
    no_verify: Annotated[
        bool,
        typer.Option(
            "--no-verify",
            rich_help_panel=ADVANCED_PANEL,
            help="Skip re-reading and checking the output before it is put in place.",
        ),
    ] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    chunk_mb: ChunkOpt = DEFAULT_CHUNK_MB,
    jobs: JobsOpt = 1,
    scheduler: SchedulerOpt = None,
) -> None:
    """Replace each ("next", k) with a compact delta and write a new dataset.

    Example: obsdelta compress sample_data/hopper_ted -o hopper_small
    """
    options = CompressOptions(
        codec=codec.value,
        keys=None if key is None else tuple(key),
        max_abs_error=max_abs_error,
        exceptions=not no_exceptions,
        time_dim=time_dim,
        force=force,
        chunk_mb=chunk_mb,
        h5_compression=h5_compression and h5_compression.value,
        verify=not no_verify,
        pack=pack,
        flat=flat,
    )
    _run(
        options,
        input,
        output,
        as_json=as_json,
        quiet=quiet,
        jobs=jobs,
        scheduler=scheduler,
    )


@app.command(cls=_Command)
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

    Example: obsdelta inflate hopper_small -o hopper_full
    """
    _run(
        InflateOptions(force=force, chunk_mb=chunk_mb),
        input,
        output,
        as_json=as_json,
        quiet=quiet,
        jobs=jobs,
        scheduler=scheduler,
    )


@app.command(cls=_Command)
def report(
    input: InputsArg,
    codec: Annotated[
        CodecName,
        typer.Option(
            "--codec",
            metavar="CODEC",
            rich_help_panel=CODEC_PANEL,
            help="Codec whose estimate is marked and totalled (dry run): "
            + ", ".join([*CODECS, AUTO])
            + ".",
        ),
    ] = DEFAULT,
    key: KeyOpt = None,
    max_abs_error: BoundOpt = None,
    time_dim: TimeDimOpt = -1,
    pack: Annotated[
        bool,
        typer.Option(
            "--pack",
            rich_help_panel=OUTPUT_PANEL,
            help="Predict the size of compress --pack's file (from a sample of each key's "
            "chunks) as the size after.",
        ),
    ] = False,
    flat: FlatOpt = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="PNG",
            rich_help_panel=OUTPUT_PANEL,
            help="Also draw sizes per key and codec and the error per dimension to this PNG "
            "(needs matplotlib; one input).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    chunk_mb: ChunkOpt = DEFAULT_CHUNK_MB,
    jobs: JobsOpt = 1,
    scheduler: SchedulerOpt = None,
) -> None:
    """Sizes and errors: every codec on a plain dataset, or what a compressed one holds.

    Example: obsdelta report sample_data/hopper_d4rl.hdf5 --max-abs-error 1e-3
    """
    options = ReportOptions(
        codec=codec.value,
        keys=None if key is None else tuple(key),
        max_abs_error=max_abs_error,
        time_dim=time_dim,
        chunk_mb=chunk_mb,
        pack=pack,
        flat=flat,
    )
    _run(
        options,
        input,
        None,
        as_json=as_json,
        quiet=False,
        jobs=jobs,
        scheduler=scheduler,
        plot=plot,
    )


@app.command(cls=_Command)
def verify(
    input: InputsArg,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    chunk_mb: ChunkOpt = DEFAULT_CHUNK_MB,
    jobs: JobsOpt = 1,
    scheduler: SchedulerOpt = None,
) -> None:
    """Check a compressed dataset: metadata, every checksum, and a full rebuild of each key.

    Example: obsdelta verify hopper_small && echo sound
    """
    _run(
        VerifyOptions(chunk_mb=chunk_mb),
        input,
        None,
        as_json=as_json,
        quiet=quiet,
        jobs=jobs,
        scheduler=scheduler,
    )
