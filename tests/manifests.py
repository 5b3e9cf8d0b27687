"""Reading and rewriting the manifest of an HDF5 output in place, as a careless or hostile
writer would: tests that tamper with files use these, wherever the manifest is stored (the
root attribute, a compressed dataset it names, or in packed files the compressed root
attribute)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py

from obsdelta_cli.formats.hdf5_meta import MANIFESTS, read_meta, write_meta
from obsdelta_cli.formats.pack_io import PLAIN_MANIFEST_BYTES
from obsdelta_cli.formats.pack_leaves import NAME as PACKED
from obsdelta_cli.manifest import content_hash


def manifest_of(f: h5py.File) -> dict[str, Any]:
    """The manifest of the open file ``f`` (read from its path, as obsdelta reads it)."""
    meta = read_meta(f, Path(f.filename))
    assert meta is not None, f"{f.filename} has no manifest"
    return meta


def rewrite_manifest(f: h5py.File, meta: dict[str, Any], *, rehash: bool = False) -> None:
    """Store ``meta`` as ``f``'s manifest; ``rehash``: with its hash made to match."""
    if rehash:
        body = {k: v for k, v in meta.items() if k != "manifest_hash"}
        meta["manifest_hash"] = content_hash(body)
    for name in MANIFESTS:
        if name in f:
            del f[name]
    packed = meta.get("format") == PACKED
    write_meta(f, meta, plain_bytes=PLAIN_MANIFEST_BYTES, in_attribute=packed)
