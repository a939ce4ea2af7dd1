"""The compiled build against the interpreted one (docs/architecture.md, "The compiled build").

The suite itself runs whichever build this checkout holds. Here the differential checks — the fused loops
against the plain walks (test_fast_path.py), the fast models against the reference models
(test_reference_models.py), every replay of the compiled policies against the stored results (test_golden.py),
and the compiled policies' own rules (test_split_bestfit.py, test_cupy_policy.py: free-list entries past 63
bits among others) — and folding (test_fold.py, test_tries.py's folded replay) run once more against the other
build, in a child process: the interpreted modules (``ALLOCSIM_INTERPRETED=1``) where a compiled build lies
here, else a compiled build made in a copy of the package where Cython and a C compiler are at hand. Both must
pass as they are: the results are the same bit for bit. The interpreted run starts as soon as the suite is
collected, beside it (conftest.py), and its test waits for it last.
"""
from __future__ import annotations

import glob
import importlib.machinery
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from allocsim.compiled import COMPILE_ENV, COMPILED_MODULES, INTERPRETED_ENV, build, compiled_modules
from conftest import ROOT

DIFFERENTIAL = ["tests/test_fast_path.py", "tests/test_reference_models.py", "tests/test_golden.py",
                "tests/test_split_bestfit.py", "tests/test_cupy_policy.py", "tests/test_fold.py",
                "tests/test_repeats.py",
                "tests/test_tries.py::test_a_folded_replay_with_tries_is_the_full_walk"]
#: The child's pytest: the policies no build compiles run the same code in both, so test_golden leaves them out.
CHILD_PYTEST = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--compiled-policies-only", *DIFFERENTIAL]
#: The test that waits for the other build's run (conftest.py starts it early and moves this test last).
WAITS = "tests/test_compiled.py::test_differential_checks_pass_on_the_other_build"


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


_started: list = []         # (the run, its folder): the other build's run this process started
#: The run's exit status is written by a small parent of it, so that a process other than the one that started it
#: (an xdist worker) can wait for it.
_WRAP = ("import os, subprocess, sys\n"
         "with open(os.path.join(sys.argv[1], 'log'), 'w') as log:\n"
         "    rc = subprocess.call(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)\n"
         "with open(os.path.join(sys.argv[1], 'rc.tmp'), 'w') as f:\n"
         "    f.write(str(rc))\n"
         "os.replace(os.path.join(sys.argv[1], 'rc.tmp'), os.path.join(sys.argv[1], 'rc'))\n")


def shared_folder(testrunuid: str) -> str:
    """The folder of the other build's run in a suite spread over xdist's workers: their controller starts the
    run there (conftest.py), the worker that draws the waiting test reads it."""
    return os.path.join(tempfile.gettempdir(), f"allocsim-other-build-{testrunuid}")


def start_interpreted_run(where: str | None = None) -> str | None:
    """Where this checkout is compiled, the differential checks start on the interpreted modules in a child
    process, once per process (its output and exit status in ``where``, a temporary folder if None), for the test
    below to wait for: the folder, or None where nothing is compiled."""
    if not compiled_modules():
        return None
    if not _started:
        where = where or tempfile.mkdtemp(prefix="allocsim-other-build-")
        os.makedirs(where, exist_ok=True)
        child = subprocess.Popen([sys.executable, "-c", _WRAP, where, sys.executable, *CHILD_PYTEST], cwd=ROOT,
                                 env=child_env(ROOT, **{INTERPRETED_ENV: "1"}), start_new_session=True)
        _started.append((child, where))
    return _started[0][1]


def stop_interpreted_run() -> None:
    """The run started here is stopped (with its own children) if still going, and its folder removed."""
    while _started:
        child, where = _started.pop()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        shutil.rmtree(where, ignore_errors=True)


def wait_for_interpreted_run(where: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """The other build's run in ``where``, once it has ended: its exit status and output."""
    rc, deadline = os.path.join(where, "rc"), time.monotonic() + timeout
    while not os.path.exists(rc):
        assert time.monotonic() < deadline, f"the interpreted build's run in {where} did not end in {timeout} s"
        time.sleep(0.5)
    with open(rc) as f, open(os.path.join(where, "log")) as log:
        return subprocess.CompletedProcess(CHILD_PYTEST, int(f.read()), log.read(), "")


def test_differential_checks_pass_on_the_other_build(tmp_path, request):
    """The differential test files, against the interpreted modules where this checkout is compiled, else
    against a compiled copy."""
    if compiled_modules():
        worker = getattr(request.config, "workerinput", None)       # xdist's: the controller started the run
        out = wait_for_interpreted_run(shared_folder(worker["testrunuid"]) if worker else start_interpreted_run())
        other = "interpreted"
    else:
        root = _compiled_copy(tmp_path)
        for name in ("tests", "traces"):        # the copy's own tests and traces are the checkout's
            assert os.path.isdir(os.path.join(root, name))
        out = run(CHILD_PYTEST, root=root)
        assert "compiled: " in run(["-m", "allocsim", "--version"], root=root).stdout
        other = "compiled"
    assert out.returncode == 0, f"the {other} build fails the differential checks:\n{out.stdout[-4000:]}"


def folded_results(path: str) -> str:
    """A repeated run (`repeat_steps`, 30 steps) replayed folded and in full under each compiled policy: per
    policy and walk, the whole result record, the clock's bits and how much was folded, as JSON."""
    import json
    from allocsim.engine import fold as folding
    from allocsim.engine.replay import Replay
    from allocsim.formats.synth import repeat_steps
    from allocsim.trace import Trace
    folding.SLACK = None        # what was folded is compared: the wall-time budget never gives up here (conftest.py)
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


def _source_copy(tmp_path) -> str:
    """A copy of the package to build, without its tests, traces or any build."""
    root = str(tmp_path / "src")
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.so", "build", "out", "traces",
                                                             "tests", ".hypothesis", "*.egg-info", "BUILD-NOTE.txt"))
    return root


def _fake_cython_build(tmp_path, root: str, version: str, cythonize: str, *args: str, **extra) -> str:
    """``setup.py build_ext --inplace`` in ``root`` under a stand-in Cython of ``version`` whose ``cythonize`` is
    the source ``cythonize``, neither switch set: the one line setup.py printed (it must print exactly one)."""
    fake = tmp_path / "cy" / "Cython"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (fake / "Build.py").write_text(cythonize)
    env = {k: v for k, v in child_env(root, PYTHONPATH=str(tmp_path / "cy"), **extra).items() if k != COMPILE_ENV}
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", *args], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in out.stderr.splitlines() if line.startswith("allocsim:")]
    assert len(said) == 1, out.stderr[-2000:]
    return said[0]


#: A stand-in ``cythonize`` that "translates" each module into an empty C file (for a compiler that fails anyway).
EMPTY_C = ("import os\n"
           "def cythonize(extensions, build_dir, **kwargs):\n"
           "    for ext in extensions:\n"
           "        c = os.path.join(build_dir, *ext.name.split('.')) + '.c'\n"
           "        os.makedirs(os.path.dirname(c), exist_ok=True)\n"
           "        open(c, 'w').close()\n"
           "        ext.sources = [c]\n"
           "    return extensions\n")


def test_a_cython_older_than_the_tested_one_builds_nothing(tmp_path):
    """setup.py with a Cython older than `LEAST_CYTHON` (3.3.0, which miscompiled torch.py into a crash) says so
    in one line and installs the interpreted modules; it never reaches ``cythonize``."""
    root = _source_copy(tmp_path)
    said = _fake_cython_build(tmp_path, root, "3.3.0", "def cythonize(*args, **kwargs):\n"
                                                       "    raise SystemExit('cythonize was called')\n")
    assert "Cython 3.3.0 is older than 3.3.1" in said and "installing the interpreted modules" in said, said
    assert not glob.glob(os.path.join(root, "allocsim", "**", "*.so"), recursive=True)


def test_without_a_c_compiler_the_install_is_interpreted_and_says_why(tmp_path):
    """By default setup.py compiles; where the C compiler fails (here ``CC=false``) it says so in one line, leaves
    no compiled module (an earlier build's goes, in place, else it would load, and from the build folder, else a
    wheel would pack it), and ``allocsim --version`` says why the build runs interpreted."""
    root = _source_copy(tmp_path)
    lib = str(tmp_path / "lib")
    for where in (root, lib):
        stale = os.path.join(where, *COMPILED_MODULES[0].split(".")) + importlib.machinery.EXTENSION_SUFFIXES[0]
        os.makedirs(os.path.dirname(stale), exist_ok=True)
        open(stale, "wb").close()
        os.utime(stale, (1, 1))     # older than any source: else distutils may take it for this build's, up to date
    said = _fake_cython_build(tmp_path, root, "3.3.1", EMPTY_C, "-b", lib, CC="false")
    assert said.startswith("allocsim: the C compile failed (CompileError: ") and \
        said.endswith("; installing the interpreted modules (same results, slower replays)"), said
    for where in (root, lib):
        assert not glob.glob(os.path.join(where, "allocsim", "**", "*.so"), recursive=True), where
    version = run(["-m", "allocsim", "--version"], root=root).stdout.strip()
    assert "(interpreted, because the C compile failed (CompileError: command '" in version and \
        version.endswith("false' failed with exit code 1))"), version


@pytest.mark.parametrize("cflags, level", [("", "-O1"), ("-O3 -pipe", "-O3")])
def test_the_modules_compile_at_the_builds_level_unless_cflags_names_one(tmp_path, cflags, level):
    """setup.py compiles at `OPTIMIZE` (``-O1``: half the compile, replays as fast, docs/performance.md), the last
    level on gcc's line, unless ``CFLAGS`` names one: then that one is the last. (The compiler here logs its line
    and fails, so the build falls back, saying so.)"""
    log = tmp_path / "cc.log"
    cc = tmp_path / "cc.sh"
    cc.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexit 1\n')
    cc.chmod(0o755)
    said = _fake_cython_build(tmp_path, _source_copy(tmp_path), "3.3.1", EMPTY_C, CC=str(cc), CFLAGS=cflags)
    assert said.startswith("allocsim: the C compile failed"), said
    lines = [line for line in log.read_text().splitlines() if " -c " in f" {line} "]
    assert lines, log.read_text()
    for line in lines:
        assert [w for w in line.split() if w.startswith("-O")][-1] == level, line
