"""``--pack``: one HDF5 file holding a compressed dataset of any container, every dataset
filtered; and its inflate and size prediction.

``compress --pack`` compresses into a private working folder beside OUTPUT, then packs that
output (the *inner* container) into OUTPUT and verifies the packed file like any compressed
output. ``inflate`` of a packed file unpacks the inner container into a working folder and
inflates it: the original container comes back, checked by the inner container's own hashes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..atomic import (
    atomic_output,
    check_output,
    full_disk_said,
    of_dead_process,
    remove_path,
    scratch_folder,
    write_back,
)
from ..errors import ObsdeltaError, UsageError
from ..formats import FORMATS, Format, detect, disk_size
from ..formats.hdf5 import HDF5Format
from ..formats.hdf5_walk import h5_file
from ..formats.pack_flat import largest_family
from ..formats.pack_io import packed_output
from ..formats.pack_leaves import NAME
from ..formats.pack_writer import Chooser, Early
from ..formats.packing import pack, pack_into, unpack
from ..inputs import manifest_of, open_input
from ..names import PACKED_SUFFIX
from ..outputs import replaceable_by
from ..report import DatasetResult
from .common import DEFAULT_CHUNK_MB
from .verify import verify_written

#: Working folders beside OUTPUT: ``.OUTPUT.obsdelta-pack-PID``.
WORK_MARK = ".obsdelta-pack-"


def packable(how: str | None = None) -> tuple[str, ...]:
    """The registered layouts ``--pack`` takes (each says so: ``Format.pack``), those it takes
    ``how`` where given (``"leaves"``: folders of ``.memmap`` files, whose leaves go into the
    packed file as it compresses, rather than to a working copy it then packs)."""
    return tuple(name for name, cls in FORMATS.items() if cls.pack and how in (None, cls.pack))


def flattenable() -> tuple[str, ...]:
    """The registered layouts ``--pack --flat`` takes: HDF5 files (``Format.flattens``)."""
    return tuple(name for name, cls in FORMATS.items() if cls.flattens)


#: What ``compress --pack --flat`` adds to what it says.
FLAT_NOTE = "; each key's datasets of every episode stored as one (--flat)"
#: ``compress --pack`` of an HDF5 file with at least this many episodes suggests ``--flat``.
FLAT_HINT_EPISODES = 32
#: What ``compress --pack`` says it did.
PACKED = "packed into one HDF5 file, every dataset filtered"
#: ... of an input with no next observations to remove (Minari, D4RL AntMaze).
ONLY_FILTERED = (
    f"{PACKED}; no next observations were removed (each observation is stored once already)"
)


def _work_dir(output: Path) -> Path:
    """A fresh working folder beside ``output``; those of dead runs are removed first."""
    for old in output.parent.glob(f".{output.name}{WORK_MARK}*"):
        if of_dead_process(old):
            remove_path(old)
    work = output.parent / f".{output.name}{WORK_MARK}{os.getpid()}"
    remove_path(work)
    work.mkdir()
    return work


def _with_working_copy(original: int) -> int:
    """Bytes ``--pack`` and the inflate of a packed file need at most, for a dataset of
    ``original`` bytes: the working copy (the inner container) and the output, each at most
    the original plus 5% (see :func:`..outputs.estimate_output_bytes`)."""
    return int(original * 2.1) + (1 << 20)


def _inner_name(input: Path) -> str:
    return "inner" + (input.suffix if input.is_file() else "")


def _check_packable(input: Path, flat: bool = False) -> Format:
    fmt = detect(input)
    name = fmt.name
    if not fmt.pack and fmt.nothing_to_do:
        fmt.open(input)  # a layout recognised only to say why: its reason, as its error
    if not fmt.pack:
        raise UsageError(
            f"--pack does not take {name} inputs",
            file=input,
            hint=f"--pack takes {', '.join(packable())}",
        )
    if flat and not fmt.flattens:
        raise UsageError(
            f"--flat does not take {name} inputs: it stores the datasets of an HDF5 file's "
            "episodes together",
            file=input,
            hint=f"drop --flat; it takes {', '.join(flattenable())}",
        )
    return fmt


def flat_hint(input: Path, fmt: Format) -> str:
    """What ``--pack`` without ``--flat`` adds to what it says of ``input`` (in format
    ``fmt``): that ``--flat`` exists, and what it costs (the dataset's own library cannot read
    its output), for an HDF5 file of :data:`FLAT_HINT_EPISODES` episodes or more (counted
    from its paths; nothing is measured)."""
    if not fmt.flattens:
        return ""
    with h5_file(input) as f:
        episodes = largest_family(f)
    if episodes < FLAT_HINT_EPISODES:
        return ""
    return (
        f"; --flat would store the datasets of its {episodes:,} episodes together, which packs "
        "files of many episodes smaller (report --pack --flat predicts it), in a file only "
        "obsdelta reads: robomimic's and Minari's own readers do not"
    )


def compress_packed(
    input: Path,
    output: Path,
    *,
    compress: Callable[..., DatasetResult],
    force: bool = False,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    verify: bool = True,
    flat: bool = False,
    **options: Any,
) -> DatasetResult:
    """``compress`` into one packed HDF5 file ``output`` (``options`` as for ``compress``);
    ``flat``: each key's datasets of every episode as one dataset (:mod:`..formats.pack_flat`).
    ``compress`` writes the inner container: the command's own function, handed in by it, as
    this module sits below the commands that use it."""
    input, output = Path(input), Path(output)
    layout = _check_packable(input, flat)
    check_output(output, input, force=force)  # refuse early, before any work
    with (
        full_disk_said(output, lambda: _with_working_copy(disk_size(input))),
        atomic_output(output, source=input, force=force, replaceable=replaceable_by(NAME)) as tmp,
    ):
        work = _work_dir(output)
        try:
            inner = work / _inner_name(input)
            with packed_output(tmp) as f:
                chooser = Chooser()
                # A folder's leaves kept unchanged go straight into the packed file as the
                # inner container is written, encoded while the input is read.
                early = Early(f, chooser) if layout.pack == "leaves" else None
                # Not verified here: the packed file is verified as a whole below. Nor flushed
                # to disk: it is read back at once from memory and deleted.
                with scratch_folder(work):
                    result = compress(
                        input, inner, chunk_mb=chunk_mb, verify=False, copy_if_nothing=True,
                        divert=early, **options,
                    )  # fmt: skip
                fmt, source = open_input(inner)
                try:
                    written = None if early is None else early.entries()
                    pack_into(f, source, fmt.name, manifest_of(source), chooser, flat=flat,
                              early=written)  # fmt: skip
                finally:
                    fmt.close(source)
        except BaseException:
            remove_path(work)
            raise
        # Deleting the working folder (the kernel freeing its pages: 0.05-0.08 s for the 290 MB
        # of a 500 MB D4RL file's) overlaps the verification.
        removing = threading.Thread(target=remove_path, args=(work,), name="obsdelta-remove")
        removing.start()
        try:
            writing = write_back(tmp)  # to disk while it is verified
            if verify:
                verify_written(tmp, chunk_mb)
            writing.join()
        finally:
            removing.join()
    note = PACKED if result.keys else ONLY_FILTERED
    note += FLAT_NOTE if flat else flat_hint(input, layout)
    return replace(result, output=str(output), bytes_after=disk_size(output), note=note)


def unpacked_name(name: str, container: str | None) -> str:
    """The name of the original container unpacked from the packed file ``name``, in a folder
    of outputs: the ``.h5`` a folder of packed files added to a name (see
    :func:`..batch.packed_name`) goes again, unless the original is an HDF5 file.

    >>> unpacked_name("hopper_ted.h5", "ted-memmap"), unpacked_name("a.pt.h5", "ted-pt")
    ('hopper_ted', 'a.pt')
    >>> unpacked_name("hopper.h5", "d4rl-hdf5"), unpacked_name("b.hdf5", "ted-memmap")
    ('hopper.h5', 'b.hdf5')
    """
    original = FORMATS.get(container or "")
    hdf5 = original is not None and issubclass(original, HDF5Format)
    if hdf5 or not name.endswith(PACKED_SUFFIX) or name == PACKED_SUFFIX:
        return name
    return name.removesuffix(PACKED_SUFFIX)


def inflate_packed(
    input: Path,
    output: Path,
    *,
    inflate: Callable[..., DatasetResult],
    force: bool = False,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    named_after_input: bool = False,
) -> DatasetResult:
    """``inflate`` a packed file: the original container, in its own format, at ``output``
    (with ``named_after_input``, at its :func:`unpacked_name` beside ``output``); ``inflate``
    (the command's own function) inflates the unpacked inner container."""
    input, output = Path(input), Path(output)
    # The objects unpacking copies whole are checked before they are copied (begun here).
    fmt, source = open_input(input, checking="objects")
    opened = True
    try:
        manifest = manifest_of(source)
        if named_after_input:
            output = output.with_name(unpacked_name(output.name, manifest.source_container))
        check_output(output, input, force=force)
        original = manifest.source_bytes or disk_size(input)
        with full_disk_said(output, lambda: _with_working_copy(original)):
            work = _work_dir(output)
            try:
                inner = work / "inner"
                unpack(source, manifest, inner)
                opened = False
                fmt.close(source)
                # The inner container's own checks (every leaf, raw chunk, file and attribute
                # as recorded at compress time) run as it is inflated.
                result = inflate(inner, output, force=force, chunk_mb=chunk_mb)
            finally:
                remove_path(work)
    except ObsdeltaError as exc:
        exc.output = output  # the batch reports where it was to go
        raise
    finally:
        if opened:
            fmt.close(source)
    return replace(result, input=str(input), bytes_before=disk_size(input), format=NAME)


def predict_packed(
    input: Path,
    *,
    compress: Callable[..., DatasetResult],
    chunk_mb: float = DEFAULT_CHUNK_MB,
    flat: bool = False,
    **options: Any,
) -> int:
    """Bytes ``compress --pack`` would write for ``input``: the compressed dataset is written to
    a working folder by ``compress`` (the command's function), then packed with only a sample
    of each dataset's chunks, the size of the others extrapolated."""
    input = Path(input)
    _check_packable(input, flat)
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"obsdelta-report-{os.getpid()}"
    work = _work_dir(probe)
    try:
        inner = work / _inner_name(input)
        with scratch_folder(work):
            compress(input, inner, chunk_mb=chunk_mb, verify=False, copy_if_nothing=True, **options)
        fmt, source = open_input(inner)
        try:
            probe = work / "probe.h5"
            chooser = Chooser(sample=True)
            return pack(source, fmt.name, manifest_of(source), probe, chooser, flat=flat)
        finally:
            fmt.close(source)
    finally:
        remove_path(work)
