"""Every command that writes a file says so in one line when it cannot (exit 2, no traceback)."""
import pytest

from conftest import ROOT, run_cli

TRACE = f"{ROOT}/traces/cupy_mlp.bin"


@pytest.mark.parametrize("args", [
    ["plot", TRACE, "--policies", "none", "-o", "{d}/x.png"],
    ["synth", "mlp", "-o", "{d}/x.bin"],
    ["import", f"{ROOT}/tests/fixtures/log.csv", "-o", "{d}/x.bin"],
    ["sweep", TRACE, "--policies", "none", "-o", "{d}/x.csv"],
    ["compare", TRACE, "--policies", "none", "--csv", "{d}/x.csv"],
    ["calibrate", "-o", "{d}/x.json"],
])
def test_unwritable_output_is_one_line(tmp_path, args):
    missing = str(tmp_path / "no" / "such" / "dir")
    out = run_cli(*[a.format(d=missing) for a in args])
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
