"""Hashes of HDF5 objects as stored, and the bytes their headers take."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import xxhash
from h5py import h5s
from h5py._hl.filters import _COMP_FILTERS as COMP_FILTERS
from h5py._hl.filters import get_filters
from h5py._objects import phil

from ..errors import InputError
from ..filters import workers
from .apart import SILENCE_SECONDS, apart, beat, begin
from .base import Ahead
from .direct import PIECE, ColdReads
from .hdf5_leaves import META_ATTR, replaced_twins
from .hdf5_types import StoredType, space_anew, stored_type, type_anew
from .hdf5_walk import OWN, object_names, objects_of, owned, raw_name


def hash_objects(
    f: h5py.File,
    file: Path,
    skip: Callable[[str], bool],
    known: Mapping[str, str] | None = None,
    copied_from: Mapping[str, str] | None = None,
    own: str = OWN,
    names: Sequence[bytes] | None = None,
    root: bool = True,
) -> dict[str, str]:
    """xxh3-64 of every dataset as stored (creation properties and raw chunks, never
    decompressed) and of every object's attributes, for the objects ``skip`` keeps; ``known``
    gives the hashes of datasets already hashed as they were written. Of obsdelta's own
    objects (the group ``own``), the twins ``inflate`` recreates replaced datasets from are
    hashed too: their creation properties and attributes become the output's.

    ``copied_from``: the hashes recorded in the file these objects were copied from, of
    another HDF5 format version (a packed file's). Objects copied there hold the same values,
    but HDF5 encodes their types (enum, compound, array) and dataspaces for the newer format:
    a hash that differs from its record only in those encodings is the recorded one.

    ``names``: of :func:`~.hdf5_walk.object_names`, the objects to hash (a run of the walk:
    see :func:`begin_hashes`); ``root``: whether the file's own attributes are hashed too."""
    each = _each_hash(f, file, skip, known or {}, copied_from or {}, own, {}, names, root)
    return {key: h for _name, key, h in each if h is not None}


#: Objects each child hashes at least where :func:`begin_hashes` splits a file's walk: a file
#: of fewer is hashed by one child, as splitting it would save less than the caller notices.
PART_OBJECTS = 2000


def begin_hashes(
    f: h5py.File, file: Path, skip: Callable[[str], bool], known: Mapping[str, str], own: str
) -> Callable[[], dict[str, str]]:
    """:func:`hash_objects` of a file obsdelta has written (flushed, open for writing), begun
    now in forked children (:func:`~.apart.begin`) beside the caller's next work: one run of
    the walk's objects each, one child a core where each gets :data:`PART_OBJECTS` or more
    (hashing a robomimic file of 1,000 demos takes seconds, which the caller would otherwise
    wait for on one core). The function returned collects the hashes, in the walk's order."""
    names = object_names(f)
    parts = max(1, min(workers(), len(names) // PART_OBJECTS))
    runs = [names[len(names) * i // parts : len(names) * (i + 1) // parts] for i in range(parts)]
    pending = [
        begin(
            partial(hash_objects, f, file, skip, known, None, own, run, root=i == 0),
            timeout=SILENCE_SECONDS,
        )
        for i, run in enumerate(runs)
    ]

    def collect() -> dict[str, str]:
        out: dict[str, str] = {}
        try:
            for part in pending:
                out |= part.result()
        finally:
            for part in pending:
                part.cancel()  # nothing for those collected: the others, after an error
        return out

    return collect


#: One hash of :func:`_each_hash`: the object's path, its key among the hashes (its path, or
#: ``@`` and its path for its attributes) and the hash (``None``: its values are left out).
Entry = tuple[str, str, str | None]


def _each_hash(
    f: h5py.File,
    file: Path,
    skip: Callable[[str], bool],
    known: Mapping[str, str],
    copied_from: Mapping[str, str],
    own: str,
    deferred: Mapping[str, int],
    names: Sequence[bytes] | None = None,
    root: bool = True,
) -> list[Entry]:
    """:func:`hash_objects`, one :data:`Entry` each, in the walk's order; the values of the
    datasets named in ``deferred`` are not read (their entry has no hash) where they store at
    least the bytes it gives."""
    out: list[Entry] = []
    if root:
        out.append(("", "@", _attrs_hash_as(f, copied_from.get("@"), META_ATTR)))
    fd = os.open(file, os.O_RDONLY)
    cold = ColdReads(fd)  # an input checked before it is copied is usually not in memory
    try:
        for name, obj in objects_of(f, names):
            beat()
            ours = owned(name, own)
            if (ours and not is_replaced_twin(name, own)) or skip(name):
                continue
            if isinstance(obj, h5py.Dataset) and ours:
                out.append((name, name, _twin_hash(obj)))
            elif isinstance(obj, h5py.Dataset):
                least = deferred.get(name)
                later = least is not None and name not in known
                later = later and (not least or obj.id.get_storage_size() >= least)
                h = None if later else _dataset_hash(name, obj, fd, cold, known, copied_from)
                out.append((name, name, h))
            if len(obj.attrs):  # an attribute added to an object without any is still caught
                attrs = _attrs_hash_as(obj, copied_from.get(f"@{name}"))
                out.append((name, f"@{name}", attrs))
    finally:
        cold.close()
        os.close(fd)
    return out


def _dataset_hash(
    name: str,
    ds: h5py.Dataset,
    fd: int,
    cold: ColdReads | None,
    known: Mapping[str, str],
    copied_from: Mapping[str, str],
) -> str:
    """The entry in :func:`hash_objects` of dataset ``ds`` at ``name``."""
    found = known.get(name) or _raw_hash(ds, fd, cold)
    recorded = copied_from.get(name)
    if recorded is not None and found != recorded:
        anew = _raw_hash(ds, fd, cold, headers_anew=True)
        found = anew if anew == recorded else found
    return found


class HashesAhead:
    """:func:`hash_objects_apart` of a file, begun as the file is opened, in a forked child
    that runs beside the parent's walk of the file's datasets: ``verify`` and ``inflate``
    check every object after that walk. Every object is hashed but obsdelta's own; the values
    of the datasets named in ``deferred`` (stored leaves, which the check skips, and large
    observations, which ``inflate`` hashes as it copies them), where they store at least the
    bytes it gives, are left to :meth:`hashes`, as are the ``skip`` and ``known`` of
    :func:`hash_objects`, which are not known before the walk."""

    def __init__(
        self,
        f: h5py.File,
        file: Path,
        deferred: Mapping[str, int],
        copied_from: Mapping[str, str],
        own: str,
    ) -> None:
        self._f, self._file, self._copied_from, self._own = f, file, dict(copied_from), own
        work = partial(_each_hash, f, file, _never, {}, self._copied_from, own, dict(deferred))
        self._pending = begin(work, timeout=SILENCE_SECONDS)

    def hashes(self, skip: Callable[[str], bool], known: Mapping[str, str]) -> dict[str, str]:
        """What :func:`hash_objects_apart` with these ``skip`` and ``known`` gives."""
        out: dict[str, str] = {}
        left: list[str] = []
        for name, key, h in self._pending.result():
            if key != "@" and skip(name):
                continue
            if key == name and name in known and not owned(name, self._own):  # as read later
                h = known[name]
                if self._copied_from.get(name, h) != h:
                    h = None  # as a walk would: its stored types may be encoded anew
            if h is None:
                left.append(name)
            out[key] = h or ""
        if left:  # not among the values the caller hashes: read in a child of their own
            out |= apart(partial(self._values, left, known), timeout=SILENCE_SECONDS)
        return out

    def hashes_like(self, copied_from: Mapping[str, str]) -> bool:
        """Whether the hashes were begun with these records of another format's hashes."""
        return self._copied_from == dict(copied_from)

    def cancel(self) -> None:
        """End the child unheard (the file is closed, or its check failed first)."""
        self._pending.cancel()

    def _values(self, names: list[str], known: Mapping[str, str]) -> dict[str, str]:
        fd = os.open(self._file, os.O_RDONLY)
        try:
            f, recorded = self._f, self._copied_from
            return {n: _dataset_hash(n, f[n], fd, None, known, recorded) for n in names}
        finally:
            os.close(fd)


def hashes_ahead(
    f: h5py.File,
    path: Path,
    meta: Mapping[str, Any],
    own: str,
    ahead: Ahead,
    left: Iterable[str] = (),
) -> HashesAhead | None:
    """Object hashes of the compressed file ``f`` begun beside the walk of its datasets; the
    values of its stored leaves, and with ``ahead`` "objects-but-observations" of its
    observations of :data:`AHEAD_LEFT_BYTES` or more, as its metadata names them, left to the
    check, as are those of the datasets ``left`` (a packed file's repacked ones). The metadata
    is not checked yet: what it names only decides what is read now, and the hashes are used
    only where its records are those the check is given (:meth:`HashesAhead.hashes_like`).
    ``None`` where the metadata records no objects: they are then not checked (metadata of
    the first format version), or, if they are, walked after all."""
    keys, objects = meta.get("keys"), meta.get("objects")
    if not (isinstance(objects, dict) and objects):
        return None
    deferred: dict[str, int] = {}
    fields = {"delta_key": 0}
    if ahead == "objects-but-observations":
        fields["obs_key"] = AHEAD_LEFT_BYTES
    for record in keys if isinstance(keys, list) else []:
        for field, least in fields.items():
            key = record.get(field) if isinstance(record, dict) else None
            if isinstance(key, list) and all(isinstance(k, str) for k in key):
                deferred["/".join(key)] = least
    deferred |= dict.fromkeys(left, 0)
    return HashesAhead(f, path, deferred, objects, own)


#: Observations smaller than this are hashed by :class:`~.hdf5_objects.HashesAhead` even
#: where the command hashes them as it copies them: a file of many episodes has thousands,
#: each quicker to hash beside the walk than to look up again after it, and reading a large
#: one twice would cost more than the walk.
AHEAD_LEFT_BYTES = 1 << 20


def _never(name: str) -> bool:
    return False


def objects_read(file: Path, work: Callable[[], dict[str, str]]) -> dict[str, str]:
    """``work()``, what HDF5 raises as it reads ``file``'s objects said as damage."""
    try:
        return work()
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise InputError(
            f"cannot read an object ({exc})", file=file, hint="the file is damaged"
        ) from None


def is_replaced_twin(name: str, own: str = OWN) -> bool:
    """Whether ``name`` is under :func:`~.hdf5_leaves.replaced_twins` of obsdelta's group
    ``own`` (``@name`` included).

    >>> is_replaced_twin("obsdelta/layout/next_observations"), is_replaced_twin("@obsdelta")
    (True, False)
    """
    return name.lstrip("@").startswith(f"{replaced_twins(own)}/")


def hash_objects_apart(
    f: h5py.File,
    file: Path,
    skip: Callable[[str], bool],
    known: Mapping[str, str] | None = None,
    copied_from: Mapping[str, str] | None = None,
    own: str = OWN,
    *,
    ahead: HashesAhead | None = None,
) -> dict[str, str]:
    """:func:`hash_objects` in a forked child (:mod:`.apart`): hashing reads every object's
    attributes, and a damaged one can crash HDF5 itself, or make it loop. The child is given
    :data:`~.apart.SILENCE_SECONDS` between signs of progress, however long the whole takes.
    ``ahead``: the hashes begun as the file was opened (:func:`hashes_ahead`), taken where they
    were begun with the records ``copied_from``, and otherwise ended unheard."""
    recorded = copied_from or {}
    if ahead is not None and ahead.hashes_like(recorded):
        return ahead.hashes(skip, known or {})
    if ahead is not None:
        ahead.cancel()
    return apart(lambda: hash_objects(f, file, skip, known, recorded, own), timeout=SILENCE_SECONDS)


def _attrs_hash_as(obj: Any, recorded: str | None, exclude: str | None = None) -> str:
    found, anew = attrs_hashes(obj, exclude)
    return anew if recorded is not None and found != recorded and anew == recorded else found


def attrs_hash(obj: Any, exclude: str | None = None, *, types_anew: bool = False) -> str:
    """xxh3-64 of an object's attributes: names, stored types and values.
    ``types_anew``: each type as HDF5 encodes it new, in its first format version
    (as a file of the earliest format stores it), not as this file's format stores it."""
    return attrs_hashes(obj, exclude)[types_anew]


def attrs_hashes(obj: Any, exclude: str | None = None) -> tuple[str, str]:
    """:func:`attrs_hash` of ``obj`` as stored and with ``types_anew``, from one read of each
    attribute (an object may hold 100,000). Each attribute is read through HDF5's own calls as
    h5py's ``attrs[name]`` reads it, each of its types converted once."""
    h, anew = xxhash.xxh3_64(), xxhash.xxh3_64()
    both = _Both(h, anew)
    oid = obj.id
    raw: list[bytes] = []
    with phil:
        h5py.h5a.iterate(oid, lambda name, *_: raw.append(name))
        for name, stored_name in sorted((_decoded(n), n) for n in raw):
            if name == exclude:
                continue
            attr = h5py.h5a.open(oid, stored_name)
            stored = stored_type(attr.get_type())
            shape = attr.shape  # ``None`` for an empty one, which h5py reads as ``Empty``
            value = np.asarray(obj.attrs[name] if shape is None else _attr_value(attr, stored))
            both.update(f"{name}\0{value.dtype.str}\0{value.shape}\0".encode())
            h.update(stored.encoded)  # how the stored bytes read
            anew.update(stored.anew_encoded)
            if value.dtype.kind == "O":
                both.update(repr(value.tolist()).encode())
            else:  # a compound may hold variable-length fields too: never their pointers
                feed_values(both, value)
    return h.hexdigest(), anew.hexdigest()


class _Both:
    """Two hash states fed the same bytes."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def update(self, data: bytes) -> None:
        self.a.update(data)
        self.b.update(data)


def _decoded(name: bytes) -> Any:
    """An attribute's name as h5py gives it: text where it is UTF-8, else its bytes."""
    try:
        return name.decode("utf8")
    except UnicodeDecodeError:
        return name


def _attr_value(attr: Any, stored: StoredType) -> Any:
    """The value of attribute ``attr`` (not empty) of type ``stored``, as h5py's
    ``attrs[name]`` gives it."""
    shape, dtype = attr.shape, stored.dtype
    if dtype.subdtype is not None:  # an array type: its dimensions become the value's
        dtype, inner = dtype.subdtype
        shape = shape + inner
    arr = np.zeros(shape, dtype=dtype, order="C")
    attr.read(arr, mtype=stored.read_as)
    string = h5py.check_string_dtype(dtype)
    if string and string.length is None:  # variable-length strings read as text
        flat = [b.decode("utf-8", "surrogateescape") for b in arr.flat]
        arr = np.array(flat, dtype=dtype).reshape(arr.shape)
    return arr[()] if arr.ndim == 0 else arr


def _twin_hash(ds: h5py.Dataset) -> str:
    """A twin of a replaced dataset: what it is, and that it stores nothing (its chunks are
    never read: h5py's read of a chunk never written may size its buffer from garbage)."""
    h = header_hash(ds)
    h.update(f"stored {ds.id.get_storage_size()}".encode())
    return h.hexdigest()


def _raw_hash(
    ds: h5py.Dataset, fd: int, cold: ColdReads | None = None, *, headers_anew: bool = False
) -> str:
    """A dataset as stored: dtype, shape, creation properties, then its raw chunks in chunk
    order (each with its position and filter mask) or its contiguous bytes (``headers_anew``:
    see :func:`header_hash`)."""
    h, what = _header(ds, headers_anew)
    dsid, dcpl, shape = ds.id, what.dcpl, what.shape
    layout = dcpl.get_layout()
    if what.dtype.hasobject:
        # Variable-length strings and arrays store references into the file's heap, which an
        # object copy moves: what they hold is hashed, read as values.
        _hash_values_of(h, ds)
    elif layout == h5py.h5d.CHUNKED:
        assert shape is not None  # a chunked dataset has a simple dataspace
        # Every chunk of the grid, found through the chunk index as a read would find it.
        grid = [range(0, n, c) for n, c in zip(shape, what.chunks or (), strict=True)]
        cells = math.prod(len(r) for r in grid)
        if cells > 4 * dsid.get_num_chunks() + 1024:
            raise ValueError(f"{ds.name}: {cells} chunk places for {dsid.get_num_chunks()} chunks")
        for offset in itertools.product(*grid):
            try:
                mask, raw = dsid.read_direct_chunk(offset)
            except (KeyError, OSError, RuntimeError, ValueError):
                h.update(f"{offset}: none".encode())
                continue
            h.update(f"{offset}: {mask} {len(raw)}".encode())
            h.update(raw)
            beat()
    elif layout == h5py.h5d.CONTIGUOUS:
        offset = dsid.get_offset()
        if offset is not None:
            hash_span(h, fd, offset, dsid.get_storage_size(), cold)
    elif shape is not None:  # compact: the values live in the object header
        feed_values(h, np.asarray(ds[()]))
    return h.hexdigest()


def chunked_hash(ds: h5py.Dataset) -> str:
    """The entry in :func:`hash_objects` of a chunked dataset (read through its raw chunks:
    no descriptor of its file is needed)."""
    return _raw_hash(ds, -1)


def header_hash(ds: h5py.Dataset, *, headers_anew: bool = False) -> Any:
    """An xxh3-64 state fed with what a dataset is, before its values: dtype, shape, creation
    properties, the stored type in full. ``headers_anew``: its type and dataspace as HDF5
    encodes them new, in the first format version that holds them (:func:`type_anew`)."""
    return _header(ds, headers_anew)[0]


class Facts:
    """What a dataset is (creation properties, dataspace, dtype), each asked of HDF5 once."""

    __slots__ = ("chunks", "dcpl", "dtype", "shape", "space")

    def __init__(self, dsid: Any) -> None:
        self.dcpl, self.space, self.dtype = dsid.get_create_plist(), dsid.get_space(), dsid.dtype
        self.shape = self.space.shape if self.space.get_simple_extent_type() != h5s.NULL else None
        chunked = self.dcpl.get_layout() == h5py.h5d.CHUNKED
        self.chunks = self.dcpl.get_chunk() if chunked else None


def dataset_props(facts: Facts) -> tuple[Any, ...]:
    """``((dtype.str, shape, maxshape, chunks, compression, compression_opts), shuffle,
    fletcher32, scaleoffset)`` as h5py's ``Dataset`` properties give them, from the creation
    properties and dataspace asked once: each h5py property asks HDF5 anew, and some make a
    new property list or type each time, which cost several times the dataset's own open."""
    dims = facts.space.get_simple_extent_dims(True)
    maxshape = None if dims is None else tuple(None if x == h5s.UNLIMITED else x for x in dims)
    used = get_filters(facts.dcpl)
    compression = next((x for x in ("gzip", "lzf", "szip") if x in used), None)
    if compression is None and any(f not in COMP_FILTERS for f in used):
        compression = "unknown"  # a filter of a plugin
    scale = used["scaleoffset"][1] if "scaleoffset" in used else None
    first = (facts.dtype.str, facts.shape, maxshape, facts.chunks, compression)
    return ((*first, used.get(compression)), "shuffle" in used, "fletcher32" in used, scale)


def _header(ds: h5py.Dataset, headers_anew: bool) -> tuple[Any, Facts]:
    h = xxhash.xxh3_64()
    dsid = ds.id
    with phil:
        what = Facts(dsid)
        h.update(repr(dataset_props(what)).encode())
        # The stored type in full (byte order, bit layout), not only what numpy makes of it.
        stored, space = dsid.get_type(), what.space
        if headers_anew:
            stored, space = type_anew(stored), space_anew(space)
        h.update(stored.encode())
        h.update(space.encode())
        dcpl = what.dcpl
        h.update(repr([dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]).encode())
        fill = np.zeros(1, dtype=what.dtype)
        if dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
            dcpl.get_fill_value(fill)
    feed_values(h, fill)
    return h, what


#: Rows of a dataset of variable-length values read at a time to hash them.
VALUE_ROWS = 4096


def _hash_values_of(h: Any, ds: h5py.Dataset) -> None:
    if ds.shape is None:  # empty (null dataspace): its header says all there is
        return
    if not ds.shape:
        feed_values(h, np.asarray(ds[()], dtype=ds.dtype))
        return
    for start in range(0, ds.shape[0], VALUE_ROWS):
        feed_values(h, ds[start : start + VALUE_ROWS])
        beat()


def feed_values(h: Any, a: np.ndarray) -> None:
    """Feed the values of ``a`` to ``h``: its bytes, or, where it holds Python objects
    (variable-length strings and arrays, whose bytes in memory are pointers), each value with
    its length, so that the same values give the same hash in every process.

    >>> a, b = xxhash.xxh3_64(), xxhash.xxh3_64()
    >>> feed_values(a, np.array([b"ab", b"c"], dtype=object))
    >>> feed_values(b, np.array([b"ab", b"c"], dtype=object))
    >>> a.hexdigest() == b.hexdigest()
    True
    """
    if not a.dtype.hasobject:
        h.update(np.ascontiguousarray(a).tobytes())
        return
    for value in a.reshape(-1):
        _feed_value(h, value)


def _feed_value(h: Any, value: Any) -> None:
    if isinstance(value, bytes | bytearray):
        h.update(b"b%d:" % len(value))
        h.update(value)
    elif isinstance(value, str):
        _feed_value(h, value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, np.void) and value.dtype.names:
        for name in value.dtype.names:
            _feed_value(h, value[name])
    elif isinstance(value, np.ndarray | np.generic):
        a = np.asarray(value)
        h.update(f"a{a.dtype.str}{a.shape}:".encode())
        feed_values(h, a)
    else:  # a reference or another object h5py gives: what it says it is
        h.update(f"o{value!r}".encode())


def hash_span(h: Any, fd: int, offset: int, size: int, cold: ColdReads | None = None) -> None:
    """Feed ``size`` bytes of the file at ``offset`` to ``h``, 4 MiB at a time (with ``cold``,
    those not in memory read past the page cache)."""
    done = 0
    while done < size:
        count = min(1 << 22, size - done)
        direct = (
            None if cold is None else cold.read(offset + done, min(count, PIECE), offset + size)
        )
        piece = os.pread(fd, count, offset + done) if direct is None else direct.data
        if not piece:
            raise ValueError(f"storage at {offset} runs past the end of the file")
        h.update(piece)
        done += len(piece)
        beat()


def header_bytes(obj: Any, *, group: bool, path: str | None = None) -> int:
    """An object's header, and for a group its link index and name heap. ``path``: ``obj`` is
    the file (or group), the object the one at ``path`` below it, asked for by name, so that
    nothing is opened (a robomimic file's thousands of datasets cost a walk's time to open)."""
    info = h5py.h5o.get_info(obj.id) if path is None else h5py.h5o.get_info(obj.id, raw_name(path))
    total = int(info.hdr.space.total)
    if group:
        total += int(info.meta_size.obj.index_size + info.meta_size.obj.heap_size)
    return total
