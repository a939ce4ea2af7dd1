import os
import random
import subprocess
import sys

import pytest

from allocsim.trace import TraceWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.fixture
def small_trace_path(tmp_path):
    p = str(tmp_path / "small.bin")
    random_trace(1500, seed=3, marks_every=300).save(p)
    return p


def run_cli(*args, cwd=None):
    """Run `python -m allocsim ARGS`; return the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "allocsim", *args], capture_output=True, text=True, cwd=cwd, env=env)
