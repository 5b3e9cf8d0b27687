"""The manifest of an HDF5 file: the JSON root attribute, or a compressed opaque dataset."""

from __future__ import annotations

import json
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np

from ..errors import InputError
from .apart import SILENCE_SECONDS, apart
from .hdf5_leaves import META_ATTR
from .hdf5_safety import Stamp, opened_stamp
from .hdf5_walk import OWN, OWN_PLACES

#: A manifest longer than this is stored zlib-compressed in the dataset ``manifest`` of
#: obsdelta's group (one record per robomimic demo and key adds up), the root attribute then
#: naming it: an HDF5 attribute holds at most 64 KB.
PLAIN_META_BYTES = 1 << 15


def manifest_path(own: str = OWN) -> str:
    """Where a file whose own group is ``own`` keeps a manifest too long for its attribute."""
    return f"{own}/manifest"


#: Every place a manifest dataset may be.
MANIFESTS = tuple(manifest_path(own) for own in OWN_PLACES)
#: Largest manifest read back: far beyond any obsdelta writes, so a crafted file cannot make
#: reading it take more memory than this.
MAX_META_BYTES = 1 << 28
#: Reading the manifest attribute takes milliseconds; HDF5 still at it after this long is
#: looping on damage (the limit of any read apart: it says nothing until it is done).
META_SECONDS = SILENCE_SECONDS


def write_meta(
    out: h5py.File,
    meta: dict[str, Any],
    plain_bytes: int = PLAIN_META_BYTES,
    in_attribute: bool = False,
) -> None:
    """Store the manifest: as the JSON root attribute, or when longer than ``plain_bytes``,
    zlib-compressed in an opaque dataset (non-tensor data to HDF5 readers) that the attribute
    names, or with ``in_attribute`` (a file of HDF5 1.8's format or later, whose attributes
    may be of any size), as the root attribute itself: a packed file then holds no object
    of obsdelta's where a library takes every root object for its own (TorchRL's
    ``MinariExperienceReplay`` takes each for an episode)."""
    text = json.dumps(meta)  # ASCII: json escapes every other character
    if len(text) > plain_bytes:
        packed = np.frombuffer(zlib.compress(text.encode(), 6), dtype=np.uint8)
        if in_attribute:
            out.attrs.create(META_ATTR, packed)
            return
        own = meta.get("own", OWN)
        name = manifest_path(own if own in OWN_PLACES else OWN)
        ds = out.create_dataset(
            name, shape=packed.shape, dtype=h5py.opaque_dtype(np.dtype("V1")), track_times=False
        )
        ds[...] = packed.view(ds.dtype)
        text = json.dumps({"manifest": name})
    # A fixed-length string, held in the root group's header, not a variable-length one, held
    # in a global heap: HDF5 read a zeroed heap forever. Files written before keep the heap
    # (read within META_SECONDS); older obsdelta versions read this one as bytes.
    out.attrs.create(META_ATTR, np.bytes_(text.encode("ascii")))


def _meta_text(f: h5py.File) -> tuple[str, str] | None:
    """The root attribute as ``(kind, text)``: a string, bytes (as Latin-1), zlib-compressed
    bytes (as Latin-1) or anything else (unreadable as JSON); ``None`` where there is none.
    An attribute taking more bytes than the file cannot be one of obsdelta's: not read."""
    if META_ATTR not in f.attrs:
        return None
    if f.attrs.get_id(META_ATTR).get_storage_size() > Path(f.filename).stat().st_size:
        return "other", ""
    raw = f.attrs.get(META_ATTR)
    if isinstance(raw, str):
        return "str", raw
    if isinstance(raw, bytes):
        return "bytes", raw.decode("latin-1")
    if isinstance(raw, np.ndarray) and raw.dtype == np.uint8 and raw.ndim == 1:
        return "zlib", raw.tobytes().decode("latin-1")
    return "other", ""


#: Why the metadata of a file could not be read.
_UNREADABLE: dict[Stamp, str] = {}
#: The root attribute of the files read last, as :func:`_meta_text` gives it: detection, opening
#: and checking a file each read it, in a child process that costs a fork.
_READ: OrderedDict[Stamp, tuple[str, str] | None] = OrderedDict()
#: How many files :data:`_READ` remembers.
READ_KEPT = 8


def read_meta(f: h5py.File, file: Path) -> dict[str, Any] | None:
    """The manifest, or ``None`` in a file without one. The attribute is read in a child
    process (:mod:`.apart`), within :data:`META_SECONDS`: a damaged attribute can crash HDF5,
    and in files written before it became a fixed-length string, it is kept in a heap that,
    damaged, made HDF5 read it forever."""
    stamp = opened_stamp(f)  # the file read, whatever its name holds now
    why = _UNREADABLE.get(stamp) if stamp is not None else None
    if why is None and stamp is not None and stamp in _READ:
        found = _READ[stamp]
    elif why is None:
        try:
            found = apart(lambda: _meta_text(f), timeout=META_SECONDS)
        except ValueError as exc:
            why = str(exc)
            if stamp is not None:  # detection and opening ask again: they are told at once
                _UNREADABLE[stamp] = why
        else:
            if stamp is not None:
                _READ[stamp] = found
                while len(_READ) > READ_KEPT:
                    _READ.popitem(last=False)
    if why is not None:
        raise InputError(
            f"cannot read the obsdelta metadata ({why})", file=file, hint="the file is damaged"
        )
    if found is None:
        return None
    kind, text = found
    raw: Any = text.encode("latin-1") if kind == "bytes" else text if kind == "str" else None
    try:
        if kind == "zlib":
            raw = _inflated(text.encode("latin-1"))
        meta = json.loads(raw)
        if isinstance(meta, dict) and set(meta) == {"manifest"}:
            meta = json.loads(_packed_manifest(f, file, meta["manifest"]))
    except (TypeError, ValueError, KeyError, OSError, zlib.error):
        raise InputError(
            "the obsdelta metadata is not readable JSON", file=file, hint="damaged file"
        ) from None
    if not isinstance(meta, dict):
        raise InputError("the obsdelta attribute is not a JSON object", file=file)
    return meta


def _stored_here(f: h5py.File, name: str) -> bool:
    """Whether ``name`` is a dataset stored in the file, reached through hard links only: the
    manifest is read before the file is checked for pointers outside itself (detection and
    packed files read it first)."""
    parts = name.split("/")
    for i in range(len(parts)):
        # Each step's parent was found a hard link already, so nothing is followed here.
        link = "/".join(parts[: i + 1]).encode()
        if not f.id.links.exists(link) or f.id.links.get_info(link).type != h5py.h5l.TYPE_HARD:
            return False
    dcpl = h5py.h5o.open(f.id, name.encode()).get_create_plist()
    return dcpl.get_layout() != h5py.h5d.VIRTUAL and not dcpl.get_external_count()


def _packed_manifest(f: h5py.File, file: Path, name: Any) -> bytes:
    """The zlib-compressed manifest of the dataset ``name`` (one of :data:`MANIFESTS`), its
    size checked first."""
    if name not in MANIFESTS:
        raise ValueError(f"no manifest dataset at {name!r}")
    ds = f.get(name) if _stored_here(f, name) else None
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.itemsize != 1:
        raise ValueError("no manifest dataset")
    if ds.shape[0] > min(MAX_META_BYTES, file.stat().st_size):
        raise ValueError("manifest dataset larger than the file")
    return _inflated(ds[()].tobytes())


def _inflated(packed: bytes) -> bytes:
    """A zlib-compressed manifest, at most :data:`MAX_META_BYTES` of it."""
    inflater = zlib.decompressobj()
    text = inflater.decompress(packed, MAX_META_BYTES)
    if inflater.unconsumed_tail:
        raise ValueError("manifest too long")
    return text


def own_of(meta: dict[str, Any] | None, file: Path) -> str:
    """Where obsdelta's group is in a file whose manifest is ``meta``: the place it names
    (``own``), or ``/obsdelta`` (files written before it named one, and files that are not
    obsdelta's)."""
    own = OWN if meta is None else meta.get("own", OWN)
    if own not in OWN_PLACES:
        raise InputError(
            f"the manifest places obsdelta's group at {own!r}, where obsdelta never writes it",
            file=file,
            hint="the file is damaged",
        )
    return str(own)


class _Opened(Protocol):
    memo: dict[str, Any]


def own_of_source(opened: _Opened) -> str:
    """Where obsdelta's group is in an opened file (a source or a packed file): the place its
    manifest named when it was opened (:func:`own_of`), ``/obsdelta`` for a plain input."""
    return str(opened.memo.get("own", OWN))
