"""The compiled build against the interpreted one (docs/architecture.md, "The compiled build").

The suite itself runs whichever build this checkout holds. Here the differential checks — the fused loops
against the plain walks (test_fast_path.py), the fast models against the reference models
(test_reference_models.py), every replay against the stored results (test_golden.py), and the compiled
policies' own rules (test_split_bestfit.py, test_cupy_policy.py: free-list entries past 63 bits among
others) — run once more against the other build, in a child process: the interpreted modules
(``ALLOCSIM_INTERPRETED=1``) where a compiled build lies here, else a compiled build made in a copy of the
package where Cython and a C compiler are at hand. Both must pass as they are: the results are the same bit
for bit.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

from allocsim.compiled import COMPILE_ENV, COMPILED_MODULES, INTERPRETED_ENV, build, compiled_modules
from conftest import ROOT

DIFFERENTIAL = ["tests/test_fast_path.py", "tests/test_reference_models.py", "tests/test_golden.py",
                "tests/test_split_bestfit.py", "tests/test_cupy_policy.py", "tests/test_fold.py",
                "tests/test_tries.py::test_a_folded_replay_with_tries_is_the_full_walk"]


def child_env(root: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != INTERPRETED_ENV}
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                 if p and os.path.abspath(p) != ROOT])
    return {**env, **extra}


def run(args: list[str], root: str = ROOT, timeout: int = 1200, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=root, env=child_env(root, **extra), capture_output=True,
                          text=True, timeout=timeout)


def test_interpreted_env_loads_every_compiled_module_from_its_source():
    code = ("import importlib, allocsim, allocsim.compiled as c\n"
            "for m in c.COMPILED_MODULES:\n"
            "    print(importlib.import_module(m).__file__)\n"
            "print(c.build())")
    out = run(["-c", code], **{INTERPRETED_ENV: "1"})
    assert out.returncode == 0, out.stderr
    *files, which = out.stdout.split("\n")[:-1]
    assert len(files) == len(COMPILED_MODULES) and all(f.endswith(".py") for f in files), files
    assert which == "interpreted"


def test_version_says_which_build_runs():
    here = run(["-m", "allocsim", "--version"])
    interpreted = run(["-m", "allocsim", "--version"], **{INTERPRETED_ENV: "1"})
    assert here.stdout.strip().endswith(f"({build()})"), here.stdout
    assert interpreted.stdout.strip().endswith("(interpreted)"), interpreted.stdout
    assert ("compiled: " in here.stdout) == bool(compiled_modules())


def test_the_compiled_build_here_is_not_older_than_its_source():
    """An in-place build (``python3 setup.py build_ext --inplace``) goes stale when its source changes after it:
    Python would go on loading the old compiled module, and the suite would test that. Rebuild, or delete the
    ``.so`` files."""
    policies = os.path.join(ROOT, "allocsim", "policies")
    shared = [os.path.join(policies, name) for name in ("_sorted.pxd", "_latency.pxd")]
    for name in compiled_modules():
        base = os.path.join(ROOT, *name.split("."))
        built = min(os.path.getmtime(p) for p in glob.glob(base + ".*.so") + glob.glob(base + ".*.pyd"))
        sources = [p for p in [base + ".py", base + ".pxd", *shared] if os.path.exists(p)]
        newer = [os.path.relpath(p, ROOT) for p in sources if os.path.getmtime(p) > built]
        assert not newer, f"{name}: the compiled build is older than {', '.join(newer)}: rebuild it"


def _compiled_copy(tmp_path) -> str:
    """A copy of the package with its compiled build made in place (``setup.py build_ext --inplace``); skips
    where Cython or a C compiler is missing (setup.py then says so and builds nothing)."""
    pytest.importorskip("Cython", reason="no compiled build here, and no Cython to make one")
    root = str(tmp_path / "src")
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.so", "build", "out",
                                                             ".hypothesis", "*.egg-info"))
    out = run(["setup.py", "-q", "build_ext", "--inplace"], root=root, timeout=600, **{COMPILE_ENV: "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    if "installing the interpreted modules" in out.stderr:
        pytest.skip(out.stderr.strip().splitlines()[-1])
    return root


def test_differential_checks_pass_on_the_other_build(tmp_path):
    """The differential test files, against the interpreted modules where this checkout is compiled, else
    against a compiled copy."""
    if compiled_modules():
        out = run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *DIFFERENTIAL], **{INTERPRETED_ENV: "1"})
        other = "interpreted"
    else:
        root = _compiled_copy(tmp_path)
        for name in ("tests", "traces"):        # the copy's own tests and traces are the checkout's
            assert os.path.isdir(os.path.join(root, name))
        out = run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *DIFFERENTIAL], root=root)
        assert "compiled: " in run(["-m", "allocsim", "--version"], root=root).stdout
        other = "compiled"
    assert out.returncode == 0, f"the {other} build fails the differential checks:\n{out.stdout[-4000:]}"


def folded_results(path: str) -> str:
    """A repeated run (`repeat_steps`, 30 steps) replayed folded and in full under each compiled policy: per
    policy and walk, the whole result record, the clock's bits and how much was folded, as JSON."""
    import json
    from allocsim.engine.replay import Replay
    from allocsim.formats.synth import repeat_steps
    from allocsim.trace import Trace
    trace = repeat_steps(Trace.load(path), 30)
    out = {}
    for name in ("cupy", "split", "bestfit", "torch"):
        for fold in (True, False):
            r = Replay(trace, name, fold=fold)
            d = r.run().to_dict()
            for key in ("replay_seconds", "load_seconds"):
                d.pop(key, None)
            out[f"{name} fold={fold}"] = {"result": d, "clock": r.device.clock.hex(), "folded": r.folded}
    return json.dumps(out, sort_keys=True)


def test_folding_is_the_full_walk_in_both_builds_and_the_same_in_each():
    """Each compiled policy folds a repeated run in both builds (a compiled fused loop's clock is a C double: the
    recorded period is walked plainly, docs/architecture.md "Folding"), and every result -- folded or walked in
    full, compiled or interpreted -- is the same bit for bit, as is what was folded. The interpreted modules run
    in a child where this checkout is compiled; on an interpreted checkout the compiled copy's run of test_fold
    (`test_differential_checks_pass_on_the_other_build`) holds the compiled build to the full walk."""
    import json
    path = os.path.join(ROOT, "traces", "synthetic-transformer.bin")
    builds = {build(): json.loads(folded_results(path))}
    if compiled_modules():
        code = ("import sys; sys.path.insert(0, 'tests'); from test_compiled import folded_results; "
                f"print(folded_results({path!r}))")
        out = run(["-c", code], timeout=600, **{INTERPRETED_ENV: "1"})
        assert out.returncode == 0, out.stderr[-2000:]
        builds["interpreted"] = json.loads(out.stdout)
    here = builds[build()]
    for name in ("cupy", "split", "bestfit", "torch"):
        full = here[f"{name} fold=False"]
        assert full["folded"] is None
        for which, got in builds.items():
            folded = got[f"{name} fold=True"]
            assert folded["folded"] is not None and folded["folded"] == here[f"{name} fold=True"]["folded"], \
                (name, which)
            assert {**folded, "folded": None} == full and got[f"{name} fold=False"] == full, (name, which)


def test_a_switch_takes_the_usual_spellings():
    """ALLOCSIM_COMPILE and ALLOCSIM_INTERPRETED: 1/true/yes/on and 0/false/no/off in any case, blanks around
    them, or empty; anything else is refused with the variable and its value (the command line prints it)."""
    from allocsim.compiled import OFF, ON, switch_on
    for words, on in ((ON, True), (OFF, False)):
        for w in words:
            for spelled in (w, w.upper(), f" {w.title()}\n"):
                assert switch_on("X", {"X": spelled}) is on, spelled
    assert switch_on("X", {}) is False
    for bad in ("maybe", "2", "-1", "enabled", "o n"):
        with pytest.raises(ValueError, match=f"X={bad!r}: expected"):
            switch_on("X", {"X": bad})


def test_a_cython_older_than_the_tested_one_builds_nothing(tmp_path):
    """setup.py with a Cython older than `LEAST_CYTHON` (3.3.0, which miscompiled torch.py into a crash) says so
    in one line and installs the interpreted modules; it never reaches ``cythonize``."""
    fake = tmp_path / "cy" / "Cython"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "3.3.0"\n')
    (fake / "Build.py").write_text("def cythonize(*args, **kwargs):\n    raise SystemExit('cythonize was called')\n")
    root = str(tmp_path / "src")
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.so", "build", "out", "traces",
                                                             "tests", ".hypothesis", "*.egg-info"))
    out = run(["setup.py", "-q", "build_ext", "--inplace"], root=root, timeout=600,
              **{COMPILE_ENV: "1", "PYTHONPATH": str(tmp_path / "cy")})
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in out.stderr.splitlines() if line.startswith("allocsim:")]
    assert len(said) == 1 and "Cython 3.3.0 is older than 3.3.1" in said[0], out.stderr[-2000:]
    assert "installing the interpreted modules" in said[0], said
    assert not glob.glob(os.path.join(root, "allocsim", "**", "*.so"), recursive=True)
