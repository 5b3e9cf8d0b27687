"""``inflate``: rebuild every next observation in its original dtype, shape and key order."""

from __future__ import annotations

from pathlib import Path

from ..blocks import block_check
from ..checksum import Hasher
from ..errors import InputError
from ..formats import Key, LeafSpec, Plan, Sink, disk_size, key_str
from ..formats.pack_leaves import is_packed
from ..inputs import check_leaves, manifest_of, open_input, stream_for
from ..rebuild import StoredPair, stored_pairs
from ..report import DatasetResult
from ..stream import ahead
from .common import DEFAULT_CHUNK_MB, one_thread, recorded_results, streamed_observations, write
from .verify import check_objects, expect, expect_leaf, mismatch


@one_thread
def inflate(
    input: Path,
    output: Path,
    *,
    force: bool = False,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    named_after_input: bool = False,
) -> DatasetResult:
    """Write ``output``: ``input`` with every next observation rebuilt in its dtype and order.
    Every byte read is checked against the manifest's hashes as it passes; on a mismatch
    nothing is left behind. ``named_after_input``: ``output`` is the input's name in a folder
    of outputs, so that of a packed file loses the ``.h5`` a folder of packed files gave it
    (see :func:`..pack.inflate_packed`)."""
    input, output = Path(input), Path(output)
    if is_packed(input):
        from .pack import inflate_packed

        return inflate_packed(
            input, output, inflate=inflate, force=force, chunk_mb=chunk_mb,
            named_after_input=named_after_input,
        )  # fmt: skip
    fmt, source = open_input(input, checking="objects-but-observations")
    try:
        manifest = manifest_of(source)
        stored = stored_pairs(source, manifest)
        check_leaves(source, manifest)
        stream = stream_for(source, manifest.time_dim, chunk_mb)
        rebuilt = {s.pair.next_key: s for s in stored}
        dropped = {s.pair.delta_key for s in stored}
        order = list(manifest.leaf_order)
        listed = set(order)  # a robomimic file of 1,000 demos has 18,000 leaves
        order += [k for k in source.leaves if k not in listed and k not in dropped]
        new: dict[Key, LeafSpec] = {}
        for key in order:
            if key in rebuilt:
                s = rebuilt[key]
                new[key] = LeafSpec(tuple(source.leaves[s.pair.obs_key].shape), s.dtype)
            elif key not in source.leaves:
                raise InputError(
                    f"leaf {key_str(key)} named in the metadata is missing",
                    file=input,
                    hint="the file is damaged or was edited",
                )
        streamed = streamed_observations(fmt, source, stream, [s.pair for s in stored], order, new)
        plan = Plan(order, new, options=dict(manifest.options), streamed=streamed)

        if manifest.version >= 2:
            # What the container copies whole is checked before anything is copied: HDF5 can
            # crash on a damaged object it is asked to copy. The values of observations the
            # rebuild pass copies (raw bytes, never through HDF5) are checked as they pass.
            check_objects(fmt, source, manifest, later=frozenset(map(key_str, streamed)))

        def fill(sink: Sink) -> None:
            for key in order:
                if key in rebuilt:
                    _rebuild_into(rebuilt[key], sink, manifest.hash_algorithm)
                elif not sink.copied:
                    # Each block is checked as it is read, as training reads check it: damage
                    # stops the pass at once, naming its rows; the leaf's hash covers the rest.
                    check = block_check(source, manifest, key)
                    found = stream.copy(
                        source.leaves[key], sink.leaves[key], manifest.hash_algorithm, check
                    )
                    expect_leaf(manifest, key, found, input)

        def _rebuild_into(s: StoredPair, sink: Sink, algorithm: str) -> None:
            rebuild = s.rebuild(source, stream)
            dst = stream.flat(sink.leaves[s.pair.next_key])
            hasher = Hasher(algorithm)
            g = rebuild.geometry
            # Observations the container left to this pass: written as they are read, and
            # their object hash (the dataset as created like the input's, then the values
            # read) compared with the recorded one at the end.
            obs_key = s.pair.obs_key
            copying = None
            if obs_key in sink.streamed:
                copying = (stream.flat(sink.leaves[obs_key]), sink.streamed[obs_key])
            checks = [block_check(source, manifest, s.pair.obs_key)]
            checks.append(
                block_check(source, manifest, s.pair.delta_key) if s.pair.delta_key else None
            )
            slices = stream.chunks([rebuild.obs, dst], g.total, g.align)
            for sl, parts in ahead(slices, rebuild.parts):
                for check, rows in zip(checks, (parts.obs, parts.stored), strict=True):
                    if check is not None and rows is not None:
                        check.update(rows)
                dst[sl] = parts.rebuilt
                if copying is not None:
                    copying[0][sl] = parts.obs
                    copying[1].update(parts.obs)
                if sl.start < g.valid:
                    hasher.update(parts.rebuilt[: g.valid - sl.start])
            if copying is not None:  # first: damaged observations explain a wrong rebuild
                recorded, found = manifest.objects.get(key_str(obs_key)), copying[1].hex
                if recorded is not None and recorded != found:
                    raise mismatch(input, key_str(obs_key), "copied data", recorded, found)
            expect(s, "rebuilt", hasher, input)

        write(fmt, source, output, plan, fill, force)
        keys = recorded_results(source, stored, restored=True)
    finally:
        fmt.close(source)
    return DatasetResult(
        command="inflate",
        input=str(input),
        output=str(output),
        format=fmt.name,
        compressed=False,
        bytes_before=disk_size(input),
        bytes_after=disk_size(output),
        keys=keys,
    )
