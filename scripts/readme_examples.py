"""Regenerate the example output in README.md by running the commands it shows.

Every ```console block under "## What it looks like" holds lines ``$ obsdelta ...``, each followed
by its output. This script runs those commands in order, in a scratch folder that sees the
repository's ``sample_data/``, at 80 columns, and writes what they print under them::

    python scripts/readme_examples.py           # rewrite README.md
    python scripts/readme_examples.py --check   # exit 1, with a diff, if README.md is stale

To change an example, edit its ``$`` line and run the script.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION = "## What it looks like"
BLOCK = re.compile(r"```console\n(.*?)```", re.S)
COLUMNS = 80


def _run(command: str, cwd: Path) -> str:
    argv = shlex.split(command)
    if argv[0] != "obsdelta":
        raise SystemExit(f"README example is not an obsdelta command: {command}")
    done = subprocess.run(
        [sys.executable, "-m", "obsdelta_cli", *argv[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": str(COLUMNS), "NO_COLOR": "1"},
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{command} exited {done.returncode}:\n{done.stderr}")
    return "".join(line.rstrip() + "\n" for line in done.stdout.splitlines())


def _block(body: str, cwd: Path) -> str:
    commands = [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    if not commands:
        raise SystemExit(f"a console block has no '$ obsdelta ...' line:\n{body}")
    return "".join(f"$ {c}\n" + _run(c, cwd) for c in commands)


def generate(text: str) -> str:
    """``text`` (the README) with the output of every example in its section regenerated."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    end = len(text) if end < 0 else end
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        (cwd / "sample_data").symlink_to(ROOT / "sample_data")
        section = BLOCK.sub(lambda m: f"```console\n{_block(m.group(1), cwd)}```", text[start:end])
    return text[:start] + section + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if stale")
    args = parser.parse_args()
    text = README.read_text()
    new = generate(text)
    if args.check:
        if new != text:
            diff = difflib.unified_diff(
                text.splitlines(True), new.splitlines(True), "README.md", "regenerated"
            )
            sys.stdout.writelines(diff)
            print("README.md examples are stale: run python scripts/readme_examples.py")
            return 1
        return 0
    if new != text:
        README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
