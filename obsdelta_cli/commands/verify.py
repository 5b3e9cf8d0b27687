"""``verify``: re-read a compressed dataset and check everything it stores against its
manifest, rebuilding every key as ``inflate`` would."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ..checksum import Hasher
from ..errors import DataError, ObsdeltaError
from ..formats import Format, Key, Source, detect, disk_size, key_str
from ..formats.hdf5_objects import is_replaced_twin
from ..formats.hdf5_walk import OWN
from ..inputs import check_leaves, manifest_of, open_detected, open_input, stream_for
from ..manifest import HASH_ALGORITHM, Manifest
from ..rebuild import StoredPair, stored_pairs
from ..report import DatasetResult
from ..stream import Geometry, Stream, ahead, beside
from .common import DEFAULT_CHUNK_MB, one_thread, original_size, recorded_results


def mismatch(file: Path, key: str, what: str, recorded: str, found: str | None) -> DataError:
    return DataError(
        f"checksum mismatch in the {what} (recorded {recorded}, found {found})",
        file=file,
        key=key,
        hint="the compressed dataset is damaged; restore it from a copy or compress again",
    )


def expect_leaf(manifest: Manifest, key: Key, found: str | None, file: Path) -> None:
    """Compare a copied leaf's hash with the one recorded at compress time, if any."""
    expected = manifest.checksums.get(key_str(key))
    if expected is not None and found != expected:
        raise mismatch(file, key_str(key), "copied data", expected, found)


def expect(s: StoredPair, name: str, hasher: Hasher, file: Path, leaf: str | None = None) -> None:
    """Compare a hash with the one recorded for ``s`` (older files may lack some)."""
    recorded = s.record.hashes.get(name)
    if recorded is not None and recorded != hasher.hex:
        what = {"rebuilt": "rebuilt next observations", "next": "original next observations"}
        raise mismatch(
            file, leaf or s.record.name, what.get(name, "stored data"), recorded, hasher.hex
        )


def check_pair(
    source: Source,
    stream: Stream,
    s: StoredPair,
    algorithm: str,
    observations: str | None = None,
) -> None:
    """Re-read everything stored for a pair and compare it with the recorded hashes;
    ``observations``: the recorded hash of the observation leaf, to check from the same
    reads (every row is then valid)."""
    path, pair = source.path, s.pair
    rebuild = s.rebuild(source, stream)
    valid = rebuild.geometry.valid
    if rebuild.exceptions is not None:  # first: the rebuild below patches them in
        for name, array in (
            ("index", rebuild.exceptions.index),
            ("rows", rebuild.exceptions.rows()),
        ):
            check = Hasher(algorithm)
            check.update(array)
            expect(s, name, check, path, leaf=f"exception {name} of {pair.name}")
    # The stored leaf is hashed from the reads that rebuild the rows (one pass over it), and
    # checked before them, as a damaged stored leaf explains a wrong rebuild.
    hasher, stored_hasher, obs_hasher = Hasher(algorithm), Hasher(algorithm), Hasher(algorithm)
    slices = stream.chunks([rebuild.obs], valid, rebuild.geometry.align)
    for _sl, parts in ahead(slices, rebuild.parts):
        if parts.stored is not None:
            stored_hasher.update(parts.stored)
        if observations is not None:
            obs_hasher.update(parts.obs)
        hasher.update(parts.rebuilt)
    if observations is not None and obs_hasher.hex != observations:
        # First: damaged observations explain a wrong rebuild.
        raise mismatch(path, key_str(pair.obs_key), "copied data", observations, obs_hasher.hex)
    if rebuild.delta is not None:
        expect(s, "stored", stored_hasher, path, leaf=key_str(pair.delta_key))
    expect(s, "rebuilt", hasher, path)
    if s.record.lossless:
        expect(s, "next", hasher, path)


def object_skip(deltas: set[str], kept: Callable[[str], bool]) -> Callable[[str], bool]:
    """Which objects of a compressed container are not copies: the stored leaves, and the
    groups made for them (a parent of a stored leaf that ``kept`` does not name)."""

    # Every group above a stored leaf, looked up in a set: a robomimic file of 1,000 demos has
    # 21,000 objects and, with a delta codec, 7,000 stored leaves.
    above = {d.rsplit("/", n)[0] for d in deltas for n in range(1, d.count("/") + 1)}

    def skip(name: str) -> bool:
        return name in deltas or (name in above and not kept(name))

    return skip


def check_objects(
    fmt: Format, source: Source, manifest: Manifest, later: frozenset[str] = frozenset()
) -> None:
    """The container's objects copied unchanged (HDF5) are the ones recorded, as stored; the
    values of the datasets named in ``later`` are not read here: the caller checks them as it
    copies them (their attributes are checked here)."""
    deltas = {key_str(k) for k in (r.delta_key for r in manifest.keys) if k is not None}
    known = {name: manifest.objects[name] for name in later if name in manifest.objects}
    skip = object_skip(deltas, lambda n: f"@{n}" in manifest.objects)
    hashes = fmt.object_hashes(source, skip, known, manifest.objects)
    own = manifest.extra.get("own", OWN)
    if not any(is_replaced_twin(name, own) for name in manifest.objects):
        # Written before the twins were hashed (the manifest's own hash says it was so).
        hashes = {name: h for name, h in hashes.items() if not is_replaced_twin(name, own)}
    differing = manifest.object_differing(hashes)
    if differing is not None:
        name, recorded, seen = differing
        what = "an object the metadata does not list" if recorded is None else "copied data"
        if seen is None:
            what = "an object the metadata lists, now missing,"
        raise mismatch(source.path, name, what, recorded or "none", seen)


def check_dataset(
    fmt: Format, source: Source, manifest: Manifest, chunk_mb: float
) -> list[StoredPair]:
    """Check every recorded hash of a compressed source; raise on the first bad leaf."""
    stored = stored_pairs(source, manifest)
    check_leaves(source, manifest)
    stream = stream_for(source, manifest.time_dim, chunk_mb)
    # Observations that cannot be hashed as stored (a packed file's, decoded as they are read)
    # or are not in memory are hashed from the reads that rebuild the next observations, not
    # read a second time, where every row is valid: against their leaf checksum, or the hash
    # of values that stands for their object. Those of a file in memory are not: that pass
    # reads the page cache at memory speed and runs beside the rebuild.
    values = fmt.value_hashes(source) if manifest.hash_algorithm == HASH_ALGORITHM else {}
    expected = {**values, **manifest.checksums}
    fused: dict[str, str] = {}
    for pair in (s.pair for s in stored):
        name, leaf = key_str(pair.obs_key), source.leaves[pair.obs_key]
        in_memory = getattr(leaf, "in_memory", None)
        apart = in_memory is not None and in_memory()
        if name in expected and not apart and _all_valid(stream.geometry(leaf)):
            fused[name] = expected[name]
    if manifest.version >= 2:
        check_objects(fmt, source, manifest, later=frozenset(fused.keys() & values.keys()))
    hashed: list[tuple[Key, Any]] = []
    for name in manifest.checksums:
        key = tuple(name.split("/"))
        leaf = source.leaves.get(key)
        if leaf is None:
            raise DataError(
                "leaf named in the metadata is missing",
                file=source.path,
                key=name,
                hint="the compressed dataset is damaged or was edited",
            )
        if name not in fused:
            hashed.append((key, leaf))

    def hash_leaf(key: Key, leaf: Any) -> None:
        found = stream.copy(leaf, None, manifest.hash_algorithm)
        expect_leaf(manifest, key, found, source.path)

    with beside(partial(hash_leaf, key, leaf) for key, leaf in hashed):
        for s in stored:
            obs = key_str(s.pair.obs_key)
            check_pair(source, stream, s, manifest.hash_algorithm, fused.get(obs))
    return stored


def _all_valid(geometry: Geometry) -> bool:
    return geometry.valid == geometry.total


@one_thread
def verify(input: Path, *, chunk_mb: float = DEFAULT_CHUNK_MB) -> DatasetResult:
    """Re-read a compressed dataset and check its manifest and every recorded hash,
    rebuilding the next observations as ``inflate`` would. Raises on the first bad leaf."""
    input = Path(input)
    fmt, source = open_input(input, checking="objects")
    try:
        manifest = manifest_of(source)
        stored = check_dataset(fmt, source, manifest, chunk_mb)
        keys = recorded_results(source, stored, restored=False)
    finally:
        fmt.close(source)
    size = disk_size(input)
    return DatasetResult(
        "verify", str(input), None, fmt.name, True, original_size(manifest, size, keys), size, keys
    )


def verify_written(path: Path, chunk_mb: float) -> None:
    """Check a freshly written output before it is renamed into place."""
    fmt = detect(path)
    source = open_detected(fmt, path, checking="objects")
    try:
        check_dataset(fmt, source, manifest_of(source), chunk_mb)
    except ObsdeltaError as exc:
        raise DataError(
            f"the output failed verification before it was put in place: {exc.message}",
            file=path,
            key=exc.key,
            hint="nothing was written; please report this",
        ) from None
    finally:
        fmt.close(source)
