"""The package is layered: a module imports only from its own layer or the layers below.

Order, bottom to top (README "Architecture"): errors, units, {resources, schema}, catalog, topology,
network, collectives, taskgraph, engine, {workload, trace}, training_run, outputs, sweep, calibrate,
cli.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dessim

LAYERS = ["errors", "units", "resources|schema", "catalog", "topology", "network", "collectives",
          "taskgraph", "engine", "workload|trace", "training_run", "outputs", "sweep", "calibrate",
          "cli"]
RANK = {name: i for i, group in enumerate(LAYERS) for name in group.split("|")}
ROOT = Path(dessim.__file__).parent


def imported_names(path: Path):
    """(line, dotted module name) of every import in ``path``, in functions too."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            yield node.lineno, name


def imported_layers(path: Path):
    for line, name in imported_names(path):
        parts = name.split(".")
        if parts[0] == "dessim" and len(parts) > 1:
            yield line, parts[1]


def test_every_module_belongs_to_a_layer():
    tops = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in ROOT.rglob("*.py")}
    assert tops - {"__init__", "__main__", "_data"} <= set(RANK), tops - set(RANK)


def test_no_module_imports_an_upper_layer():
    violations = []
    for path in ROOT.rglob("*.py"):
        top = path.relative_to(ROOT).parts[0].removesuffix(".py")
        if top in ("__init__", "__main__"):
            continue  # the package root re-exports the public API of every layer; -m runs the cli
        for line, layer in imported_layers(path):
            if layer in RANK and RANK[layer] > RANK[top]:
                violations.append(f"{path.relative_to(ROOT)}:{line} ({top}) imports {layer}")
    assert not violations, "\n".join(violations)


#: Subpackages of dessim.workload and the ones each may import (README "Architecture"); the
#: front modules (api, kinds, multijob, __init__) may import them all.
WORKLOAD_DOMAINS = {"common": set(), "transformer": {"common"}, "dataparallel": {"common"},
                    "recsys": {"common", "dataparallel"},
                    "vision": {"common", "dataparallel", "transformer"}}


def test_workload_domains_import_only_what_they_build_on():
    root = ROOT / "workload"
    tops = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert tops == set(WORKLOAD_DOMAINS), tops ^ set(WORKLOAD_DOMAINS)
    violations = []
    for path in root.rglob("*.py"):
        domain = path.relative_to(root).parts[0]
        if domain not in WORKLOAD_DOMAINS:
            continue
        for line, name in imported_names(path):
            parts = name.split(".")
            if parts[:2] == ["dessim", "workload"]:
                other = parts[2] if len(parts) > 2 else "__init__"
                if other != domain and other not in WORKLOAD_DOMAINS[domain]:
                    violations.append(f"{path.relative_to(ROOT)}:{line} ({domain}) imports {name}")
    assert not violations, "\n".join(violations)
