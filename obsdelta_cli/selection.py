"""Which leaves pair up, and which are left alone.

A format adapter lists the pairs its layout defines (TED: root ``k`` with ``("next", k)``;
D4RL: ``observations`` with ``next_observations``; robomimic: ``obs/<name>`` with
``next_obs/<name>`` in each demo). Here they are filtered. Rewards, ``info``/``infos`` and
actions have ``next`` twins in some layouts (TorchRL's offline caches) but are not
observations: a lossy codec rewrites observation pairs only, unless ``--key`` names more, while
a lossless one also takes every other pair whose next leaf is a shifted copy of its leaf
(:func:`shifted_twin`), which comes back bit for bit as well. Bool leaves are flags, never
taken unless named.

>>> is_observation(("observation",)), is_observation(("reward",)), is_observation(("info", "x"))
(True, False, False)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .arrays import dtype_name
from .codecs import CODECS, Codec
from .errors import DataError, InputError, UsageError
from .formats.base import NOTHING_HINT, Format, Pair, Source, key_str
from .formats.leaf import is_data, nbytes

#: Leaf names that are never observations, wherever they stand in a key.
NOT_OBSERVATIONS = frozenset(
    {
        "reward",
        "rewards",
        "done",
        "dones",
        "terminated",
        "terminals",
        "truncated",
        "timeouts",
        "info",
        "infos",
        "action",
        "actions",
        "step_count",
        "is_init",
        "index",
        "collector",
        "mask",
    }
)
#: Bytes an exception row costs beside its values: its int64 row index.
INDEX_BYTES = 8


def is_observation(key: tuple[str, ...]) -> bool:
    """Whether a pair's observation key may hold observations (see the module docstring)."""
    return not any(part in NOT_OBSERVATIONS for part in key)


def pair_problem(source: Source, pair: Pair, supports: Callable[[np.dtype], bool]) -> str | None:
    """Why ``pair`` cannot be encoded, or ``None`` if it can."""
    obs, nxt = source.leaves.get(pair.obs_key), source.leaves.get(pair.next_key)
    for key in (pair.obs_key, pair.next_key):
        if key in source.unread:
            return f"needs {key_str(key)}, which {source.unread[key]}"
    if obs is None:
        return "no such leaf"
    if nxt is None:
        return f"has no twin {key_str(pair.next_key)}"
    for key, leaf in ((pair.obs_key, obs), (pair.next_key, nxt)):
        if not is_data(leaf):
            return f"is not an array of numbers: {key_str(key)} holds non-tensor data"
    if tuple(obs.shape) != tuple(nxt.shape) or obs.dtype != nxt.dtype:
        return (
            f"shape/dtype {list(obs.shape)} {dtype_name(obs.dtype)} differs from "
            f"{key_str(pair.next_key)}'s {list(nxt.shape)} {dtype_name(nxt.dtype)}"
        )
    if not supports(obs.dtype):
        return f"is {dtype_name(obs.dtype)}, which the chosen codec cannot encode"
    if len(obs.shape) < source.batch_dims or math.prod(obs.shape[: source.batch_dims]) == 0:
        return "has no rows"
    if math.prod(obs.shape[source.batch_dims :]) == 0:
        return "has rows of no values, so nothing to compress"
    changes = getattr(nxt, "changes_values", None)
    if changes:
        return (
            f"{key_str(pair.next_key)} {changes} the values written: it cannot be rebuilt exactly"
        )
    return None


def pairs_of(
    fmt: Format,
    source: Source,
    keys: Sequence[str] | None,
    supports: Callable[[np.dtype], bool],
    *,
    none_ok: bool = False,
    with_twins: bool = False,
) -> list[Pair]:
    """The pairs of ``source`` (of format ``fmt``) to encode, as :func:`select_pairs` picks
    them. A layout that never stores a next observation twice (Minari) has none: it is
    refused, or with ``none_ok`` (what ``--pack`` packs) gives no pairs, unless ``keys`` name
    some."""
    if fmt.nothing_to_do:
        if keys or not none_ok:
            hint = "leave out --key" if none_ok else NOTHING_HINT
            raise InputError(fmt.nothing_to_do, file=source.path, hint=hint)
        return []
    return select_pairs(
        fmt.pairs(source), source, keys, supports, none_ok=none_ok, with_twins=with_twins
    )


#: Rows of a pair :func:`shifted_twin` compares.
TWIN_ROWS = 256


def shifted_twin(source: Source, pair: Pair) -> bool:
    """Whether the next leaf of ``pair`` holds, in most of the first :data:`TWIN_ROWS` rows, a
    bit-identical copy of the following row of its leaf (``next/info/qpos[t] == info/qpos[t+1]``
    in TorchRL's caches): ``exact`` then stores it losslessly in a few exception rows. Read from
    the first rows only, of sources with one batch dimension.

    >>> from obsdelta_cli.formats import Pair, Source
    >>> k, pair = np.arange(10.0), Pair.ted(("k",))
    >>> shifted_twin(Source(None, {("k",): k, ("next", "k"): k + 1}, 1, None), pair)
    True
    >>> shifted_twin(Source(None, {("k",): k, ("next", "k"): k}, 1, None), pair)
    False
    """
    if source.batch_dims != 1:
        return False
    rows = min(TWIN_ROWS, source.leaves[pair.obs_key].shape[0])
    if rows < 2:
        return False
    first, then = (_first_rows(source.leaves[k], rows) for k in (pair.obs_key, pair.next_key))
    same = (first[1:] == then[:-1]).reshape(rows - 1, -1).all(axis=1)
    return bool(same.mean() >= 0.5)


def _first_rows(leaf: object, rows: int) -> np.ndarray:
    return leaf[:rows] if isinstance(leaf, np.ndarray) else leaf.read(0, rows)  # type: ignore[attr-defined]


def select_pairs(
    candidates: Sequence[Pair],
    source: Source,
    keys: Sequence[str] | None,
    supports: Callable[[np.dtype], bool],
    *,
    none_ok: bool = False,
    with_twins: bool = False,
) -> list[Pair]:
    """The pairs to encode: those ``keys`` name (any alias), or every observation pair.
    ``none_ok``: a dataset with no next observations at all gives no pairs, not an error.
    ``with_twins`` (a lossless codec): also every other pair whose next leaf is a
    :func:`shifted_twin` (``info/*`` of TorchRL's caches), which comes back bit for bit too."""
    if keys:
        chosen: list[Pair] = []
        # What --key can name: the pairs whose two leaves are both there.
        present = [
            p for p in candidates if p.obs_key in source.leaves and p.next_key in source.leaves
        ]
        for text in keys:
            wanted = "/".join(p for p in text.split("/") if p)
            named = [p for p in candidates if wanted in (p.name, *p.aliases)]
            if not wanted or not named:
                known = sorted({p.name for p in present})
                why = "empty key" if not wanted else "no such leaf"
                raise DataError(
                    why, file=source.path, key=text, hint=f"known: {', '.join(known) or 'none'}"
                )
            for pair in named:
                problem = pair_problem(source, pair, supports)
                if problem:
                    usable = sorted(
                        {p.name for p in present if pair_problem(source, p, supports) is None}
                    )
                    hint = f"keys this codec can encode: {', '.join(usable) or 'none'}"
                    raise DataError(problem, file=source.path, key=text, hint=hint)
                if pair not in chosen:
                    chosen.append(pair)
        return chosen

    def eligible(dtype: np.dtype) -> bool:
        return dtype != np.bool_ and supports(dtype)

    observations = [p for p in candidates if is_observation(p.obs_key)]
    pairs = [p for p in observations if pair_problem(source, p, eligible) is None]
    if pairs and with_twins:
        # By identity: comparing pairs field by field is quadratic in files of many episodes.
        seen = {id(p) for p in observations}
        others = [p for p in candidates if id(p) not in seen]
        pairs += [
            p
            for p in others
            if pair_problem(source, p, eligible) is None and shifted_twin(source, p)
        ]
    if pairs:
        return pairs
    twins = [p for p in observations if p.next_key in source.leaves or p.next_key in source.unread]
    empty = [p for p in twins if pair_problem(source, p, eligible) == "has no rows"]
    if empty:
        raise DataError(
            "has no rows",
            file=source.path,
            key=empty[0].name,
            hint="check the right file was given",
        )
    if not twins:
        if none_ok:
            return []
        raise DataError(
            "holds no next observations beside its observations, so there is nothing to "
            "compress (each observation is already stored once)",
            file=source.path,
            hint=NOTHING_HINT,
        )
    problems = "; ".join(f"{p.name} {pair_problem(source, p, eligible)}" for p in twins[:3])
    raise DataError(
        f"no observation pair can be encoded ({problems})",
        file=source.path,
        hint="name keys with --key, or pick another --codec",
    )


def check_time_dim(source: Source, time_dim: int) -> int:
    dims = source.batch_dims
    if not -dims <= time_dim < dims:
        raise UsageError(
            f"--time-dim {time_dim} is not a batch dimension (the data has {dims})",
            file=source.path,
            hint=f"use a value in [{-dims}, {dims - 1}]",
        )
    return time_dim % dims


def candidates(dtype: np.dtype, bound: float | None) -> list[Codec]:
    """Every codec that can encode ``dtype`` under ``bound``. With a bound of 0 only the lossless
    ones: every row a lossy codec changes would be an exception, so they never win."""
    out = []
    for cls in CODECS.values():
        if bound == 0 and not cls.lossless:
            continue
        try:
            codec = cls.create(bound)
        except UsageError:
            continue
        if codec.supports(dtype):
            out.append(codec)
    return out


@dataclass
class KeyGroup:
    """The pairs that share one name (one per robomimic demo; one otherwise), and their size."""

    name: str
    pairs: list[Pair]
    dtype: np.dtype
    features: tuple[int, ...]
    total_rows: int
    raw_bytes: int

    @classmethod
    def group(cls, source: Source, pairs: Sequence[Pair]) -> list[KeyGroup]:
        out: dict[str, KeyGroup] = {}
        for p in pairs:
            leaf = source.leaves[p.obs_key]
            key = out.get(p.name)
            rows = math.prod(leaf.shape[: source.batch_dims])
            if key is None:
                feats = tuple(leaf.shape[source.batch_dims :])
                out[p.name] = cls(p.name, [p], leaf.dtype, feats, rows, nbytes(leaf))
            else:
                key.pairs.append(p)
                key.total_rows += rows
                key.raw_bytes += nbytes(leaf)
        return list(out.values())

    @property
    def row_bytes(self) -> int:
        return math.prod(self.features) * self.dtype.itemsize

    def bytes_after(self, codec: Codec, exception_rows: int) -> int:
        """Bytes ``codec`` stores: its per-row leaves plus the exception rows and their index."""
        stored = codec.stored_dtype(self.dtype)
        base = 0 if stored is None else self.total_rows * math.prod(self.features) * stored.itemsize
        return base + exception_rows * (self.row_bytes + INDEX_BYTES)
