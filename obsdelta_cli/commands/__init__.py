"""The four commands as library functions; each returns a
:class:`~obsdelta_cli.report.DatasetResult` and raises the
:class:`~obsdelta_cli.errors.ObsdeltaError` family."""

from __future__ import annotations

from .common import DEFAULT_CHUNK_MB
from .compress import compress
from .inflate import inflate
from .report import report
from .verify import verify

__all__ = ["DEFAULT_CHUNK_MB", "compress", "inflate", "report", "verify"]
