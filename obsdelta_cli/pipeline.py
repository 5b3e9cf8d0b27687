"""The pipeline: stream chunks of rows from a source container through a codec into an output.

``compress`` replaces each selected ``("next", *k)`` leaf with ``("next", "delta", *k)``;
``inflate`` undoes it; ``report`` measures without writing. Containers are reached only through
the format adapters and deltas only through the codecs, so this module holds the semantics:
which keys pair up, the order of leaves, the metadata, and the error accounting.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from . import __version__
from .atomic import atomic_output
from .codecs import CODECS, DEFAULT_CODEC, Codec, codec_from_config, get_codec
from .errors import (
    DataError,
    FormatVersionError,
    InputError,
    ObsdeltaError,
    OutputError,
    UsageError,
)
from .formats import Format, Source, detect, disk_size
from .report import Candidate, DatasetResult, KeyResult
from .stats import ErrorStats

#: Version of the stored metadata layout; bumped on any incompatible change.
FORMAT_VERSION = 1
DEFAULT_CHUNK_MB = 64

Key = tuple[str, ...]


def key_str(key: Key) -> str:
    """Slash-joined form of a nested key, as used on the command line and in JSON."""
    return "/".join(key)


def _as_key(key: str | tuple[str, ...]) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


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
    if source.td.batch_dims == 0 or source.td.numel() == 0 or source.valid_rows == 0:
        raise DataError(
            f"dataset has no rows (batch size {list(source.td.batch_size)})",
            file=path,
            hint="nothing to do; check that the right file was given",
        )
    return fmt, source


def _pair_problem(leaves: dict[Key, torch.Tensor], pair: Pair) -> str | None:
    """Why ``pair`` cannot be delta-encoded, or ``None`` if it can."""
    obs, nxt = leaves.get(pair.obs_key), leaves.get(pair.next_key)
    if obs is None:
        return "no such leaf at the root"
    if nxt is None:
        return f"has no twin {key_str(pair.next_key)}"
    if not (isinstance(obs, torch.Tensor) and isinstance(nxt, torch.Tensor)):
        return "is not a tensor"
    if obs.shape != nxt.shape or obs.dtype != nxt.dtype:
        return (
            f"shape/dtype {list(obs.shape)} {_dtype_name(obs.dtype)} differs from "
            f"{key_str(pair.next_key)}'s {list(nxt.shape)} {_dtype_name(nxt.dtype)}"
        )
    if not obs.dtype.is_floating_point:
        return f"is {_dtype_name(obs.dtype)}; cast codecs encode floating-point leaves only"
    return None


def select_pairs(td: TensorDictBase, keys: Sequence[str] | None, file: Path) -> list[Pair]:
    """The observation pairs to encode: ``keys`` (slash-joined) or every eligible float leaf."""
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
            problem = _pair_problem(leaves, pair) if pair.obs_key else "empty key"
            if problem:
                raise DataError(problem, file=file, key=text, hint="pick keys with --key")
            if pair not in pairs:
                pairs.append(pair)
        return pairs
    pairs = [Pair(k) for k in leaves if k[0] != "next" and _pair_problem(leaves, Pair(k)) is None]
    if not pairs:
        raise DataError(
            "found no floating-point leaf with a same-shaped twin under 'next'",
            file=file,
            hint="nothing to compress; name keys with --key",
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
# Streaming


def _flat(t: torch.Tensor, batch_dims: int) -> torch.Tensor:
    """View a leaf as ``[rows, *features]`` (leaves are contiguous, so this is free)."""
    return t.reshape(-1, *t.shape[batch_dims:])


def _chunks(rows: int, t: torch.Tensor, chunk_bytes: int) -> Iterator[slice]:
    row_bytes = max(1, math.prod(t.shape[1:]) * t.element_size())
    step = max(1, chunk_bytes // row_bytes)
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


@dataclass
class _Job:
    """Shared state of one pass: sizes and where rows stop being data."""

    batch_dims: int
    valid_flat: int
    chunk_bytes: int

    @classmethod
    def of(cls, td: TensorDictBase, valid_rows: int | None, chunk_mb: float) -> _Job:
        per_row = math.prod(td.batch_size[1:])
        valid = td.batch_size[0] if valid_rows is None else valid_rows
        if chunk_mb <= 0:
            raise UsageError(f"--chunk-mb must be positive, got {chunk_mb}")
        return cls(td.batch_dims, valid * per_row, max(1, int(chunk_mb * 2**20)))

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if not isinstance(src, torch.Tensor):
            return  # a non-tensor leaf, already in the output through the template
        src, dst = _flat(src, self.batch_dims), _flat(dst, self.batch_dims)
        for sl in _chunks(src.shape[0], src, self.chunk_bytes):
            dst[sl].copy_(src[sl])

    def encode(
        self, codec: Codec, obs: torch.Tensor, nxt: torch.Tensor, dst: torch.Tensor
    ) -> ErrorStats:
        obs, nxt = _flat(obs, self.batch_dims), _flat(nxt, self.batch_dims)
        dst = _flat(dst, self.batch_dims)
        stats = ErrorStats()
        for sl in _chunks(self.valid_flat, obs, self.chunk_bytes):
            o, n = obs[sl], nxt[sl]
            stored = codec.encode(o, n)
            dst[sl].copy_(stored)
            stats.update(o, n, stored, codec.decode(o, stored, n.dtype))
        # Rows past a replay buffer's len are not data: store a zero delta for them.
        dst[self.valid_flat :].zero_()
        return stats

    def measure(
        self, codecs: Sequence[Codec], obs: torch.Tensor, nxt: torch.Tensor
    ) -> list[ErrorStats]:
        obs, nxt = _flat(obs, self.batch_dims), _flat(nxt, self.batch_dims)
        stats = [ErrorStats() for _ in codecs]
        for sl in _chunks(self.valid_flat, obs, self.chunk_bytes):
            o, n = obs[sl], nxt[sl]
            for codec, s in zip(codecs, stats, strict=True):
                stored = codec.encode(o, n)
                s.update(o, n, stored, codec.decode(o, stored, n.dtype))
        return stats

    def decode(
        self, codec: Codec, obs: torch.Tensor, stored: torch.Tensor, dst: torch.Tensor
    ) -> None:
        obs, stored = _flat(obs, self.batch_dims), _flat(stored, self.batch_dims)
        dst = _flat(dst, self.batch_dims)
        for sl in _chunks(obs.shape[0], obs, self.chunk_bytes):
            dst[sl].copy_(codec.decode(obs[sl], stored[sl], dst.dtype))


def _placeholder(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    # A zero-stride tensor: gives the output its shape and dtype without allocating it.
    return torch.zeros((), dtype=dtype).expand(shape)


def _write(
    fmt: Format,
    source: Source,
    output: Path,
    template: TensorDictBase,
    fill: Any,
    meta: dict[str, Any] | None,
    force: bool,
) -> None:
    """Create ``output`` from ``template`` atomically; ``fill(out)`` writes every leaf."""
    try:
        with atomic_output(output, source=source.path, force=force) as tmp:
            out = fmt.create(tmp, template, source)
            fill(out)
            fmt.finish(tmp, out, meta)
    except ObsdeltaError:
        raise
    except OSError as exc:
        raise OutputError(
            f"cannot write ({exc.strerror or exc})",
            file=exc.filename or output,
            hint="check free space and permissions; nothing was written",
        ) from None


# ---------------------------------------------------------------------------------------------
# Commands


def compress(
    input: Path,
    output: Path,
    *,
    codec: str = DEFAULT_CODEC,
    keys: Sequence[str] | None = None,
    time_dim: int = -1,
    force: bool = False,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> DatasetResult:
    """Write ``output``: ``input`` with each selected ``("next", k)`` stored as a delta."""
    input, output = Path(input), Path(output)
    chosen = get_codec(codec)
    fmt, source = _open(input)
    if source.meta is not None:
        raise InputError(
            "is already compressed by obsdelta", file=input, hint="inflate it, or use it as it is"
        )
    td = source.td
    time_dim = _check_time_dim(td, time_dim, input)
    pairs = select_pairs(td, keys, input)
    leaves = _leaves(td)
    job = _Job.of(td, source.valid_rows, chunk_mb)

    replaced = {p.next_key for p in pairs}
    template = TensorDict(batch_size=td.batch_size, device=td.device)
    for key, leaf in leaves.items():
        if key not in replaced:
            template.set(key, leaf)
    for p in pairs:
        obs = leaves[p.obs_key]
        template.set(p.delta_key, _placeholder(obs.shape, chosen.stored_dtype(obs.dtype)))

    results: list[KeyResult] = []

    def fill(out: TensorDictBase) -> None:
        for key, leaf in leaves.items():
            if key not in replaced:
                job.copy(leaf, out.get(key))
        for p in pairs:
            obs, nxt, dst = leaves[p.obs_key], leaves[p.next_key], out.get(p.delta_key)
            stats = job.encode(chosen, obs, nxt, dst)
            _refuse_bad_rows(stats, chosen, input, p)
            results.append(_key_result(p, chosen, obs, dst, stats))

    meta: dict[str, Any] = {
        "obsdelta_format": FORMAT_VERSION,
        "writer": f"obsdelta {__version__}",
        "format": fmt.name,
        "batch_size": list(td.batch_size),
        "time_dim": time_dim,
        "valid_rows": source.valid_rows,
        "leaf_order": [list(k) for k in leaves],
        "keys": [],
    }

    def fill_and_record(out: TensorDictBase) -> None:
        fill(out)
        meta["keys"] = [_key_meta(r, p) for r, p in zip(results, pairs, strict=True)]

    _write(fmt, source, output, template, fill_and_record, meta, force)
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


def _refuse_bad_rows(stats: ErrorStats, codec: Codec, file: Path, pair: Pair) -> None:
    if stats.nonfinite_rows:
        raise DataError(
            f"{stats.nonfinite_rows} of {stats.rows} rows hold NaN or inf",
            file=file,
            key=key_str(pair.next_key),
            hint="a delta cannot carry non-finite values; leave this key out by naming the "
            "others with --key",
        )
    if stats.overflow_rows:
        wider = "fp32" if codec.id != "fp32" else None
        raise DataError(
            f"{stats.overflow_rows} of {stats.rows} rows have a delta beyond "
            f"{_dtype_name(codec.stored_dtype(torch.float64))}'s range (would be inf)",
            file=file,
            key=key_str(pair.next_key),
            hint=f"use --codec {wider}" if wider else "leave this key out with --key",
        )


def _key_result(
    pair: Pair, codec: Codec, obs: torch.Tensor, stored: torch.Tensor, stats: ErrorStats
) -> KeyResult:
    return KeyResult(
        key=key_str(pair.next_key),
        codec=codec.id,
        dtype=_dtype_name(obs.dtype),
        shape=list(obs.shape),
        bytes_before=obs.numel() * obs.element_size(),
        bytes_after=stored.numel() * stored.element_size(),
        max_abs_error=stats.max_abs_error,
        rmse=stats.rmse,
        max_rel_error=stats.max_rel_error,
        rows=stats.rows,
        exact_rows=stats.exact_rows,
        stored_dtype=_dtype_name(stored.dtype),
        delta_key=key_str(pair.delta_key),
        bad_rows=stats.bad_rows,
    )


def _key_meta(result: KeyResult, pair: Pair) -> dict[str, Any]:
    return {
        "key": result.key,
        "obs_key": list(pair.obs_key),
        "next_key": list(pair.next_key),
        "delta_key": list(pair.delta_key),
        "codec": get_codec(result.codec).get_config(),
        "source_dtype": result.dtype,
        "stored_dtype": result.stored_dtype,
        "shape": result.shape,
        "bytes_before": result.bytes_before,
        "bytes_after": result.bytes_after,
        "rows": result.rows,
        "exact_rows": result.exact_rows,
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
        for needed in (pair.obs_key, pair.delta_key):
            if needed not in leaves:
                raise InputError(
                    f"leaf {key_str(needed)} named in the metadata is missing",
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
    """Write ``output``: ``input`` with every delta rebuilt into ``("next", k)`` in its dtype."""
    input, output = Path(input), Path(output)
    fmt, source = _open(input)
    meta = read_meta(source)
    stored = _stored_keys(source, meta)
    td, leaves = source.td, _leaves(source.td)
    job = _Job.of(td, source.valid_rows, chunk_mb)
    rebuilt = {s.pair.next_key: s for s in stored}

    order = [tuple(k) for k in meta.get("leaf_order", [])]
    order += [k for k in leaves if k not in order and k[:2] != ("next", "delta")]
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

    def fill(out: TensorDictBase) -> None:
        for key in order:
            if key in rebuilt:
                s = rebuilt[key]
                job.decode(s.codec, leaves[s.pair.obs_key], leaves[s.pair.delta_key], out.get(key))
            else:
                job.copy(leaves[key], out.get(key))

    _write(fmt, source, output, template, fill, None, force)
    results = [_recorded_result(s, leaves, restored=True) for s in stored]
    return DatasetResult(
        command="inflate",
        input=str(input),
        output=str(output),
        format=fmt.name,
        compressed=False,
        bytes_before=disk_size(input),
        bytes_after=disk_size(output),
        keys=results,
    )


def _recorded_result(s: _Stored, leaves: dict[Key, torch.Tensor], *, restored: bool) -> KeyResult:
    r, delta = s.record, leaves[s.pair.delta_key]
    delta_bytes = delta.numel() * delta.element_size()
    raw = leaves[s.pair.obs_key].numel() * s.dtype.itemsize
    return KeyResult(
        key=key_str(s.pair.next_key),
        codec=s.codec.id,
        dtype=_dtype_name(s.dtype),
        shape=list(leaves[s.pair.obs_key].shape),
        bytes_before=delta_bytes if restored else raw,
        bytes_after=raw if restored else delta_bytes,
        max_abs_error=r.get("max_abs_error"),
        rmse=r.get("rmse"),
        max_rel_error=r.get("max_rel_error"),
        rows=int(r.get("rows", 0)),
        exact_rows=int(r.get("exact_rows", 0)),
        stored_dtype=_dtype_name(delta.dtype),
        delta_key=key_str(s.pair.delta_key),
    )


def report(
    input: Path,
    *,
    codec: str = DEFAULT_CODEC,
    keys: Sequence[str] | None = None,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> DatasetResult:
    """Measure without writing: every codec on every key of a plain input (a dry run), or what
    a compressed input stores and the error recorded when it was written."""
    input = Path(input)
    chosen = get_codec(codec)
    fmt, source = _open(input)
    size = disk_size(input)
    if source.meta is not None:
        meta = read_meta(source)
        leaves = _leaves(source.td)
        results = [_recorded_result(s, leaves, restored=False) for s in _stored_keys(source, meta)]
        return DatasetResult("report", str(input), None, fmt.name, True, size, size, results)

    td = source.td
    pairs = select_pairs(td, keys, input)
    leaves = _leaves(td)
    job = _Job.of(td, source.valid_rows, chunk_mb)
    results = []
    saved = 0
    for p in pairs:
        obs, nxt = leaves[p.obs_key], leaves[p.next_key]
        codecs = [c() for c in CODECS.values() if c().supports(obs.dtype)]
        stats = job.measure(codecs, obs, nxt)
        candidates = [_candidate(c, s, obs) for c, s in zip(codecs, stats, strict=True)]
        pick = next((c for c in candidates if c.codec == chosen.id), candidates[0])
        pick_stats = stats[candidates.index(pick)]
        result = KeyResult(
            key=key_str(p.next_key),
            codec=pick.codec,
            dtype=_dtype_name(obs.dtype),
            shape=list(obs.shape),
            bytes_before=nxt.numel() * nxt.element_size(),
            bytes_after=pick.bytes_after,
            max_abs_error=pick.max_abs_error,
            rmse=pick.rmse,
            max_rel_error=pick.max_rel_error,
            rows=pick_stats.rows,
            exact_rows=pick.exact_rows,
            bad_rows=pick.bad_rows,
            candidates=candidates,
        )
        saved += result.bytes_before - result.bytes_after
        results.append(result)
    return DatasetResult("report", str(input), None, fmt.name, False, size, size - saved, results)


def _candidate(codec: Codec, stats: ErrorStats, obs: torch.Tensor) -> Candidate:
    bad = stats.bad_rows
    return Candidate(
        codec=codec.id,
        bytes_after=obs.numel() * codec.stored_dtype(obs.dtype).itemsize,
        max_abs_error=None if bad else stats.max_abs_error,
        rmse=None if bad else stats.rmse,
        max_rel_error=None if bad else stats.max_rel_error,
        exact_rows=stats.exact_rows,
        bad_rows=bad,
    )
