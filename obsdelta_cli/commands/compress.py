"""``compress``: replace each selected next observation by what a codec stores.

>>> import tempfile, pathlib, torch
>>> from tensordict import TensorDict
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> obs = torch.arange(12.0).reshape(4, 3)
>>> td = TensorDict({"observation": obs, "next": {"observation": obs + 0.5}}, batch_size=[4])
>>> _ = td.memmap(d / "run")
>>> res = compress(d / "run", d / "small", codec="fp16")
>>> res.keys[0].key, res.keys[0].codec, res.keys[0].max_abs_error, res.keys[0].lossless
('next/observation', 'fp16', 0.0, False)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..blocks import leaf_digests
from ..checksum import BLOCK_BYTES, BlockFeed, Hasher
from ..codecs import AUTO, DEFAULT_CODEC, Codec, make_codec
from ..errors import DataError, InputError, UsageError
from ..formats import Format, Key, LeafSpec, Pair, Plan, Sink, Source, detect, disk_size, key_str
from ..formats.base import NOTHING_HINT
from ..formats.leaf import is_data
from ..inputs import open_detected, stream_for
from ..manifest import HASH_ALGORITHM, ArrayNames, Error, KeyRecord, Manifest
from ..report import Candidate, DatasetResult, KeyResult
from ..selection import KeyGroup, candidates, check_time_dim, dtype_name, pairs_of
from ..stats import ErrorStats
from ..stream import Behind, Stream, beside
from .common import DEFAULT_CHUNK_MB, check_bound, one_thread, streamed_observations, write
from .encode import Pieces, encode_pair, measure_pairs
from .verify import object_skip, verify_written


def key_result(
    key: KeyGroup,
    codec: str,
    stats: ErrorStats | None,
    after: int,
    *,
    lossless: bool,
    **extra: Any,
) -> KeyResult:
    """A key's result; ``stats`` is ``None`` for a key kept as it is (exact on every row).
    ``lossless``: every row is guaranteed to come back bit for bit."""
    return KeyResult(
        key=key.name,
        codec=codec,
        dtype=dtype_name(key.dtype),
        shape=[key.total_rows, *key.features],
        bytes_before=key.raw_bytes,
        bytes_after=after,
        max_abs_error=0.0 if stats is None else stats.max_abs_error,
        rmse=0.0 if stats is None else stats.rmse,
        max_rel_error=0.0 if stats is None else stats.max_rel_error,
        rows=key.total_rows if stats is None else stats.rows,
        exact_rows=key.total_rows if stats is None else stats.exact_rows,
        exception_rows=0 if stats is None else stats.exception_rows,
        lossless=lossless,
        **extra,
    )


def candidate(key: KeyGroup, codec: Codec, s: ErrorStats) -> Candidate:
    """``codec``'s figures on the whole of ``key``, as the report lists them."""
    return Candidate(
        codec=codec.id,
        bytes_after=key.bytes_after(codec, s.exception_rows),
        max_abs_error=s.max_abs_error,
        rmse=s.rmse,
        max_rel_error=s.max_rel_error,
        exact_rows=s.exact_rows,
        exception_rows=s.exception_rows,
        feature_max_abs=None if s.feature_max_abs is None else s.feature_max_abs.tolist(),
    )


def measure_key(
    stream: Stream, source: Source, key: KeyGroup, bound: float | None
) -> tuple[list[Codec], list[Candidate], list[ErrorStats]]:
    """Every candidate codec's figures on every pair of ``key``."""
    codecs = candidates(key.dtype, bound)
    totals = measure_pairs(stream, source, key.pairs, codecs, bound)
    cands = [candidate(key, c, s) for c, s in zip(codecs, totals, strict=True)]
    return codecs, cands, totals


#: The candidates of a key measured by its encoding pass, not before it (see :class:`Unpaid`).
FROM_ENCODING: list[Candidate] = []


class Unpaid(Exception):
    """A key planned as paying for its lossless codec did not: it stores no fewer bytes than
    its raw next observations (``figures``: what its encoding pass measured). The output is
    written again with the key kept as it is, as if it had been measured first."""

    def __init__(self, key: KeyGroup, figures: Candidate) -> None:
        super().__init__(key.name)
        self.key, self.figures = key, figures


def auto_pick(cands: Sequence[Candidate], raw_bytes: int) -> str | None:
    """The smallest candidate (ties: the more accurate), or ``None`` if none beats raw."""
    if not cands:
        return None
    best = min(cands, key=lambda c: (c.bytes_after, c.max_abs_error))
    return best.codec if best.bytes_after < raw_bytes else None


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


def _needed(
    hashes: dict[str, str], stats: ErrorStats, lossless: bool, stored: bool
) -> dict[str, str]:
    """The hashes worth keeping: the original next observations equal the rebuilt ones when
    lossless, and a codec without a stored leaf or a pair without exceptions stores nothing
    there (hundreds of robomimic demos make every hash count)."""
    keep = dict(hashes)
    if lossless:
        keep.pop("next")
    if not stored:
        keep.pop("stored")
    if not stats.exception_rows:
        keep.pop("index")
        keep.pop("rows")
    return keep


def _record(
    pair: Pair,
    codec: Codec,
    dtype: np.dtype,
    stats: ErrorStats,
    names: ArrayNames,
    bound: float | None,
    hashes: dict[str, str],
) -> KeyRecord:
    stored = codec.stored_dtype(dtype)
    return KeyRecord(
        name=pair.name,
        obs_key=pair.obs_key,
        next_key=pair.next_key,
        delta_key=None if stored is None else pair.delta_key,
        codec=codec.get_config(),
        lossless=codec.lossless or bound == 0,
        bound=bound,
        source_dtype=dtype_name(dtype),
        stored_dtype=None if stored is None else dtype_name(stored),
        rows=stats.rows,
        exact_rows=stats.exact_rows,
        exception_rows=stats.exception_rows,
        arrays=names if stats.exception_rows else None,
        error=Error(stats.max_abs_error, stats.rmse, stats.max_rel_error),
        hashes=_needed(hashes, stats, codec.lossless or bound == 0, stored is not None),
    )


@one_thread
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
    h5_compression: str | None = None,
    verify: bool = True,
    pack: bool = False,
    flat: bool = False,
    options: dict[str, Any] | None = None,
) -> DatasetResult:
    """Write ``output``: ``input`` with each selected next observation stored by a codec.

    The default, ``codec="auto"`` without ``max_abs_error``, is lossless: per key ``exact``
    where it beats the raw bytes, else the key is kept as it is. With ``max_abs_error``,
    ``auto`` picks per key the smallest codec whose every row is within it. Rows a codec cannot
    store within the bound are kept exactly as exception rows; ``exceptions=False`` refuses the
    key instead. ``h5_compression`` filters an HDF5 output's new datasets (``"zstd"``, ``"gzip"``,
    ...; ``options={"h5_compression": ...}`` says the same).
    With ``verify`` (the default) the output is re-read and checked before it is put in place.
    With ``pack``, ``output`` is one packed HDF5 file (:mod:`.pack`); with ``flat`` too, each
    key's datasets of an HDF5 file's episodes are stored as one.
    """
    return write_compressed(
        input, output, codec=codec, keys=keys, max_abs_error=max_abs_error, exceptions=exceptions,
        time_dim=time_dim, force=force, chunk_mb=chunk_mb, h5_compression=h5_compression,
        verify=verify, pack=pack, flat=flat, options=options,
    )  # fmt: skip


def write_compressed(
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
    h5_compression: str | None = None,
    verify: bool = True,
    pack: bool = False,
    flat: bool = False,
    options: dict[str, Any] | None = None,
    copy_if_nothing: bool = False,
    divert: Callable[[Key, Any], Any] | None = None,
) -> DatasetResult:
    """:func:`compress`, with what ``--pack`` asks of the compressed dataset it packs:
    ``copy_if_nothing``, an input with no next observations (Minari, D4RL AntMaze) is copied
    with its manifest where it would be refused; ``divert``, see
    :attr:`~obsdelta_cli.formats.base.Plan.divert`."""
    if pack:
        from .pack import compress_packed

        return compress_packed(
            input, output, compress=write_compressed, codec=codec, keys=keys,
            max_abs_error=max_abs_error,
            exceptions=exceptions, time_dim=time_dim, force=force, chunk_mb=chunk_mb,
            options=options, h5_compression=h5_compression, verify=verify, flat=flat,
        )  # fmt: skip
    if flat:
        raise UsageError("--flat needs --pack", hint="add --pack")
    input, output = Path(input), Path(output)
    check_bound(max_abs_error)
    auto = codec == AUTO
    bound = (max_abs_error or 0.0) if auto else max_abs_error
    chosen = None if auto else make_codec(codec, bound)
    if chosen is None and not exceptions:
        raise UsageError(
            "--no-exceptions needs a delta codec: the lossless default keeps episode "
            "boundaries as exception rows",
            hint="add --codec fp16 (or bf16, fp32, q16, q8)",
        )
    if chosen is not None and chosen.uses_successor and not exceptions:
        raise UsageError(
            f"codec {chosen.id} stores episode boundaries as exception rows",
            hint="drop --no-exceptions",
        )
    fmt = detect(input)
    # Before any other check, and before the file is walked for its leaves (the 2,104
    # episodes of a Minari file took 4 s).
    if fmt.nothing_to_do and not copy_if_nothing:
        raise InputError(fmt.nothing_to_do, file=input, hint=NOTHING_HINT)
    source = open_detected(fmt, input)
    try:
        options = {"h5_compression": h5_compression, **(options or {})}
        options = {k: v for k, v in options.items() if v is not None}
        unknown = set(options) - fmt.options
        if unknown:
            raise UsageError(
                f"option {', '.join(sorted(unknown))} does not apply to {fmt.name}", file=input
            )
        if source.meta is not None:
            raise InputError(
                "is already compressed by obsdelta",
                file=input,
                hint="inflate it, or use it as it is",
            )
        time_dim = check_time_dim(source, time_dim)

        def supports(dtype: np.dtype) -> bool:
            return bool(candidates(dtype, bound)) if chosen is None else chosen.supports(dtype)

        # Lossless: every pair with a shifted twin (info/* of TorchRL's caches) comes back bit
        # for bit too; a lossy codec touches only observations unless --key names more.
        lossless = not bound and (chosen is None or chosen.lossless)
        pairs = pairs_of(fmt, source, keys, supports, none_ok=copy_if_nothing, with_twins=lossless)
        stream = stream_for(source, time_dim, chunk_mb)
        groups = KeyGroup.group(source, pairs)
        plans: list[tuple[KeyGroup, Codec | None, list[Candidate] | None]] = []
        for key in groups:
            if chosen is not None:
                plans.append((key, chosen, None))
                continue
            codecs = candidates(key.dtype, bound)
            if len(codecs) == 1 and codecs[0].lossless:  # the default: exact, or nothing
                # Planned as paying, which next observations almost always do: the encoding
                # pass finds out (see Unpaid). Measuring first, until it was certain, read a
                # sixth of a D4RL file's observations twice: 15% of its compress.
                plans.append((key, codecs[0], FROM_ENCODING))
                continue
            codecs, cands, _totals = measure_key(stream, source, key, bound)
            pick = auto_pick(cands, key.raw_bytes)
            plans.append((key, next((c for c in codecs if c.id == pick), None), cands))
        check = (lambda tmp: verify_written(tmp, chunk_mb)) if verify else None
        while True:
            results: list[KeyResult] = []
            plan, fill = _writer(source, fmt, stream, plans, bound, exceptions, options, results)
            plan = replace(plan, divert=divert)
            try:
                write(fmt, source, output, plan, fill, force, check)
                break
            except Unpaid as unpaid:  # that output is gone: again, with the key kept as it is
                plans = [
                    (key, None, [unpaid.figures]) if key is unpaid.key else (key, c, cands)
                    for key, c, cands in plans
                ]
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


def _writer(
    source: Source,
    fmt: Format,
    stream: Stream,
    plans: list[tuple[KeyGroup, Codec | None, list[Candidate] | None]],
    bound: float | None,
    exceptions: bool,
    options: dict[str, Any],
    results: list[KeyResult],
) -> tuple[Plan, Any]:
    """The output's plan, and the function that fills it and returns its manifest."""
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
    streamed = streamed_observations(fmt, source, stream, [p for p, _ in encoded], order, new)
    plan = Plan(order, new, sorted(replaced), options, streamed)

    def fill(sink: Sink) -> dict[str, Any]:
        checksums: dict[str, str] = {}
        # The leaves this pass writes, each with the hasher of its copy: the container's own
        # (whose hash it records with its objects) where it copies the others itself.
        fused: dict[Key, Hasher] = (
            dict(sink.streamed) if sink.copied else {k: Hasher(HASH_ALGORITHM) for k in streamed}
        )
        copies = [] if sink.copied else [k for k in order if k not in new and k not in fused]
        copied: dict[str, str] = {}

        # Block checksums of the observations and of the leaves this pass copies, taken as
        # the pass reads them (one batch dimension: the pass's rows are then the readers'
        # rows), not in a second read.
        feeds: dict[Key, BlockFeed] = {}
        if source.batch_dims == 1:
            taken = [p.obs_key for key, _c, _cands in plans for p in key.pairs] + copies
            for k in taken:
                leaf = source.leaves[k]
                if k not in new and is_data(leaf):
                    feeds[k] = BlockFeed(leaf.shape, leaf.dtype, BLOCK_BYTES)

        def copy_leaf(k: Key) -> None:
            digest = stream.copy(source.leaves[k], sink.leaves[k], HASH_ALGORITHM, feeds.get(k))
            if digest is not None:
                copied[key_str(k)] = digest

        records: list[KeyRecord] = []

        def encode_key(key: KeyGroup, c: Codec | None, cands: list[Candidate] | None) -> None:
            if c is None:
                results.append(
                    key_result(key, "none", None, key.raw_bytes, lossless=True, candidates=cands)
                )
                return
            total = ErrorStats()
            shared = (f"k{len(results)}.index", f"k{len(results)}.rows")
            with Behind() as later:
                pieces = (
                    Pieces(sink.arrays, shared[0], later),
                    Pieces(sink.arrays, shared[1], later),
                )
                for p in key.pairs:
                    names = ArrayNames(*shared, offset=pieces[0].total)
                    copy = None
                    if p.obs_key in fused:
                        copy = (sink.leaves[p.obs_key], fused[p.obs_key])
                    stats, hashes = encode_pair(
                        stream, source, p, c, bound, sink, pieces, HASH_ALGORITHM, later, copy,
                        feed=feeds.get(p.obs_key),
                    )  # fmt: skip
                    if copy is not None and not sink.copied:
                        checksums[key_str(p.obs_key)] = copy[1].hex
                    if not exceptions and stats.exception_rows:
                        _refuse(stats, c, source.path, p)
                    records.append(_record(p, c, key.dtype, stats, names, bound, hashes))
                    total.merge(stats)
                for piece in pieces:
                    piece.close()
            after = key.bytes_after(c, total.exception_rows)
            if cands is FROM_ENCODING and after >= key.raw_bytes:
                raise Unpaid(key, candidate(key, c, total))
            stored = c.stored_dtype(key.dtype)
            results.append(
                key_result(
                    key,
                    c.id,
                    total,
                    after,
                    lossless=c.lossless or bound == 0,
                    stored_dtype=None if stored is None else dtype_name(stored),
                    delta_key=None if stored is None else key_str(key.pairs[0].delta_key),
                    max_abs_error_bound=bound,
                    candidates=[candidate(key, c, total)] if cands is FROM_ENCODING else cands,
                )
            )

        with beside(partial(copy_leaf, k) for k in copies):
            for key, c, cands in plans:
                encode_key(key, c, cands)
        checksums = {**copied, **checksums}  # in the order of the leaves, as listed
        # Objects the container copies whole (HDF5) or keeps beside the leaves (folders),
        # hashed as the output has them (every copy is then done).
        deltas = {key_str(k) for k in new}
        handle = source.handle
        in_source = (lambda n: n in handle) if sink.copied else (lambda n: True)
        # Hashed beside the block digests below where the container can (HDF5: in a child).
        objects = fmt.begin_object_hashes(sink, object_skip(deltas, in_source))
        # Every stored leaf hashed in blocks, as the output holds it: taken where the pass read
        # or copied its rows (the observations, a folder's copied leaves, an HDF5 output's raw
        # copies), else read back from the output just written (in memory still), not from
        # the input a second time, but where the container says the input's leaf costs less
        # to read and holds the same values (written_leaf: HDF5's small whole copies).
        fed = {key_str(k): r for k, f in feeds.items() if (r := f.result()) is not None}
        if source.batch_dims == 1:
            fed = {**sink.blocks, **fed}

        def stored() -> Iterator[tuple[str, Any]]:
            # Made one at a time, as they are hashed: a leaf of the output holds its dataset
            # open (about 11 KB each in HDF5), and a Minari file of 2,500 episodes has 25,000.
            for k in order:
                original = source.leaves.get(k)
                leaf = fmt.written_leaf(sink, k, original) if key_str(k) not in fed else None
                readable = leaf is not None and getattr(leaf, "readable", True)
                value = leaf if readable else source.leaves[k]
                if is_data(value):
                    yield key_str(k), value

        blocks = leaf_digests(stored(), source.batch_dims, BLOCK_BYTES, fed)
        manifest = Manifest(
            container=fmt.name,
            batch_dims=source.batch_dims,
            time_dim=stream.time_dim,
            valid_rows=source.valid_rows,
            leaf_order=tuple(source.leaves),
            keys=tuple(records),
            options=options,
            checksums=checksums,
            objects=objects(),
            hash_block_bytes=BLOCK_BYTES,
            blocks=blocks,
            source_bytes=disk_size(source.path),
            extra=sink.extra,
        )
        return manifest.to_json()

    return plan, fill
