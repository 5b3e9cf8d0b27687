"""The ``obsdelta`` command line: a thin Typer layer over :mod:`obsdelta_cli.pipeline`.

Commands only parse options, call the library and print. Every expected failure is an
:class:`~obsdelta_cli.errors.ObsdeltaError`, turned into one line on stderr and an exit code in
:func:`_run` — the only place that does so.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from . import __version__, pipeline
from .codecs import AUTO, CODECS, DEFAULT_CODEC
from .errors import ObsdeltaError
from .formats.hdf5 import H5_COMPRESSIONS
from .report import DatasetResult, render

# An Enum lets Typer validate --codec (exit code 2) and list the choices in --help.
CodecName = Enum("CodecName", {c: c for c in [*CODECS, AUTO]}, type=str)  # type: ignore[misc]
DEFAULT = CodecName(DEFAULT_CODEC)
H5Compression = Enum("H5Compression", {c: c for c in H5_COMPRESSIONS}, type=str)  # type: ignore[misc]

app = typer.Typer(
    name="obsdelta",
    help="Store the next observation of trajectory datasets as a compact delta, and back.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

CodecOpt = Annotated[
    CodecName,
    typer.Option(
        "--codec",
        help="How deltas are stored: " + "; ".join(f"{c.id}: {c.summary}" for c in CODECS.values()),
    ),
]
KeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--key",
        "-k",
        help="Observation key to encode, slash-joined (e.g. agent/obs); repeat for more. "
        "Default: every floating-point leaf with a same-shaped twin under 'next'.",
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
InputArg = Annotated[
    Path,
    typer.Argument(
        help="Dataset: TED memmap folder, .pt file, replay-buffer dump, or D4RL / robomimic / "
        "TED HDF5 file (detected from content)."
    ),
]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Where to write the result.")]


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


def _console() -> Console:
    # Pipes get Rich's 80 columns otherwise; tables are wider than that.
    console = Console()
    return console if console.is_terminal else Console(width=120)


def _run(job: Callable[[], DatasetResult], *, as_json: bool, quiet: bool) -> None:
    """Run one command: print its result, or its error as one line on stderr with an exit code."""
    try:
        result = job()
    except ObsdeltaError as exc:
        print(f"obsdelta: error: {exc}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt as exc:
        signal_name = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"obsdelta: {signal_name}; no output was written", file=sys.stderr)
        raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
    elif not quiet:
        render(result, _console())


@app.command()
def compress(
    input: InputArg,
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
    chunk_mb: ChunkOpt = pipeline.DEFAULT_CHUNK_MB,
) -> None:
    """Replace each ("next", k) with a delta ("next", "delta", k) and write a new dataset.

    Example: obsdelta compress rollouts/ -o rollouts_small/ --codec auto --max-abs-error 1e-4
    """
    _run(
        lambda: pipeline.compress(
            input,
            output,
            codec=codec.value,
            keys=key,
            max_abs_error=max_abs_error,
            exceptions=not no_exceptions,
            time_dim=time_dim,
            force=force,
            chunk_mb=chunk_mb,
            options={"h5_compression": h5_compression and h5_compression.value},
            verify=not no_verify,
        ),
        as_json=as_json,
        quiet=quiet,
    )


@app.command()
def inflate(
    input: InputArg,
    output: OutputOpt,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    chunk_mb: ChunkOpt = pipeline.DEFAULT_CHUNK_MB,
) -> None:
    """Rebuild ("next", k) from its delta, in the original dtype, layout and key order.

    Example: obsdelta inflate rollouts_small/ -o rollouts_full/
    """
    _run(
        lambda: pipeline.inflate(input, output, force=force, chunk_mb=chunk_mb),
        as_json=as_json,
        quiet=quiet,
    )


@app.command()
def report(
    input: InputArg,
    codec: Annotated[
        CodecName,
        typer.Option("--codec", help="Codec whose estimate is marked and totalled (dry run)."),
    ] = DEFAULT,
    key: KeyOpt = None,
    max_abs_error: BoundOpt = None,
    time_dim: TimeDimOpt = -1,
    as_json: JsonOpt = False,
    chunk_mb: ChunkOpt = pipeline.DEFAULT_CHUNK_MB,
) -> None:
    """Sizes and round-trip errors: all codecs on a plain dataset, or what a compressed one holds.

    Example: obsdelta report rollouts/ --max-abs-error 1e-3 --json
    """
    _run(
        lambda: pipeline.report(
            input,
            codec=codec.value,
            keys=key,
            max_abs_error=max_abs_error,
            time_dim=time_dim,
            chunk_mb=chunk_mb,
        ),
        as_json=as_json,
        quiet=False,
    )


@app.command()
def verify(
    input: InputArg,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    chunk_mb: ChunkOpt = pipeline.DEFAULT_CHUNK_MB,
) -> None:
    """Check a compressed dataset: metadata, every checksum, and a full rebuild of each key.

    Example: obsdelta verify rollouts_small/ && echo sound
    """
    _run(lambda: pipeline.verify(input, chunk_mb=chunk_mb), as_json=as_json, quiet=quiet)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that partial output is cleaned up the same way."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def main() -> None:
    """Console-script entry point."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="obsdelta")
