"""The package's imports go one way: no circle, and no module imports from a higher layer
(the table is :data:`obsdelta_cli.layers.LAYERS`).

Every import counts, at module level or inside a function: an import put off until first use
is still a dependency. Imports under ``if TYPE_CHECKING:`` do not: they name types for the
checker and never run (every module has ``from __future__ import annotations``).

An import of ``pkg.mod`` is an edge to ``pkg.mod`` only, although Python runs
``pkg/__init__.py`` first: a package's ``__init__`` is a registry or a set of re-exports, and
counting it would put every submodule in a circle with its own package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path

import pytest

from obsdelta_cli import layers

PACKAGE = "obsdelta_cli"
ROOT = Path(__file__).parents[1] / PACKAGE

#: module -> the modules of the package it imports, each with the line of its first import.
Graph = Mapping[str, Mapping[str, int]]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name relative to it (``""``: the package)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for child in node.body:
                skipped.update(id(n) for n in ast.walk(child))
    return skipped


def _resolve(name: str, known: set[str]) -> str:
    """``name`` (absolute, dotted) as the module of ``known`` it lands in."""
    relative = name.removeprefix(PACKAGE).lstrip(".")
    while relative not in known:
        relative = relative.rpartition(".")[0]
    return relative


def imports_of(path: Path, module: str, known: Iterable[str]) -> dict[str, int]:
    """The package's modules ``module`` (at ``path``) imports, with the line of the first
    import of each."""
    names = set(known)
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    is_package = path.name == "__init__.py"
    here = ".".join(filter(None, [PACKAGE, module]))
    package = here if is_package else here.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from pkg import name``, pkg.
            targets = [
                f"{origin}.{a.name}"
                if f"{origin}.{a.name}".removeprefix(PACKAGE).lstrip(".") in names
                else origin
                for a in node.names
            ]
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                imported = _resolve(target, names)
                if imported != module:
                    found.setdefault(imported, node.lineno)
    return found


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """The package's import graph: module -> modules it imports (with the line)."""
    found = modules(root)
    return {name: imports_of(path, name, found) for name, path in found.items()}


def find_cycle(graph: Graph) -> list[str] | None:
    """One import circle of ``graph`` as its path (first module repeated at the end), or
    None. Depth first, in sorted order, so that the same graph gives the same circle."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = [start]
        on_path = {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
                continue
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt in done or nxt not in graph:
                continue
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(sorted(graph[nxt])))
    return None


def _shown(path: list[str], graph: Graph) -> str:
    steps = [f"{_name(a)} -> {_name(b)} (line {graph[a][b]})" for a, b in pairwise(path)]
    return "import circle:\n  " + "\n  ".join(steps)


def _name(module: str) -> str:
    return ".".join(filter(None, [PACKAGE, module]))


def upward_imports(graph: Graph) -> list[str]:
    """Each import from a higher layer, as ``module (layer) -> module (layer), line N``."""
    wrong = []
    for module, imported in sorted(graph.items()):
        for target, line in sorted(imported.items()):
            if layers.rank(target) < layers.rank(module):
                wrong.append(
                    f"{_name(module)} ({layers.layer_of(module)}) -> {_name(target)} "
                    f"({layers.layer_of(target)}), line {line}"
                )
    return wrong


def test_there_is_no_import_circle() -> None:
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, _shown(cycle, graph)


#: Imports each module named on the command line into an interpreter that has imported none
#: of the package, as a spawned worker does (a package's ``__init__`` runs before its module,
#: which the import graph does not count).
_IMPORT_FIRST = """
import importlib, sys
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] == "obsdelta_cli"]:
        del sys.modules[loaded]
    importlib.import_module(".".join(["obsdelta_cli", name]).rstrip("."))
"""


def test_every_module_imports_first() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_FIRST, *modules()], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_module_has_one_layer() -> None:
    for module in modules():
        layers.layer_of(module)  # raises for none or several


def test_no_module_imports_from_a_higher_layer() -> None:
    wrong = upward_imports(import_graph())
    assert not wrong, "imports from a higher layer:\n  " + "\n  ".join(wrong)


def test_every_layer_pattern_names_a_module() -> None:
    # A module renamed or moved leaves no stale line in the table.
    names = list(modules())
    for layer, _, patterns in layers.LAYERS:
        for pattern in patterns:
            assert any(layers.matches(m, pattern) for m in names), (layer, pattern)


def test_a_circle_is_found_and_shown_with_its_path() -> None:
    graph = {
        "a": {"b": 3},
        "b": {"c": 4},
        "c": {"a": 5, "d": 6},
        "d": {},
    }
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert "obsdelta_cli.c -> obsdelta_cli.a (line 5)" in _shown(["a", "b", "c", "a"], graph)
    assert find_cycle({"a": {"a": 1}}) == ["a", "a"]
    del graph["c"]["a"]
    assert find_cycle(graph) is None
    assert find_cycle({"a": {"b": 1, "c": 2}, "b": {"d": 3}, "c": {"d": 4}, "d": {}}) is None


def test_an_upward_import_is_found() -> None:
    assert upward_imports({"errors": {"cli": 7}, "cli": {"errors": 3}}) == [
        "obsdelta_cli.errors (base) -> obsdelta_cli.cli (cli), line 7"
    ]


def test_lazy_imports_count_and_type_checking_ones_do_not(tmp_path: Path) -> None:
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .leaf import x\n")
    (package / "sub" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from .. import other\n"
        "if TYPE_CHECKING:\n"
        "    from ..typed import T\n"
        "def f():\n"
        "    from ..lazy import g\n"
        "    import obsdelta_cli.sub\n"
    )
    for name in ("other", "typed", "lazy"):
        (package / f"{name}.py").write_text("")
    graph = import_graph(package)
    assert graph["sub.leaf"] == {"other": 2, "lazy": 6, "sub": 7}
    assert graph["sub"] == {"sub.leaf": 1}
    assert find_cycle(graph) == ["sub", "sub.leaf", "sub"]


@pytest.mark.parametrize("module", ["formats.hdf5_leaves", "codecs", "codecs.quant", ""])
def test_the_table_places_packages_and_patterns(module: str) -> None:
    assert layers.layer_of(module) in layers.ORDER


#: Lines a module of the package may have: past it, a module holds more than one thing.
MAX_LINES = 600


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long
