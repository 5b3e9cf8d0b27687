"""``report``: sizes and errors without writing anything."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..codecs import AUTO, CODECS, DEFAULT_CODEC, make_codec
from ..errors import UsageError
from ..formats import Source, detect, disk_size, key_str
from ..formats.hdf5_leaves import H5Leaf
from ..formats.hdf5_meta import own_of_source
from ..formats.hdf5_walk import owned
from ..inputs import manifest_of, open_detected, stream_for
from ..rebuild import stored_pairs
from ..report import DatasetResult, KeyResult
from ..selection import KeyGroup, candidates, check_time_dim, pairs_of
from .common import DEFAULT_CHUNK_MB, check_bound, one_thread, original_size, recorded_results
from .compress import auto_pick, key_result, measure_key, write_compressed


@one_thread
def report(
    input: Path,
    *,
    codec: str = DEFAULT_CODEC,
    keys: Sequence[str] | None = None,
    max_abs_error: float | None = None,
    time_dim: int = -1,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    pack: bool = False,
    flat: bool = False,
) -> DatasetResult:
    """Measure without writing.

    On a plain input: every codec on every key (a dry run), with what ``--codec auto`` would
    pick under ``max_abs_error`` marked. On a compressed input: the original and the stored
    size, and the error measured when it was written. With ``pack``, the size after of a
    plain input is what ``compress --pack`` would write, predicted from a sample of chunks
    (``flat``: ``compress --pack --flat``).
    """
    input = Path(input)
    if flat and not pack:
        raise UsageError("--flat needs --pack", hint="add --pack")
    check_bound(max_abs_error)
    if codec != AUTO:
        make_codec(codec, max_abs_error)  # refuse what compress would refuse
    fmt = detect(input)
    size = disk_size(input)
    if fmt.nothing_to_do and not pack:  # said before the file is walked for its leaves
        return DatasetResult(
            "report", str(input), None, fmt.name, False, size, size, note=fmt.nothing_to_do
        )
    source = open_detected(fmt, input)
    try:
        if source.meta is not None:
            manifest = manifest_of(source)
            stored = stored_pairs(source, manifest)
            results = recorded_results(source, stored, restored=False)
            before = original_size(manifest, size, results)
            note = packed_reads_note(source)
            return DatasetResult(
                "report", str(input), None, fmt.name, True, before, size, results, note=note
            )
        slow = packed_reads_note(source)
        time_dim = check_time_dim(source, time_dim)
        bound = (max_abs_error or 0.0) if codec == AUTO else max_abs_error
        # A dry run shows every codec: lossy ones too, even when the default is lossless.
        shown = bound if bound else None

        def supports(dtype: object) -> bool:
            return bool(candidates(dtype, shown))  # type: ignore[arg-type]

        # The codec marked is lossless: every pair with a shifted twin comes back bit for bit.
        marked_lossless = not bound and (codec == AUTO or CODECS[codec].lossless)
        pairs = pairs_of(fmt, source, keys, supports, none_ok=pack, with_twins=marked_lossless)
        stream = stream_for(source, time_dim, chunk_mb)
        results = []
        picks: dict[str, str] = {}
        groups = KeyGroup.group(source, pairs)
        for key in groups:
            _codecs, cands, totals = measure_key(stream, source, key, shown)
            lossless = [c for c in cands if CODECS[c.codec].lossless] if not bound else cands
            pick = auto_pick(lossless, key.raw_bytes) or "none"
            want = pick if codec == AUTO else codec
            picks[key.name] = want
            chosen = next((i for i, c in enumerate(cands) if c.codec == want), None)
            picked = None if chosen is None else cands[chosen]
            results.append(
                key_result(
                    key,
                    want,
                    None if chosen is None else totals[chosen],
                    key.raw_bytes if picked is None else picked.bytes_after,
                    lossless=want == "none" or want == "exact" or bound == 0,
                    max_abs_error_bound=bound,
                    candidates=cands,
                    auto_pick=pick,
                )
            )
        removed = [p.next_key for p in pairs if picks.get(p.name, "none") != "none"]
        saved = sum(_saved_on_disk(source, key, k) for key, k in zip(groups, results, strict=True))
        saved += fmt.bookkeeping(source, removed)
    finally:
        fmt.close(source)
    result = DatasetResult(
        "report", str(input), None, fmt.name, False, size, size - saved, results, note=slow
    )
    if pack:
        from .pack import flat_hint, predict_packed

        predicted = predict_packed(
            input, compress=write_compressed, codec=codec, keys=keys, max_abs_error=max_abs_error,
            time_dim=time_dim, chunk_mb=chunk_mb, flat=flat,
        )  # fmt: skip
        note = "--pack: the size after is predicted from a sample of each key's chunks"
        note += "" if flat else flat_hint(Path(input), fmt)
        return replace(result, bytes_after=predicted, note=note)
    return result


def packed_reads_note(source: Source) -> str | None:
    """One line saying that training reads would be faster from ``compress --pack`` output,
    where the file's datasets are filtered in chunks that make random rows slow to read."""
    slow: dict[str, list[str]] = {}
    for key, leaf in source.leaves.items():
        why = leaf.slow_random_rows() if isinstance(leaf, H5Leaf) else None
        if why is not None and not owned(key_str(key), own_of_source(source)):
            slow.setdefault(why, []).append(key_str(key))
    if not slow:
        return None
    why, names = max(slow.items(), key=lambda item: len(item[1]))
    names.sort(key=lambda n: (not n.startswith("observations"), n))
    shown = names[0] + (f" +{len(names) - 1}" if len(names) > 1 else "")
    return f"faster to train with --pack: {shown} filtered in chunks of {why}"


def _saved_on_disk(source: Source, key: KeyGroup, result: KeyResult) -> int:
    """Bytes a key frees on disk: its next observations as stored (after the container's
    filters, where it can tell), less what replaces them, filtered alike."""
    stored = [
        getattr(source.leaves[p.next_key], "storage_bytes", lambda: None)() for p in key.pairs
    ]
    if not all(isinstance(b, int) for b in stored):
        return result.bytes_before - result.bytes_after
    on_disk = sum(b for b in stored if b is not None)
    ratio = on_disk / max(1, result.bytes_before)
    return on_disk - round(result.bytes_after * ratio)
