"""The manifest: what a compressed dataset says about itself, as frozen, typed records.

A compressed output carries one manifest (``obsdelta.json`` in a folder, the ``obsdelta`` root
attribute of an HDF5 file, the ``_obsdelta`` entry of a ``.pt``). :func:`parse` is the only
place that reads it: every field is checked for type and range before anything is allocated
from it, and an unknown format version or a malformed field is one :class:`InputError` naming
the field. Format 1 files (obsdelta 0.1) are read into the same records.

>>> record = KeyRecord(
...     name="next/observation", obs_key=("observation",), next_key=("next", "observation"),
...     delta_key=None, codec={"id": "exact"}, lossless=True, bound=None,
...     source_dtype="float32", stored_dtype=None, rows=4, exact_rows=4, exception_rows=1,
...     arrays=ArrayNames("k0.index", "k0.rows"), error=Error(0.0, 0.0, 0.0),
...     hashes={"rebuilt": "00"})
>>> m = Manifest(container="ted-memmap", batch_dims=1, time_dim=0, valid_rows=None,
...              leaf_order=(("observation",), ("next", "observation")), keys=(record,))
>>> parse(m.to_json(), file="x").keys[0] == record
True
>>> try:
...     parse({**m.to_json(), "obsdelta_format": 9}, file="x")
... except InputError as exc:
...     print(exc.message)
written with obsdelta format 9; this obsdelta reads up to 4
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from . import __version__
from .errors import FormatVersionError, InputError

#: Version of the stored layout; bumped on any incompatible change. 2: typed manifest, lossless
#: flag and bound per key, xxh3 hashes, container description, block size reserved. 3: every
#: stored leaf hashed in blocks (``blocks``, ``hash.block_bytes``), packed chunks checksummed.
#: 4: obsdelta's group may be ``/metadata/obsdelta`` (a D4RL file with metadata), named by
#: ``own``, its exception arrays numbers there: a format 3 reader would find none.
FORMAT_VERSION = 4
#: Hash of format 2 files; format 1 files used CRC-32.
HASH_ALGORITHM = "xxh3-64"
HASH_ALGORITHMS = ("crc32", HASH_ALGORITHM)
#: Names of the per-key hashes: original next observations, what the rebuild gives, the stored
#: leaf, and the exception index and rows.
HASH_NAMES = ("next", "rebuilt", "stored", "index", "rows")
#: dtypes a stored leaf or a source may have (the names torch and numpy share).
DTYPES = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
    }
)
#: Sanity limits: nothing obsdelta writes comes near them; a larger claim is damage.
MAX_DIMS = 16
MAX_ROWS = 1 << 48

Key = tuple[str, ...]


@dataclass(frozen=True)
class ArrayNames:
    """Where one pair's exception rows live in the container's array store: rows
    ``offset:offset + exception_rows`` of two arrays that every pair of one name shares (one
    array per name keeps per-group overheads away from files of many demos)."""

    index: str
    rows: str
    offset: int = 0


@dataclass(frozen=True)
class Error:
    """Error of the rebuilt next observations against the originals, over every valid row."""

    max_abs: float
    rmse: float
    max_rel: float


@dataclass(frozen=True)
class KeyRecord:
    """One stored pair (one per robomimic demo and name; one per key otherwise)."""

    #: The report name (``next/observation``, ``next_obs/agentview_image``).
    name: str
    obs_key: Key
    next_key: Key
    #: Where the per-row stored leaf lives; ``None`` for codecs that store none (``exact``).
    delta_key: Key | None
    #: The codec's JSON config (``{"id": "q8", "step": 0.0019}``).
    codec: dict[str, Any]
    #: Every valid row comes back bit for bit.
    lossless: bool
    #: The ``--max-abs-error`` bound asked for, if any.
    bound: float | None
    source_dtype: str
    stored_dtype: str | None
    rows: int
    exact_rows: int
    exception_rows: int
    arrays: ArrayNames | None
    error: Error
    #: Hex digests by :data:`HASH_NAMES` (a subset: older files may lack some).
    hashes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.name,
            "obs_key": list(self.obs_key),
            "next_key": list(self.next_key),
            "delta_key": None if self.delta_key is None else list(self.delta_key),
            "codec": self.codec,
            "lossless": self.lossless,
            "max_abs_error_bound": self.bound,
            "source_dtype": self.source_dtype,
            "stored_dtype": self.stored_dtype,
            "rows": self.rows,
            "exact_rows": self.exact_rows,
            "exception_rows": self.exception_rows,
            "arrays": None if self.arrays is None else vars(self.arrays),
            "max_abs_error": self.error.max_abs,
            "rmse": self.error.rmse,
            "max_rel_error": self.error.max_rel,
            "hashes": self.hashes,
        }


@dataclass(frozen=True)
class Manifest:
    """Everything ``inflate``, ``verify``, ``report`` and ``open_dataset`` need to trust a file."""

    #: The container format of this file (a :data:`~obsdelta_cli.formats.FORMATS` name).
    container: str
    batch_dims: int
    time_dim: int
    #: Rows along the first batch dimension that hold data (a replay buffer's ``len``).
    valid_rows: int | None
    #: Every leaf of the original dataset, in order.
    leaf_order: tuple[Key, ...]
    keys: tuple[KeyRecord, ...]
    #: Container write options (``{"h5_compression": "zstd"}``).
    options: dict[str, Any] = field(default_factory=dict)
    #: Hash of every leaf copied unchanged, by slash-joined key.
    checksums: dict[str, str] = field(default_factory=dict)
    #: Hash of every container object copied unchanged, as stored (HDF5: each dataset's raw
    #: chunks and creation properties, by path; each object's attributes, by ``@path``).
    objects: dict[str, str] = field(default_factory=dict)
    hash_algorithm: str = HASH_ALGORITHM
    #: Rows per hashed block (0: one hash over the whole leaf). Reserved for block hashes.
    hash_block_rows: int = 0
    #: Bytes of values a hashed block holds at most (format 3; 0: no block hashes).
    hash_block_bytes: int = 0
    #: Block digests of every stored leaf, end to end, by slash-joined key (format 3; see
    #: :mod:`obsdelta_cli.blocks`).
    blocks: dict[str, str] = field(default_factory=dict)
    #: The container the dataset came in, where it differs from ``container`` (packed files).
    source_container: str | None = None
    #: Bytes on disk of the dataset that was compressed.
    source_bytes: int | None = None
    #: Adapter-owned JSON (e.g. HDF5 layouts of removed datasets), kept as it is.
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    writer: str = f"obsdelta {__version__}"

    @property
    def lossless(self) -> bool:
        return all(k.lossless for k in self.keys)

    def object_differing(
        self, found: Mapping[str, str], *, all_recorded: bool = True
    ) -> tuple[str, str | None, str | None] | None:
        """The first object (by name) whose ``found`` hash is not the one recorded, as
        ``(name, recorded, found)`` with ``None`` for a side that has none; ``None`` if all
        match. ``all_recorded``: every recorded object must be found (else only those found
        are compared).

        >>> m = Manifest("d4rl-hdf5", 1, 0, None, (), (), objects={"a": "1", "b": "2"})
        >>> m.object_differing({"a": "1", "b": "3"}), m.object_differing({"a": "1"})
        (('b', '2', '3'), ('b', '2', None))
        >>> m.object_differing({"a": "1"}, all_recorded=False) is None
        True
        """
        names = set(found) | set(self.objects) if all_recorded else set(found)
        for name in sorted(names):
            recorded, seen = self.objects.get(name), found.get(name)
            if recorded != seen:
                return name, recorded, seen
        return None

    def _hashing(self) -> dict[str, Any]:
        hashing: dict[str, Any] = {"algorithm": self.hash_algorithm}
        hashing["block_rows"] = self.hash_block_rows
        if self.version >= 3:
            hashing["block_bytes"] = self.hash_block_bytes
        return hashing

    def to_json(self) -> dict[str, Any]:
        body = self._body()
        return {**body, "manifest_hash": content_hash(body)}

    def _body(self) -> dict[str, Any]:
        return {
            "obsdelta_format": self.version,
            "writer": self.writer,
            "format": self.container,
            "source_format": self.source_container,
            "source_bytes": self.source_bytes,
            "batch_dims": self.batch_dims,
            "time_dim": self.time_dim,
            "valid_rows": self.valid_rows,
            "leaf_order": [list(k) for k in self.leaf_order],
            "options": self.options,
            "hash": self._hashing(),
            "checksums": self.checksums,
            **({"blocks": self.blocks} if self.version >= 3 else {}),
            "objects": self.objects,
            "keys": [k.to_json() for k in self.keys],
            **self.extra,
        }


def content_hash(body: dict[str, Any]) -> str:
    """xxh3-64 of the manifest's canonical JSON: a damaged manifest that still parses (a flipped
    digit in a figure or a row count) is caught before anything is read from it."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return xxhash.xxh3_64_hexdigest(text.encode())


# ---------------------------------------------------------------------------------------------
# Parsing: every field checked before it is used


class _Fields:
    """Typed access to one JSON object, raising one clear error naming the bad field."""

    def __init__(self, data: Any, where: str, file: str | Path | None) -> None:
        self.file = file
        self.where = where
        if not isinstance(data, Mapping):
            self.fail(where, "is not a JSON object")
        self.data = data

    def fail(self, name: str, what: str) -> Any:
        raise InputError(
            f"obsdelta metadata field {name} {what}",
            file=self.file,
            hint="the compressed dataset is damaged or was edited; restore it from a copy",
        )

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kinds: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            self.fail(self.name(key), "is missing")
        value = self.data[key]
        if value is None and optional:
            return None
        # bool is an int in Python: never accept one where a number is meant.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _tuple(kinds)):
            self.fail(self.name(key), f"has the wrong type ({type(value).__name__})")
        return value

    def count(self, key: str, *, optional: bool = False, low: int = 0) -> Any:
        value = self.get(key, int, optional=optional)
        if value is not None and not low <= value <= MAX_ROWS:
            self.fail(self.name(key), f"is out of range ({value})")
        return value

    def number(self, key: str, *, optional: bool = False, default: float | None = 0.0) -> Any:
        if key not in self.data and optional:
            return default
        value = self.get(key, (int, float), optional=optional)
        if value is not None and not (math.isfinite(value) and value >= 0):
            self.fail(self.name(key), f"is not a finite number >= 0 ({value})")
        return None if value is None else float(value)

    def key(self, key: str, *, optional: bool = False) -> Key | None:
        value = self.get(key, list, optional=optional)
        if value is None:
            return None
        if not value or len(value) > 64 or not all(isinstance(p, str) and p for p in value):
            self.fail(self.name(key), "is not a key (a list of names)")
        if any(p in (".", "..") or "/" in p or "\0" in p for p in value):
            self.fail(self.name(key), "names a path outside the dataset")
        return tuple(value)

    def dtype(self, key: str, *, optional: bool = False) -> Any:
        value = self.get(key, str, optional=optional)
        if value is not None and value not in DTYPES:
            self.fail(self.name(key), f"names an unknown dtype ({value!r})")
        return value

    def hexes(self, key: str, *, optional: bool = True) -> dict[str, str]:
        value = self.get(key, dict, optional=optional) or {}
        for name, digest in value.items():
            if not (isinstance(digest, str) and 0 < len(digest) <= 64 and _is_hex(digest)):
                self.fail(self.name(f"{key}.{name}"), "is not a hex digest")
        return dict(value)


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


_HEX = frozenset("0123456789abcdef")


def _is_hex(text: str) -> bool:
    """Lower-case hex digits only: a large file's manifest holds megabytes of block digests.

    >>> _is_hex("0f9a"), _is_hex("0F9A"), _is_hex("")
    (True, False, True)
    """
    return _HEX.issuperset(text)


def parse(data: Any, *, file: str | Path | None = None) -> Manifest:
    """Validate ``data`` (the decoded JSON) and return the manifest it describes."""
    top = _Fields(data, "", file)
    version = top.get("obsdelta_format", int)
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"written with obsdelta format {version}; this obsdelta reads up to {FORMAT_VERSION}",
            file=file,
            hint="upgrade obsdelta",
        )
    if version < 1:
        top.fail("obsdelta_format", f"is out of range ({version})")
    if version >= 2:
        recorded = top.get("manifest_hash", str)
        body = {k: v for k, v in top.data.items() if k != "manifest_hash"}
        if recorded != content_hash(body):
            top.fail("manifest_hash", "does not match the manifest")
    batch_dims = top.get("batch_dims", int)
    if not 1 <= batch_dims <= MAX_DIMS:
        top.fail("batch_dims", f"is out of range ({batch_dims})")
    time_dim = top.get("time_dim", int)
    if not 0 <= time_dim < batch_dims:
        top.fail("time_dim", f"is out of range ({time_dim})")
    order = top.get("leaf_order", list)
    leaf_order = tuple(
        _Fields({"k": k}, f"leaf_order[{i}]", file).key("k") or () for i, k in enumerate(order)
    )
    checksums = top.hexes("checksums")
    if version == 1:
        algorithm, block_rows = "crc32", 0
    else:
        hashing = _Fields(top.get("hash", dict), "hash", file)
        algorithm = hashing.get("algorithm", str)
        if algorithm not in HASH_ALGORITHMS:
            hashing.fail("hash.algorithm", f"is unknown ({algorithm!r})")
        block_rows = hashing.count("block_rows")
    block_bytes, blocks = 0, {}
    if version >= 3:
        blocks = top.get("blocks", dict)
        # Block checksums need a block size; a manifest without any may record none (0).
        hashed = _Fields(top.get("hash", dict), "hash", file)
        block_bytes = hashed.count("block_bytes", low=1 if blocks else 0)
        for name, text in blocks.items():
            if not (isinstance(text, str) and len(text) % 16 == 0 and _is_hex(text)):
                top.fail(f"blocks.{name}", "is not a list of block digests")
    records = top.get("keys", list)
    keys = tuple(_key_record(r, f"keys[{i}]", file, version) for i, r in enumerate(records))
    known = {
        "obsdelta_format",
        "writer",
        "format",
        "source_format",
        "source_bytes",
        "batch_dims",
        "time_dim",
        "valid_rows",
        "leaf_order",
        "options",
        "hash",
        "checksums",
        "blocks",
        "objects",
        "keys",
        "manifest_hash",
    }
    return Manifest(
        container=top.get("format", str),
        batch_dims=batch_dims,
        time_dim=time_dim,
        valid_rows=top.count("valid_rows", optional=True),
        leaf_order=leaf_order,
        keys=keys,
        options=dict(top.get("options", dict, optional=True) or {}),
        checksums=checksums,
        objects=top.hexes("objects"),
        hash_algorithm=algorithm,
        hash_block_rows=block_rows,
        hash_block_bytes=block_bytes,
        blocks=dict(blocks),
        source_container=top.get("source_format", str, optional=True),
        source_bytes=top.count("source_bytes", optional=True),
        extra={k: v for k, v in top.data.items() if k not in known},
        version=version,
        writer=str(top.get("writer", str, optional=True) or "unknown"),
    )


def _key_record(data: Any, where: str, file: str | Path | None, version: int) -> KeyRecord:
    f = _Fields(data, where, file)
    codec = f.get("codec", dict)
    if not isinstance(codec.get("id"), str):
        f.fail(f.name("codec.id"), "is missing")
    rows = f.count("rows")
    exact_rows = f.count("exact_rows")
    exception_rows = f.count("exception_rows")
    if exact_rows > rows or exception_rows > rows:
        f.fail(f.name("exact_rows"), f"exceeds rows ({rows})")
    arrays = None
    if exception_rows:
        names = _Fields(f.get("arrays", dict), f.name("arrays"), file)
        arrays = ArrayNames(
            names.get("index", str),
            names.get("rows", str),
            names.count("offset", optional=True) or 0,
        )
        for name in (arrays.index, arrays.rows):
            if not name.replace(".", "").replace("_", "").isalnum():
                names.fail(f.name("arrays"), f"names an unsafe array ({name!r})")
    stored_dtype = f.dtype("stored_dtype", optional=True)
    delta_key = f.key("delta_key", optional=True)
    if (stored_dtype is None) != (delta_key is None):
        f.fail(f.name("delta_key"), "and stored_dtype disagree")
    lossless = (
        f.get("lossless", bool) if version >= 2 else exact_rows == rows and rows > 0
    )  # format 1 had no flag: a key was lossless when every row came back exact
    return KeyRecord(
        name=f.get("key", str),
        obs_key=f.key("obs_key") or (),
        next_key=f.key("next_key") or (),
        delta_key=delta_key,
        codec=dict(codec),
        lossless=lossless,
        bound=f.number("max_abs_error_bound", optional=True, default=None),
        source_dtype=f.dtype("source_dtype"),
        stored_dtype=stored_dtype,
        rows=rows,
        exact_rows=exact_rows,
        exception_rows=exception_rows,
        arrays=arrays,
        error=Error(
            f.number("max_abs_error", optional=True),
            f.number("rmse", optional=True),
            f.number("max_rel_error", optional=True),
        ),
        hashes=f.hexes("hashes" if version >= 2 else "crc32"),
    )
