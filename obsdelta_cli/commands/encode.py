"""Encoding one pair: every chunk is encoded, decoded by the rebuild rule, judged, and the rows
that fail are kept exactly as exception rows; error, hashes and bytes are measured in the same
pass."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checksum import BlockFeed, Hasher
from ..codecs import Codec
from ..formats import ArrayStore, Pair, Sink, Source
from ..manifest import HASH_NAMES
from ..rebuild import decode
from ..stats import ErrorStats, Verdict, judge
from ..stream import Behind, Stream, ahead, block_rows, reporting, window

#: Exception rows are written in pieces of this many bytes (at least one row), whatever the
#: chunking, so that containers that allocate as they append (HDF5) write the same file.
PIECE_BYTES = 1 << 16


@dataclass
class Coded:
    """One chunk after encoding: what is stored, what the rebuild gives, which rows failed."""

    stored: np.ndarray | None
    rebuilt: np.ndarray
    verdict: Verdict
    #: Positions (within the chunk) of the exception rows.
    bad: np.ndarray


def only_exact(codec: Codec, bound: float | None) -> bool:
    """Whether only rows rebuilt bit for bit pass (the others become exception rows)."""
    return codec.lossless or bound == 0


def code_chunk(
    codec: Codec,
    obs: np.ndarray,
    nxt: np.ndarray,
    successor: np.ndarray | None,
    bound: float | None,
) -> Coded:
    """Encode, rebuild exactly as inflate will, judge, and patch the exception rows in."""
    stored = codec.encode(obs, nxt, successor)
    exact = only_exact(codec, bound)
    # Where only rows rebuilt bit for bit pass, each other row is patched with itself, so the
    # patched rebuild is ``nxt``, row for row: the rebuild is then only compared, never copied
    # or patched (for ``exact``, a copy of the successor rows: 0.1 s of 168 MB of Pong frames).
    rebuilt = decode(codec, obs, stored, successor, nxt.dtype, view=exact)
    verdict = judge(obs, nxt, stored, rebuilt, bound=bound, exact=exact)
    bad = np.flatnonzero(~verdict.ok).astype(np.int64, copy=False)
    if exact:
        rebuilt = nxt  # its failing rows patched with themselves
    elif bad.size:
        rebuilt[bad] = nxt[bad]
    if bad.size:
        if stored is not None:
            stored[bad] = 0
        verdict.same[bad] = True  # patched in: now bit for bit
    return Coded(stored, rebuilt, verdict, bad)


class Pieces:
    """Appends to an array store in fixed pieces of rows; ``total`` counts every row given."""

    def __init__(self, store: ArrayStore, name: str, later: Behind) -> None:
        self.store, self.name, self.later = store, name, later
        self.parts: list[np.ndarray] = []
        self.count = 0
        self.total = 0

    def append(self, rows: np.ndarray) -> None:
        self.parts.append(rows)
        self.count += rows.shape[0]
        self.total += rows.shape[0]
        piece = max(1, PIECE_BYTES // max(1, rows[:1].size * rows.itemsize))
        if self.count >= piece:
            buffered = np.concatenate(self.parts)
            full = self.count - self.count % piece
            self._write(buffered[:full])
            self.parts = [buffered[full:]] if full < self.count else []
            self.count -= full

    def close(self) -> None:
        if self.count:
            self._write(np.concatenate(self.parts))
        self.parts, self.count = [], 0

    def _write(self, rows: np.ndarray) -> None:
        self.later(self.store.append, self.name, rows)


def chunks(
    stream: Stream, source: Source, pair: Pair, successors: bool, extra: Sequence[Any] = ()
) -> Any:
    """``(slice, obs, next_obs, successor)`` over a pair's valid rows, with progress."""
    obs = stream.flat(source.leaves[pair.obs_key])
    nxt = stream.flat(source.leaves[pair.next_key])
    geometry = stream.geometry(source.leaves[pair.obs_key])
    block = block_rows([obs, nxt, *extra], geometry.align)
    row_bytes = obs.dtype.itemsize * math.prod(obs.shape[1:])

    def load(sl: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        o, succ = window(obs, sl, geometry) if successors else (obs[sl], None)
        return o, nxt[sl], succ

    with reporting(pair.name, geometry.valid, row_bytes) as advance:
        slices = stream.chunks([obs, nxt, *extra], geometry.valid, geometry.align)
        for sl, (o, n, succ) in ahead(slices, load):
            yield block, sl, o, n, succ
            advance(sl)


def encode_pair(
    stream: Stream,
    source: Source,
    pair: Pair,
    codec: Codec,
    bound: float | None,
    sink: Sink,
    exceptions: tuple[Pieces, Pieces],
    algorithm: str,
    later: Behind,
    copy: tuple[Any, Hasher] | None = None,
    feed: BlockFeed | None = None,
) -> tuple[ErrorStats, dict[str, str]]:
    """Write ``pair``'s stored leaf and append its exception rows to ``exceptions`` (index,
    rows); return the figures and the hashes of the original next observations, of what the
    rebuild gives, and of what was written.

    Writes and the error figures run in ``later`` while the next chunk is read and coded; the
    exception pieces use the same one, so the container sees every write in program order.

    ``copy`` (the output's observation leaf and a hasher) copies the observations in the same
    pass, which reads them anyway: every row, so only where all rows are valid. ``feed``
    takes the observations' block checksums in the same pass, for the same reason."""
    has_leaf = codec.stored_dtype(source.leaves[pair.obs_key].dtype) is not None
    dst = stream.flat(sink.leaves[pair.delta_key]) if has_leaf else None
    hashers = {name: Hasher(algorithm) for name in HASH_NAMES}
    index, rows = exceptions
    stats = ErrorStats()
    extra = [] if dst is None else [dst]
    copying = None if copy is None else (stream.flat(copy[0]), copy[1])
    if copying is not None:
        extra.append(copying[0])
    exact = only_exact(codec, bound)
    for block, sl, o, n, succ in chunks(stream, source, pair, codec.uses_successor, extra):
        if copying is not None:
            later(copying[0].__setitem__, sl, o)
            copying[1].update(o)
        if feed is not None:
            feed.update(o)
        c = code_chunk(codec, o, n, succ, bound)
        if c.bad.size:
            at, values = c.bad + sl.start, n[c.bad]
            index.append(at)
            rows.append(values)
            hashers["index"].update(at)
            hashers["rows"].update(values)
        later(_account, stats, c, n, block)
        hashers["next"].update(n)
        if not exact:
            hashers["rebuilt"].update(c.rebuilt)
        if dst is not None and c.stored is not None:
            later(dst.__setitem__, sl, c.stored)
            hashers["stored"].update(c.stored)
    later.wait()
    geometry = stream.geometry(source.leaves[pair.obs_key])
    if dst is not None and geometry.valid < geometry.total:
        # Rows past a replay buffer's len are not data: store a zero delta for them.
        dst[geometry.valid :] = 0
    hashes = {name: h.hex for name, h in hashers.items()}
    if exact:  # every row rebuilt bit for bit, the failing ones patched in: next's bytes
        hashes["rebuilt"] = hashes["next"]
    return stats, hashes


def _account(stats: ErrorStats, c: Coded, truth: np.ndarray, block: int) -> None:
    stats.count(c.verdict)
    stats.update(truth, c.rebuilt, exceptions=int(c.bad.size), same=c.verdict.same, block=block)


#: Pairs read in one chunk each are measured together, up to this many bytes of observations
#: at a time: a robomimic key has hundreds of demos of a few dozen rows, and a codec's work on
#: a chunk has a fixed cost that exceeds such a demo's rows many times over.
BATCH_BYTES = 1 << 22

#: A chunk to measure: its pair's rows per block, observations, next and successor rows.
Piece = tuple[int, np.ndarray, np.ndarray, np.ndarray | None]


def measure_pairs(
    stream: Stream,
    source: Source,
    pairs: Sequence[Pair],
    codecs: Sequence[Codec],
    bound: float | None,
) -> list[ErrorStats]:
    """Figures of every codec on ``pairs`` (of one key), reading each once, writing nothing.
    Pairs read in a single chunk are coded a batch at a time: every codec codes and judges
    each row on its own, and each pair's rows are still summed in blocks of their own (see
    :meth:`ErrorStats.update`), so the figures are those of coding each pair apart."""
    stats = [ErrorStats() for _ in codecs]
    successors = any(c.uses_successor for c in codecs)
    batch: list[Piece] = []
    batch_bytes = 0
    for pair in pairs:
        first: Piece | None = None
        several = False
        for block, _sl, o, n, succ in chunks(stream, source, pair, successors):
            if first is None and not several:
                first = (block, o, n, succ)
                continue
            if first is not None:  # a pair of several chunks: each measured as it comes
                _measure([first], codecs, stats, bound)
                first, several = None, True
            _measure([(block, o, n, succ)], codecs, stats, bound)
        if first is not None:
            batch.append(first)
            batch_bytes += first[1].nbytes
            if batch_bytes >= BATCH_BYTES:
                _measure(batch, codecs, stats, bound)
                batch, batch_bytes = [], 0
    if batch:
        _measure(batch, codecs, stats, bound)
    return stats


def _measure(
    pieces: Sequence[Piece], codecs: Sequence[Codec], stats: list[ErrorStats], bound: float | None
) -> None:
    """Add every codec's figures on ``pieces``, coded as one chunk."""
    if len(pieces) == 1:
        block, o, n, succ = pieces[0]
        parts: list[tuple[int, int]] = []
    else:
        block = pieces[0][0]
        o = np.concatenate([p[1] for p in pieces])
        n = np.concatenate([p[2] for p in pieces])
        # Every piece has successors, or none has (its codecs ask for them or not).
        with_succ = [p[3] for p in pieces if p[3] is not None]
        succ = np.concatenate(with_succ) if with_succ else None
        parts = [(p[2].shape[0], p[0]) for p in pieces]
    for codec, s in zip(codecs, stats, strict=True):
        c = code_chunk(codec, o, n, succ, bound)
        s.count(c.verdict)
        s.update(
            n, c.rebuilt, exceptions=int(c.bad.size), same=c.verdict.same, block=block, parts=parts
        )
