"""Packing and unpacking as a whole: the writer each inner container calls for (an HDF5
file, flat or not, a ``.pt`` archive, a folder of files), then the manifest; and the inner
container back. The writers build on :mod:`.pack_io`; picking among them here keeps each of
them below its caller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py

from ..errors import UsageError
from ..manifest import Manifest
from .base import Key, Source
from .hdf5_meta import own_of_source, write_meta
from .pack_flat import pack_flat
from .pack_io import (
    PLAIN_MANIFEST_BYTES,
    inner_manifest,
    pack_folder,
    pack_hdf5,
    packed_manifest,
    packed_output,
)
from .pack_leaves import pack_info
from .pack_pt import pack_pt, unpack_pt
from .pack_unpack import unpack_folder, unpack_hdf5
from .pack_writer import Chooser


def pack(
    inner: Source,
    inner_name: str,
    manifest: Manifest,
    out: Path,
    chooser: Chooser,
    *,
    flat: bool = False,
) -> int:
    """Write the packed file ``out`` from the opened compressed container ``inner``; return its
    size, or with ``chooser.sample``, the size predicted for the whole file. ``flat``: the
    datasets of an HDF5 inner's episodes as one dataset per key (:mod:`.pack_flat`)."""
    with packed_output(out) as f:
        pack_into(f, inner, inner_name, manifest, chooser, flat=flat)
    return out.stat().st_size + round(chooser.extra)


def pack_into(
    f: h5py.File,
    inner: Source,
    inner_name: str,
    manifest: Manifest,
    chooser: Chooser,
    *,
    flat: bool = False,
    early: dict[Key, dict[str, Any]] | None = None,
) -> None:
    """Fill the new packed file ``f`` (:func:`~.pack_io.packed_output`) as :func:`pack` says;
    ``early``: the entries of the leaves of a folder inner already written to ``f``
    (:class:`~.pack_io.Early`)."""
    own = own_of_source(inner)
    if flat and isinstance(inner.handle, h5py.File):
        info = pack_flat(inner.handle, f, chooser, own)
    elif flat:
        raise UsageError("--flat takes HDF5 inputs only", file=inner.path)
    elif isinstance(inner.handle, h5py.File):
        info = pack_hdf5(inner.handle, f, chooser, own)
    elif inner_name == "ted-pt":
        info = pack_pt(inner, f, chooser)
    else:
        info = pack_folder(inner, f, chooser, early or {})
    meta = packed_manifest(manifest, inner_name, info).to_json()
    write_meta(f, meta, plain_bytes=PLAIN_MANIFEST_BYTES, in_attribute=True)


def unpack(packed: Source, manifest: Manifest, out: Path) -> None:
    """Write the inner container of the opened packed file ``packed`` to ``out``."""
    info = pack_info(packed.meta or {}, packed.path)
    inner = inner_manifest(manifest, packed.path)
    if info["kind"] == "folder":
        unpack_folder(packed, info, inner, out)
    elif info["kind"] == "pt":
        unpack_pt(packed, info, out)
    else:
        unpack_hdf5(packed, info, inner, out)
