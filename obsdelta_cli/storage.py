"""A read-only TorchRL storage over any dataset obsdelta reads, compressed or plain.

``TensorDictReplayBuffer(storage=ObsdeltaStorage(path))`` samples straight from the file: each
batch is one :meth:`~obsdelta_cli.dataset.ObsdeltaDataset.read`, one gather per leaf, with
``("next", k)`` rebuilt as ``inflate`` rebuilds it (bit for bit for ``exact``, within the reported
bound for lossy codecs). Every leaf is served as :func:`~obsdelta_cli.dataset.open_dataset`
serves it, TED names included for D4RL and robomimic files; only the rewards and flags those
layouts keep as ``[N]`` come with TorchRL's trailing dimension, ``[N, 1]`` (same values).

``SliceSampler`` finds episodes by reading one column of every row through ``storage[:]``: that
returns :class:`Rows`, a lazy view that reads only the leaf asked for, and keeps small columns
(flags, ids) in memory, so the done flags are read once, not on every sample. The sampler's
second look at the sampled rows (``storage[index]`` with a tuple) is lazy the same way.

torchrl is an optional extra (``pip install 'obsdelta[torchrl]'``); this module imports without
it, and :class:`ObsdeltaStorage` then says what to install.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .dataset import ObsdeltaDataset
from .errors import UsageError
from .formats import Key

if TYPE_CHECKING:
    from tensordict import TensorDictBase
    from torchrl.data.replay_buffers.storages import Storage, TensorStorage
else:
    try:
        from torchrl.data.replay_buffers.storages import Storage, TensorStorage
    except ImportError:  # the class still defines; constructing it explains what is missing
        Storage = TensorStorage = object

#: Columns this small (bytes a row) are kept in memory once read whole: done flags, ids.
CACHED_ROW_BYTES = 16
STATE_FILE = "obsdelta-storage.json"
#: Leaves TorchRL expects with a trailing dimension of 1.
FLAGS: tuple[Key, ...] = tuple(("next", k) for k in ("reward", "done", "terminated", "truncated"))
_MISSING = object()


def _read_only(what: str) -> UsageError:
    return UsageError(
        f"cannot {what}: an obsdelta storage serves its file read-only",
        hint="copy the rows into a LazyMemmapStorage to add to them, or inflate the file",
    )


def _key(key: str | tuple[Any, ...]) -> Key:
    """A nested key as a flat tuple: ``"a"`` -> ``("a",)``, ``("a", ("b",))`` -> ``("a", "b")``."""
    if isinstance(key, str):
        return (key,)
    return tuple(part for k in key for part in _key(k))


def _is_key(item: Any) -> bool:
    return isinstance(item, str) or (
        isinstance(item, tuple) and len(item) > 0 and all(_is_key(k) for k in item)
    )


def _index(index: Any, rows: int) -> torch.Tensor:
    """Any index TorchRL passes (int, slice, range, list, array, tensor, 1-tuple) as a tensor."""
    if isinstance(index, tuple):
        if len(index) != 1:
            raise IndexError(f"an obsdelta storage has one dimension, got an index of {index}")
        index = index[0]
    if isinstance(index, slice):
        return torch.arange(rows)[index]
    if isinstance(index, range):
        return torch.arange(index.start, index.stop, index.step)
    index = torch.as_tensor(index)
    if index.dtype == torch.bool:  # a mask over the rows
        return index.reshape(-1).nonzero().reshape(-1)
    return index.long()


class ObsdeltaStorage(TensorStorage):
    """A read-only, one-dimensional TorchRL storage of the transitions of ``path``.

    ``len(storage)`` is the number of transitions; ``storage.get(index)`` returns a TensorDict
    of those rows (batch shape: the index's shape), ``storage[:]`` and ``storage[(index,)]`` a
    lazy :class:`Rows` view. Writing (``extend``, ``add``, ``rb[i] = ...``, ``empty``) raises
    :class:`~obsdelta_cli.errors.UsageError`. :attr:`ends` marks the last row of every episode,
    for ``SliceSampler(ends=storage.ends, cache_values=True)`` where a file's done flags do not
    mark every boundary (robomimic demos that fail end without ``dones``).
    """

    ndim = 1
    supports_conditional_update = False

    def __init__(self, path: str | Path) -> None:
        if TensorStorage is object:
            raise ImportError(
                "ObsdeltaStorage needs torchrl: pip install 'obsdelta[torchrl]'", name="torchrl"
            )
        self._open(path)
        capacity = self._data.buffer_capacity
        Storage.__init__(self, max_size=capacity or len(self._data))
        self.initialized = True
        self.device = torch.device("cpu")
        self._storage = None  # no in-memory TensorDict: samplers read through storage[...]
        self.__dict__["_storage_keys"] = None
        if capacity is None:
            # A file is written in order: its last row ends the data (no wrap-around to row 0).
            self._set_last_cursor(max(len(self._data) - 1, 0))
        # A replay-buffer dump is read as TorchRL loads one: its capacity is its own, and no
        # write position is known, so a full buffer is circular (an episode may wrap to row 0).

    def _open(self, path: str | Path) -> None:
        self._data = ObsdeltaDataset(path)
        self._columns: dict[Key, torch.Tensor] = {}
        self._ends: torch.Tensor | None = None
        self._schema: TensorDictBase | None = None

    @property
    def path(self) -> Path:
        """The file (or folder) the rows come from."""
        return self._data.path

    def close(self) -> None:
        """Release open files (HDF5)."""
        self._data.close()

    # --- what TorchRL reads ---------------------------------------------------------------

    @property
    def _len(self) -> int:
        return len(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def _total_shape(self) -> torch.Size:
        return torch.Size([len(self._data)])

    @property
    def shape(self) -> torch.Size:
        return torch.Size([len(self._data)])

    def get(self, index: Any) -> TensorDictBase:
        """Rows ``index`` as one TensorDict; an int gives one row (batch shape ``[]``)."""
        if isinstance(index, slice):  # consecutive rows are read as such, without a gather
            return self.read(index)
        idx = _index(index, len(self))
        flat = self.read(idx.reshape(-1))
        return flat.reshape(idx.shape) if idx.dim() != 1 else flat

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, tuple) or (isinstance(index, slice) and index == slice(None)):
            return Rows(self, None if isinstance(index, slice) else _index(index, len(self)))
        return self.get(index)

    def read(self, idx: torch.Tensor | slice, keys: list[Key] | None = None) -> TensorDictBase:
        """Rows ``idx`` (1-D, or a slice) of the leaves ``keys`` (all by default), in TorchRL's
        shapes."""
        rows = self._data.read(idx, keys)
        for key in FLAGS:
            # D4RL and robomimic keep rewards and flags as [N]; TorchRL wants [N, 1], else
            # SliceSampler's marks (and losses) broadcast [N] against [N, 1] into [N, N].
            value = rows.get(key, None)
            if value is not None and value.dim() == 1:
                rows.set(key, value.unsqueeze(-1))
        return rows

    def schema(self) -> TensorDictBase:
        """One row's worth of every leaf, with no rows: keys, dtypes and shapes."""
        if self._schema is None:
            first = torch.zeros(min(1, len(self)), dtype=torch.long)
            self._schema = self.read(first)[:0]
        return self._schema

    def column(self, key: Key, idx: torch.Tensor | None = None) -> torch.Tensor:
        """Leaf ``key`` at rows ``idx`` (all rows by default). A small leaf (flags, ids: at most
        ``CACHED_ROW_BYTES`` a row) is read whole once and kept: samplers ask for it on every
        batch, and the file never changes under a read-only storage."""
        leaf = self.schema().get(key)
        if math.prod(leaf.shape[1:]) * leaf.element_size() <= CACHED_ROW_BYTES:
            if key not in self._columns:
                self._columns[key] = self.read(slice(None), [key]).get(key)
            whole = self._columns[key]
            return whole if idx is None else whole[idx]
        if idx is None:
            return self.read(slice(None), [key]).get(key)
        values = self.read(idx.reshape(-1), [key]).get(key)
        return values.reshape(*idx.shape, *values.shape[1:])

    @property
    def ends(self) -> torch.Tensor:
        """``True`` at the last row of every episode: done flags, the end of every demo or
        episode group the file keeps apart, and the last row. Computed once."""
        if self._ends is None:
            ends = torch.zeros(len(self), dtype=torch.bool)
            for key in (("next", "done"), ("next", "terminated"), ("next", "truncated")):
                if key in self._data.keys():
                    ends |= self.column(key).reshape(len(self), -1).any(-1).bool()
            # Segments are robomimic demos and Minari episodes: each ends an episode.
            last = np.maximum(self._data._offsets[1:] - 1, 0)
            ends[torch.from_numpy(last)] = len(self) > 0
            self._ends = ends
        return self._ends

    # --- read-only ------------------------------------------------------------------------

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        raise _read_only("write rows")

    def _empty(self) -> None:
        raise _read_only("empty the storage")

    def state_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "_len": len(self)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Serve the file the state names (a checkpoint of a buffer records only the path)."""
        self._open(state_dict["path"])
        self.max_size = len(self._data)
        self._set_last_cursor(max(len(self._data) - 1, 0))
        self._bump_mutation_revision()

    def dumps(self, path: str | Path) -> None:
        """Save the storage's state (the file's path; the rows stay in the file)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / STATE_FILE).write_text(json.dumps(self.state_dict()))

    def loads(self, path: str | Path) -> None:
        self.load_state_dict(json.loads((Path(path) / STATE_FILE).read_text()))

    def __getstate__(self) -> dict[str, Any]:
        # The dataset pickles as its path and reopens in the new process.
        state = Storage.__getstate__(self)
        state["_columns"], state["_ends"], state["_schema"] = {}, None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        Storage.__setstate__(self, state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={str(self.path)!r}, len={len(self)})"


class Rows:
    """Rows of an :class:`ObsdeltaStorage`, read when a leaf is asked for.

    ``rows[key]`` and ``rows.get(key, default)`` read that leaf (or the leaves under a prefix
    such as ``"next"``) for these rows only; ``rows.keys(...)``, ``batch_size`` and ``len`` read
    nothing. :meth:`to_tensordict` (and any other TensorDict attribute) reads every leaf.
    """

    def __init__(self, storage: ObsdeltaStorage, idx: torch.Tensor | None) -> None:
        self._storage = storage
        self._idx = idx

    @property
    def batch_size(self) -> torch.Size:
        return self._storage.shape if self._idx is None else self._idx.shape

    shape = batch_size

    def __len__(self) -> int:
        return self.batch_size[0] if self.batch_size else 0

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        return self._storage.schema().keys(*args, **kwargs)

    def get(self, key: str | tuple[Any, ...], default: Any = _MISSING) -> Any:
        want = _key(key)
        leaves = [k for k in self._storage._data.keys() if k[: len(want)] == want]
        if not leaves:
            if default is _MISSING:
                raise KeyError(f"key {want} not found in {self._storage.path}")
            return default
        if leaves == [want]:
            return self._storage.column(want, self._idx)
        idx = torch.arange(len(self._storage)) if self._idx is None else self._idx
        return self._storage.read(idx.reshape(-1), leaves).get(want).reshape(idx.shape)

    def __getitem__(self, item: Any) -> Any:
        if _is_key(item):
            return self.get(item)
        idx = torch.arange(len(self._storage)) if self._idx is None else self._idx
        return self._storage.get(idx[item])

    def to_tensordict(self) -> TensorDictBase:
        """Every leaf of these rows, in memory."""
        if self._idx is None:
            return self._storage.get(slice(None))
        return self._storage.get(self._idx)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.to_tensordict(), name)

    def __repr__(self) -> str:
        return f"Rows({self._storage!r}, rows={len(self)})"


__all__ = ["ObsdeltaStorage", "Rows"]
