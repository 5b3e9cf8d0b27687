"""Streaming content hashes of arrays, in row order, independent of how rows are chunked.

Format 2 files use xxh3-64 (about 20 GB/s here, so integrity costs little of the speed budget);
format 1 files used CRC-32, which is still read. Both detect accidental damage (bit rot,
truncation, a bad copy); neither is a defence against deliberate tampering.

Block digests (:mod:`obsdelta_cli.blocks` checks them on reads) are xxh3-64 of fixed blocks of a
leaf's rows; :class:`BlockFeed` takes them, and :class:`BlockCheck` checks them, from rows fed
in order by a pass that reads them anyway.

>>> import numpy as np
>>> a, b = Hasher(), Hasher()
>>> a.update(np.arange(6)); b.update(np.arange(3)); b.update(np.arange(3, 6))
>>> a.hex == b.hex
True
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .errors import DamagedError
from .manifest import HASH_ALGORITHM


def _raw(a: np.ndarray) -> memoryview:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data


def digest_of(values: np.ndarray) -> str:
    """The xxh3-64 hex digest of ``values``' bytes (C order): one block's checksum."""
    return xxhash.xxh3_64_hexdigest(_raw(values))


class Hasher:
    """A running hash over the raw bytes (C order) of the arrays (or bytes) fed to it."""

    def __init__(self, algorithm: str = HASH_ALGORITHM, *, state: Any = None) -> None:
        """``state``: an xxh3-64 state to go on from (already fed with a header, say)."""
        self.algorithm = algorithm
        self._crc = 0
        if state is not None:
            self._xxh = state
        else:
            self._xxh = xxhash.xxh3_64() if algorithm != "crc32" else None

    def update(self, data: np.ndarray | bytes) -> None:
        if isinstance(data, np.ndarray):
            if not data.size:
                return
            raw: bytes | memoryview = _raw(data)
        else:
            raw = data
        if self._xxh is not None:
            self._xxh.update(raw)
        else:
            self._crc = zlib.crc32(raw, self._crc)

    @property
    def hex(self) -> str:
        return self._xxh.hexdigest() if self._xxh is not None else f"{self._crc:08x}"


#: Bytes of values a block holds at most (one row at least).
BLOCK_BYTES = 1 << 20
#: Hex digits of one block's digest.
DIGEST = 16


def block_rows(shape: Sequence[int], dtype: np.dtype, block_bytes: int = BLOCK_BYTES) -> int:
    """Rows of a block of flat rows ``shape`` (``[rows, *features]``) of ``dtype``: the largest
    power of two whose values fit in ``block_bytes``, at least 1."""
    row = max(1, math.prod(shape[1:]) * np.dtype(dtype).itemsize)
    return 1 << max(0, (block_bytes // row).bit_length() - 1)


class _Blocks:
    """A leaf's flat rows fed in order, cut into blocks of ``block`` rows, the digest of each
    handed to :meth:`_digested` as soon as it is whole (the leaf's last, short one when every
    row is in). Whole blocks are hashed where they lie in what is fed; a block cut between two
    feeds is hashed in pieces, so nothing is copied (the caller may reuse its buffer)."""

    def __init__(self, rows: int, block: int) -> None:
        self.total, self.block = rows, block
        self.fed = 0
        self.partial: Any = None  # the hash of a block begun by the last feed
        self.held = 0  # and how many of its rows it has

    def update(self, rows: np.ndarray) -> None:
        """The next rows, in order."""
        at = 0
        if self.partial is not None:
            at = min(len(rows), self.block - self.held)
            self.partial.update(_raw(rows[:at]))
            self.held += at
            if self.held == self.block or self.fed + at == self.total:
                self._digested(self.partial.hexdigest())
                self.partial, self.held = None, 0
        end = at + (len(rows) - at) // self.block * self.block
        for start in range(at, end, self.block):
            self._digested(digest_of(rows[start : start + self.block]))
        if end < len(rows):
            rest = rows[end:]
            if self.fed + len(rows) == self.total:  # the leaf's last, short block
                self._digested(digest_of(rest))
            else:
                self.partial, self.held = xxhash.xxh3_64(_raw(rest)), len(rest)
        self.fed += len(rows)

    def _digested(self, digest: str) -> None:
        raise NotImplementedError


class BlockFeed(_Blocks):
    """The block digests of a leaf's flat rows fed in order, as :func:`digests` gives them,
    so that a pass reading the rows anyway needs no second read for them.

    >>> rows = np.arange(10, dtype=np.int64).reshape(5, 2)
    >>> feed = BlockFeed(rows.shape, rows.dtype, 32)
    >>> feed.update(rows[:3]); feed.update(rows[3:])
    >>> feed.result() == digest_of(rows[0:2]) + digest_of(rows[2:4]) + digest_of(rows[4:])
    True
    """

    def __init__(self, shape: Sequence[int], dtype: np.dtype, block_bytes: int) -> None:
        super().__init__(int(shape[0]), block_rows(shape, dtype, block_bytes))
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.out: list[str] = []
        self.other = False

    def update(self, rows: np.ndarray) -> None:
        """The next rows, in order."""
        if self.other or rows.dtype != self.dtype:
            self.other = True  # read as another dtype than readers get: not these bytes
            return
        super().update(rows)

    def _digested(self, digest: str) -> None:
        self.out.append(digest)

    def result(self) -> str | None:
        """The digests, if every row was fed (else ``None``: read them from the leaf)."""
        if self.other or self.fed != self.total:
            return None
        return "".join(self.out)


class BlockCheck(_Blocks):
    """A leaf's flat rows fed in order, each block checked against its digest as soon as it is
    whole: a pass that reads a leaf from end to end (``inflate``) checks what it reads as the
    training readers do, and stops at the first damaged block, naming its rows.

    >>> rows = np.arange(10, dtype=np.int64).reshape(5, 2)
    >>> blocks = digest_of(rows[0:2]) + digest_of(rows[2:4]) + digest_of(rows[4:])
    >>> check = BlockCheck(len(rows), blocks, 2, file="f", key="k")
    >>> check.update(rows[:3]); check.update(rows[3:]); check.done()
    True
    >>> rows[4, 1] = -1
    >>> try:
    ...     BlockCheck(len(rows), check.digests, 2, file="f", key="k").update(rows)
    ... except DamagedError as exc:
    ...     print(exc.message)
    rows 4-4 do not match their checksum; the file is damaged
    """

    def __init__(self, rows: int, digests: str, block: int, *, file: str | Path, key: str) -> None:
        super().__init__(rows, block)
        self.digests, self.file, self.key = digests, file, key
        self.blocks = -(-rows // block) if block else 0
        self.checked = 0
        if len(digests) != self.blocks * DIGEST:
            raise damaged_rows(file, key, 0, rows - 1)

    def _digested(self, digest: str) -> None:
        b = self.checked
        if digest != digest_at(self.digests, b):
            first = b * self.block
            raise damaged_rows(self.file, self.key, first, min(self.total, first + self.block) - 1)
        self.checked += 1

    def done(self) -> bool:
        """Whether every row was fed, and so every block checked."""
        return self.fed == self.total and self.checked == self.blocks


def digest_at(digests: str, block: int) -> str:
    """Digest number ``block`` of ``digests`` (one after another, :data:`DIGEST` characters
    each)."""
    return digests[block * DIGEST : (block + 1) * DIGEST]


def damaged_rows(file: str | Path, key: str, first: int, last: int) -> DamagedError:
    """The error of rows ``first``-``last`` of leaf ``key`` that do not match their checksum."""
    return DamagedError(
        f"rows {first}-{max(first, last)} do not match their checksum; the file is damaged",
        file=file,
        key=key,
        hint="restore it or compress again",
    )
