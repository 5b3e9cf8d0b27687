"""What the commands share: opening an input, reading its manifest, writing an output
atomically, and turning a manifest into per-key results."""

from __future__ import annotations

import functools
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from .. import arrays
from ..arrays import dtype_name, dtype_of
from ..atomic import atomic_output, no_space, write_back
from ..errors import (
    NoSpaceError,
    ObsdeltaError,
    UsageError,
    out_of_space,
    write_error,
)
from ..formats import Format, Key, LeafSpec, Pair, Plan, Sink, Source
from ..formats.base import close_leaves
from ..formats.leaf import is_data
from ..manifest import Manifest
from ..outputs import estimate_output_bytes, replaceable_by
from ..rebuild import StoredPair
from ..report import KeyResult
from ..selection import INDEX_BYTES
from ..stream import Stream

#: Cache-sized chunks: each chunk goes through several passes (encode, decode, checks, hashes)
#: while it is still in cache. Measured fastest here at 0.5-1 MiB.
DEFAULT_CHUNK_MB = 1
# torch and tensordict (.pt files) report failed writes (disk full, no permission, file too
# large) as RuntimeError; those messages name a file, an open, a resize or a position.
_IO_FAILURE = re.compile(r"file|open|resize|unexpected pos|write|space|permi", re.IGNORECASE)

P = ParamSpec("P")
R = TypeVar("R")


def one_thread(command: Callable[P, R]) -> Callable[P, R]:
    """Run a command with one torch thread, if a codec imports torch (for its casts): on
    chunks of a MiB, starting a parallel region for every operation costs more than it saves
    (measured: 25x slower with two threads here)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        before = arrays.torch_threads
        torch = sys.modules.get("torch")
        threads = None if torch is None else torch.get_num_threads()
        arrays.torch_threads = 1
        if torch is not None:
            torch.set_num_threads(1)
        try:
            return command(*args, **kwargs)
        finally:
            arrays.torch_threads = before
            torch = sys.modules.get("torch")
            if torch is not None:
                # The caller's count: the share it was given (a --jobs worker's), else torch's
                # own as it was, or as torch chose on import if a codec imported it meanwhile.
                restored = threads if threads is not None else arrays.torch_default_threads
                torch.set_num_threads(before or restored or torch.get_num_threads())

    return run


def check_bound(max_abs_error: float | None) -> None:
    if max_abs_error is not None and not (max_abs_error >= 0 and math.isfinite(max_abs_error)):
        raise UsageError(f"--max-abs-error must be a finite number >= 0, got {max_abs_error}")


def write(
    fmt: Format,
    source: Source,
    output: Path,
    plan: Plan,
    fill: Callable[[Sink], dict[str, Any] | None],
    force: bool,
    check: Callable[[Path], None] | None = None,
) -> None:
    """Create ``output`` as ``plan`` says, atomically; ``fill`` writes it and returns the meta,
    ``check`` re-reads it before it is renamed into place, ``source`` closed by then."""
    expected = estimate_output_bytes(source, plan)
    try:
        with atomic_output(
            output,
            source=source.path,
            force=force,
            expected_bytes=expected,
            # --force replaces only what obsdelta could have written
            replaceable=replaceable_by(fmt.name),
        ) as tmp:
            sink = fmt.create(tmp, source, plan)
            sink.path = tmp
            try:
                meta = fill(sink)
                fmt.finish(tmp, sink, meta)
            except BaseException:
                fmt.discard(sink)
                raise
            finally:
                close_leaves(sink.leaves)
            writing = write_back(tmp)  # to disk while it is verified
            if check is not None:
                # Nothing reads the input any more: HDF5 holds about 13 KB for each open
                # dataset, and the re-read opens as many again.
                fmt.close(source)
                check(tmp)
            writing.join()
    except ObsdeltaError as exc:
        if isinstance(exc, NoSpaceError):  # the temporary is gone: say how much to free
            raise no_space(output, expected) from None
        raise
    except (OSError, RuntimeError) as exc:
        text = str(exc)
        if isinstance(exc, RuntimeError) and not _IO_FAILURE.search(text):
            raise
        if out_of_space(exc):
            raise no_space(output, expected) from None
        raise write_error(getattr(exc, "filename", None) or output, exc) from None


def _stored_bytes(
    source: Source, s: StoredPair, rows: int, features: int, counted: set[str]
) -> int:
    """Bytes a stored pair takes: on disk where the container tells (HDF5, after its filters),
    else its values (the stored leaf, exception rows and their index). Exception arrays shared
    by several pairs count once, with the first pair (``counted`` holds those seen)."""
    r = s.record
    leaf = source.leaves.get(s.pair.delta_key) if r.delta_key else None
    on_disk = [] if leaf is None else [getattr(leaf, "storage_bytes", lambda: None)()]
    shared = [] if r.arrays is None else [r.arrays.index, r.arrays.rows]
    if shared and source.arrays is not None:
        on_disk += [source.arrays.storage_bytes(n) if n not in counted else 0 for n in shared]
    counted.update(shared)
    if on_disk and all(b is not None for b in on_disk):
        return sum(b for b in on_disk if b is not None)
    small = r.exception_rows * (INDEX_BYTES + features * s.dtype.itemsize)
    if r.stored_dtype:
        small += rows * features * dtype_of(r.stored_dtype).itemsize
    return small


def recorded_results(
    source: Source, stored: Sequence[StoredPair], *, restored: bool
) -> list[KeyResult]:
    """Per key name, what the manifest recorded at compress time (figures of several parts of
    one name, robomimic's demos, folded together)."""
    out: dict[str, KeyResult] = {}
    sums: dict[str, list[float]] = {}
    counted: set[str] = set()
    for s in stored:
        r = s.record
        obs = source.leaves[s.pair.obs_key]
        rows = math.prod(obs.shape[: source.batch_dims])
        features = list(obs.shape[source.batch_dims :])
        raw = rows * math.prod(features) * s.dtype.itemsize
        small = _stored_bytes(source, s, rows, math.prod(features), counted)
        before, after = (small, raw) if restored else (raw, small)
        sums.setdefault(r.name, []).append(r.error.rmse**2 * r.rows * math.prod(features))
        k = out.get(r.name)
        if k is None:
            out[r.name] = KeyResult(
                key=r.name,
                codec=s.codec.id,
                dtype=dtype_name(s.dtype),
                shape=[rows, *features],
                bytes_before=before,
                bytes_after=after,
                max_abs_error=r.error.max_abs,
                rmse=r.error.rmse,
                max_rel_error=r.error.max_rel,
                rows=r.rows,
                exact_rows=r.exact_rows,
                exception_rows=r.exception_rows,
                stored_dtype=r.stored_dtype,
                delta_key="/".join(r.delta_key) if r.delta_key else None,
                max_abs_error_bound=r.bound,
                lossless=r.lossless,
            )
            continue
        k.shape[0] += rows
        k.bytes_before += before
        k.bytes_after += after
        k.max_abs_error = max(k.max_abs_error or 0.0, r.error.max_abs)
        k.max_rel_error = max(k.max_rel_error or 0.0, r.error.max_rel)
        k.rows += r.rows
        k.exact_rows += r.exact_rows
        k.exception_rows += r.exception_rows
        k.lossless = bool(k.lossless) and r.lossless
        count = k.rows * math.prod(k.shape[1:])
        k.rmse = math.sqrt(math.fsum(sums[r.name]) / count) if count else 0.0
    return list(out.values())


def original_size(manifest: Manifest, size: int, keys: Sequence[KeyResult]) -> int:
    """Bytes the plain dataset had: as recorded, else (format 1) from the compressed size and
    the per-key figures."""
    if manifest.source_bytes is not None:
        return manifest.source_bytes
    return size + sum(k.bytes_before - k.bytes_after for k in keys)


def streamed_observations(
    fmt: Format,
    source: Source,
    stream: Stream,
    pairs: Sequence[Pair],
    order: Sequence[Key],
    new: Mapping[Key, LeafSpec],
) -> frozenset[Key]:
    """Observation leaves copied during the pass over ``pairs``, which reads them anyway,
    rather than read twice: those of exactly one pair, kept unchanged, with every row valid
    (the pass covers valid rows only), and not copied whole by the container itself."""
    uses = Counter(p.obs_key for p in pairs)
    ordered = set(order)  # a robomimic file of 1,000 demos has 7,000 pairs and 18,000 leaves
    streamed = set()
    for p in pairs:
        leaf = source.leaves[p.obs_key]
        geometry = stream.geometry(leaf)
        if (
            uses[p.obs_key] == 1
            and p.obs_key in ordered
            and p.obs_key not in new
            and is_data(leaf)
            and geometry.valid == geometry.total
        ):
            streamed.add(p.obs_key)
    return fmt.streams(source, frozenset(streamed), order)
