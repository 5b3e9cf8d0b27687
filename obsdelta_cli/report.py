"""Results of compress / inflate / report: dataclasses, their JSON Lines form and Rich tables.

The JSON form is the contract with scripts (schema ``obsdelta/1``, documented in the README);
the tables are for people and may change.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

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
    max_abs_error_bound: float | None = None
    candidates: list[Candidate] | None = None
    #: What ``--codec auto`` picks for this key (dry-run report only).
    auto_pick: str | None = None
    #: Every row comes back bit for bit (for a dry run: with the codec marked).
    lossless: bool | None = None


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


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ratio(before: int, after: int) -> str:
    return f"{before / after:.2f}x" if after else "inf"


def render(result: DatasetResult, console: Console) -> None:
    """Print ``result`` as a table for people (``max_rel_error`` is in the JSON only)."""
    title = f"{result.command}: {result.input} ({result.format})"
    if result.note:
        console.print(escape(f"{title}: {result.note}"))
        return
    if result.output:
        title += f" -> {result.output}"
    table = Table(title=escape(title), title_justify="left")
    columns = (
        "key",
        "codec",
        "before",
        "after",
        "ratio",
        "max abs err",
        "rmse",
        "exact rows",
        "exceptions",
    )
    for name in columns:
        table.add_column(name, justify="left" if name in ("key", "codec") else "right")
    for k in result.keys:
        label = f"{escape(k.key)}\n[dim]{k.dtype} {'x'.join(map(str, k.shape))}[/dim]"
        options: list[Any] = k.candidates or [k]
        for i, c in enumerate(options):
            name = c.codec
            if k.candidates is not None:
                marks = [
                    m for m, hit in (("*", name == k.codec), ("auto", name == k.auto_pick)) if hit
                ]
                name = f"[bold]{name}[/bold] {' '.join(marks)}" if marks else name
            table.add_row(
                label if i == 0 else "",
                name,
                _size(k.bytes_before) if i == 0 else "",
                _size(c.bytes_after),
                _ratio(k.bytes_before, c.bytes_after),
                _err(c.max_abs_error),
                _err(c.rmse),
                f"{c.exact_rows}/{k.rows}",
                str(c.exception_rows),
            )
        if k.codec == "none":
            why = "no codec beats the raw bytes" + (
                f" within {k.max_abs_error_bound:g}" if k.max_abs_error_bound else " losslessly"
            )
            table.add_row("", f"[yellow]kept uncompressed: {why}[/yellow]", *[""] * 7)
    console.print(table)
    total = (
        f"dataset on disk: {_size(result.bytes_before)} -> {_size(result.bytes_after)} "
        f"({_ratio(result.bytes_before, result.bytes_after)})"
    )
    if result.command == "report" and not result.compressed:
        total += "; estimate for the codecs marked *; auto marks what --codec auto picks"
    if result.command == "verify":
        total += "; verified: metadata sound, every checksum matches, every key rebuilt"
    console.print(total)
