"""The container interface: adapters that only do I/O.

A format adapter knows how one kind of container is laid out on disk: how to recognise it, how to
open its leaves for lazy reading, which observation pairs its layout defines, how to create an
output of a given structure, and where the obsdelta metadata and arrays live. Everything about
deltas, codecs and errors lives in :mod:`obsdelta_cli.pipeline`, above the adapters.
"""

from __future__ import annotations

import json
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import xxhash

from ..errors import InputError
from .folder_safety import read_json

#: File name of the metadata written beside the data in directory containers.
SIDECAR = "obsdelta.json"
#: Folder of the variable-length arrays (exception rows) in directory containers.
ARRAYS_DIR = "obsdelta.arrays"
#: Bytes of the metadata file read at most (a manifest of many keys takes a few MB).
MAX_SIDECAR_BYTES = 256 << 20


class ArrayStore:
    """Named variable-length arrays stored beside the leaves (exception rows and their index).

    Arrays are appended chunk by chunk while writing, and read back lazily with the dtype and
    shape recorded in the metadata. This default keeps each array in a raw file of a folder.

    >>> import tempfile, pathlib
    >>> store = ArrayStore(pathlib.Path(tempfile.mkdtemp()) / "a")
    >>> store.append("x", np.arange(3)); store.append("x", np.arange(2))
    >>> store.get("x", np.dtype(np.int64), (5,))[:].tolist()
    [0, 1, 2, 0, 1]
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def append(self, name: str, rows: np.ndarray) -> None:
        self.folder.mkdir(exist_ok=True)
        with (self.folder / f"{name}.bin").open("ab") as fh:
            fh.write(np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data)

    def storage_bytes(self, name: str) -> int | None:
        """Bytes array ``name`` takes on disk, where the container can tell (after filters)."""
        return None

    def get(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        """The array, readable by row slices (read from the file as needed, not loaded)."""
        numel = math.prod(shape)
        if numel == 0:
            return np.empty(shape, dtype=dtype)
        file = self.folder / f"{name}.bin"
        expected = numel * dtype.itemsize
        if not file.is_file() or file.stat().st_size != expected:
            raise InputError(
                f"array {name} is missing or not {expected} bytes long",
                file=file,
                hint="the compressed dataset is damaged",
            )
        from .leaf import FileLeaf, FlatRows

        return FlatRows(FileLeaf(file, dtype, shape), 1)


class MemoryArrays(ArrayStore):
    """Arrays kept in memory, for containers saved whole (``.pt``)."""

    def __init__(self, arrays: dict[str, np.ndarray] | None = None) -> None:
        self.arrays: dict[str, np.ndarray] = dict(arrays or {})
        self._parts: dict[str, list[np.ndarray]] = {}

    def append(self, name: str, rows: np.ndarray) -> None:
        self._parts.setdefault(name, []).append(rows.copy())

    def collect(self) -> dict[str, np.ndarray]:
        """All arrays appended so far, each as one array."""
        for name, parts in self._parts.items():
            self.arrays[name] = np.concatenate(parts)
        self._parts.clear()
        return self.arrays

    def get(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        if math.prod(shape) == 0:
            return np.empty(shape, dtype=dtype)
        array = self.arrays.get(name)
        if array is None or array.dtype != dtype or tuple(array.shape) != tuple(shape):
            raise InputError(f"array {name} is missing or of the wrong shape")
        return array


Key = tuple[str, ...]


def key_str(key: Key) -> str:
    """Slash-joined form of a nested key, as used on the command line, in JSON and in HDF5."""
    return "/".join(key)


@dataclass(frozen=True)
class Pair:
    """An observation leaf, its next-observation twin, and where the stored form goes.

    ``name`` is how reports call the pair (several pairs may share one, e.g. one per robomimic
    demo); ``--key`` accepts any of ``aliases``.
    """

    obs_key: Key
    next_key: Key
    delta_key: Key
    name: str
    aliases: tuple[str, ...] = ()

    @classmethod
    def ted(cls, obs_key: Key) -> Pair:
        """TED: root leaf ``k`` pairs with ``("next", *k)``, stored at ``("next", "delta", *k)``."""
        next_key = ("next", *obs_key)
        return cls(
            obs_key, next_key, ("next", "delta", *obs_key), key_str(next_key), (key_str(obs_key),)
        )


@dataclass(frozen=True)
class LeafSpec:
    """A leaf the output gets that the input does not have (a delta, or a rebuilt next obs)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    #: On compress: the source leaf this one replaces (containers that keep storage options,
    #: such as HDF5 filters and chunks, take them from it).
    replaces: Key | None = None


@dataclass
class Plan:
    """What the output holds: ``order`` lists its leaves; those in ``new`` are created, every
    other one is copied from the source unchanged."""

    order: list[Key]
    new: dict[Key, LeafSpec]
    #: On compress: the next-observation leaves the output no longer holds (containers that
    #: keep storage options, such as HDF5, record how to recreate them).
    replaced: list[Key] = field(default_factory=list)
    #: Container-specific write options (e.g. ``{"h5_compression": "zstd"}``).
    options: dict[str, Any] = field(default_factory=dict)
    #: Unchanged leaves the encoding pass reads whole, in order (observations): it writes them
    #: as it reads them, rather than a copy reading them from the disk a second time.
    streamed: frozenset[Key] = frozenset()
    #: ``compress --pack``: called with a kept leaf's key and its input leaf, the leaf to write
    #: it to instead of the output's own file (which a folder then leaves empty), or ``None``
    #: (see :class:`~obsdelta_cli.formats.pack_writer.Early`).
    divert: Callable[[Key, Any], Any] | None = None


@dataclass
class Sink:
    """An output being written: its writable leaves and its array store."""

    leaves: dict[Key, Any]
    arrays: ArrayStore
    #: The adapter has already copied every leaf that is not new (e.g. with h5py's copy),
    #: except those in ``streamed``.
    copied: bool = False
    #: With ``copied``: the plan's streamed leaves the adapter left to the encoding pass, each
    #: writable in ``leaves`` and with the hasher that must see its values in order.
    streamed: dict[Key, Any] = field(default_factory=dict)
    #: The adapter's own state (the output TensorDict, an open file), for ``finish``.
    handle: Any = None
    #: JSON the adapter keeps in the manifest (covered by its hash), e.g. HDF5 layouts.
    extra: dict[str, Any] = field(default_factory=dict)
    #: Where the output is being written.
    path: Path | None = None
    #: What the adapter notes for ``finish`` (not stored).
    memo: dict[str, Any] = field(default_factory=dict)
    #: Block digests (:mod:`obsdelta_cli.blocks`) of leaves the adapter copied itself, taken
    #: as it hashed them, by path; filled by ``object_hashes``.
    blocks: dict[str, str] = field(default_factory=dict)


@dataclass
class Source:
    """An opened input: its leaves (in storage order), metadata (``None`` if plain), geometry."""

    path: Path
    #: Arrays or :class:`~obsdelta_cli.formats.leaf.LazyLeaf`; other objects (tensordict's
    #: non-tensor data) are carried along unchanged.
    leaves: dict[Key, Any]
    #: Leading dimensions of a leaf that index transitions.
    batch_dims: int
    meta: dict[str, Any] | None
    #: Rows along the first batch dimension that hold data (a replay buffer's ``len``);
    #: ``None`` means all of them.
    valid_rows: int | None = None
    #: Where the arrays of a compressed source live.
    arrays: ArrayStore | None = None
    #: The adapter's own state (an open file, a TensorDict), for ``create``.
    handle: Any = None
    #: Answers the adapter works out once per opened input and asks again later in the same
    #: command (HDF5: which objects its copy rebuilds), by the adapter's own names.
    memo: dict[str, Any] = field(default_factory=dict)
    #: Arrays of numbers found but not read as leaves, with why (a big-endian HDF5 dataset):
    #: a pair naming one is refused for that reason, not as missing.
    unread: dict[Key, str] = field(default_factory=dict)


#: What to do with a dataset whose observations are each stored once already.
NOTHING_HINT = "use the dataset as it is, or --pack it (every dataset filtered)"


#: How a command that checks every object of a compressed file against its manifest
#: (:meth:`Format.object_hashes`) opens it, in formats that begin that check as they open:
#: "objects" hashes every object's values but the stored leaves'; "objects-but-observations"
#: leaves the observations' values too, which the command hashes as it copies them.
Ahead = Literal["objects", "objects-but-observations"]


class Format(ABC):
    """One container layout, registered in :data:`obsdelta_cli.formats.FORMATS`."""

    name: ClassVar[str]
    #: One line for the README table and error messages.
    summary: ClassVar[str] = ""
    #: Write options it understands (``Plan.options`` keys).
    options: ClassVar[frozenset[str]] = frozenset()
    #: For layouts that never store a next observation twice: why there is nothing to do.
    nothing_to_do: ClassVar[str | None] = None
    #: How ``compress --pack`` takes it: ``"file"``, packed from a working copy of the
    #: compressed output; ``"leaves"``, the leaves it keeps unchanged written into the packed
    #: file as the input is read (folders of ``.memmap`` files); ``None``: not at all.
    pack: ClassVar[str | None] = None
    #: Whether ``compress --pack --flat`` takes it (HDF5 files of episodes).
    flattens: ClassVar[bool] = False
    #: Whether each episode stores its T+1 observations once (Minari): training reads then
    #: give transition ``t`` ``observations[t + 1]`` of its episode as its next observation.
    observations_once: ClassVar[bool] = False
    #: Set by the commands that check every object of a file (:meth:`object_hashes`): opening
    #: it then begins that check beside the walk of its datasets, ``Ahead`` saying which values
    #: are left to the check. HDF5 files, compressed or packed, begin it
    #: (:class:`~.hdf5_objects.HashesAhead`); the other formats have nothing to begin.
    hash_ahead: Ahead | None = None
    #: Bytes of decoded chunks kept per dataset for random reads (``open_dataset`` sets it
    #: from ``cache_mb``); ``None``: the format's own reading, each chunk read once, in order.
    #: HDF5 files, compressed or packed, keep them; the other formats read without a cache.
    cache_bytes: int | None = None

    @classmethod
    def ted_name(cls, key: Key) -> Key:
        """The name training reads (``open_dataset``, ``ObsdeltaStorage``) give leaf ``key``:
        TorchRL's TED names (``observation``, ``("next", "reward")``, ...) for layouts that
        use others; inside an episode (see :meth:`episodes`), relative to it."""
        return key

    @classmethod
    def episodes(cls, keys: Iterable[Key]) -> list[list[Key]] | None:
        """``keys`` grouped by the episodes this layout keeps apart, each with rows of its own
        (robomimic demos, Minari episodes), in the layout's own order; ``None``: one geometry
        for the whole file (TED, D4RL)."""
        return None

    @classmethod
    @abstractmethod
    def sniff(cls, path: Path) -> bool:
        """Whether ``path`` looks like this container (cheap: reads headers only)."""

    @abstractmethod
    def open(self, path: Path) -> Source:
        """Open ``path`` for reading without loading it whole."""

    def pairs(self, source: Source) -> list[Pair]:
        """The observation pairs this layout defines (the twin may be missing or mismatched;
        the pipeline says why a pair cannot be used). Default: the TED rule."""
        return ted_pairs(source)

    @abstractmethod
    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        """Create the output at ``path`` as ``plan`` says; new leaves are left to be filled."""

    @abstractmethod
    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        """Write ``meta`` (``None`` for a plain, inflated dataset) and flush ``sink``."""

    def object_hashes(
        self,
        opened: Source | Sink,
        skip: Callable[[str], bool],
        known: Mapping[str, str] | None = None,
        recorded: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """Hashes of the container's own objects as stored, by name, in an opened input or an
        output being written, for containers that copy objects whole (HDF5) rather than leaf by
        leaf; ``skip`` leaves some out, and the values of those in ``known`` are not read (their
        hash is taken from it); ``recorded``: the hashes the file's metadata records, where an
        object that differs from its record only in how HDF5 encodes its types and dataspaces
        (another format version's) counts as the recorded one. Default: none, every leaf is
        hashed as it is copied."""
        return {}

    def begin_object_hashes(
        self, sink: Sink, skip: Callable[[str], bool]
    ) -> Callable[[], dict[str, str]]:
        """:meth:`object_hashes` of the output being written, begun now and given by the
        function returned, so that a container that can hashes them beside the caller's next
        work. Default: hashed now."""
        hashes = self.object_hashes(sink, skip)
        return lambda: hashes

    def streams(self, source: Source, keys: frozenset[Key], order: Sequence[Key]) -> frozenset[Key]:
        """Those of the unchanged leaves ``keys`` the output (its leaves ``order``) leaves to
        the encoding pass to write, and so to hash: :attr:`Plan.streamed`. A container that
        copies some of them whole itself (HDF5) leaves them out: their values are then checked
        as its objects are. Default: all of them."""
        return keys

    def value_hashes(self, source: Source) -> dict[str, str]:
        """xxh3-64 of the values, in row order, of the datasets whose recorded object hash
        stands for their values (a packed file holds them re-encoded), by name. A reader that
        hashes such a dataset's values anyway checks them against this, and passes the name to
        :meth:`object_hashes` in ``known``, so they are not decoded twice. Default: none."""
        return {}

    def written_leaf(self, sink: Sink, key: Key, original: Any = None) -> Any | None:
        """Leaf ``key`` as the output being written holds it, once its objects are hashed
        (every copy done), to read what was stored; ``None`` where the sink has no such leaf.
        ``original``: the input's leaf of that key, which a container that copies leaves
        whole (values unchanged) may give instead where reading it costs less. Default: the
        sink's own leaves."""
        return sink.leaves.get(key)

    def bookkeeping(self, source: Source, removed: list[Key]) -> int:
        """Bytes besides their values that leave the container with the ``removed`` leaves
        (HDF5 object headers and emptied groups), for size estimates. Default: none."""
        return 0

    def close(self, source: Source) -> None:
        """Release what :meth:`open` holds (by default, the files its leaves hold open);
        closing a source twice does no harm."""
        close_leaves(source.leaves)

    def discard(self, sink: Sink) -> None:  # noqa: B027 - most containers hold nothing open
        """Release what :meth:`create` holds after a failure (the output is deleted next)."""


def episode_order(name: str) -> tuple[int, str]:
    """Sort key of an episode group by its number: ``demo_2`` before ``demo_10``."""
    digits = name.rpartition("_")[2]
    return (int(digits), name) if digits.isdigit() else (-1, name)


def close_leaves(leaves: Mapping[Key, Any]) -> None:
    """Close the leaves that hold a file open (:class:`.leaf.FileLeaf`) now, not when the
    collector frees them: a traceback kept after an error, or a library that keeps the frames
    it was imported from, holds them, and a process that runs many commands would run out of
    file descriptors."""
    for leaf in leaves.values():
        close = getattr(leaf, "close", None)
        if callable(close):
            close()


def ted_pairs(source: Source) -> list[Pair]:
    """TED: every root leaf ``k`` pairs with ``("next", *k)``."""
    if any(k[:2] == ("next", "delta") for k in source.leaves):
        raise InputError(
            "already holds next/delta leaves but no obsdelta metadata",
            file=source.path,
            hint="it was written by another tool (e.g. TorchRL's NextObservationDelta); "
            "inflate it there first",
        )
    return [Pair.ted(k) for k in source.leaves if k[0] != "next"]


def folder_hashes(folder: Path) -> dict[str, str]:
    """xxh3-64 of every file of a folder container that is not a leaf (``*.memmap``, hashed
    leaf by leaf as it is copied) nor obsdelta's own (the manifest hashes itself, exception rows
    are hashed per key): ``meta.json`` files, replay-buffer metadata, extra files."""
    out: dict[str, str] = {}
    for file in sorted(folder.rglob("*")):
        rel = file.relative_to(folder)
        if rel.parts[0] in (SIDECAR, ARRAYS_DIR) or file.suffix == ".memmap":
            continue
        if file.is_symlink() or not file.is_file():
            continue
        h = xxhash.xxh3_64()
        with file.open("rb") as fh:
            while piece := fh.read(1 << 22):
                h.update(piece)
        out[rel.as_posix()] = h.hexdigest()
    return out


class FolderFormat(Format):
    """A container that is a folder of files: besides its leaves, every file it holds
    (``meta.json`` files, metadata of other tools, extra files) is hashed whole."""

    def object_hashes(
        self,
        opened: Source | Sink,
        skip: Callable[[str], bool],
        known: Mapping[str, str] | None = None,
        recorded: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        path = opened.path
        if path is None or not path.is_dir():
            return {}
        return {k: v for k, v in folder_hashes(path).items() if not skip(k)}


def disk_size(path: Path) -> int:
    """Bytes on disk of a file, or of every file below a directory.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a").write_bytes(b"12345")
    >>> disk_size(d)
    5
    """
    if path.is_file():
        return path.stat().st_size
    total = 0
    folders = [path]
    while folders:  # not os.walk: it recurses, and a folder may nest deeper than Python does
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def read_sidecar(directory: Path) -> dict[str, Any] | None:
    """The metadata stored in ``directory``, or ``None`` for a plain dataset."""
    file = directory / SIDECAR
    if not os.path.lexists(file):
        return None
    _, meta = read_json(file, max_bytes=MAX_SIDECAR_BYTES, hint="the file is damaged")
    if not isinstance(meta, dict):
        raise InputError(f"{SIDECAR} is not a JSON object", file=file, hint="the file is damaged")
    return meta


def write_sidecar(directory: Path, meta: dict[str, Any] | None) -> None:
    """Store ``meta`` in ``directory`` (nothing for a plain dataset)."""
    if meta is not None:
        (directory / SIDECAR).write_text(json.dumps(meta, indent=1) + "\n")
