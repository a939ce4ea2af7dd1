"""The package's import graph (docs/architecture.md, "Layers"): no circle, and no arrow from a lower layer to a
higher one. Every import counts, those inside functions too (a lazy import is still a dependency)."""
from __future__ import annotations

import ast
import os

from conftest import ROOT

#: Lowest first: the floors of docs/architecture.md's layer picture. A module may import from its own layer or a
#: lower one. An entry names a module or a folder (every module under it, at any depth); the longest entry that
#: names a module decides its layer. Every module of allocsim must be named here.
LAYERS = [
    ["errors", "units", "params", "filenames", "version", "compiled", "outputs"],     # basics, on top of the folder
    ["trace"],
    ["machine"],
    ["frameworks", "policies"],
    ["engine"],
    ["formats"],
    ["search", "testing"],
    ["report"],
    ["commands", "integrations", "cli", "_start", "__main__", ""],
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
    """The layer of module ``name``: that of the longest `LAYERS` entry naming it or a folder above it."""
    best = None
    for i, names in enumerate(LAYERS):
        for entry in names:
            if (name == entry or (entry and name.startswith(entry + "."))) and (best is None or len(entry) > best[0]):
                best = (len(entry), i)
    if best is None:
        raise AssertionError(f"allocsim.{name} is in no layer of tests/test_layers.py (and docs/architecture.md)")
    return best[1]


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
    assert layer("report.text") > layer("machine.metrics")
    assert "engine.replay" in graph()["search.sweep"] and "" not in graph()["engine.replay"]


def test_the_top_of_the_package_holds_a_dozen_modules_at_most():
    """The folders show the layers (issue 30): what is left on top is the basics, the package and its command
    line, and the plug-in test kit."""
    top = sorted(f for f in os.listdir(os.path.join(ROOT, "allocsim")) if f.endswith(".py"))
    assert len(top) <= 12, top
