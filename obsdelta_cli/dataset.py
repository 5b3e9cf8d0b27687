"""Train on a dataset as it is stored: a lazy ``torch.utils.data.Dataset`` of TED transitions.

:func:`open_dataset` opens any dataset obsdelta reads, compressed or plain, without loading it:
memmaps stay mapped, HDF5 is read row by row. Each item is a TensorDict in the ordinary TED
layout, with ``("next", k)`` rebuilt on the fly exactly as ``inflate`` would (bit for bit) and no
``delta`` keys. D4RL and robomimic files are presented with TED names (``observation``,
``action``, ``("next", "reward")``, ...); robomimic demos are concatenated.

With a ``DataLoader``, pass ``collate_fn=collate``: each batch is then read in one go (through
``__getitems__``) and comes out as one TensorDict.

Rows are read and rebuilt as numpy arrays, one gather per leaf, and become tensors sharing
their memory only as the batch's TensorDict is made.

>>> from pathlib import Path
>>> from torch.utils.data import DataLoader
>>> sample = Path(__file__).parents[1] / "sample_data" / "hopper_d4rl.hdf5"
>>> data = open_dataset(sample)
>>> len(data)
5000
>>> batch = next(iter(DataLoader(data, batch_size=256, shuffle=True, collate_fn=collate)))
>>> batch["next", "observation"].shape
torch.Size([256, 11])
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .arrays import from_torch, is_tensor, to_torch
from .blocks import check_exceptions, checked_stream
from .errors import FileChangedError
from .formats import FORMATS, Format, Key, Source
from .formats.hdf5_meta import own_of_source
from .formats.hdf5_walk import OWN, own_key
from .formats.leaf import as_rows, is_data
from .identity import Identity, changed, identity
from .inputs import check_leaves, manifest_of, open_input, stream_for
from .rebuild import Index, StoredPair, stored_pairs, take

if TYPE_CHECKING:  # tensordict costs seconds to import; HDF5 work never needs it
    from tensordict import TensorDictBase

#: Rows of one leaf: by index array, or a contiguous slice of rows.
Reader = Callable[[Index], np.ndarray]
#: Decoded chunks kept per filtered HDF5 dataset, packed file or not (frame-delta datasets of a
#: packed file included).
DEFAULT_CACHE_MB = 256
#: Opens of a file replaced while it was being opened, before it is reported as changing.
OPEN_TRIES = 3


class _Segment:
    """Rows that share one geometry: a whole TED dataset, or one robomimic demo."""

    def __init__(self, rows: int, readers: dict[Key, Reader]) -> None:
        self.rows = rows
        self.readers = readers


class ObsdeltaDataset(Dataset):
    """Transitions of an obsdelta-readable dataset; ``len`` is the number of transitions."""

    def __init__(
        self,
        path: str | Path,
        cache_mb: float = DEFAULT_CACHE_MB,
        *,
        opened: Identity | None = None,
    ) -> None:
        """``opened``: the identity of the file as another process opened it (a DataLoader
        worker's parent); a file found changed since is refused."""
        self.path = Path(path)
        self.cache_mb = cache_mb
        # HDF5 state must not cross a fork: a worker process reopens the file (see read).
        self._pid = os.getpid()
        self._opened = self._open_unchanged()
        if opened is not None and self._opened != opened:
            self.close()
            raise FileChangedError(self.path)

    def _open_unchanged(self) -> Identity:
        """Open the file, again if it was replaced meanwhile (an open reads several files of a
        folder, and a ``.pt`` file twice, by name: they must all be of one output); its
        identity as opened."""
        last: BaseException | None = None
        for _ in range(OPEN_TRIES):
            before = identity(self.path)
            try:
                self._open()
            except Exception as exc:
                if before is None or not changed(self.path, before):
                    raise
                last = exc
                if hasattr(self, "_source"):
                    with contextlib.suppress(Exception):
                        self.close()
                continue
            if before is not None and not changed(self.path, before):
                return before
            self.close()
        raise FileChangedError(self.path) from last

    def _open(self) -> None:
        fmt, source = open_input(self.path, cache_mb=self.cache_mb)
        self._fmt, self._source = fmt, source
        manifest = manifest_of(source) if source.meta is not None else None
        stored = stored_pairs(source, manifest) if manifest is not None else []
        if manifest is not None:  # a leaf lost to damage is an error, not a key left out
            check_leaves(source, manifest)
        time_dim = manifest.time_dim if manifest is not None else source.batch_dims - 1
        self._stream = stream_for(source, time_dim, 64)
        self._manifest = manifest
        if manifest is not None:
            # Each block of a leaf is checked the first time this process reads it.
            self._stream = checked_stream(source, manifest, self._stream)
        # A packed file is read as the container it was packed from.
        layout = manifest.source_container if manifest and manifest.source_container else None
        #: A TorchRL replay-buffer dump's preallocated rows (``len(self)`` of them are data).
        self.buffer_capacity: int | None = None
        self._segments = self._build(source, stored, FORMATS.get(layout or fmt.name, type(fmt)))
        self._offsets = np.array([0, *[s.rows for s in self._segments]], dtype=np.int64).cumsum()

    def _build(
        self, source: Source, stored: list[StoredPair], layout: type[Format]
    ) -> list[_Segment]:
        """The segments of rows the layout defines: one geometry (TED, D4RL), or one per
        episode it keeps apart, leaves named as the layout says (TED names)."""
        rebuilt = {s.pair.next_key: s for s in stored}
        hidden = {s.pair.delta_key for s in stored}
        # Not data: obsdelta's own leaves. In an HDF5 file, those under its group (at
        # /metadata/obsdelta in D4RL files); in a packed .pt file, ("obsdelta", "arrays", ...).
        own = own_key(own_of_source(source))
        leaves = {
            k: v
            for k, v in source.leaves.items()
            if is_data(v) and k not in hidden and k[0] != OWN and k[: len(own)] != own
        }
        episodes = layout.episodes([*leaves, *rebuilt])
        if layout.observations_once:  # episodes without observations hold no transitions
            once = (_stored_once(keys, leaves, layout.ted_name) for keys in episodes or [])
            return [segment for segment in once if segment is not None]
        if episodes is None:
            episodes = [[*leaves, *rebuilt]]
        return [
            self._segment(dict.fromkeys(keys), leaves, rebuilt, layout.ted_name)
            for keys in episodes
        ]

    def _segment(
        self,
        keys: dict[Key, Any],
        leaves: dict[Key, Any],
        rebuilt: dict[Key, StoredPair],
        rename: Callable[[Key], Key],
    ) -> _Segment:
        """The transitions of one geometry. Its rows are those of its observations; datasets
        of other shapes (policy weights under D4RL's ``metadata/``) are not transitions."""
        dims = self._source.batch_dims
        batch = _batch_shape(keys, leaves, rebuilt, dims)
        rebuilds = {k: rebuilt[k].rebuild(self._source, self._stream) for k in keys if k in rebuilt}
        algorithm = self._manifest.hash_algorithm if self._manifest is not None else ""
        for k, r in rebuilds.items():
            check_exceptions(r.exceptions, rebuilt[k].record, algorithm, self.path)
        # The observations of a rebuilt pair are read through its rebuild, which gathers the
        # rows of a batch once for both keys.
        observations = {rebuilt[k].pair.obs_key: r for k, r in rebuilds.items()}
        readers: dict[Key, Reader] = {}
        for key in keys:
            if key in rebuilds:
                readers[rename(key)] = rebuilds[key].take
            elif tuple(leaves[key].shape[:dims]) == batch:
                own = observations.get(key)
                flat = self._stream.flat(leaves[key])
                readers[rename(key)] = _reader(flat) if own is None else own.observations
        valid = self._source.valid_rows
        rows = 0 if batch is None else math.prod(batch[1:]) * (batch[0] if valid is None else valid)
        if valid is not None and batch is not None:
            self.buffer_capacity = math.prod(batch)
        if ("next", "done") not in readers and ("next", "terminated") in readers:
            readers[("next", "done")] = _done(readers)
        return _Segment(rows, readers)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(
        self, item: int | slice | torch.Tensor | np.ndarray | list[int]
    ) -> TensorDictBase:
        if isinstance(item, int):
            return self.read(np.array([item], dtype=np.int64))[0]
        return self.read(item)

    def keys(self) -> list[Key]:
        """Every leaf an item has, as tuples (``("next", "observation")``)."""
        return list(dict.fromkeys(k for seg in self._segments for k in seg.readers))

    def read(
        self,
        idx: torch.Tensor | np.ndarray | list[int] | slice,
        keys: Iterable[Key] | None = None,
    ) -> TensorDictBase:
        """Rows ``idx`` (row numbers: a 1-D tensor, array or list; or a slice) of the leaves
        ``keys`` only (all by default): a sampler that needs the done flags reads them without
        the observations. A slice of consecutive rows is read as such, block by block, without
        a gather."""
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step == 1 and start < stop:
                return self._guarded(slice(start, stop), keys)
            idx = np.arange(start, stop, step, dtype=np.int64)
        # A new array object per call, even for the caller's own: rebuilds keep the rows of
        # the last index array they gathered, by identity (see Rebuild.observations).
        idx = _index_array(idx)
        if idx.size:
            low, high = int(idx.min()), int(idx.max())
            if low < -len(self) or high >= len(self):
                raise IndexError(f"index out of range for {len(self)} transitions")
            if low < 0:
                idx = idx % len(self)
        return self._guarded(idx, keys)

    def _guarded(self, idx: Index, keys: Iterable[Key] | None) -> TensorDictBase:
        """Rows ``idx`` (checked to be in range), from the file as this reader opened it."""
        if self._pid != os.getpid():
            # A DataLoader worker forked after the file was opened: HDF5 is not fork-safe.
            self.__init__(self.path, self.cache_mb, opened=self._opened)  # type: ignore[misc]
        try:
            return self._read(idx, None if keys is None else set(keys))
        except Exception as exc:
            # Reads keep to the file as opened; one that fails (a file truncated in place, or
            # a folder's file opened by name) fails because the file changed, if it did.
            if changed(self.path, self._opened):
                raise FileChangedError(self.path) from exc
            raise

    def _read(self, idx: Index, wanted: set[Key] | None) -> TensorDictBase:
        parts: dict[Key, np.ndarray] = {}
        if len(self._segments) == 1 or _count(idx) == 0:
            # One geometry (TED, D4RL): no scatter needed; no rows: the first segment's leaves.
            idx = idx if _count(idx) else np.zeros(0, dtype=np.int64)
            readers = self._segments[0].readers.items() if self._segments else ()
            parts = {key: read(idx) for key, read in readers if wanted is None or key in wanted}
            return _tensordict(parts, _count(idx))
        if isinstance(idx, slice):
            found = self._read_span(idx, wanted)
            if found is not None:
                return found
            idx = np.arange(idx.start, idx.stop, dtype=np.int64)
        segment = np.searchsorted(self._offsets, idx, side="right") - 1
        for i, seg in enumerate(self._segments):
            mask = segment == i
            if not bool(mask.any()):
                continue
            local = idx[mask] - self._offsets[i]
            for key, read in seg.readers.items():
                if wanted is not None and key not in wanted:
                    continue
                values = read(local)
                if key not in parts:
                    parts[key] = np.empty((idx.size, *values.shape[1:]), dtype=values.dtype)
                parts[key][mask] = values
        return _tensordict(parts, idx.size)

    def _read_span(self, span: slice, wanted: set[Key] | None) -> TensorDictBase | None:
        """Consecutive rows across segments, each segment's part read as a slice; ``None``
        where a leaf is not in every segment they cross (the index path then leaves its
        other rows as they are)."""
        pieces: dict[Key, list[np.ndarray]] = {}
        crossed = 0
        for i, seg in enumerate(self._segments):
            lo, hi = (
                max(span.start, int(self._offsets[i])),
                min(span.stop, int(self._offsets[i + 1])),
            )
            if lo >= hi:
                continue
            crossed += 1
            local = slice(lo - int(self._offsets[i]), hi - int(self._offsets[i]))
            for key, read in seg.readers.items():
                if wanted is None or key in wanted:
                    pieces.setdefault(key, []).append(read(local))
        if any(len(values) != crossed for values in pieces.values()):
            return None
        parts = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in pieces.items()}
        return _tensordict(parts, span.stop - span.start)

    def __getitems__(self, indices: list[int]) -> TensorDictBase:
        # DataLoader hands a whole batch of indices here: one vectorised read per batch.
        return self.read(np.asarray(indices, dtype=np.int64))

    def close(self) -> None:
        """Release open files (HDF5)."""
        self._fmt.close(self._source)

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers reopen the dataset rather than share open file handles: the
        # same file, or none.
        return {"path": self.path, "cache_mb": self.cache_mb, "opened": tuple(self._opened)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        opened = state.get("opened")
        self.__init__(  # type: ignore[misc]
            state["path"], state["cache_mb"], opened=None if opened is None else Identity(*opened)
        )


def _count(idx: Index) -> int:
    return idx.stop - idx.start if isinstance(idx, slice) else idx.size


def _index_array(idx: Any) -> np.ndarray:
    """Row numbers (a tensor, array or list) as a new 1-D int64 array object (sharing the
    memory of an int64 tensor or array)."""
    if is_tensor(idx):
        idx = from_torch(idx.cpu())
    return np.asarray(idx).astype(np.int64, copy=False).reshape(-1)


def _tensordict(parts: dict[Key, np.ndarray], rows: int) -> TensorDictBase:
    """The nested TensorDict of one batch, its values tensors sharing the arrays' memory.
    Every value was read here with ``rows`` rows, so tensordict's checks are skipped where it
    offers that (a third of a batch's time)."""
    from tensordict import TensorDict

    tensors = {key: to_torch(value) for key, value in parts.items()}
    unchecked = getattr(TensorDict, "_new_unsafe", None)
    if unchecked is None:
        return TensorDict(tensors, batch_size=[rows])
    batch = torch.Size([rows])
    tree: dict[str, Any] = {}
    for key, value in tensors.items():
        node = tree
        for name in key[:-1]:
            node = node.setdefault(name, {})
        node[key[-1]] = value

    def build(node: dict[str, Any]) -> TensorDictBase:
        fields = {k: build(v) if isinstance(v, dict) else v for k, v in node.items()}
        return unchecked(fields, batch_size=batch)

    return build(tree)


def _stored_once(
    keys: list[Key], leaves: dict[Key, Any], rename: Callable[[Key], Key]
) -> _Segment | None:
    """An episode that stores its T+1 observations once (Minari): transition ``t`` has
    ``observations[t]`` and, as its next observation, ``observations[t + 1]``."""
    rows = {key: as_rows(leaves[key], 1) for key in keys if key in leaves}
    observations = {k: v for k, v in rows.items() if k[1] == "observations"}
    if not observations:
        return None
    steps = min(v.shape[0] for v in observations.values()) - 1
    readers: dict[Key, Reader] = {}
    for key, flat in observations.items():
        readers[rename(key)] = _reader(flat)
        readers[("next", *rename(key))] = _shifted(flat)
    for key, flat in rows.items():
        if key[1] != "observations" and len(key) == 2 and flat.shape[0] == steps:
            readers[rename(key)] = _reader(flat)
    if ("next", "terminated") in readers:
        readers[("next", "done")] = _done(readers)
    return _Segment(max(0, steps), readers)


def _shifted(rows: Any) -> Reader:
    def read(idx: Index) -> np.ndarray:
        if isinstance(idx, slice):
            return take(rows, slice(idx.start + 1, idx.stop + 1))
        return take(rows, idx + 1)

    return read


def _reader(rows: Any) -> Reader:
    def read(idx: Index) -> np.ndarray:
        return take(rows, idx)

    return read


def _batch_shape(
    keys: dict[Key, Any], leaves: dict[Key, Any], rebuilt: dict[Key, StoredPair], dims: int
) -> tuple[int, ...] | None:
    """The batch shape of a segment: that of its observations (the first pair's observation,
    stored or plain), else the most common leading shape."""
    for key in keys:
        if key in rebuilt:
            return tuple(leaves[rebuilt[key].pair.obs_key].shape[:dims])
    observations = [k for k in keys if k in leaves and _is_obs_name(k)]
    if observations:
        return tuple(leaves[observations[0]].shape[:dims])
    shapes = [tuple(leaves[k].shape[:dims]) for k in keys if k in leaves]
    return max(set(shapes), key=shapes.count) if shapes else None


def _is_obs_name(key: Key) -> bool:
    return key[-1] in ("observation", "observations") or "obs" in key


def _done(readers: dict[Key, Reader]) -> Reader:
    """``done = terminated | truncated``, for layouts (D4RL) that store only the two flags."""
    term, trunc = readers[("next", "terminated")], readers.get(("next", "truncated"))

    def read(idx: Index) -> np.ndarray:
        flags = term(idx)
        return flags | trunc(idx) if trunc is not None else flags

    return read


def collate(batch: TensorDictBase | list[TensorDictBase]) -> TensorDictBase:
    """``DataLoader`` collate function: a batch read at once passes through; items are stacked."""
    from tensordict import TensorDictBase

    return batch if isinstance(batch, TensorDictBase) else torch.stack(batch)


def open_dataset(path: str | Path, cache_mb: float = DEFAULT_CACHE_MB) -> ObsdeltaDataset:
    """Open any dataset obsdelta reads, compressed or plain, as a lazy ``Dataset``.

    ``cache_mb``: decoded chunks kept for random reads, per filtered HDF5 dataset (a packed
    file's, or one gzip-chunked as D4RL ships it), the least recently used dropped past it.

    ``len(data)`` is the number of transitions; ``data[i]``, ``data[a:b]`` and ``data[tensor]``
    return TensorDicts in the TED layout with ``("next", k)`` rebuilt.
    """
    return ObsdeltaDataset(path, cache_mb)


__all__ = ["ObsdeltaDataset", "collate", "open_dataset"]
