"""All-or-nothing output: one writer per output, written beside the target, swapped into place.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> with atomic_output(d / "out.txt", source=d / "in", force=False) as tmp:
...     _ = tmp.write_text("done")
>>> (d / "out.txt").read_text(), sorted(p.name for p in d.iterdir())
('done', ['out.txt'])

How an output comes to be, for ``OUTPUT`` in folder ``DIR``:

1. ``DIR/.OUTPUT.obsdelta-lock`` is locked (``flock``): a second run for the same OUTPUT refuses
   at once without ``force``, and waits for the first with it, so two runs never interleave.
2. Under the lock, what killed runs left is cleaned up: temporaries ``.OUTPUT.obsdelta-tmp-PID``
   and ``.OUTPUT.obsdelta-old-PID`` (an ``-old-`` copy is put back first if OUTPUT is missing,
   which only a crash in the middle of the fallback swap can cause). The lock file of a killed
   run is reused and removed at the end.
3. OUTPUT is checked (exists without ``force``; with ``replaceable``, whether it may go) and so
   is the free space (with ``expected_bytes``).
4. The caller writes the temporary; it is flushed to disk (every file and folder).
5. The temporary takes OUTPUT's place in one step: ``renameat2(RENAME_EXCHANGE)`` swaps it with
   an existing OUTPUT (the old one is then deleted under the temporary's name), and
   ``renameat2(RENAME_NOREPLACE)`` puts it in place of none. Where the system call is missing,
   two renames (OUTPUT aside, temporary in) do it, and step 2 repairs a crash between them.

After a SIGKILL at any moment, OUTPUT is the old one or the complete new one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import resource
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import interrupts
from .errors import NoSpaceError, ObsdeltaError, OutputError, out_of_space, size_text

TMP_MARK = ".obsdelta-tmp-"
OLD_MARK = ".obsdelta-old-"
LOCK_MARK = ".obsdelta-lock"

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _fsync(path: Path, *, drop: bool = False) -> None:
    """Flush one file or folder entry to stable storage; with ``drop``, then let the kernel
    drop the file's pages from the page cache (see :func:`_fsync_tree`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if drop:
            _drop_cached(fd)
    finally:
        os.close(fd)


def _drop_cached(fd: int) -> None:
    """Ask the kernel to drop a flushed file's pages from the page cache (they are clean: it
    frees them at once). A hint: where it is refused or unknown, nothing happens."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError):
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Any = None


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing a file's dirty pages now, without waiting for them
    (Linux ``sync_file_range``); elsewhere a no-op. A hint: errors are ignored."""
    global _sync_file_range
    if _sync_file_range is None:
        try:
            call = ctypes.CDLL(None, use_errno=True).sync_file_range
            call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            _sync_file_range = call
        except (OSError, AttributeError):
            _sync_file_range = False
    if _sync_file_range:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def write_back(path: Path) -> threading.Thread:
    """Start writing ``path`` (a file, or every file below it) to disk, from a thread.

    Outputs are written to the page cache while the input is read, and go to disk once
    complete, while they are re-read for verification: the disk then never reads and writes
    at once (which costs more than doing each in turn), and the final ``fsync`` finds little
    left to do. Nothing is written for a working copy (:func:`scratch_folder`). Returns the
    thread; joining it is optional."""
    files = [] if in_scratch(path) else [path] if path.is_file() else [*path.rglob("*")]
    files = [p for p in files if p.is_file()]

    def run() -> None:
        for p in files:
            with contextlib.suppress(OSError):
                fd = os.open(p, os.O_RDONLY)
                try:
                    _start_writeback(fd)
                finally:
                    os.close(fd)

    thread = threading.Thread(target=run, name="obsdelta-writeback", daemon=True)
    thread.start()
    return thread


def _fsync_tree(path: Path) -> None:
    """Flush ``path`` (a file, or every file and folder below it) to stable storage, and drop
    each file from the page cache once it is on disk.

    An output is read back (verified) before it is flushed, and not again: its pages would
    only push other data out of memory. Freed, they are the pages the next output is written
    to. Fresh pages cost far more: writing 8 files of 134 MB to the page cache took 0.8-2.3 s
    when each stayed cached and 0.28-0.35 s when each was dropped once flushed, and ``compress
    --jobs 1`` of 8 D4RL files of 250 MB went from 7.1-7.8 s to 5.4-5.6 s (a virtual machine
    whose memory the host backs anew once it was freed)."""
    paths = [path] if path.is_file() else [*path.rglob("*"), path]
    for p in paths:
        if not p.is_symlink():
            _fsync(p, drop=p.is_file())


#: Working folders whose outputs are read back at once and deleted (``--pack``'s inner
#: container): nothing written below them is flushed to disk, so their pages are dropped
#: from memory, never written, when they are deleted.
_SCRATCH: set[Path] = set()


@contextmanager
def scratch_folder(path: Path) -> Iterator[None]:
    """Outputs below ``path`` are not flushed to disk while the block runs."""
    path = path.resolve()
    _SCRATCH.add(path)
    try:
        yield
    finally:
        _SCRATCH.discard(path)


def in_scratch(path: Path) -> bool:
    """Whether ``path`` lies in a folder of :func:`scratch_folder`."""
    return any(_inside(path.resolve(), s) for s in _SCRATCH)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _debris(output: Path, mark: str) -> list[Path]:
    return sorted(output.parent.glob(f".{output.name}{mark}*"))


def clean_stale(output: Path, *, locked: bool = False) -> None:
    """Remove what killed runs left beside ``output``.

    Holding ``output``'s lock (``locked``), every temporary is stale, whatever its PID: a live
    writer would hold the lock. Without it, only those of dead processes are. A ``-old-`` copy
    is put back first if ``output`` is missing (a crash between the two renames of the fallback
    swap).
    """
    olds = [p for p in _debris(output, OLD_MARK) if locked or of_dead_process(p)]
    # Only a file or folder can be an output set aside: a link at that name is not put in
    # OUTPUT's place (it would make OUTPUT point anywhere); it is removed with the rest.
    mine = [p for p in olds if not p.is_symlink()]
    if mine and not os.path.lexists(output):
        olds.remove(mine[-1])
        os.rename(mine[-1], output)
    for tmp in [*_debris(output, TMP_MARK), *olds]:
        if locked or of_dead_process(tmp):
            remove_path(tmp)


def clean_after_killed(output: Path) -> None:
    """Remove what a run killed while writing ``output`` left (its temporary and its lock
    file), unless another run is writing ``output`` now: its files are its own.

    >>> clean_after_killed(Path("/nonexistent/out.h5"))
    """
    path = output.parent / f".{output.name}{LOCK_MARK}"
    try:
        fd = os.open(path, _LOCK_FLAGS)  # never made here, nor followed
    except OSError:
        clean_stale(output)  # no lock file: only the temporaries of dead processes
        return
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    if _at(path, fd):
        clean_stale(output, locked=True)
    _let_go(path, fd)


def of_dead_process(path: Path) -> bool:
    """Whether ``path``, named ``...-PID``, was left by a process no longer running."""
    pid = path.name.rsplit("-", 1)[-1]
    return pid.isdigit() and not _alive(int(pid))


def remove_path(path: Path) -> None:
    """Remove the file, link or folder ``path``, if there is one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def _check_paths(output: Path, source: Path) -> None:
    out, src = output.resolve(), source.resolve()
    if _inside(out, src) or _inside(src, out):
        raise OutputError(
            "output overlaps the input", file=output, hint="write the output somewhere else"
        )
    if not out.parent.is_dir():
        raise OutputError("output folder does not exist", file=out.parent, hint="create it first")


def check_output(output: Path, source: Path, *, force: bool) -> None:
    """Refuse an output that would clobber data or overlap the input."""
    _check_paths(output, source)
    if os.path.lexists(output) and not force:
        raise OutputError("output already exists", file=output, hint="pass --force to replace it")


# ---------------------------------------------------------------------------------------------
# What --force may replace


def _check_replace(output: Path, replaceable: Callable[[Path], None] | None) -> None:
    if replaceable is not None and os.path.lexists(output):
        replaceable(output)


# ---------------------------------------------------------------------------------------------
# Free space


def check_free_space(output: Path, expected_bytes: int) -> None:
    """Refuse when the output's folder has less free space than ``expected_bytes``, or the
    process's file size limit (``ulimit -f``) is below it: HDF5 can crash when a write fails
    in the middle of an object copy, so the failure is foreseen rather than met."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < expected_bytes:
        raise OutputError(
            f"cannot write (the file size limit, {size_text(limit)}, is below the output's "
            f"estimated {size_text(expected_bytes)})",
            file=output,
            hint="raise the limit (ulimit -f), check free space, or write a smaller output",
        )
    free = shutil.disk_usage(output.parent).free
    if free < expected_bytes:
        raise OutputError(
            f"not enough free space: the output needs about {size_text(expected_bytes)}, "
            f"{size_text(free)} is free in {output.parent}",
            file=output,
            hint=f"free at least {size_text(expected_bytes - free)} or write the output elsewhere",
        )


def no_space(output: Path, needed: int | None) -> NoSpaceError:
    """The one line for a disk that filled up while ``output`` was written, said once what the
    run wrote is removed: how much more to free, from ``needed`` (the run's estimate of the
    bytes it writes) and the space free now."""
    try:
        free: int | None = shutil.disk_usage(output.parent).free
    except OSError:
        free = None
    left = "" if free is None else f"{size_text(free)} of free space is left"
    if needed is not None and free is not None and needed > free:
        more = f"free {size_text(needed - free)}"
        left = f"it needs about {size_text(needed)}, {left}"
    else:
        more = "free more space"
    return NoSpaceError(
        f"no space left on device writing {output}" + (f": {left}" if left else ""),
        hint=f"{more} or choose another output; nothing was written",
    )


@contextmanager
def full_disk_said(output: Path, needed: Callable[[], int | None]) -> Iterator[None]:
    """A full disk anywhere in the block (the system's ``ENOSPC``, HDF5's message of it, or a
    :class:`NoSpaceError` raised for a part of the output) becomes :func:`no_space` for
    ``output``. The block removes what it wrote before it ends, so that the space counted free
    is what the run can have."""
    try:
        yield
    except (OSError, RuntimeError, NoSpaceError) as exc:
        if not out_of_space(exc):
            raise
        try:
            estimate = needed()
        except (OSError, ObsdeltaError):
            estimate = None
        raise no_space(output, estimate) from None


# ---------------------------------------------------------------------------------------------
# One writer per output


@contextmanager
def output_lock(output: Path, *, wait: bool) -> Iterator[None]:
    """Hold ``.OUTPUT.obsdelta-lock`` beside ``output``; without ``wait``, refuse if another
    run holds it. The lock file is removed on the way out (a killed run's is reused), also
    when a signal lands while it is being taken."""
    path = output.parent / f".{output.name}{LOCK_MARK}"
    fd = _take(path, output, wait)
    try:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        if _HELD.get(fd) == path:  # not let go of by release_locks() already
            _let_go(path, fd)


def _take(path: Path, output: Path, wait: bool) -> int:
    """A descriptor holding the lock on the file now at ``path``, entered in :data:`_HELD`.
    Whatever the moment a signal lands, the file is either ours and let go of, or entered."""
    while True:
        fd = -1
        try:
            # Held back while the file is opened: raised between the system call and the
            # assignment, a signal would lose the descriptor of a file this run made.
            with interrupts.deferred():
                fd = os.open(path, _LOCK_FLAGS | os.O_CREAT, 0o644)
            _own_lock_file(path, output, fd)
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            # The holder before us may have removed the file after we opened it: lock the
            # file that is at the path now, or two runs could hold locks on different files.
            if _at(path, fd):
                _HELD[fd] = path
                return fd
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputError(
                f"another obsdelta run{holder} is writing this output",
                file=output,
                hint="wait for it to finish, or write the output elsewhere",
            ) from None
        except OutputError:  # not a lock file: left as it is
            os.close(fd)
            raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
                raise _not_a_lock_file(path, output, "a symbolic link") from None
            if fd >= 0:
                _let_go(path, fd)
            if out_of_space(exc):
                raise no_space(output, None) from None
            raise OutputError(
                f"cannot write ({exc.strerror})",
                file=path,
                hint="check free space and permissions; nothing was written",
            ) from None
        except BaseException:  # Ctrl-C while waiting, or a signal just after the file was made
            if fd >= 0:
                _let_go(path, fd)
            raise
        os.close(fd)


def _at(path: Path, fd: int) -> bool:
    """Whether ``fd`` is the file now at ``path`` (the entry itself: a link is not followed)."""
    try:
        here, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


#: How a lock file is opened: a symbolic link at its name fails (``ELOOP``) rather than
#: being followed, so that no file outside the output's own names is created or truncated.
_LOCK_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def _own_lock_file(path: Path, output: Path, fd: int) -> None:
    """Refuse a lock file obsdelta cannot have made: not a regular file (a
    pipe, a device), or one with other names (a hard link to some other file), which writing
    the holder's PID would change."""
    info = os.fstat(fd)
    what = None
    if not stat.S_ISREG(info.st_mode):
        what = "not a regular file"
    elif info.st_nlink != 1:
        what = "a hard link to another file"
    if what is not None:
        raise _not_a_lock_file(path, output, what)


def _not_a_lock_file(path: Path, output: Path, what: str) -> OutputError:
    return OutputError(
        f"cannot lock the output: {path.name} beside it is {what}, not a lock file obsdelta "
        "made; nothing was written",
        file=output,
        hint=f"delete {path} yourself, then run again",
    )


#: Locks this process holds (descriptor: lock file), for :func:`release_locks`.
_HELD: dict[int, Path] = {}


def release_locks() -> None:
    """Let go of every lock this process holds, for a process about to end without unwinding
    (``os._exit``). A signal that lands inside ``__enter__``, once the lock is taken but before
    the ``with`` block is entered, stops ``__exit__`` from ever running: the lock file would
    stay behind.

    >>> release_locks()
    """
    for fd, path in list(_HELD.items()):
        _let_go(path, fd)


def _let_go(path: Path, fd: int) -> None:
    """Remove the lock file if it is ours to remove, then close ``fd``. Ours: we hold its lock
    or can take it at once (a file this run made, interrupted before locking it), and it is
    the file at the path. Removed while held, so that a waiter retries with a fresh file.

    Forgotten by :data:`_HELD` only once the file is gone: a signal landing before that (a
    worker finishing its output as the batch is stopped) leaves it to :func:`release_locks`."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a no-op if held already
        if _at(path, fd):
            os.unlink(path)
    _HELD.pop(fd, None)
    os.close(fd)


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        return f" (pid {pid})"
    return ""


# ---------------------------------------------------------------------------------------------
# Atomic swap

_libc: Any = None


def _renameat2(old: Path, new: Path, flags: int) -> bool:
    """``renameat2(old, new, flags)``; ``False`` where the system call or flag is unsupported
    (not Linux, an old kernel, a file system without it)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.renameat2  # noqa: B018 - raises AttributeError where libc lacks it
        except (OSError, AttributeError):
            _libc = False
    if _libc is False:
        return False
    done = _libc.renameat2(_AT_FDCWD, os.fsencode(old), _AT_FDCWD, os.fsencode(new), flags)
    if done == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(new))


def _put_in_place(tmp: Path, output: Path) -> None:
    """Make ``tmp`` be ``output`` in one step; the old ``output`` (if any) is deleted after."""
    if os.path.lexists(output):
        if _renameat2(tmp, output, _RENAME_EXCHANGE):
            remove_path(tmp)  # now the old output
            return
        old = output.parent / f".{output.name}{OLD_MARK}{os.getpid()}"
        os.rename(output, old)
        os.rename(tmp, output)
        remove_path(old)
    elif not _renameat2(tmp, output, _RENAME_NOREPLACE):
        os.rename(tmp, output)


@contextmanager
def atomic_output(
    output: Path,
    *,
    source: Path,
    force: bool,
    expected_bytes: int | None = None,
    replaceable: Callable[[Path], None] | None = None,
) -> Iterator[Path]:
    """Yield a temporary sibling of ``output``; on success flush it to disk and swap it into
    place, else remove it.

    An existing ``output`` (allowed only with ``force``) is replaced only once the new one is
    complete, so a failure leaves the old one untouched. One run at a time writes ``output``
    (see the module's notes); what killed runs left is cleaned up first.

    ``expected_bytes``: refuse before writing if the folder has less free space (see
    :func:`~obsdelta_cli.outputs.estimate_output_bytes`). ``replaceable``: what ``force`` may
    replace; it is called with ``output`` and raises :class:`OutputError` to refuse
    (:func:`~obsdelta_cli.outputs.replaceable_by` makes the check of a format). ``None`` lets
    ``force`` replace anything.
    """
    check_output(output, source, force=force)
    with output_lock(output, wait=force):
        clean_stale(output, locked=True)
        check_output(output, source, force=force)  # again: another run may have finished
        if force:
            _check_replace(output, replaceable)
        if expected_bytes is not None:
            check_free_space(output, expected_bytes)
        tmp = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}"
        remove_path(tmp)
        try:
            yield tmp
            if tmp.is_symlink():  # obsdelta writes files and folders: never a link as OUTPUT
                raise OutputError(
                    "cannot write: a symbolic link took the place of the output being written",
                    file=output,
                    hint="check who else writes in this folder; nothing was written",
                )
            # Durable before visible: after a crash, OUTPUT is the old one or the complete new one.
            durable = not in_scratch(tmp)
            if durable:
                _fsync_tree(tmp)
            # Stopped meanwhile (a worker whose parent died), with the signal's exception
            # swallowed by a library: the output is not put in place.
            interrupts.check()
            _put_in_place(tmp, output)
            if durable:
                _fsync(output.parent)
        except BaseException:
            remove_path(tmp)
            raise
