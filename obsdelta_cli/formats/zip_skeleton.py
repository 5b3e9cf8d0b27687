"""A ``torch.save`` file as a skeleton with holes, so it can be written again byte for byte.

``torch.save`` writes a zip archive whose records are stored uncompressed: the pickle
(``data.pkl``), small version records, a random ``.data/serialization_id``, and one record per
tensor storage (``data/<n>``, 64-byte aligned). The bytes of the tensors a TensorDict holds
are *holes* in those records (a storage of its own each, or side by side in one storage for a
consolidated TensorDict); every other byte (zip headers, the pickle, the central directory) is
the *skeleton*, a few KB. Writing the skeleton and each tensor's bytes in file order gives back
the file that was saved, whatever torch version wrote it.

The zip structure is read with :mod:`zipfile` and plain reads of its headers: nothing here
unpickles anything. Which record holds which tensor comes from the tensors themselves: a file
loaded with ``torch.load(mmap=True)`` is mapped once and each storage is a slice of that
mapping, so a tensor's storage address minus the mapping's start is its record's offset. The
leaves obsdelta holds are arrays sharing the tensors' memory: their storage is the tensor's
they view.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import from_torch, is_tensor
from ..errors import InputError
from .base import Key

_LOCAL = b"PK\x03\x04"
_CENTRAL = b"PK\x01\x02"
_DESCRIPTOR = b"PK\x07\x08"
#: General-purpose flag: sizes and CRC-32 follow the data in a data descriptor.
_HAS_DESCRIPTOR = 0x08


@dataclass(frozen=True)
class Hole:
    """Bytes of the file filled by the bytes of the tensor ``ref``."""

    offset: int
    size: int
    ref: Key


@dataclass(frozen=True)
class Record:
    """The data of a zip record holding holes, and where its CRC-32 is written (local
    header, data descriptor, central directory): rewritten when a tensor's bytes differ from
    the saved ones."""

    start: int
    end: int
    crc_at: tuple[int, ...] = ()


@dataclass(frozen=True)
class Layout:
    """Where the holes of a file of ``size`` bytes are, and the records they lie in; the
    skeleton is every byte outside the holes."""

    size: int
    holes: tuple[Hole, ...]
    records: tuple[Record, ...] = ()

    @property
    def skeleton_bytes(self) -> int:
        return self.size - sum(h.size for h in self.holes)

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "holes": [[h.offset, h.size, list(h.ref)] for h in self.holes],
            "records": [[r.start, r.end, list(r.crc_at)] for r in self.records],
        }

    @classmethod
    def from_json(cls, data: Any, file: Path) -> Layout:
        """The layout recorded in ``data``, checked: records and holes in file order, inside
        the file and apart, each hole inside a record, each CRC-32 field outside them all."""

        def bad(what: str) -> InputError:
            return InputError(
                f"the recorded layout of the .pt file {what}",
                file=file,
                hint="the compressed dataset is damaged; restore it from a copy",
            )

        if not isinstance(data, Mapping) or not _count(data.get("size")):
            raise bad("is malformed")
        size = data["size"]
        records: list[Record] = []
        holes: list[Hole] = []
        for item in _items(data.get("records"), bad):
            start, end, crc_at = item
            if not (_count(start) and _count(end) and end > start >= _end(records)):
                raise bad("has records out of order")
            if not (isinstance(crc_at, list) and all(_count(p) for p in crc_at)):
                raise bad("is malformed")
            records.append(Record(start, end, tuple(crc_at)))
        for item in _items(data.get("holes"), bad):
            offset, length, ref = item
            if not (_count(offset) and _count(length) and length and offset >= _end(holes)):
                raise bad("has holes out of order")
            if not (isinstance(ref, list) and ref and all(isinstance(p, str) for p in ref)):
                raise bad("names a tensor that is not a key")
            if not any(r.start <= offset and offset + length <= r.end for r in records):
                raise bad("has a hole outside the records")
            holes.append(Hole(offset, length, tuple(ref)))
        if _end(records) > size:
            raise bad("has records beyond the end of the file")
        for r in records:
            for at in r.crc_at:
                if at + 4 > size or any(at < o.end and o.start < at + 4 for o in records):
                    raise bad("puts a CRC-32 field inside the data")
        return cls(size, tuple(holes), tuple(records))


def _items(value: Any, bad: Callable[[str], InputError]) -> list[list[Any]]:
    if not isinstance(value, list) or not all(isinstance(v, list) and len(v) == 3 for v in value):
        raise bad("is malformed")
    return value


def _end(spans: list[Any]) -> int:
    last = spans[-1] if spans else None
    if isinstance(last, Hole):
        return last.offset + last.size
    return last.end if isinstance(last, Record) else 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _records(path: Path) -> list[Record] | None:
    """The stored records of a zip file: where each one's data starts and ends, and where its
    CRC-32 is written; ``None`` if the file is not a zip file this module can describe."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            start_dir = getattr(zf, "start_dir", None)
        size = path.stat().st_size
        if not isinstance(start_dir, int):
            return None
        with path.open("rb") as fh:
            fh.seek(start_dir)
            central = fh.read(size - start_dir)
            out: list[Record] = []
            at = 0
            for info in infos:
                if central[at : at + 4] != _CENTRAL:
                    return None
                crc_fields = [start_dir + at + 16]
                at += 46 + sum(struct.unpack_from("<HHH", central, at + 28))
                fh.seek(info.header_offset)
                head = fh.read(30)
                if len(head) < 30 or head[:4] != _LOCAL:
                    return None
                name_len, extra_len = struct.unpack_from("<HH", head, 26)
                data = info.header_offset + 30 + name_len + extra_len
                end = data + info.file_size
                if info.compress_type != zipfile.ZIP_STORED or end > size:
                    continue  # never a storage: stays in the skeleton
                crc_fields.append(info.header_offset + 14)
                if info.flag_bits & _HAS_DESCRIPTOR:
                    fh.seek(end)
                    crc_fields.append(end + (4 if fh.read(4) == _DESCRIPTOR else 0))
                crc_at = []
                for pos in sorted(crc_fields):
                    fh.seek(pos)
                    found = fh.read(4)
                    # A CRC of 0: torch was told not to compute them; nothing to rewrite.
                    if len(found) == 4 and info.CRC and struct.unpack("<I", found)[0] == info.CRC:
                        crc_at.append(pos)
                out.append(Record(data, end, tuple(crc_at)))
    except (OSError, zipfile.BadZipFile, struct.error, ValueError, EOFError):
        return None
    return out


#: Bytes of a storage outside its tensors' values that still count as alignment padding.
_PADDING = 64


def _tensor_of(a: np.ndarray) -> Any:
    """The tensor whose memory the array ``a`` views (:func:`~obsdelta_cli.arrays.from_torch`),
    ``None`` for an array of numpy's own."""
    base: Any = a
    while base is not None and not is_tensor(base):
        base = getattr(base, "base", None)
    return base


def find(path: Path, tensors: Mapping[Key, Any]) -> tuple[Layout, bytes] | None:
    """The layout of ``path`` with one hole per array of ``tensors`` (tensors loaded from it
    with ``torch.load(mmap=True)``, or arrays sharing their memory), and its skeleton.
    ``None`` where the file's storages hold more than the tensors' values (views of a larger
    tensor, overlapping views) or do not map onto its records (torch's legacy format)."""
    spans: dict[Key, tuple[int, int, int]] = {}  # storage address, offset in it, bytes
    storages: dict[int, int] = {}  # address: bytes
    for ref, t in tensors.items():
        t = from_torch(t) if is_tensor(t) else t
        if not isinstance(t, np.ndarray) or not t.size:
            continue  # an empty array holds no bytes: it stays in the skeleton
        owner = _tensor_of(t)
        if owner is None or not t.flags.c_contiguous or owner.device.type != "cpu":
            return None
        storage = owner.untyped_storage()
        spans[ref] = (storage.data_ptr(), t.ctypes.data - storage.data_ptr(), t.nbytes)
        storages[storage.data_ptr()] = storage.nbytes()
    records = _records(path)
    if records is None:
        return None
    by_start = {r.start: r for r in records if r.end > r.start}
    mappings: list[dict[int, Record]] = []
    if storages:
        first = min(storages)
        # Highest first: with a base too low, the highest storage lands past the last record.
        descending = sorted(storages.items(), reverse=True)
        for candidate in by_start.values():
            if candidate.end - candidate.start != storages[first]:
                continue
            base, mapped = first - candidate.start, {}
            for address, nbytes in descending:
                record = by_start.get(address - base)
                if record is None or record.end - record.start != nbytes:
                    break
                mapped[address] = record
            else:
                mappings.append(mapped)
    if len(mappings) != (1 if storages else 0):
        return None  # no mapping, or (in a file of evenly spaced equal records) no single one
    mapping: dict[int, Record] = mappings[0] if mappings else {}
    holes = sorted(
        (Hole(mapping[a].start + at, n, ref) for ref, (a, at, n) in spans.items()),
        key=lambda h: h.offset,
    )
    if any(a.offset + a.size > b.offset for a, b in itertools.pairwise(holes)):
        return None  # overlapping views
    filled: dict[int, list[int]] = {}  # storage address: its tensors' bytes
    for address, _, nbytes in spans.values():
        filled.setdefault(address, []).append(nbytes)
    for address, sizes in filled.items():
        if storages[address] - sum(sizes) > _PADDING * len(sizes):
            return None  # a storage holds more than its tensors: kept only by saving anew
    used = sorted(set(mapping.values()), key=lambda r: r.start)
    layout = Layout(path.stat().st_size, tuple(holes), tuple(used))
    skeleton = bytearray()
    with path.open("rb") as fh:
        at = 0
        for hole in (*holes, Hole(layout.size, 0, ())):
            fh.seek(at)
            skeleton += fh.read(hole.offset - at)
            at = hole.offset + hole.size
    if len(skeleton) != layout.skeleton_bytes:
        return None  # the file changed while it was read
    return layout, bytes(skeleton)


Fill = Callable[[Hole], Iterable[Any]]


def write(
    path: Path, layout: Layout, skeleton: bytes, fill: Fill, changed: frozenset[Key] = frozenset()
) -> None:
    """Write the file ``layout`` describes: the skeleton, and each hole's bytes as ``fill``
    gives them (buffers, in order). The CRC-32 of a record holding a tensor of ``changed`` is
    computed again and written over the recorded one, so the zip stays valid when a lossy
    rebuild changed the tensor's bytes."""
    skel = bytearray(skeleton)
    if len(skel) != layout.skeleton_bytes:
        raise InputError(
            f"the .pt skeleton is {len(skel)} bytes, not {layout.skeleton_bytes}",
            file=path,
            hint="the compressed dataset is damaged; restore it from a copy",
        )
    starts = [h.offset for h in layout.holes]
    before = list(itertools.accumulate((h.size for h in layout.holes), initial=0))

    def index(pos: int) -> int:  # where a file position outside the holes is in ``skel``
        return pos - before[bisect.bisect_left(starts, pos)]

    def pieces(start: int, end: int) -> Iterator[Any]:
        """The bytes of ``start:end`` (which holes do not straddle), in order."""
        at = start
        for hole in layout.holes[bisect.bisect_left(starts, start) :]:
            if hole.offset >= end:
                break
            yield skel[index(at) : index(hole.offset)]
            yield from _sized(hole, fill(hole), path)
            at = hole.offset + hole.size
        yield skel[index(at) : index(end)]

    for record in layout.records if changed else ():
        inside = layout.holes[
            bisect.bisect_left(starts, record.start) : bisect.bisect_left(starts, record.end)
        ]
        if record.crc_at and any(h.ref in changed for h in inside):
            crc = 0
            for piece in pieces(record.start, record.end):
                crc = zlib.crc32(piece, crc)
            for pos in record.crc_at:
                skel[index(pos) : index(pos) + 4] = struct.pack("<I", crc)
    with path.open("wb") as fh:
        for piece in pieces(0, layout.size):
            fh.write(piece)


def _sized(hole: Hole, blocks: Iterable[Any], path: Path) -> Iterator[memoryview]:
    """The blocks filling ``hole``, checked to add up to its size."""
    written = 0
    for block in blocks:
        view = memoryview(block).cast("B")
        written += len(view)
        yield view
    if written != hole.size:
        raise InputError(
            f"tensor {'/'.join(hole.ref)} has {written} bytes where the .pt file had {hole.size}",
            file=path,
            hint="the compressed dataset is damaged; restore it from a copy",
        )
