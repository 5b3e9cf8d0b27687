"""Which obsdelta source is measured: the installed working tree, or a snapshot of a commit."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "obsdelta_cli"


def git(*args: str) -> str:
    """Output of a git command in the repository ("" if git fails or is missing)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)
    except OSError:
        return ""
    return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else ""


def working_tree_revision() -> str:
    """The commit checked out, and whether the package's files differ from it."""
    revision = git("rev-parse", "--short", "HEAD") or "unknown commit"
    edited = git("status", "--porcelain", PACKAGE)
    return f"{revision} + uncommitted changes" if edited else revision


def package_state() -> str:
    """What identifies the package's source: its tree at HEAD and any uncommitted changes.

    Commits that touch only other files (benchmarks, docs) leave it unchanged.
    """
    return git("rev-parse", f"HEAD:{PACKAGE}") + git("status", "--porcelain", PACKAGE)


def export_snapshot(root: Path, rev: str) -> tuple[Path, str]:
    """The package as committed at ``rev``, extracted under ``root``; and the short commit id.

    Measuring a snapshot keeps every command of a run on the same source while the working
    tree changes.
    """
    commit = git("rev-parse", "--short", rev)
    if not commit:
        raise SystemExit(f"--snapshot: {rev!r} is not a commit of {REPO}")
    dest = root / commit
    if not (dest / PACKAGE).is_dir():
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, PACKAGE],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    return dest, commit


def obsdelta_argv(installed: str, snapshot: Path | None) -> list[str]:
    """How to start obsdelta: the installed command, or the snapshot's ``python -m`` (``-P``:
    without the current folder first on the path, which from the repository's root would
    import the working tree's package instead of the snapshot's)."""
    if snapshot is None:
        return [installed]
    return ["env", f"PYTHONPATH={snapshot}", sys.executable, "-P", "-m", PACKAGE]


def compile_bytecode(obsdelta: list[str]) -> None:
    """Write the bytecode of the package ``obsdelta`` (an :func:`obsdelta_argv`) runs, as
    ``pip install`` does: where the environment sets ``PYTHONDONTWRITEBYTECODE``, every command
    would otherwise compile each of its modules from source again (0.1-0.15 s of each
    start-up on the machine of RESULTS.md), which no installed copy does."""
    env = obsdelta[:2] if obsdelta[0] == "env" else []
    code = (
        f"import compileall, os, {PACKAGE} as p; "
        "compileall.compile_dir(os.path.dirname(p.__file__), quiet=1)"
    )
    subprocess.run([*env, sys.executable, "-P", "-c", code], check=True)
