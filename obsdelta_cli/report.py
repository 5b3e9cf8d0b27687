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
    """What one codec would do to one key (``report`` on a plain dataset)."""

    codec: str
    bytes_after: int
    max_abs_error: float | None
    rmse: float | None
    max_rel_error: float | None = None
    exact_rows: int = 0
    #: Rows the codec cannot store (non-finite source or a delta out of range); > 0 means
    #: ``compress`` with this codec refuses the key.
    bad_rows: int = 0


@dataclass
class KeyResult:
    """One next-observation leaf and what became of it."""

    key: str
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
    stored_dtype: str | None = None
    delta_key: str | None = None
    bad_rows: int = 0
    candidates: list[Candidate] | None = None


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
    schema: str = SCHEMA

    def to_json(self) -> str:
        """One line of JSON; optional fields that do not apply are left out."""
        data = asdict(self)
        for key in data["keys"]:
            if key["candidates"] is None:
                del key["candidates"]
        return json.dumps(_ordered(data), allow_nan=False)


def _ordered(data: dict[str, Any]) -> dict[str, Any]:
    first = ("schema", "command", "input", "output", "format", "compressed")
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
    return f"{before / after:.2f}x" if after else "-"


def render(result: DatasetResult, console: Console) -> None:
    """Print ``result`` as a table for people (``max_rel_error`` is in the JSON only)."""
    title = f"{result.command}: {result.input} ({result.format})"
    if result.output:
        title += f" -> {result.output}"
    title = escape(title)
    table = Table(title=title, title_justify="left")
    for name in ("key", "codec", "before", "after", "ratio", "max abs err", "rmse", "exact rows"):
        table.add_column(name, justify="left" if name in ("key", "codec") else "right")
    for k in result.keys:
        label = f"{escape(k.key)}\n[dim]{k.dtype} {'x'.join(map(str, k.shape))}[/dim]"
        rows = [(k.codec, k.bytes_after, k.max_abs_error, k.rmse, k.exact_rows, k.bad_rows)]
        if k.candidates:
            rows = [
                (c.codec, c.bytes_after, c.max_abs_error, c.rmse, c.exact_rows, c.bad_rows)
                for c in k.candidates
            ]
        for i, (codec, after, mae, rmse, exact, bad) in enumerate(rows):
            marked = k.candidates is not None and codec == k.codec
            errs = [_err(mae), _err(rmse)] if not bad else [f"[red]{bad} rows unstorable[/red]", ""]
            table.add_row(
                label if i == 0 else "",
                f"[bold]{codec}[/bold] *" if marked else codec,
                _size(k.bytes_before) if i == 0 else "",
                _size(after),
                _ratio(k.bytes_before, after),
                *errs,
                f"{exact}/{k.rows}",
            )
    console.print(table)
    total = (
        f"dataset on disk: {_size(result.bytes_before)} -> {_size(result.bytes_after)} "
        f"({_ratio(result.bytes_before, result.bytes_after)})"
    )
    if result.command == "report" and not result.compressed:
        total += "; estimate for the codecs marked *"
    console.print(total)
