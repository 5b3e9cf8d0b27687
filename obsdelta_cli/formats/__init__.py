"""Format registry and content-based detection.

>>> list(FORMATS)  # doctest: +NORMALIZE_WHITESPACE
['packed-hdf5', 'torchrl-rb', 'ted-memmap', 'ted-pt', 'd4rl-hdf5', 'robomimic-hdf5',
 'minari-hdf5', 'ted-hdf5']
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
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
from .torchrl_rb import TorchRLReplayBuffer

# Order matters: detection tries the most specific layout first (a replay-buffer dump contains
# a memmap tree; a packed file holds any layout's datasets).
FORMATS: dict[str, type[Format]] = {
    Packed.name: Packed,
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
    else:
        kind = "directory" if path.is_dir() else "file"
    raise InputError(
        f"{kind} is in no layout obsdelta reads",
        file=path,
        hint=f"supported: {', '.join(f'{n} ({c.summary})' for n, c in FORMATS.items())}",
    )


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
