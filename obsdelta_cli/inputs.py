"""Opening a dataset: the adapter its content calls for, its validated manifest, and the
stream that cuts its rows into chunks. Shared by the commands and the reads for training."""

from __future__ import annotations

from pathlib import Path

from .errors import DataError, InputError, UsageError
from .formats import Format, Source, detect, key_str
from .formats.base import Ahead
from .manifest import Manifest, parse
from .stream import Stream


def open_input(
    path: Path, *, cache_mb: float | None = None, checking: Ahead | None = None
) -> tuple[Format, Source]:
    """Open ``path`` with the adapter its content calls for; ``cache_mb`` sizes the chunk
    cache of each dataset of an HDF5 file read for training (packed or not); ``checking``:
    every object of the file will be checked against its manifest (``Format.object_hashes``),
    which an HDF5 file, compressed or packed, then begins as it is opened."""
    fmt = detect(path)
    return fmt, open_detected(fmt, path, cache_mb=cache_mb, checking=checking)


def open_detected(
    fmt: Format, path: Path, *, cache_mb: float | None = None, checking: Ahead | None = None
) -> Source:
    """Open ``path`` with ``fmt``, the adapter :func:`detect` chose for it (see
    :func:`open_input`)."""
    if cache_mb is not None:
        fmt.cache_bytes = max(0, int(cache_mb * 2**20))
    if checking is not None:
        fmt.hash_ahead = checking
    source = fmt.open(path)
    if source.valid_rows == 0:
        fmt.close(source)
        raise DataError(
            "holds no rows (len 0)", file=path, hint="nothing to do; check the right file was given"
        )
    return source


def manifest_of(source: Source) -> Manifest:
    """The validated manifest of a compressed source."""
    if source.meta is None:
        raise InputError(
            "is not compressed by obsdelta (no obsdelta metadata)",
            file=source.path,
            hint="compress it first, or pass the compressed output",
        )
    manifest = parse(source.meta, file=source.path)
    found = {"batch dims": source.batch_dims, "valid rows": source.valid_rows}
    claimed = {"batch dims": manifest.batch_dims, "valid rows": manifest.valid_rows}
    for what, value in claimed.items():
        if value != found[what]:
            raise InputError(
                f"metadata says {value} {what}, the data has {found[what]}",
                file=source.path,
                hint="the compressed dataset is damaged; restore it from a copy",
            )
    return manifest


def check_leaves(source: Source, manifest: Manifest) -> None:
    """The source holds exactly the leaves the manifest describes: the original ones but the
    rebuilt next observations, and the stored leaves. A leaf renamed, added or lost by damage
    is never carried along unchecked."""
    rebuilt = {r.next_key for r in manifest.keys}
    expected = {k for k in manifest.leaf_order if k not in rebuilt}
    expected |= {r.delta_key for r in manifest.keys if r.delta_key is not None}
    found = set(source.leaves)
    for key in sorted(found ^ expected):
        what = "is not in the metadata" if key in found else "named in the metadata is missing"
        raise DataError(
            f"leaf {what}",
            file=source.path,
            key=key_str(key),
            hint="the compressed dataset is damaged or was edited; restore it from a copy",
        )


def stream_for(
    source: Source, time_dim: int, chunk_mb: float, valid_rows: int | None = None
) -> Stream:
    """The stream over ``source``'s rows in chunks of about ``chunk_mb`` MiB."""
    if not chunk_mb > 0:
        raise UsageError(f"--chunk-mb must be positive, got {chunk_mb}")
    rows = source.valid_rows if valid_rows is None else valid_rows
    return Stream(source.batch_dims, time_dim, rows, max(1, int(chunk_mb * 2**20)))
