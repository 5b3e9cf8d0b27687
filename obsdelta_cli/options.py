"""What a command is asked to do, as the command line sets it: one frozen dataclass per
command, built by the CLI and run by the job runner (in this process, in a worker process or on
a Dask cluster) through the library function of the same name, argument by argument.

>>> CompressOptions(codec="fp16", keys=("observation",)).command
'compress'
>>> InflateOptions(force=True).named_after_input
False
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .interrupts import import_heavy
from .names import DEFAULT_CHUNK_MB, DEFAULT_CODEC

if TYPE_CHECKING:
    from .report import DatasetResult

#: The module with the command implementations, imported when a job runs (numpy and h5py;
#: torch only where a format or codec needs it): the one place the command line names it.
IMPLEMENTATION = "obsdelta_cli.commands"


def load_commands() -> None:
    """Import the command implementations as heavy modules are imported (``import_heavy``):
    each ``run`` then takes its function from the loaded module."""
    import_heavy(IMPLEMENTATION)


@dataclass(frozen=True)
class CompressOptions:
    """``obsdelta compress``: see :func:`obsdelta_cli.compress`."""

    command: ClassVar[str] = "compress"
    codec: str = DEFAULT_CODEC
    keys: tuple[str, ...] | None = None
    max_abs_error: float | None = None
    exceptions: bool = True
    time_dim: int = -1
    force: bool = False
    chunk_mb: float = DEFAULT_CHUNK_MB
    h5_compression: str | None = None
    verify: bool = True
    pack: bool = False
    flat: bool = False

    def run(self, input: Path, output: Path | None) -> DatasetResult:
        """Compress ``input`` into ``output``."""
        assert output is not None, "compress writes an output"
        load_commands()
        from .commands import compress

        return compress(
            input,
            output,
            codec=self.codec,
            keys=self.keys,
            max_abs_error=self.max_abs_error,
            exceptions=self.exceptions,
            time_dim=self.time_dim,
            force=self.force,
            chunk_mb=self.chunk_mb,
            h5_compression=self.h5_compression,
            verify=self.verify,
            pack=self.pack,
            flat=self.flat,
        )


@dataclass(frozen=True)
class InflateOptions:
    """``obsdelta inflate``: see :func:`obsdelta_cli.inflate`."""

    command: ClassVar[str] = "inflate"
    force: bool = False
    chunk_mb: float = DEFAULT_CHUNK_MB
    #: ``output`` is named after the input in a folder of outputs (see ``inflate``).
    named_after_input: bool = False

    def run(self, input: Path, output: Path | None) -> DatasetResult:
        """Inflate ``input`` into ``output``."""
        assert output is not None, "inflate writes an output"
        load_commands()
        from .commands import inflate

        return inflate(
            input,
            output,
            force=self.force,
            chunk_mb=self.chunk_mb,
            named_after_input=self.named_after_input,
        )


@dataclass(frozen=True)
class ReportOptions:
    """``obsdelta report``: see :func:`obsdelta_cli.report`."""

    command: ClassVar[str] = "report"
    codec: str = DEFAULT_CODEC
    keys: tuple[str, ...] | None = None
    max_abs_error: float | None = None
    time_dim: int = -1
    chunk_mb: float = DEFAULT_CHUNK_MB
    pack: bool = False
    flat: bool = False

    def run(self, input: Path, output: Path | None = None) -> DatasetResult:
        """Report on ``input`` (nothing is written)."""
        load_commands()
        from .commands import report

        return report(
            input,
            codec=self.codec,
            keys=self.keys,
            max_abs_error=self.max_abs_error,
            time_dim=self.time_dim,
            chunk_mb=self.chunk_mb,
            pack=self.pack,
            flat=self.flat,
        )


@dataclass(frozen=True)
class VerifyOptions:
    """``obsdelta verify``: see :func:`obsdelta_cli.verify`."""

    command: ClassVar[str] = "verify"
    chunk_mb: float = DEFAULT_CHUNK_MB

    def run(self, input: Path, output: Path | None = None) -> DatasetResult:
        """Verify ``input`` (nothing is written)."""
        load_commands()
        from .commands import verify

        return verify(input, chunk_mb=self.chunk_mb)


#: The options of any command.
Options = CompressOptions | InflateOptions | ReportOptions | VerifyOptions
