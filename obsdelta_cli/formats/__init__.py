"""Format registry and content-based detection.

>>> list(FORMATS)  # doctest: +NORMALIZE_WHITESPACE
['packed-hdf5', 'torchrl-checkpoint', 'torchrl-rb', 'ted-memmap', 'ted-pt', 'd4rl-hdf5',
 'robomimic-hdf5', 'minari-hdf5', 'ted-hdf5']
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, ObsdeltaError
from .base import (
    ArrayStore,
    Format,
    Key,
    LeafSpec,
    Pair,
    Plan,
    Sink,
    Source,
    disk_size,
    key_str,
)
from .d4rl import D4RL
from .hdf5 import is_hdf5, open_h5
from .minari import Minari
from .packed import Packed
from .robomimic import Robomimic
from .ted_hdf5 import TedHDF5
from .ted_memmap import TedMemmap
from .ted_pt import TedPt
from .torchrl_checkpoint import TorchRLCheckpoint
from .torchrl_rb import TorchRLReplayBuffer

# Order matters: detection tries the most specific layout first (a replay-buffer dump contains
# a memmap tree, and a TorchRL checkpoint is a dump; a packed file holds any layout's datasets).
FORMATS: dict[str, type[Format]] = {
    Packed.name: Packed,
    TorchRLCheckpoint.name: TorchRLCheckpoint,
    TorchRLReplayBuffer.name: TorchRLReplayBuffer,
    TedMemmap.name: TedMemmap,
    TedPt.name: TedPt,
    D4RL.name: D4RL,
    Robomimic.name: Robomimic,
    Minari.name: Minari,
    TedHDF5.name: TedHDF5,
}


def detect(path: Path) -> Format:
    """Return the adapter for ``path``, recognised from its content."""
    if not path.exists():
        raise InputError("no such file or directory", file=path, hint="check the path")
    for cls in FORMATS.values():
        if cls.sniff(path):
            return cls()
    if is_hdf5(path):
        open_h5(path).close()  # a damaged file says so precisely
        kind = "HDF5 file"
    elif path.is_dir():
        held = _datasets_in(path)
        if held:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise InputError(
                f"directory holds datasets ({shown}) but is not one",
                file=path,
                hint="give each dataset as an input: a command takes several, and -o FOLDER/ "
                "gets one output per input",
            )
        kind = "directory"
    else:
        kind = "file"
    raise InputError(
        f"{kind} is in no layout obsdelta reads",
        file=path,
        hint=f"it reads {', '.join(FORMATS)} (README: Formats)",
    )


#: Entries of a directory looked at to tell a folder of datasets from anything else.
LOOKED_AT = 64


def _datasets_in(folder: Path) -> list[str]:
    """Names of the datasets among the first :data:`LOOKED_AT` entries of ``folder`` (by
    name), for the error that a folder of datasets is not one."""
    found = []
    for entry in sorted(folder.iterdir())[:LOOKED_AT]:
        try:
            if any(cls.sniff(entry) for cls in FORMATS.values()):
                found.append(entry.name)
        except (ObsdeltaError, OSError):  # unreadable or damaged: not counted
            continue
    return found


__all__ = [
    "FORMATS",
    "ArrayStore",
    "Format",
    "Key",
    "LeafSpec",
    "Pair",
    "Plan",
    "Sink",
    "Source",
    "detect",
    "disk_size",
    "key_str",
]
