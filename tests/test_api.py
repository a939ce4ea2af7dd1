"""The Python API carries the command line's names and imports no GPU framework or plotting library."""
import subprocess
import sys

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
