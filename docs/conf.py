"""Sphinx configuration: MyST pages, the API from docstrings, the CLI reference from the Typer
app itself (written to ``_generated/cli.md`` at every build, so it never goes stale)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

project = "obsdelta"
author = "the obsdelta authors"
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# The TorchRL storage documents itself without torchrl installed.
autodoc_mock_imports = [] if importlib.util.find_spec("torchrl") else ["torchrl"]
# Links to files outside the site (the benchmark scripts, sample data) stay as written.
suppress_warnings = ["myst.xref_missing"]


def _write_cli_reference() -> None:
    import typer
    from typer.cli import get_docs_for_click

    from obsdelta_cli.cli import app

    command = typer.main.get_command(app)
    text = get_docs_for_click(obj=command, ctx=typer.Context(command), name="obsdelta")
    out = HERE / "_generated" / "cli.md"
    out.parent.mkdir(exist_ok=True)
    body = "# Command-line reference\n\nGenerated from the program's own help.\n\n"
    body += text.split("\n", 1)[1]  # typer's own title: the command name
    if not out.exists() or out.read_text() != body:
        out.write_text(body)


_write_cli_reference()
