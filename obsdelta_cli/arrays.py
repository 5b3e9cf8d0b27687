"""Arrays and dtypes of obsdelta's core: numpy arrays, with bfloat16 from ``ml_dtypes``.

The commands move rows as numpy arrays and never import torch for an HDF5 file or a memmap
folder: ``import torch`` alone takes 1-3 s, longer than compressing hundreds of MB. torch
comes in at the edges only (``.pt`` files, tensordict, ``open_dataset`` and the TorchRL
storage, the float casts of the delta codecs), through :func:`to_torch` and
:func:`from_torch`, which share memory and never copy.

``ml_dtypes`` is imported only where a bfloat16 is met (:func:`bfloat16`): as it is imported
it registers each of its dozens of types with numpy, one loop at a time, which in its recent
releases costs more than the rest of a command's start-up.

>>> dtype_of("bfloat16") is bfloat16(), dtype_name(np.dtype(np.float32)), dtype_name(bfloat16())
(True, 'float32', 'bfloat16')
>>> is_float(bfloat16()), is_float(np.dtype(np.int16)), bits_dtype(np.dtype(np.float32))
(True, False, dtype('int32'))
>>> from_torch(to_torch(np.arange(3.0, dtype=bfloat16()))).tolist()
[0.0, 1.0, 2.0]
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from . import interrupts
from .manifest import DTYPES as DTYPE_NAMES

if TYPE_CHECKING:
    import torch

_BFLOAT16: np.dtype | None = None


def bfloat16() -> np.dtype:
    """numpy's bfloat16 (numpy has none of its own: ``ml_dtypes``'), imported on first use."""
    global _BFLOAT16
    if _BFLOAT16 is None:
        import ml_dtypes

        _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
    return _BFLOAT16


def is_bfloat16(dtype: Any) -> bool:
    """Whether ``dtype`` is :func:`bfloat16`, without importing ``ml_dtypes``: no array holds
    its bfloat16 before it is imported."""
    if _BFLOAT16 is None and "ml_dtypes" not in sys.modules:
        return False
    return bool(dtype == bfloat16())


class _Dtypes(Mapping[str, np.dtype]):
    """By name, the dtypes of :data:`DTYPES`: bfloat16 made when it is asked for."""

    def __init__(self, names: Any) -> None:
        self._names = sorted(names)
        self._plain = {name: np.dtype(name) for name in self._names if name != "bfloat16"}

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bfloat16" and name in self._names:
            return bfloat16()
        return self._plain[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


#: Every dtype a leaf obsdelta encodes or stores may have, by its name in the metadata (the
#: names torch and numpy share).
DTYPES: Mapping[str, np.dtype] = _Dtypes(DTYPE_NAMES)
_SIGNED: dict[int, np.dtype] = {size: np.dtype(f"int{8 * size}") for size in (1, 2, 4, 8)}


def dtype_of(name: str) -> np.dtype:
    """The dtype named ``name`` in the metadata (``KeyError`` for any other name)."""
    return DTYPES[name]


def dtype_name(dtype: np.dtype) -> str:
    """The metadata's name of ``dtype`` (``float32``, ``bfloat16``, ``bool``)."""
    return np.dtype(dtype).name


def is_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a floating-point type (bfloat16 included)."""
    return dtype.kind == "f" or is_bfloat16(dtype)


def bits_dtype(dtype: np.dtype) -> np.dtype:
    """The signed integer dtype of ``dtype``'s size: a view through it compares bit patterns
    (NaN payloads, signed zeros) where ``==`` compares values."""
    return _SIGNED[dtype.itemsize]


def sorted_distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-d array, without the import of ``numpy.ma`` that
    ``np.unique`` makes on its first call (20 ms of every command's start).

    >>> sorted_distinct(np.array([3, 1, 3, 2, 1])).tolist()
    [1, 2, 3]
    """
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    first = np.empty(ordered.size, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def float_info(dtype: np.dtype) -> Any:
    """``finfo`` of a float dtype, bfloat16 included."""
    if is_bfloat16(dtype):
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


#: torch threads a running command wants (``None``: torch's own choice); see
#: :func:`torch_module`.
torch_threads: int | None = None
#: torch's own thread count, as it was when :func:`torch_module` imported it.
torch_default_threads: int | None = None


def torch_module() -> Any:
    """torch, imported on first use as start-up should (signals held back, the collector
    paused: see :func:`obsdelta_cli.interrupts.import_heavy`), with the running command's thread
    count."""
    torch = sys.modules.get("torch")
    if torch is None:
        torch = interrupts.import_heavy("torch")
        global torch_default_threads
        torch_default_threads = torch.get_num_threads()
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
    return torch


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of ``dtype`` (imports torch)."""
    return getattr(torch_module(), dtype_name(dtype))


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The dtype of torch dtype ``dtype``."""
    return dtype_of(str(dtype).removeprefix("torch."))


def to_torch(a: np.ndarray) -> torch.Tensor:
    """``a`` as a tensor sharing its memory (imports torch). A read-only array gives a tensor
    that must not be written (torch has no read-only tensors)."""
    th = torch_module()

    def tensor() -> torch.Tensor:
        if is_bfloat16(a.dtype):
            return th.from_numpy(a.view(np.int16)).view(th.bfloat16)
        return th.from_numpy(a)

    if a.flags.writeable:  # rows read for a batch: no warning to silence, nor its cost
        return tensor()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return tensor()


def from_torch(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as an array sharing its memory."""
    torch = torch_module()

    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16())
    return t.numpy()


def is_tensor(x: object) -> bool:
    """Whether ``x`` is a torch tensor, without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")
