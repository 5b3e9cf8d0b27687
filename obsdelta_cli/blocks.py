"""Block checksums: every stored leaf hashed in fixed blocks of rows at compress time, and
checked by the training readers the first time a process reads a block.

A block is a power of two of a leaf's flat rows (``[rows, *features]``), about
:data:`BLOCK_BYTES` of values, so its rows depend only on the leaf's shape and dtype, never on
``--chunk-mb`` or ``--jobs``. Its checksum is the xxh3-64 of the values' bytes (C order), as
any reader of the container gets them: a memmap file's bytes, an HDF5 dataset's decoded values.
The manifest keeps one string per leaf, the blocks' digests end to end (16 hex digits each).

>>> import numpy as np
>>> rows = np.arange(10, dtype=np.int64).reshape(5, 2)
>>> block_rows(rows.shape, rows.dtype, 32)
2
>>> checked = CheckedRows(rows, digests(rows, 2), 2, file="f", key="k")
>>> checked[np.array([4, 0])].tolist(), int(checked.checked.sum())
([[8, 9], [0, 1]], 2)
>>> rows[2, 0] = 7  # damage in a block not read yet
>>> try:
...     checked[2:3]
... except DamagedError as exc:
...     print(exc)
f: key k: rows 2-3 do not match their checksum; the file is damaged; restore it or compress again
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .checksum import (
    DIGEST,
    BlockCheck,
    Hasher,
    block_rows,
    damaged_rows,
    digest_at,
    digest_of,
)
from .errors import DamagedError
from .formats.base import Key, Source, key_str
from .formats.leaf import FlatRows, as_rows, is_data
from .manifest import KeyRecord, Manifest
from .rebuild import Exceptions, take
from .stream import Stream, ahead

#: Bytes read at a time while a leaf is hashed at compress time (whole blocks).
READ_BYTES = 8 << 20


def digests(rows: Any, block: int) -> str:
    """The digests of flat ``rows`` (an array or lazy rows), block after block, end to end."""
    total = rows.shape[0]
    row = max(1, math.prod(rows.shape[1:]) * np.dtype(rows.dtype).itemsize)
    step = block * max(1, READ_BYTES // (block * row))
    spans = [slice(a, min(total, a + step)) for a in range(0, total, step)]
    out: list[str] = []
    for _, chunk in ahead(spans, rows.__getitem__):
        out.extend(digest_of(chunk[at : at + block]) for at in range(0, len(chunk), block))
    return "".join(out)


def leaf_digests(
    leaves: Iterable[tuple[str, Any]],
    batch_dims: int,
    block_bytes: int,
    fed: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The block digests of every leaf (flat over ``batch_dims``), by name, from pairs made as
    they are asked for; those in ``fed`` (from a :class:`BlockFeed` the encoding pass fed as
    it read them) are not read again."""
    fed = fed or {}
    out = {}
    for name, leaf in leaves:
        if name in fed:
            out[name] = fed[name]
            continue
        rows = as_rows(leaf, batch_dims)
        out[name] = digests(rows, block_rows(rows.shape, rows.dtype, block_bytes))
    return out


class CheckedRows:
    """Flat rows whose blocks are checked against their digests the first time they are read
    (a bitmap of checked blocks; reads of checked blocks cost one lookup). ``digests``: the
    blocks' digests end to end, or, with ``algorithm``, the one hash of the whole leaf
    (format 2 files: the first read of any row checks them all)."""

    def __init__(
        self,
        rows: Any,
        digests: str,
        block: int,
        *,
        file: str | Path,
        key: str,
        algorithm: str | None = None,
    ) -> None:
        self.rows, self.shape, self.dtype = rows, tuple(rows.shape), rows.dtype
        #: Slices of a lazy leaf are read into new arrays (see :func:`~obsdelta_cli.rebuild.take`).
        self.fresh_slices = isinstance(rows, FlatRows)
        self.block, self.file, self.key, self.algorithm = block, file, key, algorithm
        self._digests = digests
        count = -(-self.shape[0] // block) if block else 0
        self.checked = np.zeros(count, dtype=bool)
        self._all = count == 0
        if algorithm is None and len(digests) != count * DIGEST:
            # The manifest lists another number of blocks than the rows hold.
            self._fail(0, count)

    def __len__(self) -> int:
        return self.shape[0]

    def _fail(self, first: int, last: int) -> None:
        high = min(self.shape[0], last * self.block) - 1
        raise damaged_rows(self.file, self.key, first * self.block, high)

    def _check_block(self, b: int, values: np.ndarray | None = None) -> None:
        """Check block ``b``: its ``values`` where the caller read them, else read now."""
        if values is None:
            values = self.rows[b * self.block : (b + 1) * self.block]
        if self.algorithm is not None:  # one hash of the whole leaf
            hasher = Hasher(self.algorithm)
            hasher.update(np.ascontiguousarray(values))
            if hasher.hex != self._digests:
                self._fail(b, b + 1)
        elif digest_of(values) != digest_at(self._digests, b):
            self._fail(b, b + 1)
        self.checked[b] = True
        self._all = bool(self.checked.all())

    def check(self, first: int, stop: int) -> None:
        """Check the blocks of rows ``first:stop`` not checked yet."""
        if self._all or stop <= first:
            return
        for b in range(first // self.block, -(-stop // self.block)):
            if not self.checked[b]:
                self._check_block(b)

    def check_rows(self, idx: np.ndarray) -> None:
        """Check the blocks of rows ``idx`` (any order, in range) not checked yet."""
        if self._all or not idx.size:
            return
        blocks = idx // self.block
        if bool(self.checked[blocks].all()):
            return
        touched = np.zeros(self.checked.size, dtype=bool)  # no sort of every row's block
        touched[blocks] = True
        for b in np.flatnonzero(touched & ~self.checked).tolist():
            self._check_block(int(b))

    def _check_read(self, start: int, values: np.ndarray) -> None:
        """Check the blocks of rows ``start:start + len(values)`` not checked yet; those whole
        in ``values`` are hashed from them (the rows served are the rows checked, read once),
        the one or two cut by its ends are read whole."""
        stop = start + len(values)
        for b in range(start // self.block, -(-stop // self.block)):
            if self.checked[b]:
                continue
            lo, hi = b * self.block, min((b + 1) * self.block, self.shape[0])
            inside = start <= lo and hi <= stop
            self._check_block(b, values[lo - start : hi - start] if inside else None)

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                return self[np.arange(start, stop, step)]
            values = np.asarray(self.rows[start : max(start, stop)])
            if not self._all:
                self._check_read(start, values)
            return values
        idx = np.asarray(key)
        self.check_rows(idx.reshape(-1))
        return take(self.rows, idx)


@dataclass(frozen=True)
class CheckedStream(Stream):
    """A :class:`~obsdelta_cli.stream.Stream` whose flat leaves are :class:`CheckedRows`
    where the manifest holds checksums for them (by the leaf's identity); each leaf is
    wrapped once, so its readers share which blocks are checked."""

    checks: dict[int, tuple[Any, CheckedRows]] = field(default_factory=dict)

    def flat(self, leaf: Any) -> Any:
        found = self.checks.get(id(leaf))
        if found is not None and found[0] is leaf:
            return found[1]
        return as_rows(leaf, self.batch_dims)


def checked_stream(source: Source, manifest: Manifest, stream: Stream) -> CheckedStream:
    """``stream``, reading every leaf of ``source`` that ``manifest`` holds checksums for
    through :class:`CheckedRows`: block digests (format 3), else the one hash of a leaf kept
    unchanged or of a stored leaf whose every row is hashed (format 2)."""
    whole = dict(manifest.checksums)
    for r in manifest.keys:
        leaf = source.leaves.get(r.delta_key) if r.delta_key else None
        # Format 2 hashed the valid rows of a stored leaf: the rows past a buffer's len not.
        every_row = leaf is not None and source.valid_rows in (None, leaf.shape[0])
        if r.delta_key and "stored" in r.hashes and every_row:
            whole.setdefault(key_str(r.delta_key), r.hashes["stored"])
    checks: dict[int, tuple[Any, CheckedRows]] = {}
    for key, leaf in source.leaves.items():
        name = key_str(key)
        if not is_data(leaf) or (name not in manifest.blocks and name not in whole):
            continue
        rows = as_rows(leaf, source.batch_dims)
        if name in manifest.blocks:
            block = block_rows(rows.shape, rows.dtype, manifest.hash_block_bytes)
            checked = CheckedRows(rows, manifest.blocks[name], block, file=source.path, key=name)
        else:
            checked = CheckedRows(
                rows,
                whole[name],
                max(1, rows.shape[0]),
                file=source.path,
                key=name,
                algorithm=manifest.hash_algorithm,
            )
        checks[id(leaf)] = (leaf, checked)
    fields = {f.name: getattr(stream, f.name) for f in dataclasses.fields(Stream)}
    return CheckedStream(**fields, checks=checks)


def block_check(source: Source, manifest: Manifest, key: Key) -> BlockCheck | None:
    """The check of leaf ``key`` of ``source`` against its block digests, for a pass that reads
    it from end to end; ``None`` where the manifest holds none (format 2)."""
    name = key_str(key)
    if name not in manifest.blocks:
        return None
    rows = as_rows(source.leaves[key], source.batch_dims)
    block = block_rows(rows.shape, rows.dtype, manifest.hash_block_bytes)
    return BlockCheck(rows.shape[0], manifest.blocks[name], block, file=source.path, key=name)


def check_exceptions(
    exceptions: Exceptions | None, record: KeyRecord, algorithm: str, file: str | Path
) -> None:
    """Check a pair's exception rows and their index against the hashes recorded for them."""
    if exceptions is None:
        return
    for name, values in (("index", exceptions.index), ("rows", exceptions.rows())):
        if name not in record.hashes:
            continue
        hasher = Hasher(algorithm)
        hasher.update(np.ascontiguousarray(values))
        if hasher.hex != record.hashes[name]:
            raise DamagedError(
                f"exception rows ({name}) do not match their checksum; the file is damaged",
                file=file,
                key=record.name,
                hint="restore it or compress again",
            )
