"""The objects of an HDF5 file as obsdelta walks them: each opened once and held while the
file is open read-only (:func:`objects_of`, :func:`object_at`), with the descriptor its
leaves' raw reads share (:class:`FileReads`)."""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
from h5py._objects import phil

from ..errors import FileChangedError
from .direct import ColdReads

#: obsdelta's own group (exception rows, layouts, packing): ``/obsdelta``, or in a D4RL file
#: with a ``metadata`` group, :data:`OWN_IN_METADATA`. A file's manifest names the place it uses
#: (``own``), and every reader takes it from there.
OWN = "obsdelta"
#: D4RL readers take every root object of the file for data and set ``metadata/`` apart
#: (TorchRL's ``D4RLExperienceReplay`` among them): there, obsdelta's group is no data of theirs.
OWN_IN_METADATA = f"metadata/{OWN}"
#: Every place obsdelta's group may be.
OWN_PLACES = (OWN, OWN_IN_METADATA)


def layout_twins(own: str = OWN) -> str:
    """Where a packed file whose own group is ``own`` keeps the empty twins of its repacked
    datasets (their original creation properties), one per dataset: read by path when a
    dataset is unpacked, and left out of walks, which open what they list (HDF5 holds about
    13 KB for each open dataset)."""
    return f"{own}/pack/layout"


def owned(name: str, own: str = OWN) -> bool:
    """Whether the object at ``name`` (no leading slash) is in obsdelta's group ``own``.

    >>> owned("metadata/obsdelta/arrays/k0.rows", OWN_IN_METADATA), owned("obsdelta2", OWN)
    (True, False)
    """
    return name == own or name.startswith(f"{own}/")


def own_key(own: str = OWN) -> tuple[str, ...]:
    """``own`` as a leaf key's leading parts."""
    return tuple(own.split("/"))


class FileReads:
    """The descriptor, and the reads past the page cache, that the leaves of one file share:
    each of a robomimic file's hundreds of datasets would otherwise open the file twice and map
    it once. Opened at the first read; closed when no leaf holds it any more."""

    def __init__(
        self, file: Path, read_only: bool, opened: Callable[[], h5py.File | None] | None = None
    ) -> None:
        """``opened``: gives the h5py File of ``file`` (``None`` once it is gone), whose
        descriptor reads are made through while it is open."""
        self.file = file
        #: Raw reads are made only of a file open read-only: no write can be pending in HDF5.
        self.read_only = read_only
        self.fd = -1
        self.cold: ColdReads | None = None
        self._opening = threading.Lock()  # leaves are read from the read-ahead thread too
        self._size: int | None = None
        self._h5 = opened

    def file_size(self) -> int:
        """The file's size, asked once of a file open read-only (it cannot change)."""
        if self._size is None or not self.read_only:
            self._size = os.fstat(self.descriptor()).st_size
        return self._size

    def open(self) -> tuple[int, ColdReads]:
        with self._opening:
            if self.cold is None:
                self.fd = self._h5_descriptor()
                if self.fd < 0:
                    self.fd = os.open(self.file, os.O_RDONLY)
                self.cold = ColdReads(self.fd)
            return self.fd, self.cold

    def _h5_descriptor(self) -> int:
        """A descriptor of the file HDF5 opened, -1 where HDF5 has none: that file even if
        another has been put at its name since (an output written again), so that raw reads
        and HDF5's own see the same bytes. Opened anew, not duplicated: a duplicate would
        share, and so keep, HDF5's lock on the file after HDF5 closes it."""
        f = None if self._h5 is None else self._h5()
        try:
            if f is None or not f.id.valid or f.driver != "sec2":
                return -1
            held = f.id.get_vfd_handle()
        except (ValueError, TypeError, RuntimeError):
            return -1  # closed meanwhile
        try:
            return os.open(f"/proc/self/fd/{held}", os.O_RDONLY)
        except OSError:  # no /proc: by name, if the name still holds that file
            fd = os.open(self.file, os.O_RDONLY)
            if not os.path.sameopenfile(fd, held):
                os.close(fd)
                raise FileChangedError(self.file) from None
            return fd

    def descriptor(self) -> int:
        """The shared descriptor, opened at the first call."""
        return self.open()[0]

    def close(self) -> None:
        """Close the descriptor now (a later read opens it again)."""
        with self._opening:
            cold, self.cold = self.cold, None
            if cold is not None:
                cold.close()
            fd, self.fd = self.fd, -1
            if fd >= 0:
                os.close(fd)

    def __del__(self) -> None:
        if hasattr(self, "_opening"):  # set after fd and cold; unset if a signal cut __init__ short
            self.close()


#: Objects of a file open read-only held open at once (:class:`Held`): HDF5 keeps about 12.5
#: KB for each open object, so 4,096 take about 50 MB. A file with fewer (a robomimic file of
#: up to about 240 demos) is opened object by object once; one with more (34,000 objects in a
#: robomimic file of 2,000 demos, 424 MB held open) keeps the first it opened, and the most
#: recently used of the others.
HELD = 4096


class Held:
    """The objects of one h5py File open read-only, opened as asked and kept open, at most
    :data:`HELD`: a walk of the file, and every leaf of it, gets its objects here instead of
    holding its own handles.

    The first opened stay open; the others share a sixteenth of the places, the least recently
    used closed first. Every pass over a file (its leaves, the walk that checks its objects,
    the reads) asks for its objects in the same order, and with only the most recently used
    kept, a file of more objects than that had each one closed just before it was asked for
    again: every pass opened every object."""

    def __init__(self, f: h5py.File) -> None:
        self._file = weakref.ref(f)  # not kept alive by this: the entry goes with it
        _, self._slots, self._nbytes, self._w0 = f.id.get_access_plist().get_cache()
        self._first: dict[bytes, Any] = {}
        self._recent: OrderedDict[bytes, Any] = OrderedDict()
        self._lock = threading.Lock()  # leaves are read from the read-ahead thread too

    def get(self, name: str | bytes) -> Any:
        """The object at ``name`` (a path from the root, without the leading slash)."""
        raw = raw_name(name)
        with self._lock:
            obj = self._first.get(raw)
            if obj is None and (obj := self._recent.get(raw)) is not None:
                self._recent.move_to_end(raw)
            if obj is not None:
                return obj
        f = self._file()
        assert f is not None  # asked through the File itself, or a leaf that holds it
        with phil:
            obj = _open(f, raw, True, self._slots, self._nbytes, self._w0)
        recent = max(1, HELD // 16)
        closed = []
        with self._lock:
            held = self._first.get(raw, self._recent.get(raw))
            if held is not None:  # opened meanwhile by another thread: that one is kept
                closed.append(obj)
                obj = held
            elif len(self._first) < HELD - recent:
                self._first[raw] = obj
            else:
                self._recent[raw] = obj
                while len(self._recent) > recent:
                    closed.append(self._recent.popitem(last=False)[1])
        # Closed here, out of the lock: h5py takes its own lock to close an object, and a
        # thread holding that one may be waiting for this one.
        del closed
        return obj


class _Shared:
    """What the readers of one h5py File open read-only share: its descriptor and reads (see
    FileReads), the names of its objects, walked at the first call that needs them, and the
    objects held open (:class:`Held`)."""

    def __init__(self, f: h5py.File) -> None:
        # Held by the leaves, not here: the descriptor closes when no leaf holds it any more.
        self._reads: weakref.ref[FileReads] | None = None
        self._file = weakref.ref(f)  # not kept alive by this: the entry goes with it
        self._names: list[bytes] | None = None
        self._known: set[bytes] | None = None
        self.held = Held(f)

    def reads(self) -> FileReads:
        reads = None if self._reads is None else self._reads()
        if reads is None:
            f = self._file()
            assert f is not None  # asked through the File itself
            reads = FileReads(Path(f.filename), read_only=True, opened=self._file)
            self._reads = weakref.ref(reads)
        return reads

    def names(self) -> list[bytes]:
        if self._names is None:
            f = self._file()
            assert f is not None  # asked through the File itself
            self._names = _names(f)
        return self._names

    def objects(self, names: Sequence[bytes] | None = None) -> Iterator[tuple[str, Any]]:
        for raw in self.names() if names is None else names:
            yield _name(raw), self.held.get(raw)

    def at(self, path: str) -> Any:
        if self._known is None:
            self._known = set(self.names())
        raw = raw_name(path)
        return self.held.get(raw) if raw in self._known else None


#: By ``id`` of the h5py File open read-only; an entry goes with its File.
_SHARED: dict[int, tuple[weakref.ref[h5py.File], _Shared]] = {}


def shared_of(f: h5py.File) -> _Shared:
    key = id(f)
    hit = _SHARED.get(key)
    if hit is None or hit[0]() is not f:
        hit = (weakref.ref(f, lambda _ref: _SHARED.pop(key, None)), _Shared(f))
        _SHARED[key] = hit
    return hit[1]


def file_reads(f: h5py.File) -> FileReads:
    """The reads every leaf of ``f`` shares: one descriptor for a file's hundreds of datasets.
    A file open for writing gets reads that make no raw read (a write may be pending)."""
    return shared_of(f).reads() if f.mode == "r" else FileReads(Path(f.filename), read_only=False)


def object_names(f: h5py.File) -> list[bytes]:
    """The names of the objects :func:`objects_of` gives, in its order, as HDF5 has them."""
    return shared_of(f).names() if f.mode == "r" else _names(f)


def objects_of(f: h5py.File, names: Sequence[bytes] | None = None) -> Iterable[tuple[str, Any]]:
    """Every object below the root (groups and datasets, as h5py objects) but
    :func:`layout_twins`, by path, in the order ``visititems`` visits them; with ``names`` (of
    :func:`object_names`), those alone, in that order. Each is opened as
    the walk reaches it, and not held by the walk: HDF5 holds about 12.5 KB for each open
    object, and a robomimic file of 2,000 demos has 34,000. A file open read-only is walked
    once, its objects held open up to :data:`HELD` of them (:class:`Held`): its objects
    cannot change, and opening its leaves, checking its objects and packing it each need
    them, while h5py takes 30-60 µs to open each. A file open for writing is walked afresh."""
    return shared_of(f).objects(names) if f.mode == "r" else _visit(f, names)


def object_at(f: h5py.File, path: str) -> Any:
    """``f.get(path)`` (no leading slash), from the walk of a file open read-only."""
    return shared_of(f).at(path) if f.mode == "r" else f.get(path)


def held_at(f: h5py.File, path: str) -> Any:
    """``f.get(path)``, as the walk of ``f`` holds it open where it does (:func:`object_at`):
    a file of 1,000 episodes has thousands of objects, and opening each again by name costs
    as much as the walk. Where the walk does not hold it (a second hard link, a layout twin)
    it is opened by name."""
    obj = object_at(f, path)
    return f.get(path) if obj is None else obj


class ByPath(Mapping[str, Any]):
    """The objects of ``f`` at ``paths``, each asked for (:func:`object_at`) when it is looked
    up: a dict of them would hold every one open (HDF5 holds about 11 KB for each), where a
    walk of a file open read-only holds at most :data:`HELD`."""

    def __init__(self, f: h5py.File, paths: Iterable[str]) -> None:
        self._f = f
        self._paths = list(paths)

    def __getitem__(self, path: str) -> Any:
        obj = object_at(self._f, path)
        if obj is None:
            raise KeyError(path)
        return obj

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


def _names(f: h5py.File) -> list[bytes]:
    """The names ``f.visititems`` visits, but those of :func:`layout_twins` (of each place
    obsdelta's group may be: both are names obsdelta keeps for itself)."""
    names: list[bytes] = []
    with phil:
        h5py.h5o.visit(f.id, names.append)
    twins = tuple(layout_twins(own).encode() for own in OWN_PLACES)
    inside = tuple(t + b"/" for t in twins)
    return [raw for raw in names if not (raw in twins or raw.startswith(inside))]


def _visit(f: h5py.File, names: Sequence[bytes] | None = None) -> Iterator[tuple[str, Any]]:
    """What ``f.visititems`` visits, made with h5py's low-level calls as they are asked for:
    its ``f[name]`` makes a File object for every object it opens (to ask the file's mode),
    which took 80 µs an object against 30-50 µs here (a 4,000-object robomimic file: 0.27-0.37
    s against 0.17-0.32 s). Datasets get chunk caches sized by :func:`_cache_slots`."""
    readonly = f.mode == "r"
    _, slots, nbytes, w0 = f.id.get_access_plist().get_cache()
    for raw in _names(f) if names is None else names:
        with phil:  # not held while the caller has the object
            obj = _open(f, raw, readonly, slots, nbytes, w0)
        yield _name(raw), obj


def _open(f: h5py.File, raw: bytes, readonly: bool, slots: int, nbytes: int, w0: float) -> Any:
    oid = h5py.h5o.open(f.id, raw)
    kind = h5py.h5i.get_type(oid)
    if kind == h5py.h5i.DATASET:
        want = _cache_slots(oid, slots, nbytes) if nbytes else None
        if want is not None:
            del oid  # the dataset closes, so that it opens again with its own cache
            dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
            dapl.set_chunk_cache(want, nbytes, w0)
            oid = h5py.h5d.open(f.id, raw, dapl)
        return h5py.Dataset(oid, readonly=readonly)
    if kind == h5py.h5i.GROUP:
        return h5py.Group(oid)
    if kind == h5py.h5i.DATATYPE:
        return h5py.Datatype(oid)
    raise TypeError(f"/{raw.decode(errors='replace')}: an object of unknown type {kind}")


def raw_name(name: str | bytes) -> bytes:
    """An object's name as HDF5 has it, from h5py's (the inverse of :func:`_name`)."""
    return name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name


def _name(raw: bytes) -> Any:
    """An object's name as h5py gives it: text where it is UTF-8, else the bytes."""
    try:
        return raw.decode("utf8")
    except UnicodeDecodeError:
        return raw


#: Slots of the chunk cache every HDF5 file is opened with (:func:`h5_file`): a dataset
#: with more chunks gets its own number when it is opened (:func:`_cache_slots`). HDF5 gives
#: every open chunked dataset a table of its cache's slots, 8 bytes each, however few chunks it
#: has: with HDF5 2.0's default of 8,191 that is 64 KB a dataset, and with the 100,003 slots
#: packed files were read with, 800 KB (verifying a packed robomimic file of 600 chunked
#: datasets took 850 MB). 521 is h5py's own default (4 KB a dataset).
CACHE_SLOTS = 521


def h5_file(path: Path, mode: str = "r", **options: Any) -> h5py.File:
    """``h5py.File(path, mode, **options)`` with a chunk cache of :data:`CACHE_SLOTS` slots:
    the way obsdelta opens every HDF5 file."""
    return h5py.File(path, mode, rdcc_nslots=CACHE_SLOTS, **options)


def _cache_slots(dsid: Any, slots: int, nbytes: int) -> int | None:
    """How many slots the chunk cache of dataset ``dsid`` needs when its file's cache has
    ``slots`` of them (``None``: those will do): one a chunk (a chunk's slot is its index along
    time, so no two share one), at most 100 per chunk the cache holds, as HDF5 advises."""
    if dsid.get_offset() is not None:  # contiguous, and quicker to ask than the layout
        return None
    dcpl = dsid.get_create_plist()
    if dcpl.get_layout() != h5py.h5d.CHUNKED:
        return None
    chunk = dcpl.get_chunk()
    count = math.prod(-(-int(n) // int(c)) for n, c in zip(dsid.shape, chunk, strict=True))
    if count <= slots:
        return None
    held = nbytes // max(1, math.prod(chunk) * dsid.get_type().get_size())
    return max(slots, min(count, 100 * held))
