"""obsdelta: store the next observation of trajectory datasets as a compact delta.

The library API mirrors the commands: :func:`compress`, :func:`inflate`, :func:`report` and
:func:`verify` take paths and return a :class:`~obsdelta_cli.report.DatasetResult`; failures raise
:class:`ObsdeltaError`. See :mod:`obsdelta_cli.commands.compress` for a runnable example.
"""

from __future__ import annotations

__version__ = "0.2.0"

from .commands import compress, inflate, report, verify
from .dataset import ObsdeltaDataset, collate, open_dataset
from .errors import ObsdeltaError

__all__ = [
    "ObsdeltaDataset",
    "ObsdeltaError",
    "__version__",
    "collate",
    "compress",
    "inflate",
    "open_dataset",
    "report",
    "verify",
]
