"""The package's import graph (docs/architecture.md, "Layers"): no circle, and no arrow from a lower layer to a
higher one. Every import counts, those inside functions too (a lazy import is still a dependency)."""
from __future__ import annotations

import ast
import os

from conftest import ROOT

#: Lowest first. A module may import from its own layer or a lower one; a package's ``__init__`` is the
#: layer of the package. Every module of allocsim must be named here (by itself or by its package).
LAYERS = [
    ["errors", "units", "sections", "placement", "context", "params", "version", "filenames", "compiled"],
    ["outputs"],
    ["trace"],
    ["costs", "frameworks", "capacity", "ranks"],
    ["importers", "recorders", "synth"],
    ["device", "gpu", "runtime", "metrics", "calibrate"],
    ["policies"],
    ["spec", "guard", "exporters", "fold", "replay"],
    ["sweep", "fit", "validate", "tune", "tune_ranks", "spaces", "testing"],
    ["report"],
    ["commands", "cli", "integrations", "__main__", ""],
]


def modules() -> dict[str, str]:
    """``{dotted name without 'allocsim.': path}`` of every module of the package (the package itself is '')."""
    out = {}
    pkg = os.path.join(ROOT, "allocsim")
    for folder, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), pkg)[:-3].replace(os.sep, ".")
                out[rel[:-len("__init__")].rstrip(".") if rel.endswith("__init__") else rel] = \
                    os.path.join(folder, f)
    return out


def imports(name: str, path: str, known: dict) -> set[str]:
    """The allocsim modules ``name`` imports (``from . import x`` of a submodule names the submodule)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = parts[:len(parts) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "allocsim" or node.module.startswith("allocsim.")):
                target = node.module[len("allocsim."):] if node.module != "allocsim" else ""
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}".lstrip(".")
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "allocsim" or alias.name.startswith("allocsim."):
                    out.add(alias.name[len("allocsim."):] if alias.name != "allocsim" else "")
    out.discard(name)
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer(name: str) -> int:
    top = name.split(".")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"allocsim.{name} is in no layer of tests/test_layers.py (and docs/architecture.md)")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle():
    assert cycles(graph()) == []


def test_no_module_imports_from_a_higher_layer():
    upward = sorted(f"allocsim.{a or '(package)'} (layer {layer(a)}) imports allocsim.{b} (layer {layer(b)})"
                    for a, targets in graph().items() for b in targets if layer(b) > layer(a))
    assert upward == []


def test_the_checks_see_a_circle_and_an_upward_arrow():
    """The two checks can fail: a made-up graph with both is caught."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert layer("report.text") > layer("metrics")
    assert "replay" in graph()["sweep"] and "" not in graph()["replay"]
