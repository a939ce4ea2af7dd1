"""A small mutation runner: does the test suite notice when a policy's code changes?

Parses a module with `ast`, makes one mutant at a time, writes it over the module
file, runs a pytest selection on it (``-x -q``, with a timeout) and restores the
file in a ``finally``. A mutant the tests fail on is *killed*; one they pass is a
*survivor*, printed with its line. Mutations:

- comparison flips: ``<`` <-> ``<=``, ``>`` <-> ``>=``;
- integer constants +1 and -1 (not booleans, not docstrings);
- ``and`` <-> ``or``;
- an if-branch loses one statement (it becomes ``pass`` when it was the only one).

It rewrites the file it is given, so run it in a scratch copy of the tree::

    cp -r . /tmp/mut && cd /tmp/mut        # from the repository root
    python benchmarks/mutate.py allocsim/policies/torch.py --lines 330-900 \\
        -- tests/test_reference_models.py -k torch

Everything after ``--`` goes to pytest (with ``-p mutate_plugin``: no hypothesis shrinking).
``--list`` prints the mutants without running them; ``--rerun old.json`` runs only the
survivors of an earlier run (after adding tests).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


def _docstrings(tree) -> set[int]:
    """ids of the constant nodes that are docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def sites(tree):
    """Every mutation of ``tree`` as ``(node index in ast.walk order, kind, detail, line)``."""
    docs = _docstrings(tree)
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                if type(op) in FLIPS:
                    yield i, "compare", k, node.lineno
        elif (isinstance(node, ast.Constant) and type(node.value) is int and id(node) not in docs):
            yield i, "const", +1, node.lineno
            yield i, "const", -1, node.lineno
        elif isinstance(node, ast.BoolOp):
            yield i, "boolop", None, node.lineno
        elif isinstance(node, ast.If):
            for branch in ("body", "orelse"):
                stmts = getattr(node, branch)
                if branch == "orelse" and len(stmts) == 1 and isinstance(stmts[0], ast.If):
                    continue            # an elif: its own If node covers it
                for k, stmt in enumerate(stmts):
                    if not isinstance(stmt, ast.Pass):
                        yield i, "delete", (branch, k), stmt.lineno


def mutate(source: str, site) -> tuple[str, str]:
    """(mutant source, one-line description) for ``site``."""
    tree = ast.parse(source)
    index, kind, detail, line = site
    node = next(n for i, n in enumerate(ast.walk(tree)) if i == index)
    if kind == "compare":
        old = node.ops[detail]
        node.ops[detail] = FLIPS[type(old)]()
        what = f"{type(old).__name__} -> {type(node.ops[detail]).__name__}"
    elif kind == "const":
        what = f"{node.value} -> {node.value + detail}"
        node.value += detail
    elif kind == "boolop":
        new = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        what = f"{type(node.op).__name__} -> {type(new).__name__}"
        node.op = new
    else:
        branch, k = detail
        stmts = getattr(node, branch)
        what = f"delete {branch}[{k}]: {ast.unparse(stmts[k]).splitlines()[0][:60]}"
        del stmts[k]
        if not stmts:
            stmts.append(ast.Pass())
    return ast.unparse(tree), what


def run_tests(pytest_args, timeout: float) -> str:
    """'killed' if the selection fails (or times out), 'survived' if it passes."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "mutate_plugin", *pytest_args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
    try:
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout,
                            env=env).returncode
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    return "survived" if rc == 0 else "killed"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module", help="the Python file to mutate (rewritten in place, restored after each mutant)")
    ap.add_argument("--lines", help="only mutate lines A-B")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run")
    ap.add_argument("--every", type=int, default=1, help="sample: run every N-th mutant")
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    ap.add_argument("--rerun", help="only the survivors recorded in this --json file of an earlier run")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    with open(args.module) as f:
        original = f.read()
    lo, hi = (int(x) for x in args.lines.split("-")) if args.lines else (0, 10**9)
    baseline = ast.unparse(ast.parse(original))
    todo = [s for s in sites(ast.parse(original)) if lo <= s[3] <= hi][::args.every]
    if args.rerun:
        with open(args.rerun) as f:
            again = {(r["line"], r["mutation"]) for r in json.load(f)["results"] if r["outcome"] == "survived"}
        todo = [s for s in todo if (s[3], mutate(original, s)[1]) in again]
    if args.list:
        for s in todo:
            print(f"{args.module}:{s[3]}: {mutate(original, s)[1]}")
        print(f"{len(todo)} mutants")
        return 0
    if run_tests(pytest_args, args.timeout) != "survived":
        print("the test selection fails on the unmutated module", file=sys.stderr)
        return 2
    results = []
    t0 = time.time()
    try:
        for n, site in enumerate(todo, 1):
            mutant, what = mutate(original, site)
            if mutant == baseline:
                continue
            try:
                with open(args.module, "w") as f:
                    f.write(mutant)
                outcome = run_tests(pytest_args, args.timeout)
            finally:
                with open(args.module, "w") as f:
                    f.write(original)
            results.append({"line": site[3], "mutation": what, "outcome": outcome})
            if args.json:                       # after every mutant: a stopped run keeps what it did
                with open(args.json, "w") as f:
                    json.dump({"module": args.module, "pytest": pytest_args, "results": results}, f, indent=1)
            if outcome == "survived":
                print(f"SURVIVED {args.module}:{site[3]}: {what}", flush=True)
            print(f"  [{n}/{len(todo)} {time.time() - t0:.0f}s]", file=sys.stderr, flush=True)
    finally:
        with open(args.module, "w") as f:
            f.write(original)
    survived = [r for r in results if r["outcome"] == "survived"]
    print(f"{args.module}: {len(results)} mutants, {len(results) - len(survived)} killed, {len(survived)} survived")
    return 0


if __name__ == "__main__":
    sys.exit(main())
