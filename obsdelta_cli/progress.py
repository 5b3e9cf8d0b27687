"""Progress of long work, reported by the pipeline and shown (or not) by the CLI.

The pipeline reports through :func:`current`; nothing is shown unless the CLI installs a display
with :func:`showing` (on a terminal, without ``--quiet`` or ``--json``).

>>> with showing(Recorder()) as rec:
...     task = current().task("next/observation", 100)
...     current().advance(task, 60)
>>> rec.events
[('task', 'next/observation', 100), ('advance', 0, 60)]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any


class Progress:
    """Shows nothing: the default."""

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def task(self, description: str, total: int) -> Any:
        """Start a task of ``total`` units (bytes of next observations)."""
        return None

    def inputs(self, total: int) -> Any:
        """Start counting the ``total`` inputs of a batch run in worker processes, whose own
        bars are not shown here: :meth:`advance` it by one as each input ends."""
        return None

    def advance(self, task: Any, amount: int) -> None:
        """``amount`` more units of ``task`` are done."""

    def finish(self, task: Any) -> None:
        """``task`` is complete."""


class Recorder(Progress):
    """Keeps the events, for tests."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def task(self, description: str, total: int) -> int:
        self.events.append(("task", description, total))
        return sum(e[0] == "task" for e in self.events) - 1

    def inputs(self, total: int) -> int:
        return self.task("inputs", total)

    def advance(self, task: Any, amount: int) -> None:
        self.events.append(("advance", task, amount))


class RichProgress(Progress):
    """Rich progress bars with bytes per second, on stderr."""

    def __init__(self, title: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as Bars

        class Bytes(DownloadColumn):
            def render(self, task: Any) -> Any:
                if "inputs" in task.fields:
                    return f"{task.completed:.0f}/{task.total:.0f} inputs"
                return super().render(task)

        class Speed(TransferSpeedColumn):
            def render(self, task: Any) -> Any:
                return "" if "inputs" in task.fields else super().render(task)

        self.title = title
        self.bars = Bars(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            Bytes(),
            Speed(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )

    def __enter__(self) -> RichProgress:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

    def task(self, description: str, total: int) -> Any:
        return self.bars.add_task(f"{self.title} {description}", total=total)

    def inputs(self, total: int) -> Any:
        return self.bars.add_task(self.title, total=total, inputs=True)

    def advance(self, task: Any, amount: int) -> None:
        self.bars.advance(task, amount)

    def finish(self, task: Any) -> None:
        self.bars.remove_task(task)


_SILENT = Progress()
_CURRENT: ContextVar[Progress | None] = ContextVar("obsdelta_progress", default=None)


def current() -> Progress:
    """Where the pipeline reports progress."""
    return _CURRENT.get() or _SILENT


@contextmanager
def showing(progress: Progress) -> Iterator[Any]:
    """Show the pipeline's progress on ``progress`` inside the ``with`` block."""
    token = _CURRENT.set(progress)
    try:
        with progress:
            yield progress
    finally:
        _CURRENT.reset(token)
