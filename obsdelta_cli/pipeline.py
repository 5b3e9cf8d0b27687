"""The pipeline: stream chunks of rows from a source container through a codec into an output.

``compress`` replaces each selected next-observation leaf with what a codec stores (usually a
delta leaf) plus exception rows; ``inflate`` undoes it; ``report`` measures without writing.
Containers are reached only through the format adapters and deltas only through the codecs, so
this module holds the semantics: which pairs to encode, rows and their successors along time,
which rows become exceptions, the metadata and the error accounting.

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

import functools
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import __version__
from .atomic import atomic_output
from .checksum import Crc
from .codecs import AUTO, CODECS, DEFAULT_CODEC, Codec, codec_from_config, make_codec
from .errors import (
    DataError,
    FormatVersionError,
    InputError,
    ObsdeltaError,
    OutputError,
    UsageError,
)
from .formats import Format, Key, LeafSpec, Pair, Plan, Sink, Source, detect, disk_size, key_str
from .formats.leaf import FlatRows, as_rows, is_data, nbytes
from .progress import current
from .report import Candidate, DatasetResult, KeyResult
from .stats import ErrorStats, Verdict, judge

#: Version of the stored metadata layout; bumped on any incompatible change.
FORMAT_VERSION = 1
#: Cache-sized chunks: each chunk goes through several passes (encode, decode, checks, CRC)
#: while it is still in cache. Measured fastest here at 0.5-1 MiB.
DEFAULT_CHUNK_MB = 1
#: Bytes an exception row costs beside its values: its int64 row index.
INDEX_BYTES = 8
# torch and tensordict report failed writes (disk full, no permission, file too large) as
# RuntimeError; those messages name a file, an open, a resize or a position.
_IO_FAILURE = re.compile(r"file|open|resize|unexpected pos|write|space|permi", re.IGNORECASE)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str, file: Path) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"stored dtype {name!r} is unknown", file=file, hint="the file is damaged")
    return dtype


# ---------------------------------------------------------------------------------------------
# Reading the source


def _pair_problem(
    source: Source, pair: Pair, supports: Callable[[torch.dtype], bool]
) -> str | None:
    """Why ``pair`` cannot be encoded, or ``None`` if it can."""
    obs, nxt = source.leaves.get(pair.obs_key), source.leaves.get(pair.next_key)
    if obs is None:
        return "no such leaf"
    if nxt is None:
        return f"has no twin {key_str(pair.next_key)}"
    if not (is_data(obs) and is_data(nxt)):
        return "is not a tensor"
    if tuple(obs.shape) != tuple(nxt.shape) or obs.dtype != nxt.dtype:
        return (
            f"shape/dtype {list(obs.shape)} {_dtype_name(obs.dtype)} differs from "
            f"{key_str(pair.next_key)}'s {list(nxt.shape)} {_dtype_name(nxt.dtype)}"
        )
    if not supports(obs.dtype):
        return f"is {_dtype_name(obs.dtype)}, which the chosen codec cannot encode"
    if len(obs.shape) < source.batch_dims or math.prod(obs.shape[: source.batch_dims]) == 0:
        return "has no rows"
    return None


def select_pairs(
    fmt: Format,
    source: Source,
    keys: Sequence[str] | None,
    supports: Callable[[torch.dtype], bool],
) -> list[Pair]:
    """The pairs to encode: those ``keys`` name (any alias), or every eligible one.

    By default a pair is eligible if the codec supports its dtype; bool leaves never are (they
    are flags, not observations, as in TorchRL's ``excluded_dtypes``).
    """
    candidates = fmt.pairs(source)
    if keys:
        chosen: list[Pair] = []
        for text in keys:
            wanted = "/".join(p for p in text.split("/") if p)
            named = [p for p in candidates if wanted in (p.name, *p.aliases)]
            if not wanted or not named:
                known = sorted({p.name for p in candidates})
                why = "empty key" if not wanted else "no such leaf"
                raise DataError(
                    why, file=source.path, key=text, hint=f"known: {', '.join(known) or 'none'}"
                )
            for pair in named:
                problem = _pair_problem(source, pair, supports)
                if problem:
                    raise DataError(
                        problem, file=source.path, key=text, hint="pick keys with --key"
                    )
                if pair not in chosen:
                    chosen.append(pair)
        return chosen

    def eligible(dtype: torch.dtype) -> bool:
        return dtype != torch.bool and supports(dtype)

    pairs = [p for p in candidates if _pair_problem(source, p, eligible) is None]
    if not pairs:
        empty = [p for p in candidates if _pair_problem(source, p, eligible) == "has no rows"]
        raise DataError(
            "has no rows" if empty else "found no leaf the codec can encode with a twin",
            file=source.path,
            key=empty[0].name if empty else None,
            hint="nothing to compress; check the file, name keys with --key, or try --codec exact",
        )
    return pairs


def _time_dim(source: Source, time_dim: int) -> int:
    dims = source.batch_dims
    if not -dims <= time_dim < dims:
        raise UsageError(
            f"--time-dim {time_dim} is not a batch dimension (the data has {dims})",
            file=source.path,
            hint=f"use a value in [{-dims}, {dims - 1}]",
        )
    return time_dim % dims


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
    #: Rows per index of the first batch dimension: chunks of lazy leaves align to it.
    align: int

    @classmethod
    def of(cls, batch: Sequence[int], time_dim: int, valid_rows: int | None) -> Rows:
        per_first = math.prod(batch[1:])
        valid = batch[0] if valid_rows is None else valid_rows
        return cls(
            total=math.prod(batch),
            valid=valid * per_first,
            step=math.prod(batch[time_dim + 1 :]),
            length=batch[time_dim],
            align=per_first,
        )

    def has_successor(self, rows: torch.Tensor) -> torch.Tensor:
        """Per row number in ``rows``: whether it has a successor."""
        last_step = (rows // self.step) % self.length == self.length - 1
        return ~last_step & (rows + self.step < self.valid)


def _slices(rows: Any, stop: int, chunk_bytes: int, align: int) -> Iterator[slice]:
    """Row slices of about ``chunk_bytes`` of ``rows`` (flat) up to ``stop``; lazy leaves are
    cut at whole indices of their first dimension."""
    row_bytes = max(1, math.prod(rows.shape[1:]) * rows.dtype.itemsize)
    step = max(1, chunk_bytes // row_bytes)
    if isinstance(rows, FlatRows):
        # Whole indices of the first dimension, and whole HDF5 chunks where the budget allows,
        # so that every stored chunk is read and written once.
        unit = align * getattr(rows.leaf, "chunk_rows", 1)
        unit = unit if unit <= step else align
        step = max(unit, step - step % unit)
    for start in range(0, stop, step):
        yield slice(start, min(stop, start + step))


def _window(obs: Any, sl: slice, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``sl`` of ``obs`` and their successors, read once; a row without a successor gets
    its own observation (any fixed choice works: inflate makes the same one)."""
    n = sl.stop - sl.start
    block = obs[sl.start : min(rows.total, sl.stop + rows.step)]
    chunk = block[:n]
    successor = chunk.clone()
    reach = block.shape[0] - rows.step
    if reach > 0:
        successor[:reach] = block[rows.step : rows.step + reach]
    missing = ~rows.has_successor(torch.arange(sl.start, sl.stop))
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
        verdict.same[bad] = True  # patched in: now bit for bit
    return _Chunk(stored, rebuilt, verdict, bad)


# ---------------------------------------------------------------------------------------------
# Per-pair passes


@dataclass
class _Job:
    """One pass over a dataset: where rows and time are, the bound and the chunk budget."""

    source: Source
    time_dim: int
    chunk_bytes: int
    bound: float | None

    def rows(self, pair: Pair) -> Rows:
        leaf = self.source.leaves[pair.obs_key]
        return Rows.of(leaf.shape[: self.source.batch_dims], self.time_dim, self.source.valid_rows)

    def flat(self, leaf: Any) -> Any:
        return as_rows(leaf, self.source.batch_dims)

    def copy(self, src: Any, dst: Any) -> str | None:
        """Copy a leaf chunk by chunk; return the CRC-32 of what was written."""
        if not is_data(src):
            return None  # a non-tensor leaf, already in the output through the template
        crc = Crc()
        src = self.flat(src)
        dst = None if dst is None else self.flat(dst)
        align = src.per_first if isinstance(src, FlatRows) else 1
        for sl in _slices(src, src.shape[0], self.chunk_bytes, align):
            chunk = src[sl]
            crc.update(chunk)
            if dst is not None:
                dst[sl] = chunk
        return crc.hex

    def _chunks(
        self, pair: Pair, successors: bool
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        rows = self.rows(pair)
        obs = self.flat(self.source.leaves[pair.obs_key])
        nxt = self.flat(self.source.leaves[pair.next_key])
        with _reporting(pair, rows, obs) as advance:
            for sl in _slices(obs, rows.valid, self.chunk_bytes, rows.align):
                if successors:
                    o, succ = _window(obs, sl, rows)
                    yield sl, o, nxt[sl], succ
                else:
                    yield sl, obs[sl], nxt[sl], None
                advance(sl)

    def encode(
        self, pair: Pair, codec: Codec, sink: Sink, names: dict[str, str], allow: bool
    ) -> tuple[ErrorStats, dict[str, str]]:
        """Write ``pair``'s stored leaf and exception rows; return the figures and the CRC-32
        of the original next observations, of what inflate rebuilds, and of what was written."""
        has_leaf = codec.stored_dtype(self.source.leaves[pair.obs_key].dtype) is not None
        dst = self.flat(sink.leaves[pair.delta_key]) if has_leaf else None
        stats = ErrorStats()
        crcs = {name: Crc() for name in ("next", "rebuilt", "stored", "index", "rows")}
        for sl, o, n, succ in self._chunks(pair, codec.uses_successor):
            c = _code_chunk(codec, o, n, succ, self.bound)
            stats.count(c.verdict)
            if c.bad.numel() and allow:
                index, rows_out = c.bad + sl.start, n[c.bad]
                sink.arrays.append(names["index"], index)
                sink.arrays.append(names["rows"], rows_out)
                crcs["index"].update(index)
                crcs["rows"].update(rows_out)
            stats.update(n, c.rebuilt, exceptions=int(c.bad.numel()), same=c.verdict.same)
            crcs["next"].update(n)
            crcs["rebuilt"].update(c.rebuilt)
            if dst is not None and c.stored is not None:
                dst[sl] = c.stored
                crcs["stored"].update(c.stored)
        rows = self.rows(pair)
        if dst is not None and rows.valid < rows.total:
            # Rows past a replay buffer's len are not data: store a zero delta for them.
            dst[rows.valid :] = 0
        return stats, {name: crc.hex for name, crc in crcs.items()}

    def measure(self, pair: Pair, codecs: Sequence[Codec]) -> list[ErrorStats]:
        """Figures of every codec on ``pair``, reading it once, writing nothing."""
        stats = [ErrorStats() for _ in codecs]
        successors = any(c.uses_successor for c in codecs)
        for _sl, o, n, succ in self._chunks(pair, successors):
            for codec, s in zip(codecs, stats, strict=True):
                c = _code_chunk(codec, o, n, succ, self.bound)
                s.count(c.verdict)
                s.update(n, c.rebuilt, exceptions=int(c.bad.numel()), same=c.verdict.same)
        return stats

    def decoded(self, stored: _Stored) -> Iterator[tuple[slice, torch.Tensor]]:
        """A pair's rebuilt next observations, chunk by chunk, valid rows first, in order."""
        pair, codec, dtype = stored.pair, stored.codec, stored.dtype
        rows = self.rows(pair)
        obs = self.flat(self.source.leaves[pair.obs_key])
        delta = self.flat(self.source.leaves[pair.delta_key]) if codec.stored_dtype(dtype) else None
        index, rows_at = self.exceptions(stored, obs.shape[1:])
        with _reporting(pair, rows, obs) as advance:
            for sl in _slices(obs, rows.valid, self.chunk_bytes, rows.align):
                if codec.uses_successor:
                    o, succ = _window(obs, sl, rows)
                else:
                    o, succ = obs[sl], None
                rebuilt = codec.decode(o, None if delta is None else delta[sl], succ, dtype)
                if index is not None and rows_at is not None:
                    bounds = torch.tensor([sl.start, sl.stop])
                    lo, hi = torch.searchsorted(index, bounds).tolist()
                    if hi > lo:
                        rebuilt[index[lo:hi] - sl.start] = rows_at[lo:hi]
                yield sl, rebuilt
                advance(sl)
        if rows.valid < rows.total:
            # Rows past a replay buffer's len are not data: they come back as next = obs.
            for sl in _slices(obs, rows.total, self.chunk_bytes, rows.align):
                if sl.stop > rows.valid:
                    tail = slice(max(sl.start, rows.valid), sl.stop)
                    yield tail, obs[tail]

    def exceptions(
        self, stored: _Stored, features: Sequence[int]
    ) -> tuple[torch.Tensor | None, Any]:
        """The exception rows' index (in memory: 8 bytes a row) and rows (lazy) of a pair."""
        n_exc = int(stored.record.get("exception_rows", 0))
        if not n_exc:
            return None, None
        names = stored.record.get("arrays") or {}
        arrays = self.source.arrays
        if arrays is None or not names:
            raise InputError(
                "exception rows are missing", file=self.source.path, key=stored.pair.name
            )
        index = torch.as_tensor(arrays.get(names["index"], torch.int64, (n_exc,))[:])
        if index.numel() > 1 and not bool((index[1:] > index[:-1]).all()):
            raise DataError(
                "exception row index is not increasing",
                file=self.source.path,
                key=stored.pair.name,
                hint="the compressed dataset is damaged",
            )
        return index, arrays.get(names["rows"], stored.dtype, (n_exc, *features))

    def decode(self, stored: _Stored, dst: Any) -> None:
        """Rebuild a pair's next observations into ``dst``, checking them against the CRC-32
        recorded at compress time."""
        dst = self.flat(dst)
        crc = Crc()
        valid = self.rows(stored.pair).valid
        for sl, rebuilt in self.decoded(stored):
            dst[sl] = rebuilt
            if sl.start < valid:
                crc.update(rebuilt)
        _expect(stored, "rebuilt", crc, self.source.path)

    def check(self, stored: _Stored) -> None:
        """Re-read everything stored for a pair and compare it with the recorded CRC-32s."""
        pair, path = stored.pair, self.source.path
        valid = self.rows(pair).valid
        if stored.codec.stored_dtype(stored.dtype) is not None:
            crc = Crc()
            delta = self.flat(self.source.leaves[pair.delta_key])
            for sl in _slices(delta, valid, self.chunk_bytes, self.rows(pair).align):
                crc.update(delta[sl])
            _expect(stored, "stored", crc, path, leaf=key_str(pair.delta_key))
        index, rows_at = self.exceptions(
            stored, self.source.leaves[pair.obs_key].shape[self.source.batch_dims :]
        )
        if index is not None:
            for name, array in (("index", index), ("rows", rows_at[:])):
                crc = Crc()
                crc.update(torch.as_tensor(array))
                _expect(stored, name, crc, path, leaf=f"exception {name} of {pair.name}")
        crc = Crc()
        for sl, rebuilt in self.decoded(stored):
            if sl.start < valid:
                crc.update(rebuilt)
        _expect(stored, "rebuilt", crc, path)
        lossless = int(stored.record.get("exact_rows", -1)) == int(stored.record.get("rows", -2))
        if lossless:
            _expect(stored, "next", crc, path)


def _expect(stored: _Stored, name: str, crc: Crc, file: Path, leaf: str | None = None) -> None:
    """Compare a CRC-32 with the one recorded for ``stored`` (older files may have none)."""
    recorded = (stored.record.get("crc32") or {}).get(name)
    if recorded is not None and recorded != crc.hex:
        what = {"rebuilt": "rebuilt next observations", "next": "original next observations"}
        raise DataError(
            f"checksum mismatch in the {what.get(name, 'stored data')} "
            f"(recorded {recorded}, found {crc.hex})",
            file=file,
            key=leaf or stored.pair.name,
            hint="the compressed dataset is damaged; restore it from a copy or compress again",
        )


def _one_thread(command: Callable[..., DatasetResult]) -> Callable[..., DatasetResult]:
    """Run a command with one torch thread: on chunks of a MiB, starting a parallel region for
    every operation costs more than it saves (measured: 25x slower with two threads here)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> DatasetResult:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return command(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


@contextmanager
def _reporting(pair: Pair, rows: Rows, obs: Any) -> Iterator[Callable[[slice], None]]:
    """A progress task over a pair's valid rows, counted in bytes of next observations."""
    progress = current()
    row_bytes = math.prod(obs.shape[1:]) * obs.dtype.itemsize
    task = progress.task(pair.name, rows.valid * row_bytes)
    try:
        yield lambda sl: progress.advance(task, (sl.stop - sl.start) * row_bytes)
    finally:
        progress.finish(task)


def _job(source: Source, time_dim: int, chunk_mb: float, bound: float | None) -> _Job:
    if chunk_mb <= 0:
        raise UsageError(f"--chunk-mb must be positive, got {chunk_mb}")
    return _Job(source, time_dim, max(1, int(chunk_mb * 2**20)), bound)


def _write(
    fmt: Format,
    source: Source,
    output: Path,
    plan: Plan,
    fill: Callable[[Sink], dict[str, Any] | None],
    force: bool,
    check: Callable[[Path], None] | None = None,
) -> None:
    """Create ``output`` as ``plan`` says, atomically; ``fill`` writes it and returns the meta,
    ``check`` re-reads it before it is renamed into place."""
    try:
        with atomic_output(output, source=source.path, force=force) as tmp:
            sink = fmt.create(tmp, source, plan)
            try:
                meta = fill(sink)
                fmt.finish(tmp, sink, meta)
            except BaseException:
                fmt.discard(sink)
                raise
            if check is not None:
                check(tmp)
    except ObsdeltaError:
        raise
    except (OSError, RuntimeError) as exc:
        text = str(exc)
        if isinstance(exc, RuntimeError) and not _IO_FAILURE.search(text):
            raise
        reason = getattr(exc, "strerror", None) or (text.splitlines() or [type(exc).__name__])[0]
        raise OutputError(
            f"cannot write ({reason})",
            file=getattr(exc, "filename", None) or output,
            hint="check free space and permissions; nothing was written",
        ) from None


def _open(path: Path) -> tuple[Format, Source]:
    fmt = detect(path)
    source = fmt.open(path)
    if source.valid_rows == 0:
        raise DataError(
            "holds no rows (len 0)", file=path, hint="nothing to do; check the right file was given"
        )
    return fmt, source


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


@dataclass
class _Key:
    """The pairs that share one name (one per robomimic demo; one otherwise), and their figures."""

    name: str
    pairs: list[Pair]
    dtype: torch.dtype
    features: tuple[int, ...]
    total_rows: int
    raw_bytes: int

    @classmethod
    def group(cls, source: Source, pairs: Sequence[Pair]) -> list[_Key]:
        out: dict[str, _Key] = {}
        for p in pairs:
            leaf = source.leaves[p.obs_key]
            key = out.get(p.name)
            rows = math.prod(leaf.shape[: source.batch_dims])
            if key is None:
                feats = tuple(leaf.shape[source.batch_dims :])
                out[p.name] = cls(p.name, [p], leaf.dtype, feats, rows, nbytes(leaf))
            else:
                key.pairs.append(p)
                key.total_rows += rows
                key.raw_bytes += nbytes(leaf)
        return list(out.values())

    @property
    def row_bytes(self) -> int:
        return math.prod(self.features) * self.dtype.itemsize

    def bytes_after(self, codec: Codec, stats: ErrorStats) -> int:
        """Bytes ``codec`` stores: its per-row leaves plus the exception rows and their index."""
        stored = codec.stored_dtype(self.dtype)
        base = 0 if stored is None else self.total_rows * math.prod(self.features) * stored.itemsize
        return base + stats.exception_rows * (self.row_bytes + INDEX_BYTES)

    def result(self, codec: str, stats: ErrorStats | None, after: int, **extra: Any) -> KeyResult:
        """The key's result; ``stats`` is ``None`` for a key kept as it is (exact on every row)."""
        return KeyResult(
            key=self.name,
            codec=codec,
            dtype=_dtype_name(self.dtype),
            shape=[self.total_rows, *self.features],
            bytes_before=self.raw_bytes,
            bytes_after=after,
            max_abs_error=0.0 if stats is None else stats.max_abs_error,
            rmse=0.0 if stats is None else stats.rmse,
            max_rel_error=0.0 if stats is None else stats.max_rel_error,
            rows=self.total_rows if stats is None else stats.rows,
            exact_rows=self.total_rows if stats is None else stats.exact_rows,
            exception_rows=0 if stats is None else stats.exception_rows,
            **extra,
        )


def _measure_key(
    job: _Job, key: _Key, bound: float | None
) -> tuple[list[Codec], list[Candidate], list[ErrorStats]]:
    codecs = _candidates(key.dtype, bound)
    totals = [ErrorStats() for _ in codecs]
    for p in key.pairs:
        for total, s in zip(totals, job.measure(p, codecs), strict=True):
            total.merge(s)
    cands = [
        Candidate(
            codec=c.id,
            bytes_after=key.bytes_after(c, s),
            max_abs_error=s.max_abs_error,
            rmse=s.rmse,
            max_rel_error=s.max_rel_error,
            exact_rows=s.exact_rows,
            exception_rows=s.exception_rows,
            feature_max_abs=None if s.feature_max_abs is None else s.feature_max_abs.tolist(),
        )
        for c, s in zip(codecs, totals, strict=True)
    ]
    return codecs, cands, totals


def _auto_pick(candidates: Sequence[Candidate], raw_bytes: int) -> str | None:
    """The smallest candidate (ties: the more accurate), or ``None`` if none beats raw."""
    if not candidates:
        return None
    best = min(candidates, key=lambda c: (c.bytes_after, c.max_abs_error))
    return best.codec if best.bytes_after < raw_bytes else None


# ---------------------------------------------------------------------------------------------
# Commands


@_one_thread
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
    options: dict[str, Any] | None = None,
    verify: bool = True,
) -> DatasetResult:
    """Write ``output``: ``input`` with each selected next observation stored by a codec.

    ``codec="auto"`` picks, per key, the smallest codec whose every row is within
    ``max_abs_error`` (default 0: lossless). Rows a codec cannot store within the bound are kept
    as exception rows in full precision; ``exceptions=False`` refuses the key instead.
    ``options`` are container write options (``{"h5_compression": "zstd"}``). With
    ``verify`` (the default) the output is re-read and checked before it is put in place.
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
    if fmt.nothing_to_do:
        fmt.close(source)
        raise InputError(fmt.nothing_to_do, file=input, hint="use the dataset as it is")
    options = {k: v for k, v in (options or {}).items() if v is not None}
    unknown = set(options) - fmt.options
    if unknown:
        raise UsageError(
            f"option {', '.join(sorted(unknown))} does not apply to {fmt.name}", file=input
        )
    if source.meta is not None:
        raise InputError(
            "is already compressed by obsdelta", file=input, hint="inflate it, or use it as it is"
        )
    time_dim = _time_dim(source, time_dim)

    def supports(dtype: torch.dtype) -> bool:
        return bool(_candidates(dtype, bound)) if chosen is None else chosen.supports(dtype)

    pairs = select_pairs(fmt, source, keys, supports)
    job = _job(source, time_dim, chunk_mb, bound)
    groups = _Key.group(source, pairs)

    plans: list[tuple[_Key, Codec | None, list[Candidate] | None]] = []
    for key in groups:
        if chosen is not None:
            plans.append((key, chosen, None))
            continue
        codecs, cands, _totals = _measure_key(job, key, bound)
        pick = _auto_pick(cands, key.raw_bytes)
        plans.append((key, next((c for c in codecs if c.id == pick), None), cands))

    encoded = [(p, c) for key, c, _ in plans if c is not None for p in key.pairs]
    replaced = {p.next_key for p, _ in encoded}
    order = [k for k in source.leaves if k not in replaced]
    new: dict[Key, LeafSpec] = {}
    for p, c in encoded:
        obs = source.leaves[p.obs_key]
        stored = c.stored_dtype(obs.dtype)
        if stored is not None:
            new[p.delta_key] = LeafSpec(tuple(obs.shape), stored, replaces=p.next_key)
            order.append(p.delta_key)
    plan = Plan(order, new, sorted(replaced), options)
    results: list[KeyResult] = []

    def fill(sink: Sink) -> dict[str, Any]:
        checksums: dict[str, str] = {}
        if not sink.copied:
            for k in order:
                if k not in new:
                    crc = job.copy(source.leaves[k], sink.leaves[k])
                    if crc is not None:
                        checksums[key_str(k)] = crc
        records: list[dict[str, Any]] = []
        for key, c, cands in plans:
            if c is None:
                results.append(key.result("none", None, key.raw_bytes, candidates=cands))
                continue
            total = ErrorStats()
            for p in key.pairs:
                names = {"index": f"k{len(records)}.index", "rows": f"k{len(records)}.rows"}
                stats, crcs = job.encode(p, c, sink, names, exceptions)
                if not exceptions and stats.exception_rows:
                    _refuse(stats, c, input, p)
                records.append(_record(p, c, key.dtype, stats, names, bound, crcs))
                total.merge(stats)
            stored = c.stored_dtype(key.dtype)
            results.append(
                key.result(
                    c.id,
                    total,
                    key.bytes_after(c, total),
                    stored_dtype=None if stored is None else _dtype_name(stored),
                    delta_key=None if stored is None else key_str(key.pairs[0].delta_key),
                    max_abs_error_bound=bound,
                    candidates=cands,
                )
            )
        return {
            "obsdelta_format": FORMAT_VERSION,
            "writer": f"obsdelta {__version__}",
            "format": fmt.name,
            "batch_dims": source.batch_dims,
            "time_dim": time_dim,
            "valid_rows": source.valid_rows,
            "leaf_order": [list(k) for k in source.leaves],
            "options": options,
            "checksums": checksums,
            "keys": records,
        }

    check = (lambda tmp: _verify_written(tmp, chunk_mb)) if verify else None
    try:
        _write(fmt, source, output, plan, fill, force, check)
    finally:
        fmt.close(source)
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


def _record(
    pair: Pair,
    codec: Codec,
    dtype: torch.dtype,
    stats: ErrorStats,
    names: dict[str, str],
    bound: float | None,
    crcs: dict[str, str],
) -> dict[str, Any]:
    """The metadata of one stored pair: everything inflate, report and verify need."""
    stored = codec.stored_dtype(dtype)
    return {
        "key": pair.name,
        "obs_key": list(pair.obs_key),
        "next_key": list(pair.next_key),
        "delta_key": None if stored is None else list(pair.delta_key),
        "codec": codec.get_config(),
        "source_dtype": _dtype_name(dtype),
        "stored_dtype": None if stored is None else _dtype_name(stored),
        "rows": stats.rows,
        "exact_rows": stats.exact_rows,
        "exception_rows": stats.exception_rows,
        "arrays": names if stats.exception_rows else None,
        "max_abs_error_bound": bound,
        "max_abs_error": stats.max_abs_error,
        "rmse": stats.rmse,
        "max_rel_error": stats.max_rel_error,
        "crc32": crcs,
    }


@dataclass
class _Stored:
    """One stored pair as the metadata describes it, checked against the data."""

    pair: Pair
    codec: Codec
    dtype: torch.dtype
    record: dict[str, Any]


def _stored_pairs(source: Source, meta: dict[str, Any]) -> list[_Stored]:
    out = []
    for record in meta.get("keys", []):
        try:
            delta = record["delta_key"]
            pair = Pair(
                tuple(record["obs_key"]),
                tuple(record["next_key"]),
                tuple(delta) if delta else (),
                record["key"],
            )
            dtype = _dtype(record["source_dtype"], source.path)
            codec = codec_from_config(record["codec"])
        except (KeyError, TypeError):
            raise InputError(
                "obsdelta metadata is incomplete", file=source.path, hint="the file is damaged"
            ) from None
        needed = [pair.obs_key] + ([pair.delta_key] if codec.stored_dtype(dtype) else [])
        for key in needed:
            if key not in source.leaves:
                raise InputError(
                    f"leaf {key_str(key)} named in the metadata is missing",
                    file=source.path,
                    key=pair.name,
                    hint="the file is damaged or was edited",
                )
        out.append(_Stored(pair, codec, dtype, record))
    return out


def _stored_bytes(source: Source, s: _Stored, rows: int, features: int) -> int:
    """Bytes a stored pair takes: on disk where the container tells (HDF5, after its filters),
    else its values (the delta leaf, exception rows and their index)."""
    r = s.record
    n_exc = int(r.get("exception_rows", 0))
    names = r.get("arrays") or {}
    stored_dtype = r.get("stored_dtype")
    leaf = source.leaves.get(s.pair.delta_key) if stored_dtype else None
    on_disk = [] if leaf is None else [getattr(leaf, "storage_bytes", lambda: None)()]
    if n_exc and source.arrays is not None:
        on_disk += [source.arrays.storage_bytes(n) for n in names.values()]
    if on_disk and all(b is not None for b in on_disk):
        return sum(b for b in on_disk if b is not None)
    small = n_exc * (INDEX_BYTES + features * s.dtype.itemsize)
    if stored_dtype:
        small += rows * features * _dtype(stored_dtype, source.path).itemsize
    return small


def _recorded_results(
    source: Source, stored: Sequence[_Stored], *, restored: bool
) -> list[KeyResult]:
    """Per key name, what the metadata recorded at compress time."""
    out: dict[str, KeyResult] = {}
    for s in stored:
        r = s.record
        obs = source.leaves[s.pair.obs_key]
        rows = math.prod(obs.shape[: source.batch_dims])
        features = list(obs.shape[source.batch_dims :])
        raw = rows * math.prod(features) * s.dtype.itemsize
        stored_dtype = r.get("stored_dtype")
        small = _stored_bytes(source, s, rows, math.prod(features))
        k = out.get(s.pair.name)
        if k is None:
            out[s.pair.name] = KeyResult(
                key=s.pair.name,
                codec=s.codec.id,
                dtype=_dtype_name(s.dtype),
                shape=[rows, *features],
                bytes_before=small if restored else raw,
                bytes_after=raw if restored else small,
                max_abs_error=float(r.get("max_abs_error", 0.0)),
                rmse=float(r.get("rmse", 0.0)),
                max_rel_error=float(r.get("max_rel_error", 0.0)),
                rows=int(r.get("rows", 0)),
                exact_rows=int(r.get("exact_rows", 0)),
                exception_rows=int(r.get("exception_rows", 0)),
                stored_dtype=stored_dtype,
                delta_key=key_str(s.pair.delta_key) if stored_dtype else None,
                max_abs_error_bound=r.get("max_abs_error_bound"),
            )
            continue
        # Another part of the same key: fold its figures in.
        n0, n1 = k.rows, int(r.get("rows", 0))
        k.shape[0] += rows
        k.bytes_before += small if restored else raw
        k.bytes_after += raw if restored else small
        k.max_abs_error = max(k.max_abs_error or 0.0, float(r.get("max_abs_error", 0.0)))
        k.max_rel_error = max(k.max_rel_error or 0.0, float(r.get("max_rel_error", 0.0)))
        mean_sq = ((k.rmse or 0.0) ** 2 * n0 + float(r.get("rmse", 0.0)) ** 2 * n1) / max(
            1, n0 + n1
        )
        k.rmse = math.sqrt(mean_sq)
        k.rows += n1
        k.exact_rows += int(r.get("exact_rows", 0))
        k.exception_rows += int(r.get("exception_rows", 0))
    return list(out.values())


@_one_thread
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
    try:
        meta = read_meta(source)
        stored = _stored_pairs(source, meta)
        time_dim = int(meta.get("time_dim", source.batch_dims - 1))
        job = _job(source, time_dim, chunk_mb, None)
        rebuilt = {s.pair.next_key: s for s in stored}
        dropped = {s.pair.delta_key for s in stored}

        order = [tuple(k) for k in meta.get("leaf_order", [])]
        order += [k for k in source.leaves if k not in order and k not in dropped]
        new: dict[Key, LeafSpec] = {}
        for key in order:
            if key in rebuilt:
                s = rebuilt[key]
                new[key] = LeafSpec(tuple(source.leaves[s.pair.obs_key].shape), s.dtype)
            elif key not in source.leaves:
                raise InputError(
                    f"leaf {key_str(key)} named in the metadata is missing",
                    file=input,
                    hint="the file is damaged or was edited",
                )
        plan = Plan(order, new, options=dict(meta.get("options") or {}))

        checksums = meta.get("checksums") or {}

        def fill(sink: Sink) -> None:
            for key in order:
                if key in rebuilt:
                    job.decode(rebuilt[key], sink.leaves[key])
                elif not sink.copied:
                    found = job.copy(source.leaves[key], sink.leaves[key])
                    _expect_leaf(checksums, key, found, input)

        _write(fmt, source, output, plan, fill, force)
        keys = _recorded_results(source, stored, restored=True)
    finally:
        fmt.close(source)
    return DatasetResult(
        command="inflate",
        input=str(input),
        output=str(output),
        format=fmt.name,
        compressed=False,
        bytes_before=disk_size(input),
        bytes_after=disk_size(output),
        keys=keys,
    )


@_one_thread
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
    try:
        if fmt.nothing_to_do:
            return DatasetResult(
                "report", str(input), None, fmt.name, False, size, size, note=fmt.nothing_to_do
            )
        if source.meta is not None:
            stored = _stored_pairs(source, read_meta(source))
            results = _recorded_results(source, stored, restored=False)
            return DatasetResult("report", str(input), None, fmt.name, True, size, size, results)
        time_dim = _time_dim(source, time_dim)
        bound = (max_abs_error or 0.0) if codec == AUTO else max_abs_error
        pairs = select_pairs(fmt, source, keys, lambda dt: bool(_candidates(dt, bound)))
        job = _job(source, time_dim, chunk_mb, bound)
        results = []
        for key in _Key.group(source, pairs):
            _codecs, cands, totals = _measure_key(job, key, bound)
            auto_pick = _auto_pick(cands, key.raw_bytes) or "none"
            want = auto_pick if codec == AUTO else codec
            chosen = next((i for i, c in enumerate(cands) if c.codec == want), None)
            pick = None if chosen is None else cands[chosen]
            results.append(
                key.result(
                    want,
                    None if chosen is None else totals[chosen],
                    key.raw_bytes if pick is None else pick.bytes_after,
                    max_abs_error_bound=bound,
                    candidates=cands,
                    auto_pick=auto_pick,
                )
            )
    finally:
        fmt.close(source)
    saved = sum(k.bytes_before - k.bytes_after for k in results)
    return DatasetResult("report", str(input), None, fmt.name, False, size, size - saved, results)


def _expect_leaf(checksums: dict[str, str], key: Key, found: str | None, file: Path) -> None:
    """Compare a copied leaf's CRC-32 with the one recorded at compress time, if any."""
    expected = checksums.get(key_str(key))
    if expected is not None and found != expected:
        raise DataError(
            f"checksum mismatch (recorded {expected}, found {found})",
            file=file,
            key=key_str(key),
            hint="the compressed dataset is damaged; restore it from a copy",
        )


def _check_dataset(source: Source, meta: dict[str, Any], chunk_mb: float) -> list[_Stored]:
    """Check every recorded checksum of a compressed source; raise on the first bad leaf."""
    stored = _stored_pairs(source, meta)
    time_dim = int(meta.get("time_dim", source.batch_dims - 1))
    job = _job(source, time_dim, chunk_mb, None)
    checksums = meta.get("checksums") or {}
    for name in checksums:
        key = tuple(name.split("/"))
        leaf = source.leaves.get(key)
        if leaf is None:
            raise DataError(
                "leaf named in the metadata is missing",
                file=source.path,
                key=name,
                hint="the compressed dataset is damaged or was edited",
            )
        _expect_leaf(checksums, key, job.copy(leaf, None), source.path)
    for s in stored:
        job.check(s)
    return stored


@_one_thread
def verify(input: Path, *, chunk_mb: float = DEFAULT_CHUNK_MB) -> DatasetResult:
    """Re-read a compressed dataset and check its metadata and every recorded checksum,
    rebuilding the next observations as ``inflate`` would. Raises on the first bad leaf."""
    input = Path(input)
    fmt, source = _open(input)
    try:
        stored = _check_dataset(source, read_meta(source), chunk_mb)
        keys = _recorded_results(source, stored, restored=False)
    finally:
        fmt.close(source)
    size = disk_size(input)
    return DatasetResult("verify", str(input), None, fmt.name, True, size, size, keys)


def _verify_written(path: Path, chunk_mb: float) -> None:
    """Check a freshly written output before it is renamed into place."""
    fmt = detect(path)
    source = fmt.open(path)
    try:
        _check_dataset(source, read_meta(source), chunk_mb)
    except ObsdeltaError as exc:
        raise DataError(
            f"the output failed verification before it was put in place: {exc.message}",
            file=path,
            key=exc.key,
            hint="nothing was written; please report this",
        ) from None
    finally:
        fmt.close(source)
