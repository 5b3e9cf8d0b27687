"""Copies of large untouched HDF5 datasets by their raw bytes: a contiguous dataset is
recreated with its source's exact type, dataspace, creation properties and attributes, and its
bytes are copied by the kernel (``copy_file_range``, page cache to page cache).

HDF5's own object copy (``H5Ocopy``) moves the values through a user-space buffer in small
pieces. Every other object (chunked, compact, small, variable-length or reference-typed
datasets, committed types, datasets with timestamps) keeps HDF5's object copy.
"""

from __future__ import annotations

import errno
import math
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py._objects import phil

from ..checksum import BLOCK_BYTES, BlockFeed
from .direct import ALIGN, WINDOW, ColdReads, mapped_buffer
from .hdf5_leaves import BF16_ATTR, contiguous_span, copy_attrs
from .hdf5_objects import hash_span, header_hash
from .hdf5_types import space_anew, type_anew
from .hdf5_walk import held_at, object_at, raw_name
from .leaf import LazyLeaf, read_exact, write_exact

#: Datasets smaller than this are copied by HDF5: a thread would not pay.
RAW_COPY_MIN = 1 << 20
#: Bytes copied per call.
PIECE_BYTES = 64 << 20
#: Kinds of dtype whose stored bytes mean the same in any file (no heap or object addresses).
_PLAIN_KINDS = "biufc"


def _fill_on_allocation(dcpl: h5py.h5p.PropDCID) -> bool:
    """Whether allocating the storage writes fill values (wasted work before a raw copy)."""
    when = dcpl.get_fill_time()
    if when == h5py.h5d.FILL_TIME_ALLOC:
        return True
    user_fill = dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED
    return when == h5py.h5d.FILL_TIME_IFSET and user_fill


def raw_copyable(ds: h5py.Dataset, file_size: int) -> bool:
    """A large contiguous dataset of plain numbers, stored whole inside its file, without
    timestamps."""
    span = contiguous_span(ds, file_size)
    if span is None or span[1] < RAW_COPY_MIN or ds.dtype.kind not in _PLAIN_KINDS:
        return False
    dcpl = ds.id.get_create_plist()
    return (
        ds.dtype.fields is None
        and dcpl.get_external_count() == 0
        and not ds.id.get_type().committed()
        and not _fill_on_allocation(dcpl)
        # A new object would get the time of its creation; HDF5's object copy keeps the
        # source's, so that the same input gives the same output, byte for byte. (The creation
        # properties of an opened dataset do not say whether it stores times: its header does.)
        and not h5py.h5o.get_info(ds.id).ctime
    )


def object_copy_loses_fill(obj: Any) -> bool:
    """Whether HDF5's object copy would damage ``obj``: a dataset of variable-length values
    with a fill value of its own, which the copy leaves pointing into the source file's heap
    (the copy's creation properties then cannot be read)."""
    return (
        isinstance(obj, h5py.Dataset)
        and obj.dtype.hasobject
        and obj.id.get_create_plist().fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED
    )


def copy_object(group: h5py.Group, obj: Any, dst: h5py.Group, name: str) -> None:
    """Copy ``obj`` (a member of ``group``) to ``dst[name]`` with HDF5's object copy, or value
    by value where that copy would damage it (:func:`object_copy_loses_fill`)."""
    if object_copy_loses_fill(obj):
        copy_anew(obj, dst, name)
    else:
        group.copy(obj, dst, name=name)


def copy_anew(ds: h5py.Dataset, dst: h5py.Group, name: str) -> h5py.Dataset:
    """``ds`` written anew as ``dst[name]``, values (:func:`copy_values`) and attributes: its
    storage (chunk index, fill value) laid out by the new file, not copied as it was."""
    new = copy_values(ds, dst, name)
    copy_attrs(ds, new)
    return new


#: Bytes of values moved at a time by :func:`copy_values`.
VALUE_BLOCK_BYTES = 1 << 22


def copy_values(ds: h5py.Dataset, dst: h5py.Group, name: str) -> h5py.Dataset:
    """A new dataset ``name`` of ``dst`` with ``ds``'s stored type, dataspace and creation
    properties (HDF5 writes its fill value anew, into the new file), and its values, read and
    written a block of rows at a time; not its attributes."""
    dsid = ds.id
    dcpl = dsid.get_create_plist()
    dcpl.set_obj_track_times(False)  # as the source: see RawCopies.add
    # Type and dataspace built anew, encoded as the new file's format asks (see type_anew).
    tid, space = type_anew(dsid.get_type()), space_anew(dsid.get_space())
    new = h5py.Dataset(h5py.h5d.create(dst.id, name.encode(), tid, space, dcpl=dcpl))
    if ds.shape is None:  # empty (null dataspace): nothing to write
        return new
    if not ds.shape:
        new[()] = ds[()]
        return new
    step = max(1, VALUE_BLOCK_BYTES // max(1, ds.dtype.itemsize * math.prod(ds.shape[1:])))
    for start in range(0, ds.shape[0], step):
        new[start : start + step] = ds[start : start + step]
    return new


class CopyRule:
    """Which objects of ``f`` a copy that drops the datasets at ``dropped`` rebuilds itself,
    worked out once per command: the plan asks before anything is checked (which observations
    the encoding pass copies, hashing them as it reads them) and the copy follows the same
    answers. A group is *rewritten* (object by object) where it loses a dataset, holds one
    to copy raw or one HDF5's object copy would damage, or holds an object linked twice;
    everything else is copied whole by HDF5's object copy.
    """

    def __init__(
        self, f: h5py.File, dropped: set[str], leaf_bytes: Iterable[tuple[str, int]] = ()
    ) -> None:
        """``leaf_bytes``: ``(path, bytes of values)`` of datasets of numbers (leaves). Those
        of fewer than :data:`RAW_COPY_MIN` bytes (:attr:`small`) are never copied raw, nor
        damaged by HDF5's object copy: only their links are asked about, by name, and each is
        copied by name (a robomimic file's thousands of them are not opened again)."""
        self.dropped = dropped
        self.small = frozenset(path for path, size in leaf_bytes if size < RAW_COPY_MIN)
        self.source_size = Path(f.filename).stat().st_size
        self._f = f
        # Every group above a dropped dataset: it loses one.
        parts = [d.split("/") for d in dropped]
        self._losing = {"/".join(p[:i]) for p in parts for i in range(1, len(p))}
        # By group path: the answer, and (no object below is linked twice, a dataset below is
        # copied raw). A robomimic file has hundreds of demos, each asked about by each group
        # above it, and hundreds of pairs a group.
        self._rewritten: dict[str, bool] = {}
        self._below: dict[str, tuple[bool, bool]] = {}
        self._emptied: dict[str, bool] = {}

    def rewritten(self, group: h5py.Group) -> bool:
        """Whether ``group`` is rebuilt object by object rather than copied whole."""
        return self._rewritten_at(group.name.lstrip("/"), group)

    def _rewritten_at(self, path: str, group: h5py.Group | None = None) -> bool:
        if path not in self._rewritten:
            if group is None:
                group = held_at(self._f, path)
            self._rewritten[path] = path in self._losing or self._walked(group)
        return self._rewritten[path]

    def _walked(self, group: h5py.Group) -> bool:
        """Whether ``group`` holds a dataset to copy raw or value by value, or an object linked
        twice: one object copy of the group would make a second object of a target also linked
        from outside it, where the walk links again to the one copy (:class:`Relinks`)."""
        single, raw = self._scan(group)
        return raw or not single

    def emptied(self, group: h5py.Group) -> bool:
        """Whether a rewrite of ``group`` would keep nothing of it: it has members, no
        attributes, and each member is dropped or a group emptied too. The copy leaves such a
        group out (a robomimic demo's ``next_obs``), as a reader of the input sees no data in
        it."""
        path = group.name.strip("/")
        if path not in self._emptied:
            self._emptied[path] = (
                bool(len(group))
                and not len(group.attrs)
                and all(self._emptied_member(f"{path}/{name}" if path else name) for name in group)
            )
        return self._emptied[path]

    def _emptied_member(self, path: str) -> bool:
        if path in self.dropped:
            return True
        obj = object_at(self._f, path)
        return isinstance(obj, h5py.Group) and self._rewritten_at(path, obj) and self.emptied(obj)

    def copied_raw(self, ds: h5py.Dataset) -> bool:
        """Whether the copy moves ``ds``'s bytes itself (where its group is rewritten)."""
        return linked_once(ds) and raw_copyable(ds, self.source_size)

    def streamed(self, paths: Iterable[str]) -> set[str]:
        """Those of the datasets at ``paths`` that the copy leaves to the encoding pass: copied
        raw, in groups rewritten down to them. The others are copied whole by HDF5, so their
        values must be checked as objects."""
        found = set()
        for path in paths:
            if path in self.small:  # never copied raw: not opened to ask
                continue
            parts = path.split("/")
            ds = object_at(self._f, path)  # as the walk holds it; a second link is not copied raw
            if (
                isinstance(ds, h5py.Dataset)
                and streamable(ds)
                and self.copied_raw(ds)
                and all(self._rewritten_at("/".join(parts[:i])) for i in range(1, len(parts)))
            ):
                found.add(path)
        return found

    def _scan(self, group: h5py.Group) -> tuple[bool, bool]:
        path = group.name
        if path not in self._below:
            single, raw = True, False
            prefix = path.strip("/")
            for name in group:
                member = f"{prefix}/{name}" if prefix else name
                if member in self.small:
                    if not linked_once_at(group, name):
                        single = False
                        break
                    continue
                # As the file's walk holds them open: values() would open each again.
                obj = held_at(self._f, member)
                if not linked_once(obj):
                    single = False
                    break
                if isinstance(obj, h5py.Group):
                    below_single, below_raw = self._scan(obj)
                    single, raw = below_single, raw or below_raw
                    if not single:
                        break
                elif isinstance(obj, h5py.Dataset) and not raw:
                    raw = raw_copyable(obj, self.source_size) or object_copy_loses_fill(obj)
            self._below[path] = single, raw
        return self._below[path]


def linked_once(obj: Any) -> bool:
    return int(h5py.h5o.get_info(obj.id).rc) == 1


def linked_once_at(group: h5py.Group, name: str | bytes) -> bool:
    """:func:`linked_once` of ``group``'s member ``name``, asked by name: nothing is opened."""
    return int(h5py.h5o.get_info(group.id, raw_name(name)).rc) == 1


class Relinks:
    """Objects with more than one hard link, as a walk copies them one by one: the first link
    met is copied, and each later one becomes a link to that copy, so the output holds one
    object, as the input did (copying each link would make two)."""

    def __init__(self) -> None:
        self._copies: dict[int, str] = {}

    def relinked(self, obj: Any, dst: h5py.Group, name: str) -> bool:
        """Whether ``obj`` was met before, in which case ``dst[name]`` now links to its copy;
        otherwise the caller copies it to ``dst[name]``."""
        info = h5py.h5o.get_info(obj.id)
        if info.rc == 1:
            return False
        first = self._copies.get(info.addr)
        if first is None or first not in dst.file:
            self._copies[info.addr] = f"{dst.name.rstrip('/')}/{name}"
            return False
        dst[name] = dst.file[first]
        return True


def streamable(ds: h5py.Dataset) -> bool:
    """Whether the values the pipeline reads from ``ds`` are its stored bytes: numbers in the
    machine's byte order (booleans are read as 0 and 1, whatever bytes the file holds)."""
    return ds.dtype.kind in "fiuc" and ds.dtype.isnative


def allocate(ds: h5py.Dataset) -> None:
    """Allocate a new contiguous dataset's whole storage (with the fill value, where its
    creation properties ask for it) by writing one zero, which the caller's raw writes then
    overwrite. A zero, not a source's first value: reading that would start the kernel's
    read-ahead there, and the pass's reads of the source would then find it cached
    (:class:`~obsdelta_cli.formats.direct.ColdReads`). Written with h5py's low-level calls:
    its indexing builds a selection for each write, and inflating a file of thousands of
    episodes allocates thousands of datasets."""
    dsid = ds.id
    rank = dsid.rank
    space = dsid.get_space()
    if rank:
        space.select_hyperslab((0,) * rank, (1,) * rank)
        memory = h5py.h5s.create_simple((1,) * rank)
    else:
        memory = h5py.h5s.create(h5py.h5s.SCALAR)
    dsid.write(memory, space, np.zeros((1,) * rank, dtype=ds.dtype))


class SpanLeaf(LazyLeaf):
    """A contiguous dataset of an output being written, read and written in place by rows
    through the output's descriptor."""

    def __init__(self, fd: int, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.fd, self.offset = fd, offset
        self.shape, self.dtype = tuple(shape), dtype
        self.row_bytes = math.prod(self.shape[1:]) * dtype.itemsize

    def read(self, start: int, stop: int) -> np.ndarray:
        count = max(0, min(stop, self.shape[0]) - start)
        at = self.offset + start * self.row_bytes
        out = read_exact(self.fd, at, count * self.row_bytes, "output")
        return out.view(self.dtype).reshape(count, *self.shape[1:])

    def write(self, start: int, value: np.ndarray) -> None:
        write_exact(self.fd, self.offset + start * self.row_bytes, value)


def in_place(
    out: h5py.File, datasets: Sequence[tuple[str, np.dtype]], fd: int
) -> list[SpanLeaf | None]:
    """For each new dataset of the output ``out`` at ``fd`` (its path, with the pipeline's
    dtype for it), a leaf the pass writes in place, row chunk by row chunk with ``pwrite`` at
    its offset, rather than through h5py (whose selection and write cost 0.8 ms a 1 MiB chunk,
    on the thread that also measures errors): for those contiguous and of numbers in the
    machine's order, their storage allocated here; ``None`` for any other dataset. Each is
    opened in turn and let go: HDF5 holds about 12.5 KB for each open dataset, and inflating a
    robomimic file of 2,000 demos makes 10,000 of them."""
    offsets: list[tuple[int, tuple[int, ...]] | None] = []
    for path, _ in datasets:
        with phil:  # opened as h5py's ``out[path]`` does, without its lookups
            ds = h5py.Dataset(h5py.h5d.open(out.id, path.encode()))
        if _placeable(ds):
            allocate(ds)
            offset = ds.id.get_offset()
            offsets.append(None if offset is None else (int(offset), tuple(ds.shape)))
        else:
            offsets.append(None)
    if any(o is not None for o in offsets):
        # Nothing HDF5 holds for them may land after the pass's writes. Once for all: each
        # flush writes what HDF5 holds of the whole file, and a robomimic file of 1,000 demos
        # has 7,000 such datasets (flushing after each took 30 of the 60 s of compress).
        out.flush()
    return [
        None if at is None else SpanLeaf(fd, at[0], at[1], dtype)
        for at, (_, dtype) in zip(offsets, datasets, strict=True)
    ]


def _feed(ds: h5py.Dataset) -> BlockFeed | None:
    """A feed for the block digests of ``ds``, if its stored bytes are the rows readers get
    (numbers in this machine's byte order)."""
    dtype = ds.dtype
    if not ds.ndim or dtype.kind not in "iufc" or not dtype.isnative or ds.attrs.get(BF16_ATTR):
        return None
    return BlockFeed(ds.shape, dtype, BLOCK_BYTES)


def _hash_rows(job: Job, fd: int) -> None:
    """Hash a copied dataset's bytes as the output holds them, whole rows at a time, to its
    object hash and its block feed."""
    assert job.feed is not None
    dtype, shape = job.feed.dtype, job.feed.shape
    row = max(1, math.prod(shape[1:]) * dtype.itemsize)
    step = max(1, (1 << 22) // row) * row
    for at in range(0, job.nbytes, step):
        piece = read_exact(fd, job.dst + at, min(step, job.nbytes - at), job.path)
        job.head.update(piece.data)
        job.feed.update(piece.view(dtype).reshape(-1, *shape[1:]))


def _placeable(ds: h5py.Dataset) -> bool:
    dcpl = ds.id.get_create_plist()
    return dcpl.get_layout() == h5py.h5d.CONTIGUOUS and streamable(ds) and bool(ds.size)


@dataclass
class Job:
    """One dataset to copy: its path in the output, its hash so far, where its bytes are."""

    path: str
    head: Any
    src: int
    dst: int
    nbytes: int
    #: Takes its block digests as it is hashed, where its bytes are the rows readers get.
    feed: BlockFeed | None = None


class RawCopies:
    """Datasets of one output whose raw bytes are copied from one input by the kernel.

    :meth:`add` creates each dataset like its source (allocated, not yet filled); :meth:`start`
    copies and then hashes all of them in a thread, while the next observations are encoded;
    :meth:`wait` must return before the output is read or closed, and :meth:`cancel` stops an
    abandoned copy before its file is closed.

    A dataset added ``streamed`` is left to the encoding pass, which reads its source anyway:
    :meth:`start` gives a leaf writing its storage in place and the hash its values go to.
    """

    def __init__(self, source: Path, out: h5py.File, out_fd: int) -> None:
        self.source, self.out, self.out_fd = source, out, out_fd
        self.out_path = out.filename  # read here: the thread makes no h5py call
        self.source_size = source.stat().st_size
        self.spans: list[tuple[int, h5py.Dataset, int, np.dtype | None]] = []
        #: Each copied dataset's hash as stored (see ``hash_objects``), by path, once copied.
        self.digests: dict[str, str] = {}
        #: And its block digests (:mod:`obsdelta_cli.blocks`), where it has rows of numbers.
        self.blocks: dict[str, str] = {}
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()
        #: Hashes fed by the encoding pass, by path (:meth:`start`).
        self.fed: dict[str, Any] = {}

    def add(
        self,
        ds: h5py.Dataset,
        group: h5py.Group,
        name: str,
        *,
        streamed: np.dtype | None = None,
    ) -> h5py.Dataset:
        """Create ``name`` in ``group`` like ``ds`` (type, dataspace, creation properties,
        attributes); its values are copied by :meth:`start`, or with ``streamed`` (the dtype
        the pipeline reads it as; only for datasets :func:`streamable`) written by the
        caller."""
        dsid = ds.id
        dcpl = dsid.get_create_plist()
        # No times, as the source stores none (raw_copyable): an opened dataset's creation
        # properties ask for them whatever its header holds.
        dcpl.set_obj_track_times(False)
        new = h5py.Dataset(
            h5py.h5d.create(group.id, name.encode(), dsid.get_type(), dsid.get_space(), dcpl=dcpl)
        )
        copy_attrs(ds, new)
        allocate(new)  # the creation properties, allocation time included, stay the source's
        span = contiguous_span(ds, self.source_size)
        assert span is not None  # raw_copyable said so
        self.spans.append((span[0], new, span[1], streamed))
        return new

    def start(self) -> dict[str, tuple[LazyLeaf, Any]]:
        """Copy every added dataset's bytes in a background thread (the kernel copy releases
        the interpreter lock: the next observations are encoded meanwhile). Return, for each
        ``streamed`` dataset by path, a leaf writing its storage in place and the xxh3 state,
        fed with its header, that its values must be fed to in order."""
        spans, self.spans = self.spans, []
        if not spans:
            return {}
        self.out.flush()  # nothing HDF5 buffered for these datasets may land after the copy
        jobs: list[Job] = []
        streams: dict[str, tuple[LazyLeaf, Any]] = {}
        for src_offset, new, nbytes, streamed in spans:
            dst_offset = new.id.get_offset()
            if dst_offset is None:  # pragma: no cover - allocated by add()
                raise OSError(errno.EIO, f"{new.name}: storage was not allocated")
            # What the dataset is, hashed here (h5py); its bytes, in the thread once copied.
            head = header_hash(new)
            path = new.name.lstrip("/")
            if streamed is not None:
                self.fed[path] = head
                leaf = SpanLeaf(self.out_fd, int(dst_offset), new.shape, streamed)
                streams[path] = (leaf, head)
            else:
                jobs.append(Job(path, head, src_offset, int(dst_offset), nbytes, _feed(new)))
        if not jobs:
            return streams
        self.thread = threading.Thread(
            target=self._run, args=(jobs,), name="obsdelta-copy", daemon=True
        )
        self.thread.start()
        return streams

    def _run(self, jobs: list[Job]) -> None:
        try:
            fd = os.open(self.source, os.O_RDONLY)
            cold = ColdReads(fd)
            try:
                for job in jobs:
                    self._copy(fd, cold, job.src, job.dst, job.nbytes)
            finally:
                cold.close()
                os.close(fd)
            # Hashed as the output holds them (read back through the page cache), so the
            # manifest records what was written, as it does for every other object.
            fd = os.open(self.out_path, os.O_RDONLY)
            try:
                for job in jobs:
                    if self.stop.is_set():
                        return
                    if job.feed is None:
                        hash_span(job.head, fd, job.dst, job.nbytes)
                    else:
                        _hash_rows(job, fd)
                        if (blocks := job.feed.result()) is not None:
                            self.blocks[job.path] = blocks
                    self.digests[job.path] = job.head.hexdigest()
            finally:
                os.close(fd)
        except BaseException as exc:  # raised again by wait(), in the caller's thread
            self.error = exc

    def wait(self) -> None:
        """Return once every byte is copied; a failed copy raises its error here."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        error, self.error = self.error, None
        if error is not None:
            raise error
        for path, head in self.fed.items():
            self.digests[path] = head.hexdigest()

    def cancel(self) -> None:
        """Stop copying (the output is abandoned) and wait for the thread to end."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        self.error = None

    def _copy(self, fd: int, cold: ColdReads, src: int, dst: int, nbytes: int) -> None:
        done = 0
        kernel = True
        buffer: np.ndarray | None = None
        while done < nbytes and not self.stop.is_set():
            count = min(PIECE_BYTES, nbytes - done)
            piece = min(WINDOW, count)
            if cold.usable and not cold.cached(src + done, piece):
                # Not in memory: read past the page cache, at the disk's speed (the kernel's
                # copy reads it through the cache, a few hundred KB at a time).
                if buffer is None:
                    buffer = mapped_buffer(WINDOW + ALIGN)
                data = cold.read_direct(src + done, piece, into=buffer)
                if data is not None:
                    write_exact(self.out_fd, dst + done, data)
                    done += piece
                    continue
            if kernel:
                try:
                    n = os.copy_file_range(fd, self.out_fd, count, src + done, dst + done)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    kernel = False  # another file system, or no kernel support: read and write
                    continue
            else:
                n = os.pwrite(self.out_fd, os.pread(fd, count, src + done), dst + done)
            if n <= 0:
                raise OSError(errno.EIO, f"{self.source}: short read at offset {src + done}")
            done += n
