"""What the HDF5 layouts share: lazy h5py leaves, exact copies, and obsdelta's own group.

Every object that is not rewritten is copied with HDF5's own object copy, or for a large
contiguous dataset by its raw bytes (:mod:`.hdf5_copy`), so its values, dtype, shape, chunks,
filters, fill value and attributes come out exactly as they went in. Groups on the way to a
rewritten or raw-copied dataset are recreated with their attributes and creation properties.

A compressed file keeps obsdelta's objects in one root group, ``/obsdelta``:

- ``layout/<path>``: for each next-observation dataset that was removed, an empty dataset with
  its dtype, chunks, filters, fill value and attributes, so ``inflate`` can recreate it exactly;
- ``arrays/<name>``: exception rows and their row index;
- ``delta/<path>`` in the D4RL and robomimic layouts: the stored delta of ``<path>``.

The metadata is the JSON root attribute ``obsdelta``.
"""

from __future__ import annotations

import contextlib
import os
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..arrays import is_bfloat16
from ..checksum import Hasher
from ..errors import InputError, UsageError, failed_write, write_error
from ..filters import short_zstd_name
from ..heap import give_back
from .base import Format, Key, LeafSpec, Plan, Sink, Source, key_str
from .direct import MIN_DIRECT
from .hdf5_copy import CopyRule, RawCopies, Relinks, copy_object, in_place, linked_once_at
from .hdf5_create import (
    ALLOC_TIMES,
    Groups,
    create_dataset,
    dcpl_like,
    gcpl_like,
    write_unstored,
)
from .hdf5_leaves import (
    BF16_ATTR,
    MAGIC,
    META_ATTR,
    H5Arrays,
    H5Leaf,
    copy_attrs,
    h5_dtype,
    leaf_dtype,
    leaves_of,
    replaced_twins,
)
from .hdf5_meta import own_of, own_of_source, read_meta, write_meta
from .hdf5_objects import (
    HashesAhead,
    begin_hashes,
    hash_objects_apart,
    hashes_ahead,
    header_bytes,
    objects_read,
)
from .hdf5_safety import (
    check_contained,
    damaged_file,
    most_attrs,
    output_libver,
    written_here,
)
from .hdf5_walk import OWN, OWN_PLACES, h5_file, held_at, object_names, raw_name
from .leaf import nbytes

hdf5plugin: Any
try:  # registers Zstd, Blosc, LZ4, ... filters for reading and writing, when installed
    import hdf5plugin
except ImportError:  # pragma: no cover - exercised when the extra is not installed
    hdf5plugin = None
else:  # as soon as imported: the name is part of every filtered dataset's object hash
    short_zstd_name(hdf5plugin)


def is_hdf5(path: Path) -> bool:
    """Whether ``path`` is a file starting with the HDF5 signature."""
    if not path.is_file():
        return False
    with path.open("rb") as fh:
        return fh.read(8) == MAGIC


def open_h5(path: Path) -> h5py.File:
    """Open read-only, turning a damaged file into :class:`InputError` and refusing a file that
    points outside itself (:func:`check_contained`). A file holding scale-offset datasets is
    opened again without a chunk cache (see :func:`~.hdf5_safety.scale_offset`)."""
    f, uncached = _open_checked(path)
    if uncached:
        f.close()
        f, _ = _open_checked(path, rdcc_nbytes=0)
    return f


def _open_checked(path: Path, **cache: int) -> tuple[h5py.File, bool]:
    """``path`` opened read-only and checked, and whether it must be read without a cache."""
    try:
        f = h5_file(path, "r", **cache)
    except (OSError, ValueError) as exc:
        raise damaged_file(path, exc) from None
    try:
        return f, check_contained(f, path)
    except BaseException:
        f.close()
        raise


def compression_kwargs(name: str) -> dict[str, Any]:
    """h5py ``create_dataset`` keywords for ``--h5-compression``."""
    if name == "none":
        return {}
    if name in ("gzip", "lzf"):
        return {"compression": name, "shuffle": True}
    if name in ("zstd", "blosc"):
        if hdf5plugin is None:
            raise UsageError(
                f"--h5-compression {name} needs hdf5plugin",
                hint="pip install 'obsdelta[hdf5plugin]', or use gzip or lzf",
            )
        if name == "zstd":
            return dict(hdf5plugin.Zstd(clevel=3))
        # zstd inside Blosc: lz4 hardly shrinks the noisy low bits of float deltas.
        return dict(hdf5plugin.Blosc(cname="zstd", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE))
    raise UsageError(
        f"unknown --h5-compression {name!r}", hint=f"choose one of {', '.join(H5_COMPRESSIONS)}"
    )


H5_COMPRESSIONS = ("gzip", "lzf", "zstd", "blosc", "none")


class HDF5Format(Format):
    """Base of the HDF5 layouts: they differ in how they are recognised and how pairs are found."""

    options = frozenset({"h5_compression"})
    pack = "file"
    flattens = True
    #: Leading dimensions that index transitions.
    batch_dims = 1

    @classmethod
    def sniff(cls, path: Path) -> bool:
        if not is_hdf5(path):
            return False
        try:
            with h5_file(path) as f:
                check_contained(f, path)  # before matches() follows any link
                return cls.matches(f)
        except OSError:
            return False  # cannot be opened: detection reports it precisely
        except (RuntimeError, KeyError, ValueError) as exc:  # opens, but its structure is damaged
            raise InputError(
                f"cannot read the file's structure ({exc})", file=path, hint="the file is damaged"
            ) from None

    @classmethod
    @abstractmethod
    def matches(cls, f: h5py.File) -> bool:
        """Whether the open file has this layout."""

    def open(self, path: Path) -> Source:
        f = open_h5(path)
        ahead: HashesAhead | None = None
        try:
            meta = read_meta(f, path)
            own = own_of(meta, path)
            taken = [p for p in OWN_PLACES if p in f] if meta is None else []
            if taken:
                raise InputError(
                    f"object /{taken[0]} is a name obsdelta writes itself, in a file obsdelta "
                    f"did not write (it has no {META_ATTR} attribute)",
                    file=path,
                    hint="rename it: obsdelta would leave it out of its output",
                )
            if self.hash_ahead is not None and meta is not None:
                ahead = hashes_ahead(f, path, meta, own, self.hash_ahead)
            unread: dict[Key, str] = {}
            leaves = leaves_of(f, path, unread, own)
            batch_dims = self.infer_batch_dims(leaves, meta)
            if self.cache_bytes is not None:
                for leaf in leaves.values():
                    leaf.keep_decoded(self.cache_bytes)
        except (RuntimeError, OSError, KeyError) as exc:  # h5py's errors on a damaged file
            _close_opening(f, ahead)
            raise InputError(
                f"cannot read the file's structure ({exc})", file=path, hint="the file is damaged"
            ) from None
        except BaseException:
            _close_opening(f, ahead)
            raise
        arrays = H5Arrays(f, path, own=own)
        source = Source(path, leaves, batch_dims, meta, arrays=arrays, handle=f, unread=unread)
        source.memo["own"] = own
        if ahead is not None:
            source.memo["ahead"] = ahead
        return source

    @classmethod
    def own_place(cls, f: h5py.File) -> str:
        """Where a compressed output of ``f`` keeps obsdelta's group (one of
        :data:`OWN_PLACES`)."""
        return OWN

    def own_for(self, source: Source) -> str:
        """Where obsdelta's group is in ``source`` (compressed), or will be in its compressed
        output."""
        own = own_of_source(source)
        return own if source.meta is not None else self.own_place(source.handle)

    def infer_batch_dims(self, leaves: dict[Key, Any], meta: dict[str, Any] | None) -> int:
        return self.batch_dims

    def close(self, source: Source) -> None:
        ahead = source.memo.pop("ahead", None)
        if ahead is not None:  # not asked for: the command failed before its check
            ahead.cancel()
        super().close(source)
        source.handle.close()
        give_back()

    def written_leaf(self, sink: Sink, key: Key, original: Any = None) -> Any | None:
        # Datasets copied whole (by HDF5 or the kernel) are not among the sink's leaves.
        leaf = sink.leaves.get(key)
        out: h5py.File = sink.handle
        if leaf is None and isinstance(original, H5Leaf) and nbytes(original) < MIN_DIRECT:
            # A small dataset copied whole holds the input's values, read through the page
            # cache to be copied: the input's leaf (its dataset held open by the walk, its
            # bytes read with one pread) costs less than opening the output's again, and a
            # file of 1,000 episodes has thousands of them.
            return original
        if leaf is None:
            ds = out.get(key_str(key))  # one open, where a test of the name first made two
            leaf = H5Leaf(ds, Path(out.filename)) if isinstance(ds, h5py.Dataset) else None
        return leaf

    def object_hashes(
        self,
        opened: Source | Sink,
        skip: Callable[[str], bool],
        known: Mapping[str, str] | None = None,
        recorded: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        if isinstance(opened, Sink):  # an output being written: one way to hash it
            return self.begin_object_hashes(opened, skip)()
        f: h5py.File = opened.handle
        file = Path(f.filename)
        ahead = opened.memo.pop("ahead", None)
        # A file read: damage may crash HDF5, so it is hashed apart (see hash_objects_apart).
        own = own_of_source(opened)
        work = partial(hash_objects_apart, f, file, skip, known, recorded, own, ahead=ahead)
        return objects_read(file, work)

    def begin_object_hashes(
        self, sink: Sink, skip: Callable[[str], bool]
    ) -> Callable[[], dict[str, str]]:
        # In a forked child (:func:`~.apart.begin`), beside the caller's next work; its raw
        # chunks must be on disk first. Written by obsdelta in this process: not damaged.
        f: h5py.File = sink.handle
        file = Path(f.filename)
        known = _written(sink, f, file)
        return partial(objects_read, file, begin_hashes(f, file, skip, known, own_of_source(sink)))

    def streams(self, source: Source, keys: frozenset[Key], order: Sequence[Key]) -> frozenset[Key]:
        paths = {key_str(k): k for k in keys if isinstance(source.leaves[k], H5Leaf)}
        return frozenset(paths[p] for p in _copy_rule(source, order).streamed(paths))

    def bookkeeping(self, source: Source, removed: list[Key]) -> int:
        f: h5py.File = source.handle
        gone = {key_str(k) for k in removed}
        # The walk's names: h5py's ``name in f`` follows each link of a path in Python.
        walked = set(object_names(f))
        there = (name for name in gone if raw_name(name) in walked)
        total = sum(header_bytes(f, group=False, path=name) for name in there)
        parents = {name.rpartition("/")[0] for name in gone}
        for parent in parents - {""}:
            group = f[parent]
            emptied = all(f"{parent}/{child}" in gone for child in group)
            if emptied and not len(group.attrs):
                total += header_bytes(group, group=True)
        return total

    def create(self, path: Path, source: Source, plan: Plan) -> Sink:
        src: h5py.File = source.handle
        out = new_output(path, output_libver(src.libver, source.path))
        with closed_on_failure(out, path):
            return self._fill_structure(src, out, path, source, plan)

    def _fill_structure(
        self, src: h5py.File, out: h5py.File, path: Path, source: Source, plan: Plan
    ) -> Sink:
        copy_attrs(src, out, exclude=META_ATTR)
        rule = _copy_rule(source, plan.order)
        fd = _OUTPUT_FDS[id(out)]
        copies = _COPIES[id(out)] = RawCopies(source.path, out, fd)
        # The plan streams only what this copy leaves to the encoding pass (see streams()).
        streamed = {key_str(k): source.leaves[k].dtype for k in plan.streamed}
        _copy_tree(src, out, rule, copies, streamed, top=src)
        passed = copies.start()
        compression = plan.options.get("h5_compression")
        kwargs = compression_kwargs(compression) if compression else None
        layouts = dict((source.meta or {}).get("hdf5_layouts") or {})
        new_layouts: dict[str, Any] = {}
        groups = Groups(out)
        own = self.own_for(source)
        for key in plan.replaced:
            original = held_at(src, key_str(key))
            _keep_layout(groups, original, own)
            alloc = original.id.get_create_plist().get_alloc_time()
            new_layouts[key_str(key)] = {"maxshape": list(original.maxshape), "alloc_time": alloc}
        # By path: each is let go once made (see in_place).
        made = {
            k: self._new_dataset(src, groups, k, spec, kwargs, layouts, own).name
            for k, spec in plan.new.items()
        }
        placed = in_place(out, [(name, plan.new[k].dtype) for k, name in made.items()], fd)
        leaves: dict[Key, Any] = {
            k: leaf or H5Leaf(out[name], path)
            for (k, name), leaf in zip(made.items(), placed, strict=True)
        }
        arrays_kwargs = kwargs if kwargs is not None else _arrays_kwargs(src, plan)
        arrays = H5Arrays(out, path, arrays_kwargs, own)
        extra: dict[str, Any] = {"hdf5_layouts": new_layouts}
        if source.meta is None and own != OWN:
            extra["own"] = own
        hashers: dict[Key, Hasher] = {}
        for key in plan.streamed:
            if key_str(key) in passed:
                leaves[key], state = passed[key_str(key)]
                hashers[key] = Hasher(state=state)
        # An input opened without a chunk cache holds scale-offset datasets, and so will this.
        uncached = src.id.get_access_plist().get_cache()[2] == 0
        return Sink(
            leaves,
            arrays,
            copied=True,
            handle=out,
            extra=extra,
            streamed=hashers,
            memo={"uncached": uncached, "most_attrs": most_attrs(source.path), "own": own},
        )

    def _new_dataset(
        self,
        src: h5py.File,
        groups: Groups,
        key: Key,
        spec: LeafSpec,
        kwargs: dict[str, Any] | None,
        layouts: dict[str, Any],
        own: str,
    ) -> h5py.Dataset:
        path = key_str(key)
        parent, _, name = path.rpartition("/")
        group = groups(parent)
        dtype = h5_dtype(spec.dtype)
        if spec.replaces is not None:  # compress: a delta replacing a next-observation dataset
            original = held_at(src, key_str(spec.replaces))
            if kwargs is None:
                dcpl = dcpl_like(original.id.get_create_plist(), original.dtype == dtype)
                ds = create_dataset(group, name, dtype, spec.shape, original.maxshape, dcpl)
            else:
                # Chunks of whole rows: a filter then sees each row's values together.
                rows = original.chunks[0] if original.chunks else None
                chunks = (rows, *spec.shape[1:]) if rows else True
                ds = group.create_dataset(
                    name, shape=spec.shape, dtype=dtype, chunks=chunks, track_times=False, **kwargs
                )
        else:  # inflate: recreate the original from its recorded layout
            layout = src.get(f"{replaced_twins(own)}/{path}")
            if layout is None:
                ds = group.create_dataset(name, shape=spec.shape, dtype=dtype, track_times=False)
            else:
                recorded = layouts.get(path) or {}
                maxshape = tuple(recorded.get("maxshape") or spec.shape)
                dcpl = dcpl_like(layout.id.get_create_plist(), True)
                if recorded.get("alloc_time") in ALLOC_TIMES:
                    dcpl.set_alloc_time(recorded["alloc_time"])
                ds = create_dataset(group, name, layout.dtype, spec.shape, maxshape, dcpl)
                copy_attrs(layout, ds)
        if is_bfloat16(spec.dtype):
            ds.attrs[BF16_ATTR] = "bfloat16"
        return ds

    def discard(self, sink: Sink) -> None:
        _close_quietly(sink.handle)

    def finish(self, path: Path, sink: Sink, meta: dict[str, Any] | None) -> None:
        out = sink.handle
        with closed_on_failure(out, path):
            _copied(out)
            if meta is not None:
                write_meta(out, meta)
            finish_output(out)
        # What it holds was copied from the checked input, scale-offset datasets included.
        written_here(path, sink.memo["uncached"], sink.memo["most_attrs"])


#: The file descriptor of each output being written, by ``id`` of its h5py file.
_OUTPUT_FDS: dict[int, int] = {}
#: The raw copies still to make into each output being written, by ``id`` of its h5py file.
_COPIES: dict[int, RawCopies] = {}


def _written(sink: Sink, f: h5py.File, file: Path) -> dict[str, str]:
    """Wait for the raw copies into the output ``f`` and flush it, so that what it holds is on
    disk to be hashed; the copies' hashes by name (their blocks go to the sink's)."""
    try:
        copies = _copied(f)
        f.flush()
    except (OSError, RuntimeError) as exc:
        raise write_error(file, exc) from None
    if copies is None:
        return {}
    sink.blocks.update(copies.blocks)
    return dict(copies.digests)


def _close_opening(f: h5py.File, ahead: HashesAhead | None) -> None:
    if ahead is not None:
        ahead.cancel()
    f.close()


def _copied(out: h5py.File) -> RawCopies | None:
    """Wait for the raw copies into ``out`` (before it is hashed or closed); they hold the
    hashes of the datasets they wrote."""
    copies = _COPIES.pop(id(out), None)
    if copies is not None:
        copies.wait()
    return copies


def new_output(path: Path, libver: Any) -> h5py.File:
    """A new HDF5 output file, registered so that a failed write can close it safely; a
    failure to create it is one :class:`OutputError`."""
    try:
        out = h5_file(path, "w", libver=libver)
        _OUTPUT_FDS[id(out)] = int(out.id.get_vfd_handle())
    except (OSError, ValueError) as exc:
        raise write_error(path, exc) from None
    return out


def finish_output(out: h5py.File) -> None:
    """Flush and close an output made by :func:`new_output`, and give back the memory writing
    it held (its check opens as many objects again)."""
    out.flush()
    out.close()
    _OUTPUT_FDS.pop(id(out), None)
    give_back()


@contextlib.contextmanager
def closed_on_failure(out: h5py.File, path: Path) -> Iterator[None]:
    """Close ``out`` quietly if the block fails; a failed write becomes one
    :class:`OutputError` (the caller deletes the file)."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        _close_quietly(out)
        if isinstance(exc, RuntimeError) and not failed_write(exc):
            raise
        raise write_error(path, exc) from None
    except BaseException:
        _close_quietly(out)
        raise


def _close_quietly(f: h5py.File) -> None:
    """Close an output being abandoned after a failure (it is deleted next).

    A write that failed (full disk, file size limit, I/O error) leaves HDF5 with dirty metadata
    it tries to flush again on close; a second failure there leaves the library in a state where
    the next call touching the file crashes the process. So the file's descriptor is first
    pointed at ``/dev/null``: the flush on close then succeeds, writing nowhere.
    """
    copies = _COPIES.pop(id(f), None)
    if copies is not None:
        copies.cancel()  # its thread writes to the descriptor closed below
    # The descriptor was noted when the file was created: asking HDF5 for it now could crash.
    fd = _OUTPUT_FDS.pop(id(f), None)
    if fd is None:
        return  # closed already, or not an output
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    with contextlib.suppress(OSError, RuntimeError):
        f.close()


def _arrays_kwargs(src: h5py.File, plan: Plan) -> dict[str, Any]:
    """Exception arrays get the built-in compression of the datasets they stand in for."""
    for key in plan.replaced:
        ds = held_at(src, key_str(key))
        if ds.compression in ("gzip", "lzf"):
            return {"compression": ds.compression, "compression_opts": ds.compression_opts}
    return {}


def _is_plain(ds: h5py.Dataset) -> bool:
    """Contiguous, unfiltered, default fill, no attributes, fixed size: what ``create_dataset``
    with a shape and dtype alone makes (robomimic's default)."""
    dcpl = ds.id.get_create_plist()
    return (
        dcpl.get_layout() == h5py.h5d.CONTIGUOUS
        and dcpl.get_nfilters() == 0
        and dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_DEFAULT
        and not len(ds.attrs)
        and ds.maxshape == ds.shape
        and leaf_dtype(ds.dtype) is not None
    )


def _keep_layout(groups: Groups, original: h5py.Dataset, own: str) -> None:
    """A dataset with ``original``'s shape, dtype, creation properties and attributes that is
    never written, so it takes no storage; nothing for a plain dataset (``inflate`` recreates
    one from its shape and dtype). It has the batch shape, so readers that check every dataset
    against a batch size (``PersistentTensorDict.from_h5``) accept the file."""
    if _is_plain(original):
        return
    path = original.name.lstrip("/")
    parent, _, name = f"{replaced_twins(own)}/{path}".rpartition("/")
    copy_attrs(original, write_unstored(groups(parent), name, original))


def _copy_rule(source: Source, order: Sequence[Key]) -> CopyRule:
    """The copy's decisions for an output keeping the leaves in ``order``: worked out once, when
    the plan is made, and followed by the copy."""
    kept = set(order)
    dropped = {key_str(k) for k in source.leaves if k not in kept}
    if source.meta is not None:  # a compressed input: its own group is not copied
        dropped.add(own_of_source(source))
    rules: dict[frozenset[str], CopyRule] = source.memo.setdefault("copy_rules", {})
    frozen = frozenset(dropped)
    if frozen not in rules:
        sizes = ((key_str(k), nbytes(v)) for k, v in source.leaves.items() if isinstance(v, H5Leaf))
        rules[frozen] = CopyRule(source.handle, dropped, sizes)
    return rules[frozen]


def _copy_tree(
    src: h5py.Group,
    dst: h5py.Group,
    rule: CopyRule,
    copies: RawCopies,
    streamed: dict[str, np.dtype],
    relinks: Relinks | None = None,
    *,
    top: h5py.File,
) -> None:
    """Copy ``src`` (a group of the file ``top``) into ``dst`` except the datasets ``rule``
    drops and obsdelta's own group; large contiguous datasets through ``copies`` (those in
    ``streamed`` left to the encoding pass), everything else with HDF5's object copy; a second
    link to an object copied here links to its copy."""
    relinks = Relinks() if relinks is None else relinks
    prefix = src.name.strip("/")
    for name in src:
        # The source's objects as its walk holds them open: items() would open each again.
        path = f"{prefix}/{name}" if prefix else name
        if path == OWN or path in rule.dropped:  # obsdelta's own group, a dataset dropped
            continue
        if path in rule.small and linked_once_at(src, name):
            src.copy(name, dst, name=name)  # by name: see CopyRule
            continue
        obj = held_at(top, path)
        if relinks.relinked(obj, dst, name):
            continue
        if isinstance(obj, h5py.Group) and rule.rewritten(obj):
            if rule.emptied(obj):  # nothing of it kept: no group made (and deleted) for it
                continue
            group = h5py.Group(h5py.h5g.create(dst.id, name.encode(), gcpl=gcpl_like(obj)))
            copy_attrs(obj, group)
            _copy_tree(obj, group, rule, copies, streamed, relinks, top=top)
        elif isinstance(obj, h5py.Dataset) and rule.copied_raw(obj):
            copies.add(obj, dst, name, streamed=streamed.get(path))
        else:
            copy_object(src, obj, dst, name)


def h5_groups(group: h5py.Group) -> Iterator[tuple[str, h5py.Group]]:
    """Subgroups of ``group`` in storage order."""
    for name, obj in group.items():
        if isinstance(obj, h5py.Group):
            yield name, obj
