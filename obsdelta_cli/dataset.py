"""Train on a dataset as it is stored: a lazy ``torch.utils.data.Dataset`` of TED transitions.

:func:`open_dataset` opens any dataset obsdelta reads, compressed or plain, without loading it:
memmaps stay mapped, HDF5 is read row by row. Each item is a TensorDict in the ordinary TED
layout, with ``("next", k)`` rebuilt on the fly exactly as ``inflate`` would (bit for bit) and no
``delta`` keys. D4RL and robomimic files are presented with TED names (``observation``,
``action``, ``("next", "reward")``, ...); robomimic demos are concatenated.

With a ``DataLoader``, pass ``collate_fn=collate``: each batch is then read in one go (through
``__getitems__``) and comes out as one TensorDict.

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

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from .errors import UsageError
from .formats import Key, Source
from .formats.leaf import FlatRows, is_data
from .pipeline import _job, _open, _Stored, _stored_pairs, read_meta

if TYPE_CHECKING:  # tensordict costs seconds to import; HDF5 work never needs it
    from tensordict import TensorDictBase

Reader = Callable[[torch.Tensor], torch.Tensor]

D4RL_NAMES: dict[Key, Key] = {
    ("observations",): ("observation",),
    ("next_observations",): ("next", "observation"),
    ("actions",): ("action",),
    ("rewards",): ("next", "reward"),
    ("terminals",): ("next", "terminated"),
    ("timeouts",): ("next", "truncated"),
}
ROBOMIMIC_NAMES: dict[str, Key] = {
    "actions": ("action",),
    "rewards": ("next", "reward"),
    "dones": ("next", "done"),
    "states": ("state",),
}


def _take(rows: Any, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` of a flat leaf, reading each contiguous run of a lazy leaf once."""
    if not isinstance(rows, FlatRows):
        return rows[idx]
    if idx.numel() == 0:
        return torch.empty((0, *rows.shape[1:]), dtype=rows.dtype)
    order = torch.argsort(idx)
    sorted_idx = idx[order]
    out = torch.empty((idx.numel(), *rows.shape[1:]), dtype=rows.dtype)
    # Runs of nearby rows are read as one slice: fewer, larger reads of the HDF5 chunks.
    breaks = (torch.diff(sorted_idx) > 64).nonzero().flatten() + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), idx.numel()]
    for a, b in zip(starts, ends, strict=True):
        lo, hi = int(sorted_idx[a]), int(sorted_idx[b - 1]) + 1
        block = rows[lo:hi]
        out[order[a:b]] = block[sorted_idx[a:b] - lo]
    return out


class _Segment:
    """Rows that share one geometry: a whole TED dataset, or one robomimic demo."""

    def __init__(self, rows: int, readers: dict[Key, Reader]) -> None:
        self.rows = rows
        self.readers = readers


class ObsdeltaDataset(Dataset):
    """Transitions of an obsdelta-readable dataset; ``len`` is the number of transitions."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        fmt, source = _open(self.path)
        if fmt.nothing_to_do:
            fmt.close(source)
            raise UsageError(fmt.nothing_to_do, file=self.path)
        self._fmt, self._source = fmt, source
        meta = read_meta(source) if source.meta is not None else None
        stored = _stored_pairs(source, meta) if meta is not None else []
        time_dim = int((meta or {}).get("time_dim", source.batch_dims - 1))
        self._job = _job(source, time_dim, 64, None)
        self._segments = self._build(source, stored, fmt.name)
        self._offsets = torch.tensor([0, *[s.rows for s in self._segments]]).cumsum(0)

    def _build(self, source: Source, stored: list[_Stored], fmt: str) -> list[_Segment]:
        rebuilt = {s.pair.next_key: s for s in stored}
        hidden = {s.pair.delta_key for s in stored}
        leaves = {
            k: v
            for k, v in source.leaves.items()
            if is_data(v) and k not in hidden and k[0] != "obsdelta"
        }
        if fmt == "robomimic-hdf5":
            demos: dict[str, dict[Key, Any]] = {}
            for key in [*leaves, *rebuilt]:
                if key[0] == "data" and len(key) > 2:
                    demos.setdefault(key[1], {})[key] = key
            return [
                self._segment(keys, leaves, rebuilt, _robomimic_name) for keys in demos.values()
            ]
        rename = _d4rl_name if fmt == "d4rl-hdf5" else _same_name
        return [self._segment({k: k for k in [*leaves, *rebuilt]}, leaves, rebuilt, rename)]

    def _segment(
        self,
        keys: dict[Key, Any],
        leaves: dict[Key, Any],
        rebuilt: dict[Key, _Stored],
        rename: Callable[[Key], Key],
    ) -> _Segment:
        readers: dict[Key, Reader] = {}
        rows = None
        for key in keys:
            if key in rebuilt:
                s = rebuilt[key]
                readers[rename(key)] = self._decoder(s)
                count = self._job.rows(s.pair).valid
            else:
                flat = self._job.flat(leaves[key])
                readers[rename(key)] = _reader(flat)
                first = leaves[key].shape[0]
                count = (
                    flat.shape[0]
                    if self._source.valid_rows is None
                    else (self._source.valid_rows * (flat.shape[0] // max(1, first)))
                )
            rows = count if rows is None else min(rows, count)
        if ("next", "done") not in readers and ("next", "terminated") in readers:
            readers[("next", "done")] = _done(readers)
        return _Segment(rows or 0, readers)

    def _decoder(self, s: _Stored) -> Reader:
        """Rows of ``("next", k)`` rebuilt as inflate would: codec, successors, exceptions."""
        job, pair, codec = self._job, s.pair, s.codec
        geometry = job.rows(pair)
        obs = job.flat(self._source.leaves[pair.obs_key])
        delta = (
            job.flat(self._source.leaves[pair.delta_key]) if codec.stored_dtype(s.dtype) else None
        )
        index, rows_at = job.exceptions(s, obs.shape[1:])

        def read(idx: torch.Tensor) -> torch.Tensor:
            o = _take(obs, idx)
            succ = None
            if codec.uses_successor:
                has = geometry.has_successor(idx)
                succ = o.clone()
                if bool(has.any()):
                    succ[has] = _take(obs, idx[has] + geometry.step)
            rebuilt = codec.decode(o, None if delta is None else _take(delta, idx), succ, s.dtype)
            if index is not None:
                pos = torch.searchsorted(index, idx).clamp_(max=index.numel() - 1)
                hit = index[pos] == idx
                if bool(hit.any()):
                    rebuilt[hit] = _take(rows_at, pos[hit])
            return rebuilt

        return read

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(self, item: int | slice | torch.Tensor | list[int]) -> TensorDictBase:
        if isinstance(item, int):
            return self[torch.tensor([item])][0]
        if isinstance(item, slice):
            idx = torch.arange(len(self))[item]
        else:
            idx = torch.as_tensor(item, dtype=torch.long).reshape(-1)
        if idx.numel() and (int(idx.min()) < -len(self) or int(idx.max()) >= len(self)):
            raise IndexError(f"index out of range for {len(self)} transitions")
        idx = idx % max(1, len(self))
        segment = torch.searchsorted(self._offsets, idx, right=True) - 1
        parts: dict[Key, torch.Tensor] = {}
        for i, seg in enumerate(self._segments):
            mask = segment == i
            if not bool(mask.any()):
                continue
            local = idx[mask] - self._offsets[i]
            for key, read in seg.readers.items():
                values = read(local)
                if key not in parts:
                    parts[key] = torch.empty((idx.numel(), *values.shape[1:]), dtype=values.dtype)
                parts[key][mask] = values
        from tensordict import TensorDict

        return TensorDict(dict(parts), batch_size=[idx.numel()])

    def __getitems__(self, indices: list[int]) -> TensorDictBase:
        # DataLoader hands a whole batch of indices here: one vectorised read per batch.
        return self[torch.as_tensor(indices, dtype=torch.long)]

    def close(self) -> None:
        """Release open files (HDF5)."""
        self._fmt.close(self._source)

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers reopen the dataset rather than share open file handles.
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]


def _reader(rows: Any) -> Reader:
    def read(idx: torch.Tensor) -> torch.Tensor:
        return _take(rows, idx)

    return read


def _done(readers: dict[Key, Reader]) -> Reader:
    """``done = terminated | truncated``, for layouts (D4RL) that store only the two flags."""
    term, trunc = readers[("next", "terminated")], readers.get(("next", "truncated"))

    def read(idx: torch.Tensor) -> torch.Tensor:
        flags = term(idx)
        return flags | trunc(idx) if trunc is not None else flags

    return read


def _same_name(key: Key) -> Key:
    return key


def _d4rl_name(key: Key) -> Key:
    return D4RL_NAMES.get(key, key)


def _robomimic_name(key: Key) -> Key:
    rest = key[2:]
    if rest[0] == "obs" and len(rest) > 1:
        return rest[1:]
    if rest[0] == "next_obs" and len(rest) > 1:
        return ("next", *rest[1:])
    return ROBOMIMIC_NAMES.get(rest[0], rest) if len(rest) == 1 else rest


def collate(batch: TensorDictBase | list[TensorDictBase]) -> TensorDictBase:
    """``DataLoader`` collate function: a batch read at once passes through; items are stacked."""
    from tensordict import TensorDictBase

    return batch if isinstance(batch, TensorDictBase) else torch.stack(batch)


def open_dataset(path: str | Path) -> ObsdeltaDataset:
    """Open any dataset obsdelta reads, compressed or plain, as a lazy ``Dataset``.

    ``len(data)`` is the number of transitions; ``data[i]``, ``data[a:b]`` and ``data[tensor]``
    return TensorDicts in the TED layout with ``("next", k)`` rebuilt.
    """
    return ObsdeltaDataset(path)


__all__ = ["ObsdeltaDataset", "collate", "open_dataset"]
