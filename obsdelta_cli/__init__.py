"""obsdelta: store the next observation of trajectory datasets as a compact delta.

The library API mirrors the commands: :func:`compress`, :func:`inflate`, :func:`report` and
:func:`verify` take paths and return a :class:`~obsdelta_cli.report.DatasetResult`; failures raise
:class:`ObsdeltaError`. See :mod:`obsdelta_cli.commands.compress` for a runnable example.

The names are imported on first use, so that ``obsdelta --version`` and ``--help`` start without
torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# The submodule ``report`` (result dataclasses, light) is loaded now: loading it later would bind
# ``obsdelta_cli.report`` to the module instead of the command.
from . import report as _results  # noqa: F401

del globals()["report"]

if TYPE_CHECKING:
    from .commands.compress import compress
    from .commands.inflate import inflate
    from .commands.report import report
    from .commands.verify import verify
    from .dataset import ObsdeltaDataset, collate, open_dataset
    from .errors import ObsdeltaError
    from .storage import ObsdeltaStorage

_LAZY = {
    "compress": ".commands",
    "inflate": ".commands",
    "report": ".commands",
    "verify": ".commands",
    "ObsdeltaDataset": ".dataset",
    "collate": ".dataset",
    "open_dataset": ".dataset",
    "ObsdeltaError": ".errors",
    "ObsdeltaStorage": ".storage",  # needs torchrl (the extra obsdelta[torchrl]) when used
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "ObsdeltaDataset",
    "ObsdeltaError",
    "ObsdeltaStorage",
    "__version__",
    "collate",
    "compress",
    "inflate",
    "open_dataset",
    "report",
    "verify",
]
