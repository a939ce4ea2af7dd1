import os
import random
import subprocess
import sys

import pytest

from allocsim.trace import TraceWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_addoption(parser):
    parser.addoption("--compiled-policies-only", action="store_true",
                     help="test_golden replays only the policies the compiled build compiles (tests/test_compiled.py "
                          "runs the other build so: the rest run the same code in both)")
    parser.addoption("--defer-peaks", action="store_true",
                     help="every replay that may defer its peak's state to a second walk does (Replay.PEAK_SHARE): "
                          "the figures must be the same; a loaded machine defers some (run by hand, not in CI)")


def pytest_configure(config):
    """The package's bytecode is written once, before any worker or child starts, where the environment asks
    Python not to write it (PYTHONDONTWRITEBYTECODE, as on the project's machines): else every ``python -m
    allocsim`` the tests start compiles the whole package again, 0.35 s of its 0.9 s start. Written where Python
    writes it (``__pycache__``, which git ignores). ``--defer-peaks``: no peak's state is afforded as the walk
    goes (each xdist worker configures its own)."""
    if config.getoption("--defer-peaks"):
        from allocsim.engine.replay import Replay
        Replay.PEAK_ALLOWANCE, Replay.PEAK_SHARE = -1.0, 0.0
    if sys.flags.dont_write_bytecode and not hasattr(config, "workerinput"):
        import compileall
        compileall.compile_dir(os.path.join(ROOT, "allocsim"), quiet=2)


def pytest_collection_modifyitems(config, items):
    """The run of the other build (tests/test_compiled.py) starts in a child process as soon as the tests are
    collected, and the test that waits for it goes last: on two cores the two run side by side. Spread over xdist's
    workers, their controller starts it (below), once."""
    test_compiled = sys.modules.get("test_compiled")
    waits = [item for item in items if test_compiled and item.nodeid == test_compiled.WAITS]
    if waits:
        items.remove(waits[0])
        items.append(waits[0])
        if not hasattr(config, "workerinput"):
            test_compiled.start_interpreted_run()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """xdist's controller: a worker collected the test that waits for the other build's run, so the run starts
    in a folder every worker can name (`test_compiled.shared_folder`)."""
    import test_compiled
    if test_compiled.WAITS in ids:
        test_compiled.start_interpreted_run(test_compiled.shared_folder(node.workerinput["testrunuid"]))


def pytest_sessionfinish(session):
    """A run of the other build still going (the session stopped early, -x) is stopped."""
    if "test_compiled" in sys.modules:
        sys.modules["test_compiled"].stop_interpreted_run()


def random_trace(n=2000, seed=1, max_size=1 << 22, streams=1, marks_every=0, total_memory=None):
    """A random alloc/free trace with timestamps, optional marks and streams."""
    rng = random.Random(seed)
    meta = {"device": {"name": "test", "total_memory": total_memory}} if total_memory else {}
    w = TraceWriter(meta=meta)
    live = []
    for k in range(n):
        if marks_every and k % marks_every == 0:
            w.mark(f"iter {k // marks_every}", t=k * 1000)
        if live and rng.random() < 0.5:
            w.free(live.pop(rng.randrange(len(live))), t=k * 1000)
        else:
            live.append(w.alloc(rng.randint(1, max_size), rng.randrange(streams), t=k * 1000))
    return w.finish()


@pytest.fixture(autouse=True)
def _folding_never_gives_up(monkeypatch):
    """Folding's budget reads the clocks (allocsim/engine/fold.py, `Budget`): with it off, the tests that count
    folds see every fold a trace allows whatever the machine's load (a fold never changes a result either way);
    tests/test_fold.py checks the budget with settings of its own."""
    from allocsim.engine import fold
    monkeypatch.setattr(fold, "SLACK", None)


@pytest.fixture
def small_trace_path(tmp_path):
    p = str(tmp_path / "small.bin")
    random_trace(1500, seed=3, marks_every=300).save(p)
    return p


def run_cli(*args, cwd=None):
    """Run `python -m allocsim ARGS`; return the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "allocsim", *args], capture_output=True, text=True, cwd=cwd, env=env)
