"""The pipeline: stream chunks of rows from a source container through a codec into an output.

``compress`` replaces each selected ``("next", *k)`` leaf with what a codec stores (usually
``("next", "delta", *k)``) plus exception rows; ``inflate`` undoes it; ``report`` measures
without writing. Containers are reached only through the format adapters and deltas only through
the codecs, so this module holds the semantics: which keys pair up, rows and their successors
along time, which rows become exceptions, the order of leaves, the metadata and the error
accounting.

>>> import tempfile, pathlib, torch
>>> from tensordict import TensorDict
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> obs = torch.arange(12.0).reshape(4, 3)
>>> td = TensorDict({"observation": obs, "next": {"observation": obs + 0.5}}, batch_size=[4])
>>> _ = td.memmap(d / "run")
>>> res = compress(d / "run", d / "small")
>>> res.keys[0].key, res.keys[0].codec, res.keys[0].max_abs_error
('next/observation', 'fp16', 0.0)
>>> back = inflate(d / "small", d / "back")
>>> bool((TensorDict.load_memmap(d / "back")["next", "observation"] == obs + 0.5).all())
True
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from . import __version__
from .atomic import atomic_output
from .codecs import AUTO, CODECS, DEFAULT_CODEC, Codec, codec_from_config, make_codec
from .errors import (
    DataError,
    FormatVersionError,
    InputError,
    ObsdeltaError,
    OutputError,
    UsageError,
)
from .formats import ArrayStore, Format, Sink, Source, detect, disk_size
from .report import Candidate, DatasetResult, KeyResult
from .stats import ErrorStats, Verdict, judge

#: Version of the stored metadata layout; bumped on any incompatible change.
FORMAT_VERSION = 1
DEFAULT_CHUNK_MB = 64
#: Bytes an exception row costs beside its values: its int64 row index.
INDEX_BYTES = 8
_IO_FAILURE = re.compile(r"file|open|resize|unexpected pos|write|space|permi", re.IGNORECASE)

Key = tuple[str, ...]


def key_str(key: Key) -> str:
    """Slash-joined form of a nested key, as used on the command line and in JSON."""
    return "/".join(key)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str, file: Path) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"stored dtype {name!r} is unknown", file=file, hint="the file is damaged")
    return dtype


@dataclass(frozen=True)
class Pair:
    """A root observation leaf and the leaves derived from it under ``"next"``."""

    obs_key: Key

    @property
    def next_key(self) -> Key:
        return ("next", *self.obs_key)

    @property
    def delta_key(self) -> Key:
        return ("next", "delta", *self.obs_key)

    @property
    def name(self) -> str:
        return key_str(self.next_key)


# ---------------------------------------------------------------------------------------------
# Reading the source


def _leaves(td: TensorDictBase, prefix: Key = ()) -> dict[Key, torch.Tensor]:
    """Leaves in storage order (a sub-TensorDict's leaves stand at its position).

    Non-tensor leaves (tensordict's ``NonTensorData``) are included as they are: they are carried
    to the output through the template and never streamed.
    """
    # items(include_nested=True) lists a level's own leaves before its sub-TensorDicts, which
    # would reorder keys on the way back; walk level by level instead.
    out: dict[Key, torch.Tensor] = {}
    for name, value in td.items():
        key = (*prefix, name)
        if isinstance(value, TensorDictBase):
            out.update(_leaves(value, key))
        else:
            out[key] = value
    return out


def _open(path: Path) -> tuple[Format, Source]:
    fmt = detect(path)
    source = fmt.open(path)
    if source.td.batch_size.numel() == 0 or source.td.batch_dims == 0 or source.valid_rows == 0:
        raise DataError(
            f"dataset has no rows (batch size {list(source.td.batch_size)})",
            file=path,
            hint="nothing to do; check that the right file was given",
        )
    return fmt, source


def _pair_problem(
    leaves: dict[Key, torch.Tensor], pair: Pair, supports: Callable[[torch.dtype], bool]
) -> str | None:
    """Why ``pair`` cannot be encoded, or ``None`` if it can."""
    obs, nxt = leaves.get(pair.obs_key), leaves.get(pair.next_key)
    if obs is None:
        return "no such leaf at the root"
    if nxt is None:
        return f"has no twin {pair.name}"
    if not (isinstance(obs, torch.Tensor) and isinstance(nxt, torch.Tensor)):
        return "is not a tensor"
    if obs.shape != nxt.shape or obs.dtype != nxt.dtype:
        return (
            f"shape/dtype {list(obs.shape)} {_dtype_name(obs.dtype)} differs from "
            f"{pair.name}'s {list(nxt.shape)} {_dtype_name(nxt.dtype)}"
        )
    if not supports(obs.dtype):
        return f"is {_dtype_name(obs.dtype)}, which the chosen codec cannot encode"
    return None


def select_pairs(
    td: TensorDictBase,
    keys: Sequence[str] | None,
    file: Path,
    supports: Callable[[torch.dtype], bool],
) -> list[Pair]:
    """The observation pairs to encode: ``keys`` (slash-joined) or every eligible leaf.

    By default a leaf is eligible if the codec supports its dtype; bool leaves never are (they
    are flags, not observations, as in TorchRL's ``excluded_dtypes``).
    """
    leaves = _leaves(td)
    if any(k[:2] == ("next", "delta") for k in leaves):
        raise InputError(
            "already holds next/delta leaves but no obsdelta metadata",
            file=file,
            hint="it was written by another tool (e.g. TorchRL's NextObservationDelta); "
            "inflate it there first",
        )
    if keys:
        pairs = []
        for text in keys:
            parts = tuple(p for p in text.split("/") if p)
            pair = Pair(parts[1:] if parts[:1] == ("next",) else parts)
            problem = _pair_problem(leaves, pair, supports) if pair.obs_key else "empty key"
            if problem:
                raise DataError(problem, file=file, key=text, hint="pick keys with --key")
            if pair not in pairs:
                pairs.append(pair)
        return pairs

    def eligible(dtype: torch.dtype) -> bool:
        return dtype != torch.bool and supports(dtype)

    roots = [Pair(k) for k in leaves if k[0] != "next"]
    pairs = [p for p in roots if _pair_problem(leaves, p, eligible) is None]
    if not pairs:
        raise DataError(
            "found no leaf the codec can encode with a same-shaped twin under 'next'",
            file=file,
            hint="nothing to compress; name keys with --key, or try --codec exact",
        )
    return pairs


def _check_time_dim(td: TensorDictBase, time_dim: int, file: Path) -> int:
    if not -td.batch_dims <= time_dim < td.batch_dims:
        raise UsageError(
            f"--time-dim {time_dim} is not a batch dimension of batch size {list(td.batch_size)}",
            file=file,
            hint=f"use a value in [{-td.batch_dims}, {td.batch_dims - 1}]",
        )
    return time_dim % td.batch_dims


def read_meta(source: Source) -> dict[str, Any]:
    """The obsdelta metadata of a compressed source, checked for a known format version."""
    meta = source.meta
    if meta is None:
        raise InputError(
            "is not compressed by obsdelta (no obsdelta metadata)",
            file=source.path,
            hint="compress it first, or pass the compressed output",
        )
    version = meta.get("obsdelta_format")
    if not isinstance(version, int):
        raise InputError("metadata has no format version", file=source.path, hint="damaged file")
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"written with obsdelta format {version}; this obsdelta reads up to {FORMAT_VERSION}",
            file=source.path,
            hint="upgrade obsdelta",
        )
    return meta


# ---------------------------------------------------------------------------------------------
# Rows, successors and chunks


@dataclass(frozen=True)
class Rows:
    """Rows (transitions) of a leaf flattened over its batch dimensions, and their successors.

    The successor of row ``r`` is the row one step later along the time dimension,
    ``r + step``; the last step of each trajectory row, and rows past ``valid``, have none.
    """

    total: int
    valid: int
    step: int
    length: int

    @classmethod
    def of(cls, batch: torch.Size, time_dim: int, valid_rows: int | None) -> Rows:
        per_first = math.prod(batch[1:])
        valid = batch[0] if valid_rows is None else valid_rows
        return cls(
            total=math.prod(batch),
            valid=valid * per_first,
            step=math.prod(batch[time_dim + 1 :]),
            length=batch[time_dim],
        )

    def has_successor(self, start: int, stop: int) -> torch.Tensor:
        r = torch.arange(start, stop)
        return ((r // self.step) % self.length < self.length - 1) & (r + self.step < self.valid)


def _flat(t: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """View a leaf as ``[rows, *features]`` (leaves are contiguous, so this is free)."""
    return t.reshape(-1, *t.shape[batch_dims:])


@dataclass(frozen=True)
class _Chunker:
    rows: Rows
    chunk_bytes: int

    def slices(self, leaf: torch.Tensor, stop: int | None = None) -> Iterator[slice]:
        """Row slices of about ``chunk_bytes`` of ``leaf`` (flat), up to ``stop`` (default all)."""
        end = leaf.shape[0] if stop is None else stop
        row_bytes = max(1, math.prod(leaf.shape[1:]) * leaf.element_size())
        step = max(1, self.chunk_bytes // row_bytes)
        for start in range(0, end, step):
            yield slice(start, min(end, start + step))

    def window(self, obs: torch.Tensor, sl: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``sl`` of ``obs`` and their successors, read once; a row without a successor
        gets its own observation (any fixed choice works: inflate makes the same one)."""
        n = sl.stop - sl.start
        block = obs[sl.start : min(self.rows.total, sl.stop + self.rows.step)]
        chunk = block[:n]
        successor = chunk.clone()
        reach = block.shape[0] - self.rows.step
        if reach > 0:
            successor[:reach] = block[self.rows.step : self.rows.step + reach]
        missing = ~self.rows.has_successor(sl.start, sl.stop)
        if bool(missing.any()):
            successor[missing] = chunk[missing]
        return chunk, successor


@dataclass
class _Chunk:
    stored: torch.Tensor | None
    rebuilt: torch.Tensor
    verdict: Verdict
    #: Positions (within the chunk) of the exception rows.
    bad: torch.Tensor


def _code_chunk(
    codec: Codec,
    obs: torch.Tensor,
    nxt: torch.Tensor,
    successor: torch.Tensor | None,
    bound: float | None,
) -> _Chunk:
    """Encode, decode exactly as inflate will, judge, and patch the exception rows in."""
    stored = codec.encode(obs, nxt, successor)
    rebuilt = codec.decode(obs, stored, successor, nxt.dtype)
    exact = codec.lossless or bound == 0
    verdict = judge(obs, nxt, stored, rebuilt, bound=bound, exact=exact)
    bad = (~verdict.ok).nonzero().flatten()
    if bad.numel():
        rebuilt[bad] = nxt[bad]
        if stored is not None:
            stored[bad] = 0
    return _Chunk(stored, rebuilt, verdict, bad)


def _array_names(index: int) -> dict[str, str]:
    return {"index": f"k{index}.index", "rows": f"k{index}.rows"}


# ---------------------------------------------------------------------------------------------
# Per-key passes


@dataclass
class _Job:
    """One pass over a dataset: its geometry, the bound and where exceptions go."""

    leaves: dict[Key, torch.Tensor]
    batch_dims: int
    chunker: _Chunker
    bound: float | None

    @property
    def rows(self) -> Rows:
        return self.chunker.rows

    def flat(self, key: Key) -> torch.Tensor:
        return _flat(self.leaves[key], self.batch_dims)

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if not isinstance(src, torch.Tensor):
            return  # a non-tensor leaf, already in the output through the template
        src, dst = _flat(src, self.batch_dims), _flat(dst, self.batch_dims)
        for sl in self.chunker.slices(src):
            dst[sl].copy_(src[sl])

    def _chunks(
        self, pair: Pair, successors: bool
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        obs, nxt = self.flat(pair.obs_key), self.flat(pair.next_key)
        for sl in self.chunker.slices(obs, self.rows.valid):
            if successors:
                o, succ = self.chunker.window(obs, sl)
                yield sl, o, nxt[sl], succ
            else:
                yield sl, obs[sl], nxt[sl], None

    def encode(
        self, pair: Pair, codec: Codec, sink: Sink, names: dict[str, str], allow: bool
    ) -> ErrorStats:
        """Write ``pair``'s stored leaf and exception rows; return the figures."""
        has_leaf = codec.stored_dtype(self.leaves[pair.obs_key].dtype) is not None
        dst = _flat(sink.td.get(pair.delta_key), self.batch_dims) if has_leaf else None
        stats = ErrorStats()
        for sl, o, n, succ in self._chunks(pair, codec.uses_successor):
            c = _code_chunk(codec, o, n, succ, self.bound)
            stats.count(c.verdict)
            if c.bad.numel() and allow:
                sink.arrays.append(names["index"], c.bad + sl.start)
                sink.arrays.append(names["rows"], n[c.bad])
            stats.update(n, c.rebuilt, exceptions=int(c.bad.numel()))
            if dst is not None and c.stored is not None:
                dst[sl].copy_(c.stored)
        if dst is not None:
            # Rows past a replay buffer's len are not data: store a zero delta for them.
            dst[self.rows.valid :].zero_()
        return stats

    def measure(self, pair: Pair, codecs: Sequence[Codec]) -> list[ErrorStats]:
        """Figures of every codec on ``pair``, reading it once, writing nothing."""
        stats = [ErrorStats() for _ in codecs]
        successors = any(c.uses_successor for c in codecs)
        for _sl, o, n, succ in self._chunks(pair, successors):
            for codec, s in zip(codecs, stats, strict=True):
                c = _code_chunk(codec, o, n, succ, self.bound)
                s.count(c.verdict)
                s.update(n, c.rebuilt, exceptions=int(c.bad.numel()))
        return stats

    def decode(
        self,
        pair: Pair,
        codec: Codec,
        dtype: torch.dtype,
        arrays: ArrayStore,
        record: dict[str, Any],
        dst: torch.Tensor,
    ) -> None:
        """Rebuild ``pair``'s next observations into ``dst``."""
        obs = self.flat(pair.obs_key)
        stored = self.flat(pair.delta_key) if codec.stored_dtype(dtype) else None
        n_exc = int(record.get("exception_rows", 0))
        names = record.get("arrays") or {}
        index = arrays.get(names.get("index", ""), torch.int64, (n_exc,))
        rows = arrays.get(names.get("rows", ""), dtype, (n_exc, *obs.shape[1:]))
        dst = _flat(dst, self.batch_dims)
        for sl in self.chunker.slices(obs, self.rows.valid):
            if codec.uses_successor:
                o, succ = self.chunker.window(obs, sl)
            else:
                o, succ = obs[sl], None
            rebuilt = codec.decode(o, None if stored is None else stored[sl], succ, dtype)
            lo, hi = torch.searchsorted(index, torch.tensor([sl.start, sl.stop])).tolist()
            if hi > lo:
                rebuilt[index[lo:hi] - sl.start] = rows[lo:hi]
            dst[sl].copy_(rebuilt)
        # Rows past a replay buffer's len are not data: they come back as next = obs.
        for sl in self.chunker.slices(obs):
            if sl.stop > self.rows.valid:
                start = max(sl.start, self.rows.valid)
                dst[start : sl.stop].copy_(obs[start : sl.stop])


def _job(source: Source, time_dim: int, chunk_mb: float, bound: float | None) -> _Job:
    if chunk_mb <= 0:
        raise UsageError(f"--chunk-mb must be positive, got {chunk_mb}")
    td = source.td
    rows = Rows.of(td.batch_size, time_dim, source.valid_rows)
    chunker = _Chunker(rows, max(1, int(chunk_mb * 2**20)))
    return _Job(_leaves(td), td.batch_dims, chunker, bound)


def _placeholder(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    # A zero-stride tensor: gives the output its shape and dtype without allocating it.
    return torch.zeros((), dtype=dtype).expand(shape)


def _write(
    fmt: Format,
    source: Source,
    output: Path,
    template: TensorDictBase,
    fill: Callable[[Sink], dict[str, Any] | None],
    force: bool,
) -> None:
    """Create ``output`` from ``template`` atomically; ``fill`` writes it and returns the meta."""
    try:
        with atomic_output(output, source=source.path, force=force) as tmp:
            sink = fmt.create(tmp, template, source)
            meta = fill(sink)
            fmt.finish(tmp, sink, meta)
    except ObsdeltaError:
        raise
    except (OSError, RuntimeError) as exc:
        # torch and tensordict report failed writes (disk full, no permission, file too large)
        # as RuntimeError; those name a file, an open, a resize or a position.
        text = str(exc)
        if isinstance(exc, RuntimeError) and not _IO_FAILURE.search(text):
            raise
        reason = getattr(exc, "strerror", None) or (text.splitlines() or [type(exc).__name__])[0]
        raise OutputError(
            f"cannot write ({reason})",
            file=getattr(exc, "filename", None) or output,
            hint="check free space and permissions; nothing was written",
        ) from None


# ---------------------------------------------------------------------------------------------
# Choosing codecs


def _check_bound(max_abs_error: float | None) -> None:
    if max_abs_error is not None and not (max_abs_error >= 0 and math.isfinite(max_abs_error)):
        raise UsageError(f"--max-abs-error must be a finite number >= 0, got {max_abs_error}")


def _candidates(dtype: torch.dtype, bound: float | None) -> list[Codec]:
    """Every codec that can encode ``dtype`` under ``bound`` (quantisers need a bound > 0)."""
    out = []
    for cls in CODECS.values():
        try:
            codec = cls.create(bound)
        except UsageError:
            continue
        if codec.supports(dtype):
            out.append(codec)
    return out


def _bytes_after(codec: Codec, leaf: torch.Tensor, batch_dims: int, stats: ErrorStats) -> int:
    """Bytes ``codec`` stores for ``leaf``: its per-row leaf plus the exception rows."""
    stored = codec.stored_dtype(leaf.dtype)
    row_bytes = math.prod(leaf.shape[batch_dims:]) * leaf.element_size()
    base = 0 if stored is None else math.prod(leaf.shape) * stored.itemsize
    return base + stats.exception_rows * (row_bytes + INDEX_BYTES)


def _candidate(codec: Codec, leaf: torch.Tensor, batch_dims: int, stats: ErrorStats) -> Candidate:
    return Candidate(
        codec=codec.id,
        bytes_after=_bytes_after(codec, leaf, batch_dims, stats),
        max_abs_error=stats.max_abs_error,
        rmse=stats.rmse,
        max_rel_error=stats.max_rel_error,
        exact_rows=stats.exact_rows,
        exception_rows=stats.exception_rows,
    )


def _auto_pick(candidates: Sequence[Candidate], raw_bytes: int) -> str | None:
    """The smallest candidate (ties: the more accurate), or ``None`` if none beats raw."""
    if not candidates:
        return None
    best = min(candidates, key=lambda c: (c.bytes_after, c.max_abs_error or 0.0))
    return best.codec if best.bytes_after < raw_bytes else None


# ---------------------------------------------------------------------------------------------
# Commands


def compress(
    input: Path,
    output: Path,
    *,
    codec: str = DEFAULT_CODEC,
    keys: Sequence[str] | None = None,
    max_abs_error: float | None = None,
    exceptions: bool = True,
    time_dim: int = -1,
    force: bool = False,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> DatasetResult:
    """Write ``output``: ``input`` with each selected ``("next", k)`` stored by a codec.

    ``codec="auto"`` picks, per key, the smallest codec whose every row is within
    ``max_abs_error`` (default 0: lossless). Rows a codec cannot store within the bound are kept
    as exception rows in full precision; ``exceptions=False`` refuses the key instead.
    """
    input, output = Path(input), Path(output)
    _check_bound(max_abs_error)
    auto = codec == AUTO
    bound = (max_abs_error or 0.0) if auto else max_abs_error
    chosen = None if auto else make_codec(codec, bound)
    if chosen is not None and chosen.uses_successor and not exceptions:
        raise UsageError(
            f"codec {chosen.id} stores episode boundaries as exception rows",
            hint="drop --no-exceptions",
        )
    fmt, source = _open(input)
    if source.meta is not None:
        raise InputError(
            "is already compressed by obsdelta", file=input, hint="inflate it, or use it as it is"
        )
    td = source.td
    time_dim = _check_time_dim(td, time_dim, input)

    def supports(dtype: torch.dtype) -> bool:
        return bool(_candidates(dtype, bound)) if chosen is None else chosen.supports(dtype)

    pairs = select_pairs(td, keys, input, supports)
    job = _job(source, time_dim, chunk_mb, bound)
    leaves = job.leaves

    plans: list[tuple[Pair, Codec | None, list[Candidate] | None]] = []
    for p in pairs:
        if chosen is not None:
            plans.append((p, chosen, None))
            continue
        obs = leaves[p.obs_key]
        codecs = _candidates(obs.dtype, bound)
        stats = job.measure(p, codecs)
        cands = [_candidate(c, obs, td.batch_dims, s) for c, s in zip(codecs, stats, strict=True)]
        pick = _auto_pick(cands, obs.numel() * obs.element_size())
        plans.append((p, next((c for c in codecs if c.id == pick), None), cands))

    encoded = [(p, c) for p, c, _ in plans if c is not None]
    replaced = {p.next_key for p, _ in encoded}
    template = TensorDict(batch_size=td.batch_size, device=td.device)
    for key, leaf in leaves.items():
        if key not in replaced:
            template.set(key, leaf)
    for p, c in encoded:
        obs = leaves[p.obs_key]
        stored = c.stored_dtype(obs.dtype)
        if stored is not None:
            template.set(p.delta_key, _placeholder(obs.shape, stored))

    results: list[KeyResult] = []

    def fill(sink: Sink) -> dict[str, Any]:
        for key, leaf in leaves.items():
            if key not in replaced:
                job.copy(leaf, sink.td.get(key))
        records = []
        for i, (p, c, cands) in enumerate(plans):
            obs = leaves[p.obs_key]
            if c is None:
                results.append(_kept_result(p, obs, cands))
                continue
            names = _array_names(i)
            stats = job.encode(p, c, sink, names, exceptions)
            if not exceptions and stats.exception_rows:
                _refuse(stats, c, input, p)
            result = _key_result(p, c, obs, td.batch_dims, stats, bound, cands)
            results.append(result)
            records.append(_key_meta(result, p, c, names if stats.exception_rows else None))
        return {
            "obsdelta_format": FORMAT_VERSION,
            "writer": f"obsdelta {__version__}",
            "format": fmt.name,
            "batch_size": list(td.batch_size),
            "time_dim": time_dim,
            "valid_rows": source.valid_rows,
            "leaf_order": [list(k) for k in leaves],
            "keys": records,
        }

    _write(fmt, source, output, template, fill, force)
    return DatasetResult(
        command="compress",
        input=str(input),
        output=str(output),
        format=fmt.name,
        compressed=True,
        bytes_before=disk_size(input),
        bytes_after=disk_size(output),
        keys=results,
    )


def _refuse(stats: ErrorStats, codec: Codec, file: Path, pair: Pair) -> None:
    reasons = []
    if stats.nonfinite_rows:
        reasons.append(f"{stats.nonfinite_rows} hold NaN or inf")
    if stats.overflow_rows:
        reasons.append(f"{stats.overflow_rows} have a delta beyond {codec.id}'s range")
    if stats.over_bound_rows:
        reasons.append(f"{stats.over_bound_rows} exceed --max-abs-error")
    wider = "; or use --codec fp32" if stats.overflow_rows and codec.id != "fp32" else ""
    raise DataError(
        f"{stats.exception_rows} of {stats.rows} rows cannot be stored by {codec.id} "
        f"({', '.join(reasons)})",
        file=file,
        key=pair.name,
        hint=f"drop --no-exceptions to store them exactly as exception rows{wider}",
    )


def _key_result(
    pair: Pair,
    codec: Codec,
    obs: torch.Tensor,
    batch_dims: int,
    stats: ErrorStats,
    bound: float | None,
    candidates: list[Candidate] | None,
) -> KeyResult:
    stored = codec.stored_dtype(obs.dtype)
    return KeyResult(
        key=pair.name,
        codec=codec.id,
        dtype=_dtype_name(obs.dtype),
        shape=list(obs.shape),
        bytes_before=obs.numel() * obs.element_size(),
        bytes_after=_bytes_after(codec, obs, batch_dims, stats),
        max_abs_error=stats.max_abs_error,
        rmse=stats.rmse,
        max_rel_error=stats.max_rel_error,
        rows=stats.rows,
        exact_rows=stats.exact_rows,
        exception_rows=stats.exception_rows,
        stored_dtype=None if stored is None else _dtype_name(stored),
        delta_key=None if stored is None else key_str(pair.delta_key),
        max_abs_error_bound=bound,
        candidates=candidates,
    )


def _kept_result(pair: Pair, obs: torch.Tensor, candidates: list[Candidate] | None) -> KeyResult:
    raw = obs.numel() * obs.element_size()
    return KeyResult(
        key=pair.name,
        codec="none",
        dtype=_dtype_name(obs.dtype),
        shape=list(obs.shape),
        bytes_before=raw,
        bytes_after=raw,
        max_abs_error=0.0,
        rmse=0.0,
        rows=0,
        exact_rows=0,
        candidates=candidates,
    )


def _key_meta(
    result: KeyResult, pair: Pair, codec: Codec, arrays: dict[str, str] | None
) -> dict[str, Any]:
    return {
        "key": result.key,
        "obs_key": list(pair.obs_key),
        "next_key": list(pair.next_key),
        "delta_key": None if result.delta_key is None else list(pair.delta_key),
        "codec": codec.get_config(),
        "source_dtype": result.dtype,
        "stored_dtype": result.stored_dtype,
        "shape": result.shape,
        "bytes_before": result.bytes_before,
        "bytes_after": result.bytes_after,
        "rows": result.rows,
        "exact_rows": result.exact_rows,
        "exception_rows": result.exception_rows,
        "arrays": arrays,
        "max_abs_error_bound": result.max_abs_error_bound,
        "max_abs_error": result.max_abs_error,
        "rmse": result.rmse,
        "max_rel_error": result.max_rel_error,
    }


@dataclass
class _Stored:
    """One key as the metadata describes it, checked against the data."""

    pair: Pair
    codec: Codec
    dtype: torch.dtype
    record: dict[str, Any]


def _stored_keys(source: Source, meta: dict[str, Any]) -> list[_Stored]:
    leaves = _leaves(source.td)
    out = []
    for record in meta.get("keys", []):
        try:
            pair = Pair(tuple(record["obs_key"]))
            dtype = _dtype(record["source_dtype"], source.path)
            codec = codec_from_config(record["codec"])
        except (KeyError, TypeError):
            raise InputError(
                "obsdelta metadata is incomplete", file=source.path, hint="the file is damaged"
            ) from None
        needed = [pair.obs_key] + ([pair.delta_key] if codec.stored_dtype(dtype) else [])
        for key in needed:
            if key not in leaves:
                raise InputError(
                    f"leaf {key_str(key)} named in the metadata is missing",
                    file=source.path,
                    key=record.get("key"),
                    hint="the file is damaged or was edited",
                )
        out.append(_Stored(pair, codec, dtype, record))
    return out


def inflate(
    input: Path,
    output: Path,
    *,
    force: bool = False,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> DatasetResult:
    """Write ``output``: ``input`` with every next observation rebuilt in its dtype and order."""
    input, output = Path(input), Path(output)
    fmt, source = _open(input)
    meta = read_meta(source)
    stored = _stored_keys(source, meta)
    td = source.td
    job = _job(source, int(meta.get("time_dim", td.batch_dims - 1)), chunk_mb, None)
    leaves = job.leaves
    rebuilt = {s.pair.next_key: s for s in stored}
    dropped = {s.pair.delta_key for s in stored}

    order = [tuple(k) for k in meta.get("leaf_order", [])]
    order += [k for k in leaves if k not in order and k not in dropped]
    template = TensorDict(batch_size=td.batch_size, device=td.device)
    for key in order:
        if key in rebuilt:
            s = rebuilt[key]
            template.set(key, _placeholder(leaves[s.pair.obs_key].shape, s.dtype))
        elif key in leaves:
            template.set(key, leaves[key])
        else:
            raise InputError(
                f"leaf {key_str(key)} named in the metadata is missing",
                file=input,
                hint="the file is damaged or was edited",
            )
    arrays = source.arrays if source.arrays is not None else ArrayStore(input)

    def fill(sink: Sink) -> None:
        for key in order:
            if key in rebuilt:
                s = rebuilt[key]
                job.decode(s.pair, s.codec, s.dtype, arrays, s.record, sink.td.get(key))
            else:
                job.copy(leaves[key], sink.td.get(key))
        return None

    _write(fmt, source, output, template, fill, force)
    return DatasetResult(
        command="inflate",
        input=str(input),
        output=str(output),
        format=fmt.name,
        compressed=False,
        bytes_before=disk_size(input),
        bytes_after=disk_size(output),
        keys=[_recorded_result(s, leaves, restored=True) for s in stored],
    )


def _recorded_result(s: _Stored, leaves: dict[Key, torch.Tensor], *, restored: bool) -> KeyResult:
    r = s.record
    obs = leaves[s.pair.obs_key]
    raw = obs.numel() * s.dtype.itemsize
    small = int(r.get("bytes_after", 0))
    return KeyResult(
        key=s.pair.name,
        codec=s.codec.id,
        dtype=_dtype_name(s.dtype),
        shape=list(obs.shape),
        bytes_before=small if restored else raw,
        bytes_after=raw if restored else small,
        max_abs_error=r.get("max_abs_error"),
        rmse=r.get("rmse"),
        max_rel_error=r.get("max_rel_error"),
        rows=int(r.get("rows", 0)),
        exact_rows=int(r.get("exact_rows", 0)),
        exception_rows=int(r.get("exception_rows", 0)),
        stored_dtype=r.get("stored_dtype"),
        delta_key=None if r.get("delta_key") is None else key_str(s.pair.delta_key),
        max_abs_error_bound=r.get("max_abs_error_bound"),
    )


def report(
    input: Path,
    *,
    codec: str = DEFAULT_CODEC,
    keys: Sequence[str] | None = None,
    max_abs_error: float | None = None,
    time_dim: int = -1,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> DatasetResult:
    """Measure without writing.

    On a plain input: every codec on every key (a dry run), with what ``--codec auto`` would
    pick under ``max_abs_error`` marked. On a compressed input: what is stored and the error
    measured when it was written.
    """
    input = Path(input)
    _check_bound(max_abs_error)
    if codec != AUTO:
        make_codec(codec, max_abs_error)  # refuse what compress would refuse
    fmt, source = _open(input)
    size = disk_size(input)
    if source.meta is not None:
        meta = read_meta(source)
        leaves = _leaves(source.td)
        results = [_recorded_result(s, leaves, restored=False) for s in _stored_keys(source, meta)]
        return DatasetResult("report", str(input), None, fmt.name, True, size, size, results)

    td = source.td
    time_dim = _check_time_dim(td, time_dim, input)
    bound = (max_abs_error or 0.0) if codec == AUTO else max_abs_error
    pairs = select_pairs(td, keys, input, lambda dt: bool(_candidates(dt, bound)))
    job = _job(source, time_dim, chunk_mb, bound)
    results = []
    saved = 0
    for p in pairs:
        obs = job.leaves[p.obs_key]
        codecs = _candidates(obs.dtype, bound)
        stats = job.measure(p, codecs)
        cands = [_candidate(c, obs, td.batch_dims, s) for c, s in zip(codecs, stats, strict=True)]
        raw = obs.numel() * obs.element_size()
        auto_pick = _auto_pick(cands, raw) or "none"
        want = auto_pick if codec == AUTO else codec
        pick = next((c for c in cands if c.codec == want), None)
        rows = stats[0].rows if stats else 0
        result = KeyResult(
            key=p.name,
            codec=want,
            dtype=_dtype_name(obs.dtype),
            shape=list(obs.shape),
            bytes_before=raw,
            bytes_after=raw if pick is None else pick.bytes_after,
            max_abs_error=0.0 if pick is None else pick.max_abs_error,
            rmse=0.0 if pick is None else pick.rmse,
            max_rel_error=0.0 if pick is None else pick.max_rel_error,
            rows=rows,
            exact_rows=rows if pick is None else pick.exact_rows,
            exception_rows=0 if pick is None else pick.exception_rows,
            max_abs_error_bound=bound,
            candidates=cands,
            auto_pick=auto_pick,
        )
        saved += result.bytes_before - result.bytes_after
        results.append(result)
    return DatasetResult("report", str(input), None, fmt.name, False, size, size - saved, results)
