"""What an output may replace and how much room it needs: the rules that read datasets, given
to :func:`~obsdelta_cli.atomic.atomic_output`, which writes any output without knowing them."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from .errors import ObsdeltaError, OutputError
from .formats import Plan, Source, detect, disk_size
from .formats.hdf5 import is_hdf5
from .formats.hdf5_meta import read_meta
from .formats.hdf5_walk import h5_file


def replaceable_by(kind: str) -> Callable[[Path], None]:
    """The check of what ``--force`` may replace with an output of format ``kind`` (see
    :func:`check_replaceable`), as :func:`~obsdelta_cli.atomic.atomic_output` takes it."""
    return partial(check_replaceable, kind=kind)


def check_replaceable(output: Path, kind: str) -> None:
    """Refuse to replace ``output`` unless obsdelta could have written it.

    Replaceable: an earlier obsdelta output of any format (its metadata says so, whatever else
    in it is damaged), or a dataset of format ``kind`` (the output's own, so that ``inflate
    --force`` replaces an earlier inflate). Anything else (a folder of other files, a file of
    another kind, something that cannot be read) raises :class:`OutputError` and is left as it
    is. The check reads the target the way an input is read, so it runs no code from it and
    follows no link out of it.
    """
    if not os.path.lexists(output):
        return
    what = "neither an obsdelta output nor a dataset obsdelta reads"
    if not output.is_symlink():
        try:
            if _holds_meta(output):
                return
            fmt = detect(output)
            if fmt.name == kind:
                return
            source = fmt.open(output)
            try:
                if source.meta is not None:
                    return
            finally:
                fmt.close(source)
            what = f"a {fmt.name} dataset, not {kind}, and not an obsdelta output"
        except (ObsdeltaError, OSError, ValueError, RuntimeError):
            pass
    else:
        what = "a symbolic link"
    raise OutputError(
        f"output exists and is {what}; --force replaces only what obsdelta could have written",
        file=output,
        hint="delete it yourself if it should go, or choose another output",
    )


def _holds_meta(output: Path) -> bool:
    """Whether ``output`` is an HDF5 file that holds obsdelta's metadata (a compressed or packed
    output), read from its root attribute alone (in a child, as every input's is): a file of
    thousands of objects is not walked as an input is before it is replaced."""
    if not is_hdf5(output):
        return False
    with h5_file(output) as f:
        return read_meta(f, output) is not None


def estimate_output_bytes(source: Source, plan: Plan) -> int:
    """An upper estimate of the bytes ``plan`` writes from ``source``: the input's bytes on disk,
    less the leaves left out, plus the new leaves at their full (unfiltered) size, plus 5% and
    1 MiB for metadata, exception rows and container overhead."""
    kept = set(plan.order)
    dropped = 0
    for key, leaf in source.leaves.items():
        if key not in kept:
            dropped += _leaf_bytes(leaf)
    new = sum(math.prod(s.shape) * s.dtype.itemsize for s in plan.new.values())
    body = max(0, disk_size(source.path) - dropped) + new
    return int(body * 1.05) + (1 << 20)


def _leaf_bytes(leaf: Any) -> int:
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    itemsize = getattr(dtype, "itemsize", None)
    if shape is None or not isinstance(itemsize, int):
        return 0
    return math.prod(shape) * itemsize
