"""HDF5 inputs that point outside themselves are refused before anything follows the pointer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py

from ..errors import InputError


def damaged_file(path: Path, exc: BaseException) -> InputError:
    return InputError(
        f"cannot open as HDF5 ({exc})", file=path, hint="the file is truncated or damaged"
    )


_OUTSIDE_HINT = (
    "obsdelta reads only data stored inside the file; copy the data in "
    "(e.g. h5py's Group.copy, or h5repack) and retry"
)
#: Files already found self-contained, by (device, inode, size, mtime): detection opens a file
#: once per HDF5 layout, and a file with many objects takes a while to walk.
_CONTAINED: set[tuple[int, int, int, int]] = set()


def check_contained(f: h5py.File, path: Path) -> None:
    """Refuse a file that points outside itself, before anything follows the pointer.

    Every link is listed without being followed (``H5Lvisit`` descends through hard links only),
    and every dataset's creation properties are read without reading its data. Refused, naming
    the object: external links; soft links (dangling ones, and also those naming an object
    inside the file: obsdelta copies objects exactly, and a link would come out as a second
    copy of its target); other user-defined links; datasets whose raw data sits in external
    files; virtual datasets, whose data sits in other datasets, usually other files.
    """
    try:
        st = path.stat()
    except OSError:
        st = None
    stamp = None if st is None else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if stamp is not None and stamp in _CONTAINED:
        return
    try:
        _check_links(f, path)
        _check_datasets(f, path)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise damaged_file(path, exc) from None
    if stamp is not None:
        _CONTAINED.add(stamp)


def _check_links(f: h5py.File, path: Path) -> None:
    found: list[tuple[bytes, int]] = []

    def visit(name: bytes, info: Any) -> None:
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


def _check_datasets(f: h5py.File, path: Path) -> None:
    problems: list[str] = []

    def visit(name: bytes, info: Any) -> None:
        if info.type != h5py.h5o.TYPE_DATASET:
            return None
        dcpl = h5py.h5o.open(f.id, name).get_create_plist()
        obj = "/" + name.decode(errors="replace")
        if dcpl.get_layout() == h5py.h5d.VIRTUAL:
            count = dcpl.get_virtual_count()
            files = sorted({dcpl.get_virtual_filename(i) for i in range(count)})
            problems.append(
                f"dataset {obj} is a virtual dataset mapping {', '.join(files) or 'nothing'}"
            )
        elif dcpl.get_external_count():
            raw = dcpl.get_external(0)[0].decode(errors="replace")
            problems.append(f"dataset {obj} stores its data in the external file {raw}")
        return None

    h5py.h5o.visit(f.id, visit, info=True)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(problems[0] + more, file=path, hint=_OUTSIDE_HINT)
