"""Every picture comes out of a shipped trace as a valid image with the expected title."""
import glob
import os
import struct

import pytest

from conftest import ROOT, run_cli

SHIPPED = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")), key=os.path.getsize)
TITLES = {"memory": "Memory over time", "bars": "Policies side by side", "frontier": "Capacity frontier",
          "latency": "Malloc latency CDF", "gc": "Garbage collections"}


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def shipped():
    if not SHIPPED:
        pytest.skip("no trace shipped in traces/")
    return SHIPPED[0]


@pytest.mark.parametrize("kind", sorted(TITLES))
def test_each_plot_png_and_svg(tmp_path, shipped, kind):
    pols = "none,split" if kind != "frontier" else "none"
    png = str(tmp_path / f"{kind}.png")
    out = run_cli("plot", shipped, "--kind", kind, "--policies", pols, "--caps", "none,64GB", "-o", png, "-j", "1")
    assert out.returncode == 0, out.stderr
    w, h = png_size(png)
    assert 400 <= w <= 3000 and 250 <= h <= 3000
    assert os.path.getsize(png) > 8000
    svg = str(tmp_path / f"{kind}.svg")
    assert run_cli("plot", shipped, "--kind", kind, "--policies", pols, "-o", svg, "-j", "1").returncode == 0
    text = open(svg).read()
    assert TITLES[kind] in text and os.path.basename(shipped) in text


def test_report_writes_index(tmp_path, shipped):
    out = run_cli("plot", shipped, "--policies", "none,split", "--report", str(tmp_path / "rep"), "-j", "1")
    assert out.returncode == 0, out.stderr
    html = open(tmp_path / "rep" / "index.html").read()
    for name in ("memory.png", "bars.png", "frontier.png", "latency.png", "gc.png"):
        assert name in html and os.path.getsize(tmp_path / "rep" / name) > 8000
    assert "peak reserved" in html


def test_plot_needs_an_output(shipped):
    out = run_cli("plot", shipped)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
