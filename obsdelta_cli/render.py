"""Tables for people: results of compress / inflate / report / verify, sized to the terminal.

A table never runs past the console's width and never elides a number. Wide consoles get every
column; narrower ones drop the least useful columns first (rmse, then exact rows), then move
"before" under the key, then fold long key names.

>>> _size(132_000), _size(1_250), _size(336), _size(1_420_000)
('132 KB', '1.25 KB', '336 B', '1.42 MB')
>>> _ratio(132_000, 1_250), _ratio(100, 50), _ratio(100, 0)
('106x', '2.00x', 'inf')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .report import DatasetResult, KeyResult

if TYPE_CHECKING:
    from .batch import Outcome


def _size(n: int) -> str:
    """Bytes with a unit, three significant digits."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 999.5 or unit == "TB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ratio(before: int, after: int) -> str:
    if not after:
        return "inf"
    r = before / after
    return f"{r:.0f}x" if abs(r) >= 99.5 else f"{r:.1f}x" if abs(r) >= 9.95 else f"{r:.2f}x"


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[KeyResult, Any, int], str]  # (key, candidate or key, row index) -> text
    #: The header on two lines, for narrow layouts.
    narrow: str = ""


COLUMNS: dict[str, _Column] = {
    "before": _Column("before", lambda k, c, i: _size(k.bytes_before) if i == 0 else ""),
    "after": _Column("after", lambda k, c, i: _size(c.bytes_after)),
    "ratio": _Column("ratio", lambda k, c, i: _ratio(k.bytes_before, c.bytes_after)),
    "max abs err": _Column("max abs err", lambda k, c, i: _err(c.max_abs_error), "max abs\nerror"),
    "rmse": _Column("rmse", lambda k, c, i: _err(c.rmse)),
    "exact rows": _Column("exact rows", lambda k, c, i: f"{c.exact_rows}/{k.rows}", "exact\nrows"),
    "exceptions": _Column("exceptions", lambda k, c, i: str(c.exception_rows), "exception\nrows"),
}


@dataclass(frozen=True)
class _Layout:
    numbers: tuple[str, ...]
    #: "before" under the key's dtype and shape rather than in a column of its own.
    stacked: bool = False
    #: No vertical rules.
    compact: bool = False
    #: Two-line headers.
    narrow: bool = True


#: From the widest to the narrowest; the first that fits is used.
LAYOUTS = (
    _Layout(tuple(COLUMNS), narrow=False),
    _Layout(("before", "after", "ratio", "max abs err", "exact rows", "exceptions")),
    _Layout(("before", "after", "ratio", "max abs err", "exceptions")),
    _Layout(("after", "ratio", "max abs err", "exceptions"), stacked=True),
    _Layout(("after", "ratio", "max abs err", "exceptions"), stacked=True, compact=True),
    _Layout(("after", "ratio", "max abs err"), stacked=True, compact=True),
)


def _codec_cell(k: KeyResult, name: str) -> str:
    if k.candidates is None:
        return escape(name)
    marks = [m for m, hit in (("*", name == k.codec), ("auto", name == k.auto_pick)) if hit]
    return f"[bold]{escape(name)}[/bold] {' '.join(marks)}" if marks else escape(name)


def _key_table(result: DatasetResult, layout: _Layout) -> Table:
    numbers, stacked = layout.numbers, layout.stacked
    if layout.compact:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    else:
        table = Table(box=box.HEAVY_HEAD)
    table.add_column("key", overflow="fold")
    table.add_column("codec", overflow="fold")
    for name in numbers:
        column = COLUMNS[name]
        header = column.narrow if layout.narrow and column.narrow else column.header
        table.add_column(header, justify="right", no_wrap=True)
    for n, k in enumerate(result.keys):
        label = f"{escape(k.key)}\n[dim]{k.dtype} {'x'.join(map(str, k.shape))}[/dim]"
        if stacked:
            label += f"\n[dim]{_size(k.bytes_before)}[/dim]"
        options: list[Any] = k.candidates or [k]
        for i, c in enumerate(options):
            cells = [COLUMNS[n].cell(k, c, i) for n in numbers]
            last = i == len(options) - 1 and n < len(result.keys) - 1
            table.add_row(
                label if i == 0 else "",
                _codec_cell(k, c.codec),
                *cells,
                end_section=last and k.candidates is not None,
            )
    return table


def _fits(console: Console, table: Table) -> bool:
    unbounded = console.options.update_width(1_000_000)
    return Measurement.get(console, unbounded, table).maximum <= console.width


def key_table(result: DatasetResult, console: Console) -> Table:
    """The widest layout that fits ``console`` (the narrowest one folds long key names)."""
    for layout in LAYOUTS:
        table = _key_table(result, layout)
        if _fits(console, table):
            return table
    return table


def _kept(k: KeyResult) -> str:
    why = "no codec beats the raw bytes" + (
        f" within {k.max_abs_error_bound:g}" if k.max_abs_error_bound else " losslessly"
    )
    return f"{k.key}: kept uncompressed: {why}"


def _fidelity(keys: Sequence[KeyResult]) -> str:
    """Whether the values come back as they were: the first thing a table should say.

    >>> k = KeyResult("obs", "fp16", "float32", [4, 2], 32, 16, 0.002, 0.001, 4, 0, lossless=False)
    >>> _fidelity([k])
    'lossy: obs within 0.002 of the original (max abs error)'
    """
    lossy = [k for k in keys if k.lossless is False]
    if not lossy:
        return "lossless: every value comes back bit for bit"
    names = ", ".join(k.key for k in lossy)
    worst = max(k.max_abs_error or 0.0 for k in lossy)
    return f"lossy: {names} within {worst:.3g} of the original (max abs error)"


def render(result: DatasetResult, console: Console) -> None:
    """Print ``result`` as a table for people (``max_rel_error`` is in the JSON only)."""
    title = f"{result.command}: {result.input} ({result.format})"
    if result.note and not result.keys and result.bytes_after == result.bytes_before:
        # Nothing to do (a Minari file): the reason is the whole answer.
        console.print(Text(f"{title}: {result.note}", overflow="fold"))
        return
    if result.output:
        title += f" -> {result.output}"
    console.print(Text(title, overflow="fold"))
    if result.keys:
        console.print(key_table(result, console))
    lines = [_kept(k) for k in result.keys if k.codec == "none"]
    lines += [
        f"dataset on disk: {_size(result.bytes_before)} -> {_size(result.bytes_after)} "
        f"({_ratio(result.bytes_before, result.bytes_after)})"
    ]
    if result.command == "report" and not result.compressed and result.keys:
        lines[-1] += ", estimated for the codecs marked *"
        lines.append("auto marks what --codec auto picks")
    elif result.keys:
        lines.append(_fidelity(result.keys))
    if result.command == "verify":
        rebuilt = ", every key rebuilt" if result.keys else ""
        lines.append(f"verified: metadata sound, every checksum matches{rebuilt}")
    if result.note:
        lines.append(result.note)
    for line in lines:
        console.print(Text(line, overflow="fold"))


def render_summary(outcomes: Sequence[Outcome], console: Console) -> None:
    """One row per input of a batch run."""
    table = Table(title="summary", title_justify="left", box=box.HEAVY_HEAD)
    table.add_column("input", overflow="fold")
    table.add_column("status", overflow="fold")
    for name in ("before", "after", "seconds"):
        table.add_column(name, justify="right", no_wrap=True)
    for o in outcomes:
        r = o.result
        status = "[green]ok[/green]" if r else f"[red]failed ({o.exit_code})[/red]"
        before = _size(r.bytes_before) if r else ""
        after = _size(r.bytes_after) if r else ""
        table.add_row(escape(str(o.job.input)), status, before, after, f"{o.seconds:.2f}")
    console.print(table)
