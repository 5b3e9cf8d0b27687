"""What the TensorDict-based containers share: leaves in storage order and output templates."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import interrupts
from ..arrays import from_torch, is_tensor, numpy_dtype, torch_dtype
from ..errors import InputError
from .base import ArrayStore, Format, Key, Plan, Sink, Source, key_str
from .leaf import FileLeaf

if TYPE_CHECKING:  # tensordict costs seconds to import; HDF5 work never needs it
    import torch
    from tensordict import TensorDictBase


def tensordict_module() -> Any:
    """tensordict, imported on first use (it takes seconds; HDF5 work never needs it)."""
    with interrupts.deferred():
        import tensordict

    return tensordict


def leaves_of(td: TensorDictBase, prefix: Key = ()) -> dict[Key, Any]:
    """Leaves in storage order (a sub-TensorDict's leaves stand at its position).

    Non-tensor leaves (tensordict's ``NonTensorData``) are included as they are; the pipeline
    carries them along and never streams them.
    """
    # items(include_nested=True) lists a level's own leaves before its sub-TensorDicts, which
    # would reorder keys on the way back; walk level by level instead.
    out: dict[Key, Any] = {}
    for name, value in td.items():
        key = (*prefix, name)
        if isinstance(value, tensordict_module().TensorDictBase):
            out.update(leaves_of(value, key))
        else:
            out[key] = value
    return out


def file_leaf(leaf: Any, *, writable: bool = False) -> Any:
    """A memmap leaf as a :class:`FileLeaf`, any other tensor as an array sharing its memory
    (what is written to it reaches the tensor); anything else unchanged."""
    if not is_tensor(leaf):
        return leaf
    filename = getattr(leaf, "filename", None)
    if filename is None or not leaf.is_contiguous() or leaf.dtype.is_complex:
        return from_torch(leaf)  # complex: a dtype obsdelta never encodes, carried as it is
    return FileLeaf(filename, numpy_dtype(leaf.dtype), tuple(leaf.shape), writable=writable)


def _check_dtype(path: Path, key: Key, leaf: Any) -> None:
    """Refuse a tensor whose dtype NumPy has no equivalent of (the float8 and other narrow
    float types, unsigned 16-64 bit integers in older torch): its bytes could not be read,
    checked or rebuilt exactly."""
    if not is_tensor(leaf) or leaf.dtype.is_complex:
        return
    try:
        numpy_dtype(leaf.dtype)
    except (KeyError, TypeError, ValueError):
        raise InputError(
            f"dtype {leaf.dtype} has no NumPy equivalent, so obsdelta cannot store it exactly",
            file=path,
            key=key_str(key),
            hint="convert the leaf to a dtype NumPy holds (float8 to float16 is exact) and retry",
        ) from None


def _placeholder(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    # A zero-stride tensor: gives the output its shape and dtype without allocating it. Only
    # TensorDict outputs ask for one, and they have imported torch already.
    import torch

    return torch.zeros((), dtype=torch_dtype(dtype)).expand(shape)


class TensorDictFormat(Format):
    """A container holding one TensorDict: the output is built from a template TensorDict."""

    def source(
        self, path: Path, td: TensorDictBase, meta: dict[str, Any] | None, **extra: Any
    ) -> Source:
        """A :class:`Source` over ``td``, keeping ``td`` for :meth:`create`. Leaves stored in
        files are read with explicit reads (:class:`FileLeaf`), not through their mapping;
        tensors in memory become arrays sharing their memory."""
        leaves = leaves_of(td)
        for key, leaf in leaves.items():
            _check_dtype(path, key, leaf)
        return Source(
            path=path,
            leaves={k: file_leaf(v) for k, v in leaves.items()},
            batch_dims=td.batch_dims,
            meta=meta,
            handle=td,
            **extra,
        )

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        td: TensorDictBase = source.handle
        originals = leaves_of(td)
        template = tensordict_module().TensorDict(batch_size=td.batch_size, device=td.device)
        for key in plan.order:
            spec = plan.new.get(key)
            leaf = originals[key] if spec is None else _placeholder(spec.shape, spec.dtype)
            template.set(key, leaf)
        out, arrays = self.materialise(path, template, source)
        leaves = {k: file_leaf(v, writable=True) for k, v in leaves_of(out).items()}
        return Sink(leaves, arrays, handle=out)

    @abstractmethod
    def materialise(
        self, path: Path, template: TensorDictBase, source: Source
    ) -> tuple[TensorDictBase, ArrayStore]:
        """Allocate an empty, writable TensorDict shaped like ``template`` (for ``path``)."""
