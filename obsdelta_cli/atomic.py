"""All-or-nothing output: write beside the target, then rename into place.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> with atomic_output(d / "out.txt", source=d / "in", force=False) as tmp:
...     _ = tmp.write_text("done")
>>> (d / "out.txt").read_text(), sorted(p.name for p in d.iterdir())
('done', ['out.txt'])
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import OutputError

TMP_MARK = ".obsdelta-tmp-"


def _fsync(path: Path) -> None:
    """Flush one file or folder entry to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush ``path`` (a file, or every file and folder below it) to stable storage."""
    paths = [path] if path.is_file() else [*path.rglob("*"), path]
    for p in paths:
        if not p.is_symlink():
            _fsync(p)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(output: Path) -> None:
    """Remove temporaries a killed run left beside ``output`` (their process is gone)."""
    for tmp in output.parent.glob(f".{output.name}{TMP_MARK}*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output(output: Path, source: Path, *, force: bool) -> None:
    """Refuse an output that would clobber data or overlap the input."""
    out, src = output.resolve(), source.resolve()
    if _inside(out, src) or _inside(src, out):
        raise OutputError(
            "output overlaps the input", file=output, hint="write the output somewhere else"
        )
    if not out.parent.is_dir():
        raise OutputError("output folder does not exist", file=out.parent, hint="create it first")
    if output.exists() and not force:
        raise OutputError("output already exists", file=output, hint="pass --force to replace it")


@contextmanager
def atomic_output(output: Path, *, source: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary sibling of ``output``; on success flush it to disk and rename it into
    place, else remove it.

    An existing ``output`` (allowed only with ``force``) is replaced only once the new one is
    complete, so a failure leaves the old one untouched. Temporaries left by killed runs are
    removed first.
    """
    check_output(output, source, force=force)
    clean_stale(output)
    tmp = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}"
    _remove(tmp)
    try:
        yield tmp
        # Durable before visible: after a crash, OUTPUT is either absent or complete.
        _fsync_tree(tmp)
        if output.exists():
            old = output.parent / f".{output.name}.obsdelta-old-{os.getpid()}"
            os.replace(output, old)
            os.replace(tmp, output)
            _remove(old)
        else:
            os.replace(tmp, output)
        _fsync(output.parent)
    except BaseException:
        _remove(tmp)
        raise
