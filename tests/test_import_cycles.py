"""No import cycle inside a package: each package's modules form a directed acyclic graph.

The graph is built from the source with ``ast``, so it sees every import: at module level,
inside functions and under ``TYPE_CHECKING``.  A cycle means two modules each need the other;
the shared piece belongs in one of them (or in a third module both import), not behind an
import moved into a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dessim

ROOT = Path(dessim.__file__).parent


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path`` (a package is named by its ``__init__``)."""
    parts = ("dessim",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imported_modules(name: str, path: Path) -> set[str]:
    """The dessim modules the module ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` imports the module ``pkg.mod``; ``from mod import name`` ``mod``
            subs = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            found.update(subs or {base})
    return {m for m in found if m in MODULES and m != name}


def package_of(name: str) -> str:
    """The layer package ``dessim.<layer>`` that module ``name`` lies in."""
    return ".".join(name.split(".")[:2])


def graph() -> dict[str, set[str]]:
    """Module -> the modules of its own layer package it imports."""
    return {name: {m for m in imported_modules(name, path) if package_of(m) == package_of(name)}
            for name, path in MODULES.items()}


def tangles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of ``edges`` with two or more nodes (Tarjan 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursive: a package has a few dozen modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return components


def shortest_cycle(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the smallest-named module of a strongly connected component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("a strongly connected component always has a cycle")


def test_cycle_finder_names_a_cycle():
    edges = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}
    assert tangles(edges) == [{"a", "b", "c"}]
    assert shortest_cycle({"a", "b", "c"}, edges) == ["a", "b", "a"]
    assert tangles({"a": {"b"}, "b": set()}) == []


def test_relative_and_from_package_imports_resolve():
    edges = graph()
    assert "dessim.workload.kinds" in edges["dessim.workload.api"] | edges["dessim.workload"]


def test_no_import_cycle_inside_a_package():
    edges = graph()
    report = [" -> ".join(shortest_cycle(c, edges)) + "  (all in the cycle: "
              + ", ".join(sorted(c)) + ")" for c in tangles(edges)]
    assert not report, "import cycles:\n" + "\n".join(report)
