"""The Python API carries the command line's names and imports no GPU framework or plotting library."""
import subprocess
import sys

import pytest

import allocsim
from conftest import ROOT


def test_api_names_work(tmp_path):
    t = allocsim.synthesize("mlp", seed=1, iterations=2)
    p = str(tmp_path / "m.bin")
    t.save(p)
    r = allocsim.replay(p, "split")
    rows = allocsim.compare(p, ["split", "torch[expandable_segments:True]"], caps=[None])
    assert [row["policy"] for row in rows] == ["split", "torch"]
    assert rows[0]["peak_reserved_bytes"] == r.peak_reserved_bytes
    f = allocsim.fit_capacity(p, "none", resolution=1)
    assert f["capacity_bytes"] == t.load_bytes
    assert allocsim.validate_trace(f"{ROOT}/traces/resnet50.bin").match


def test_import_is_light():
    code = "import sys, allocsim; print(sorted(m for m in ('torch','cupy','matplotlib','dask','tqdm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_replay_from_the_command_line_leaves_numpy_ma_unimported():
    """`numpy.unique`'s first call in a process imports `numpy.ma` (10-20 ms: more than a folded replay of a small
    GPT takes); a replay does not call it (`Trace.kinds_present` counts the kinds instead)."""
    code = ("import sys, numpy; early = 'numpy.ma' in sys.modules; from allocsim.cli import main; "
            "rc = main(['replay', 'traces/gpt2.bin', '--policy', 'torch', '--json']); "
            "print(early, rc, 'numpy.ma' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    early, *rest = out.stderr.split()[-3:]
    if early == "True":
        pytest.skip("this numpy imports numpy.ma with itself (numpy 1.x)")
    assert rest == ["0", "False"], out.stderr[-2000:]
