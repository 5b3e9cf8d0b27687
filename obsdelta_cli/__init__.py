"""obsdelta: store the next observation of trajectory datasets as a compact delta.

The library API mirrors the commands: :func:`compress`, :func:`inflate`, :func:`report` and
:func:`verify` take paths and return a :class:`~obsdelta_cli.report.DatasetResult`; failures raise
:class:`ObsdeltaError`. See :mod:`obsdelta_cli.pipeline` for a runnable example.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .dataset import ObsdeltaDataset, collate, open_dataset
from .errors import ObsdeltaError
from .pipeline import compress, inflate, report, verify

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
