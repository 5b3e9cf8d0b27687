"""HDF5 inputs that point outside themselves are refused before anything follows the pointer."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py

from ..errors import InputError, ObsdeltaError, failed_write, size_text
from .apart import SILENCE_SECONDS, apart, beat

#: What to do about a packed file found damaged.
PACK_DAMAGED = "the packed file is damaged; restore it from a copy"


def damaged_pack(file: Path, what: str) -> InputError:
    """The error of a packed file whose structure or records are not as written."""
    return InputError(what, file=file, hint=PACK_DAMAGED)


@contextmanager
def reading_pack(file: Path) -> Iterator[None]:
    """What HDF5 raises while the packed ``file`` is read into an output is damage to it, but
    a failed write (which the output reports): an object header or attribute that does not
    parse, an address past the end of the file."""
    try:
        yield
    except ObsdeltaError:
        raise  # said precisely already (some are ValueErrors too)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        if failed_write(exc):
            raise
        text = " ".join(str(exc).split())
        raise damaged_pack(file, f"cannot read an object ({text})") from None


def damaged_file(path: Path, exc: BaseException) -> InputError:
    return InputError(
        f"cannot open as HDF5 ({exc})", file=path, hint="the file is truncated or damaged"
    )


_OUTSIDE_HINT = (
    "obsdelta reads only data stored inside the file; copy the data in "
    "(e.g. h5py's Group.copy, or h5repack) and retry"
)
#: A file as it is now: (device, inode, size, modification time in ns). Caches of what was
#: found out about a file are keyed by it, so a file replaced or changed is looked at again.
Stamp = tuple[int, int, int, int]
#: Files already found self-contained, each with whether it holds a scale-offset dataset (see
#: :func:`scale_offset`): detection opens a file once per HDF5 layout, and a file with many
#: objects takes a while to walk.
_CONTAINED: dict[Stamp, bool] = {}
#: The most attributes one object of each file walked holds (see :func:`output_libver`).
_MOST_ATTRS: dict[Stamp, int] = {}

#: An output of a file where one object holds more attributes than this is written in HDF5's
#: 1.8 format, at least. Files of the oldest format keep an object's attributes in a list that
#: HDF5 searches for each one written or opened by name, so 100,000 attributes took h5py 800 s
#: to write; from 1.8 on, many attributes are indexed by name.
DENSE_ATTRS = 1000


def scale_offset(dcpl: h5py.h5p.PropDCID) -> bool:
    """Whether creation properties ``dcpl`` filter with scale-offset, which rounds values as
    they are written. HDF5 must not hold such a dataset in its chunk cache: copying
    (``H5Ocopy``) one whose chunks are cached writes past the end of a buffer in HDF5 2.0,
    which then aborts the process (``malloc(): invalid size``) or worse. obsdelta reads a pair's
    observations and then copies them whole, so a file holding one is opened without a cache."""
    codes = (dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters()))
    return h5py.h5z.FILTER_SCALEOFFSET in codes


def file_stamp(path: Path) -> Stamp | None:
    """``path``'s :data:`Stamp`, or ``None`` where it cannot be read (nothing is then cached)."""
    try:
        return _stamp(path.stat())
    except OSError:
        return None


def opened_stamp(f: h5py.File) -> Stamp | None:
    """The :data:`Stamp` of the file HDF5 opened as ``f``, not of what its name holds now:
    another process may have put a new file there since (``compress --force`` of an output
    being read), and what was found in one file would then be remembered for the other. ``None``
    where HDF5 has no descriptor to ask (nothing is then cached)."""
    try:
        if f.driver != "sec2":
            return None
        return _stamp(os.fstat(f.id.get_vfd_handle()))
    except (OSError, ValueError, TypeError, RuntimeError):
        return None


def _stamp(st: os.stat_result) -> Stamp:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


#: A selection that is one box: its first index and its end (exclusive) in each dimension.
Box = tuple[tuple[int, ...], tuple[int, ...]]
#: One mapping of a virtual dataset: the box it fills, the source file and dataset names as
#: stored, and the box of the source it takes (``None`` for a selection that is not a box).
VirtualMap = tuple[Box | None, str, str, Box | None]
#: The mappings a virtual dataset may have, given its path (no leading slash) and shape;
#: ``None`` where it may not exist.
Allowed = Callable[[str, tuple[int, ...]], list[VirtualMap] | None]


def written_here(path: Path, uncached: bool, most: int) -> None:
    """Record that the HDF5 file at ``path``, as it is now, was just written by this process
    from inputs :func:`check_contained` passed, with no virtual dataset, whether it holds
    scale-offset datasets and the most attributes one of its objects holds: reading it back
    (``compress --pack`` reads its inner container, ``compress`` verifies its output) need not
    walk it again in a child. A file changed since has another :data:`Stamp` and is walked as
    any other."""
    stamp = file_stamp(path)
    if stamp is not None:
        _CONTAINED[stamp] = uncached
        _MOST_ATTRS[stamp] = most


def most_attrs(path: Path) -> int:
    """The most attributes one object of the file at ``path`` holds, as :func:`check_contained`
    found them (0 for a file not walked as it is now)."""
    stamp = file_stamp(path)
    return 0 if stamp is None else _MOST_ATTRS.get(stamp, 0)


def output_libver(libver: tuple[str, str] | None, path: Path) -> tuple[str, str] | None:
    """The HDF5 library versions to write a file made from the one at ``path`` (walked by
    :func:`check_contained`) in: ``libver``, the source's (``None``: HDF5's default), at least
    1.8 where an object holds more than :data:`DENSE_ATTRS` attributes (their names and values
    are kept; only how HDF5 indexes them changes)."""
    low, high = libver or ("earliest", "latest")
    if low == "earliest" and most_attrs(path) > DENSE_ATTRS:
        return "v108", high
    return libver


def check_contained(f: h5py.File, path: Path, virtual: Allowed | None = None) -> bool:
    """Refuse a file that points outside itself, before anything follows the pointer; return
    whether it holds datasets to read without a chunk cache (:func:`scale_offset`).

    Every link is listed without being followed (``H5Lvisit`` descends through hard links only),
    and every dataset's creation properties are read without reading its data. Refused, naming
    the object: external links; soft links (dangling ones, and also those naming an object
    inside the file: obsdelta copies objects exactly, and a link would come out as a second
    copy of its target); other user-defined links; datasets whose raw data sits in external
    files; virtual datasets, whose data sits in other datasets, usually other files. Only a
    packed file may hold virtual datasets (``virtual`` says which mappings its manifest
    records), each mapping stored datasets of the same file exactly as recorded.

    The walk runs in a forked child (:mod:`.apart`): link values and virtual mappings are
    kept in a heap that, zeroed, made HDF5 read them forever.
    """
    stamp = opened_stamp(f)
    if stamp is not None and stamp in _CONTAINED:
        return _CONTAINED[stamp]  # no virtual dataset at all: fine whatever ``virtual`` allows
    try:
        refused, uncached, most = apart(lambda: _refusal(f, path, virtual), timeout=SILENCE_SECONDS)
    except ValueError as exc:  # an error of damage in the child, a crash, or silence
        raise damaged_file(path, exc) from None
    if stamp is not None:
        _MOST_ATTRS[stamp] = most
    if refused is not None:
        message, hint = refused
        raise InputError(message, file=path, hint=hint)
    if stamp is not None and virtual is None:
        _CONTAINED[stamp] = uncached
    return uncached


def _refusal(
    f: h5py.File, path: Path, virtual: Allowed | None
) -> tuple[tuple[str, str | None] | None, bool, int]:
    """Why ``f`` is refused, as message and hint (``None`` for a file kept to itself),
    whether it holds datasets to read without a chunk cache, and the most attributes one of
    its objects holds."""
    try:
        _check_links(f, path)
        return None, *_check_datasets(f, path, virtual)
    except InputError as err:
        return (err.message, err.hint), False, 0


def _check_links(f: h5py.File, path: Path) -> None:
    found: list[tuple[bytes, int]] = []

    def visit(name: bytes, info: Any) -> None:
        beat()
        if info.type != h5py.h5l.TYPE_HARD:
            found.append((name, info.type))
            return None
        return None

    f.id.links.visit(visit, info=True)
    if not found:
        return
    # External links first: a soft link is resolved below only once none exists.
    found.sort(key=lambda item: (item[1] == h5py.h5l.TYPE_SOFT, item[1] != h5py.h5l.TYPE_EXTERNAL))
    name, kind = found[0]
    obj = "/" + name.decode(errors="replace")
    hint = _OUTSIDE_HINT
    if kind == h5py.h5l.TYPE_EXTERNAL:
        target_file, target = (v.decode(errors="replace") for v in f.id.links.get_val(name))
        what = f"object {obj} is an external link to {target_file}:{target}"
    elif kind == h5py.h5l.TYPE_SOFT:
        target = f.id.links.get_val(name).decode(errors="replace")
        if _resolves(f, name):
            what = f"object {obj} is a soft link to {target}, which obsdelta does not follow"
            hint = (
                "obsdelta copies HDF5 objects exactly and would store the link as a second "
                f"copy of {target}; delete the link (del f['{obj}']) or replace it by the object"
            )
        else:
            what = f"object {obj} is a soft link to {target}, which does not exist"
            hint = f"delete the dangling link (del f['{obj}']) and retry"
    else:
        what = f"object {obj} is a user-defined link (type {kind})"
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    raise InputError(what + more, file=path, hint=hint)


def _resolves(f: h5py.File, name: bytes) -> bool:
    """Whether a soft link names an object (no external link exists in the file by now)."""
    try:
        return bool(f.id.links.exists(name)) and h5py.h5o.open(f.id, name) is not None
    except (KeyError, OSError, RuntimeError, ValueError):
        return False


def _box(space: Any) -> Box | None:
    """A selection as one box, ``None`` if it is not exactly one."""
    kind = space.get_select_type()
    if kind == h5py.h5s.SEL_ALL:
        return (tuple(0 for _ in space.shape), tuple(int(n) for n in space.shape))
    if kind != h5py.h5s.SEL_HYPERSLABS:
        return None
    low, high = space.get_select_bounds()
    stop = tuple(int(h) + 1 for h in high)
    box = (tuple(int(x) for x in low), stop)
    size = math.prod(b - a for a, b in zip(*box, strict=True))
    return box if space.get_select_npoints() == size else None


def virtual_maps(dcpl: Any) -> list[VirtualMap]:
    """The mappings of a virtual dataset, read from its creation properties (nothing is
    opened)."""
    return [
        (
            _box(dcpl.get_virtual_vspace(i)),
            dcpl.get_virtual_filename(i),
            dcpl.get_virtual_dsetname(i),
            _box(dcpl.get_virtual_srcspace(i)),
        )
        for i in range(dcpl.get_virtual_count())
    ]


def _check_datasets(f: h5py.File, path: Path, virtual: Allowed | None) -> tuple[bool, int]:
    """Refuse datasets stored outside the file; return whether one of them must be read
    without a chunk cache, and the most attributes one object holds."""
    problems: list[str] = []
    damaged: list[str] = []
    references: list[str] = []
    uncached = [False]
    root_attrs = h5py.h5o.get_info(f.id).num_attrs
    most = [root_attrs]

    def visit(name: bytes, info: Any) -> None:
        beat()
        most[0] = max(most[0], info.num_attrs)
        if info.num_attrs:
            references.extend(_reference_attrs(f, name, info.num_attrs))
        if info.type != h5py.h5o.TYPE_DATASET:
            return None
        dsid = h5py.h5o.open(f.id, name)
        if dsid.get_type().get_class() == h5py.h5t.REFERENCE:
            references.append(f"dataset /{name.decode(errors='replace')}")
        dcpl = dsid.get_create_plist()
        obj = "/" + name.decode(errors="replace")
        if dcpl.get_layout() == h5py.h5d.VIRTUAL:
            count = dcpl.get_virtual_count()
            files = sorted({dcpl.get_virtual_filename(i) for i in range(count)})
            if virtual is None or files != ["."]:
                problems.append(
                    f"dataset {obj} is a virtual dataset mapping {', '.join(files) or 'nothing'}"
                )
            elif (maps := virtual_maps(dcpl)) != virtual(obj[1:], tuple(dsid.shape)):
                damaged.append(f"dataset {obj} is a virtual dataset not mapped as recorded")
            else:
                damaged.extend(_unstored_sources(f, obj, maps))
        elif dcpl.get_external_count():
            raw = dcpl.get_external(0)[0].decode(errors="replace")
            problems.append(f"dataset {obj} stores its data in the external file {raw}")
        else:
            unstored = _unstored_bytes(dsid, dcpl)
            if unstored > limit:
                declared = math.prod(dsid.shape) * dsid.get_type().get_size()
                hollow.append(
                    f"dataset {obj} declares shape {tuple(dsid.shape)} ({size_text(declared)}), "
                    f"of which {size_text(unstored)} is stored nowhere (the file holds "
                    f"{size_text(size)})"
                )
            if not uncached[0] and dcpl.get_layout() == h5py.h5d.CHUNKED:
                uncached[0] = scale_offset(dcpl)
        return None

    size = os.fstat(f.id.get_vfd_handle()).st_size
    limit = max(HOLLOW_BYTES, HOLLOW_RATIO * size)
    hollow: list[str] = []
    h5py.h5o.visit(f.id, visit, info=True)
    if hollow:  # before anything reads it: the rows would be read as fill values for hours
        more = f" (and {len(hollow) - 1} more)" if len(hollow) > 1 else ""
        raise InputError(
            hollow[0] + more,
            file=path,
            hint="the file is damaged or its datasets were declared longer than written; "
            "resize them to the rows written (h5py: Dataset.resize) and retry",
        )
    references[:0] = _reference_attrs(f, b".", root_attrs)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(problems[0] + more, file=path, hint=_OUTSIDE_HINT)
    if references:
        more = f" (and {len(references) - 1} more)" if len(references) > 1 else ""
        raise InputError(
            f"{references[0]}{more} holds HDF5 object references, which would point nowhere "
            "in the output (objects are copied to new addresses)",
            file=path,
            hint="store the referenced objects' paths as strings instead, or delete the "
            "references, and retry",
        )
    if damaged:
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise damaged_pack(path, damaged[0] + more)
    return uncached[0], most[0]


#: A dataset may declare at most this many bytes (or :data:`HOLLOW_RATIO` times the file's
#: size, if more) that are stored nowhere: chunks never written, contiguous storage never
#: allocated. HDF5 reads them as fill values; a file of 830 KB declaring 2**40 rows kept
#: every command busy for hours.
HOLLOW_BYTES = 1 << 30
HOLLOW_RATIO = 1024


def _unstored_bytes(dsid: Any, dcpl: Any) -> int:
    """Bytes of dataset ``dsid`` HDF5 would make up from its fill value: its chunks never
    written, or all of it if its contiguous storage was never allocated. Counted from the
    chunk index and the declared shape; no data is read."""
    if dsid.shape is None:  # empty (null dataspace): nothing declared
        return 0
    item = dsid.get_type().get_size()
    layout = dcpl.get_layout()
    if layout == h5py.h5d.CHUNKED:
        chunk = dcpl.get_chunk()
        declared = math.prod(-(-int(n) // int(c)) for n, c in zip(dsid.shape, chunk, strict=True))
        missing = declared - int(dsid.get_num_chunks())
        return max(0, missing) * math.prod(chunk) * item
    if layout == h5py.h5d.CONTIGUOUS and not dsid.get_storage_size():
        return math.prod(dsid.shape) * item
    return 0


def _reference_attrs(f: h5py.File, name: bytes, count: int) -> list[str]:
    """The attributes of object ``name`` that hold references, as ``attribute A of /path``."""
    if not count:
        return []
    oid = h5py.h5o.open(f.id, name)
    where = "/" if name == b"." else "/" + name.decode(errors="replace")
    # Listed in one pass, then opened by name: opening the i-th attribute builds HDF5's table
    # of every attribute again each time, so that many attributes took quadratic time.
    names: list[bytes] = []
    h5py.h5a.iterate(oid, lambda attr, *_: names.append(attr))
    found = []
    for attr in names:
        beat()
        if h5py.h5a.open(oid, attr).get_type().get_class() == h5py.h5t.REFERENCE:
            found.append(f"attribute {attr.decode(errors='replace')} of {where}")
    return found


def _unstored_sources(f: h5py.File, obj: str, maps: list[VirtualMap]) -> list[str]:
    """Sources of a virtual dataset that are not datasets stored in the file (another virtual
    dataset would make chains, or loops, for HDF5 to follow)."""
    out: list[str] = []
    for source in sorted({m[2] for m in maps}):
        try:
            sid = h5py.h5o.open(f.id, source.encode())
        except KeyError:
            sid = None
        if not isinstance(sid, h5py.h5d.DatasetID) or (
            sid.get_create_plist().get_layout() == h5py.h5d.VIRTUAL
        ):
            out.append(f"dataset {obj} maps {source}, which is not a stored dataset")
    return out
