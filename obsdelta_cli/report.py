"""Results of compress / inflate / report / verify: dataclasses and their JSON Lines form.

The JSON form is the contract with scripts (schema ``obsdelta/1``, documented in the README);
the tables for people are drawn by :mod:`obsdelta_cli.render` and may change.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "obsdelta/1"


@dataclass
class Candidate:
    """What one codec would do to one key (``report`` on a plain dataset, ``--codec auto``)."""

    codec: str
    #: Bytes of the stored leaf plus the exception rows and their index.
    bytes_after: int
    max_abs_error: float
    rmse: float
    max_rel_error: float = 0.0
    exact_rows: int = 0
    #: Rows stored in full precision because the codec cannot represent them within the bound.
    exception_rows: int = 0
    #: Largest absolute error per feature (for plots; not part of the JSON).
    feature_max_abs: list[float] | None = field(default=None, repr=False)


@dataclass
class KeyResult:
    """One next-observation leaf and what became of it."""

    key: str
    #: The codec used (or marked, for a dry run); ``"none"``: kept uncompressed.
    codec: str
    dtype: str
    shape: list[int]
    bytes_before: int
    bytes_after: int
    max_abs_error: float | None
    rmse: float | None
    rows: int
    exact_rows: int
    max_rel_error: float | None = None
    exception_rows: int = 0
    stored_dtype: str | None = None
    delta_key: str | None = None
    #: The error bound asked for; ``None`` for none (a bound of 0 asks for no error either).
    max_abs_error_bound: float | None = None
    candidates: list[Candidate] | None = None
    #: What ``--codec auto`` picks for this key (dry-run report only).
    auto_pick: str | None = None
    #: Every row comes back bit for bit (for a dry run: with the codec marked).
    lossless: bool | None = None

    def __post_init__(self) -> None:
        # The lossless default runs with a bound of 0 inside; a user asked for none.
        if not self.max_abs_error_bound:
            self.max_abs_error_bound = None


@dataclass
class DatasetResult:
    """One input of one command; one JSON line with ``--json``."""

    command: str
    input: str
    output: str | None
    format: str
    compressed: bool
    bytes_before: int
    bytes_after: int
    keys: list[KeyResult] = field(default_factory=list)
    #: A plain-language remark (e.g. why there is nothing to compress).
    note: str | None = None
    schema: str = SCHEMA
    #: Always true here; a failed input's JSON line has ``"ok": false`` and ``"error"``.
    ok: bool = True

    def to_json(self) -> str:
        """One line of JSON; optional fields that do not apply are left out."""
        data = asdict(self)
        if data["note"] is None:
            del data["note"]
        for key in data["keys"]:
            for optional in ("candidates", "auto_pick"):
                if key[optional] is None:
                    del key[optional]
            for candidate in key.get("candidates") or []:
                del candidate["feature_max_abs"]
        return json.dumps(_ordered(data), allow_nan=False)


def _ordered(data: dict[str, Any]) -> dict[str, Any]:
    first = ("schema", "command", "input", "output", "ok", "format", "compressed")
    return {k: data[k] for k in first} | {k: v for k, v in data.items() if k not in first}
