"""Every picture comes out of a shipped trace as a valid image with the expected title."""
import glob
import os
import struct

import pytest

from conftest import ROOT, run_cli

SHIPPED = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")), key=os.path.getsize)
TITLES = {"memory": "Memory over time", "bars": "Policies side by side", "frontier": "Capacity frontier",
          "latency": "Malloc latency", "gc": "Garbage collections"}


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


# ---------------------------------------------------------------------------------------------
# what a reader sees: labels, scales, legends, colours (figures inspected, not just files)

import numpy as np  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from allocsim.report import plots  # noqa: E402
from allocsim.commands.plot import parse_caps  # noqa: E402
from allocsim.search.sweep import Cell, Settings, run_cell, run_cells  # noqa: E402
from allocsim.engine.replay import ReplaySettings  # noqa: E402
from allocsim.units import parse_size  # noqa: E402

POLICIES = ["split", "bestfit"]
CAPS = "none,100MB,3MB"          # 3MB stops both at an OOM; given out of order on purpose


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from conftest import random_trace
    from allocsim.trace import Trace
    p = str(tmp_path_factory.mktemp("plots") / "small.bin")
    random_trace(1500, seed=3, marks_every=300).save(p)
    return Trace.load(p)


@pytest.fixture(scope="module")
def figures(small):
    """Every figure of one small report, drawn the way the command draws them."""
    import matplotlib.pyplot as plt
    cap_text = parse_caps(CAPS)
    styles = plots.policy_styles(POLICIES)
    rows = run_cells([Cell(small.path, p, c, rt, ()) for p in POLICIES for c in cap_text for rt in ("eager",)])
    gc_rows = run_cells([Cell(small.path, p, c, "gc", ()) for p in POLICIES for c in cap_text])
    timeline = {p: run_cell(Cell(small.path, p, None), Settings(ReplaySettings(timeline=True)), full=True)[1]
                for p in POLICIES}
    fit = {"load_bytes": small.load_bytes, "oracle_peak_bytes": small.load_bytes + 1000,
           "fits": [{"policy": p, "options": "", "capacity_bytes": small.load_bytes * (1.1 + i / 10),
                     "island_bytes": None, "threshold": True}
                    for i, p in enumerate(POLICIES)]}
    figs = {"bars": plots.bars_figure(small, rows, styles=styles, cap_text=cap_text),
            "gc": plots.gc_figure(small, gc_rows, styles=styles, cap_text=cap_text),
            "memory": plots.memory_figure(small, timeline, styles=styles),
            "latency": plots.latency_figure(small, timeline, styles=styles),
            "frontier": plots.frontier_figure(small, fit, styles=styles)}
    for f in figs.values():
        f.canvas.draw()
    yield figs, styles, rows
    for f in figs.values():
        plt.close(f)


def _texts(ax):
    return [t.get_text() for t in ax.texts]


@pytest.mark.parametrize("kind", ["bars", "gc"])
def test_cap_labels_follow_the_users_text(figures, kind):
    figs, *_ = figures
    ticks = [t.get_text() for t in figs[kind].axes[0].get_xticklabels()]
    assert ticks == ["no cap", "cap 100MB\n(95.37 MiB)", "cap 3MB\n(2.86 MiB)"]


@given(st.sampled_from(["GB", "GiB", "MB", "MiB", "gb", "gib"]), st.integers(1, 999))
@settings(max_examples=40, deadline=None)
def test_cap_label_keeps_the_spelling_and_adds_binary_only_when_decimal(unit, n):
    text = f"{n}{unit}"
    b = parse_size(text)
    label = plots.cap_label(b, {b: text})
    assert label.startswith(f"cap {text}")
    assert ("(" in label) == (not unit.lower().endswith("ib"))


def test_caps_given_twice_are_refused():
    from allocsim.errors import UsageError
    with pytest.raises(UsageError, match="named twice"):
        parse_caps("4GB,4000000000")


def test_log_scales_where_counts_span_decades(figures):
    figs, *_ = figures
    bars = figs["bars"].axes
    assert [a.get_yscale() for a in bars] == ["linear", "linear", "log", "log"]
    assert [a.get_yscale() for a in figs["gc"].axes] == ["log", "log"]
    lat = figs["latency"].axes[0]
    assert (lat.get_xscale(), lat.get_yscale()) == ("log", "log")
    for ax in bars[2:] + list(figs["gc"].axes) + [lat]:          # plain numbers, at least two of them
        for axis in ([ax.yaxis] if ax is not lat else [ax.xaxis, ax.yaxis]):
            lo, hi = sorted(axis.get_view_interval())
            shown = [t.get_text() for t in axis.get_ticklabels() if lo <= t.get_position()[axis is ax.yaxis] <= hi]
            assert len([t for t in shown if t]) >= 2 and not any("$" in t for t in shown), shown


@pytest.mark.parametrize("kind", ["bars", "gc", "memory", "latency", "frontier"])
def test_legend_stays_off_the_data_area(figures, kind):
    fig = figures[0][kind]
    r = fig.canvas.get_renderer()
    legends = fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]
    assert legends, "no legend"
    for leg in legends:
        box = leg.get_window_extent(r)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(r)), (kind, box, ax.get_window_extent(r))


def test_one_colour_per_policy_in_every_picture(figures):
    figs, styles, _ = figures
    from matplotlib.colors import to_rgba
    for p in POLICIES:
        want = to_rgba(styles[p]["color"])
        for kind in ("bars", "gc"):
            bars = [c.patches[0] for c in figs[kind].axes[0].containers if c.get_label() == p]
            assert bars and to_rgba(bars[0].get_facecolor()) == want, kind
        for kind, suffix in (("memory", " reserved"), ("latency", "")):
            lines = [ln for ln in figs[kind].axes[0].get_lines() if ln.get_label() == p + suffix]
            assert lines and to_rgba(lines[0].get_color()) == want, kind
    assert len({str(s["color"]) for s in styles.values()}) == len(styles)
    assert len({s["marker"] for s in styles.values()}) == len(styles)


def test_oom_runs_are_labelled(figures):
    figs, _, rows = figures
    stopped = sum(1 for r in rows if r["ooms"])
    assert stopped >= len(POLICIES)                # each policy stops at the 3MB cap at least
    assert sum(_texts(a).count("OOM") for a in figs["bars"].axes) == 4 * stopped       # in each of 4 panels
    assert any(b.get_hatch() == plots.OOM_HATCH for b in figs["bars"].axes[0].patches)


def test_frontier_axis_starts_near_load_not_zero(figures, small):
    ax = figures[0]["frontier"].axes[0]
    lo, hi = ax.get_xlim()
    load = small.load_bytes / plots._unit(small.load_bytes)[0]
    assert 0.8 * load < lo < load < hi


def test_memory_timeline_starts_at_the_first_event(figures):
    ax = figures[0]["memory"].axes[0]
    assert ax.get_xlim()[0] == 0 and "first event" in ax.get_xlabel()
    live = [ln for ln in ax.get_lines() if ln.get_label().startswith("live")][0]
    assert np.min(live.get_xdata()) == 0


def test_memory_timeline_ends_at_the_last_event(figures, small):
    """issue 29: the axis ran to 1.0 s for a trace of 0.65 s (here 1.5 ms): a span shorter than one unit was
    widened to one, as only an instant needs."""
    t = np.asarray(small.time_ns)
    assert figures[0]["memory"].axes[0].get_xlim()[1] == pytest.approx((int(t[-1]) - int(t[0])) / 1e9)


def test_pdf_picture(tmp_path, shipped):
    pdf = str(tmp_path / "m.pdf")
    out = run_cli("plot", shipped, "--policies", "none", "-o", pdf, "-j", "1")
    assert out.returncode == 0, out.stderr
    assert open(pdf, "rb").read(5) == b"%PDF-"


def test_capped_timeline_marks_the_cap_and_the_ooms(small):
    import matplotlib.pyplot as plt
    cap_text = parse_caps("3MB")
    res = {p: run_cell(Cell(small.path, p, 3_000_000), Settings(ReplaySettings(timeline=True)), full=True)[1]
           for p in POLICIES}
    assert all(r.ooms for r in res.values())
    mem = plots.memory_figure(small, res, cap_text=cap_text)
    labels = [ln.get_label() for ln in mem.axes[0].get_lines()]
    assert "cap 3MB (2.86 MiB)" in labels and any(lab.startswith("OOM") for lab in labels)
    lat = plots.latency_figure(small, res)
    assert all("OOM" in ln.get_label() for ln in lat.axes[0].get_lines())
    plt.close(mem)
    plt.close(lat)


def test_a_policy_looks_the_same_whatever_the_policies_list_says():
    alone = plots.policy_styles(["split"])["split"]
    assert plots.policy_styles(["bestfit", "torch", "binned", "split"])["split"] == alone
    readme = plots.policy_styles("binned,split,knet,torch,torch[expandable_segments:True],cupy,bestfit".split(","))
    default = plots.policy_styles("split,binned,torch,cupy,bestfit".split(","))
    assert all(readme[p] == default[p] for p in default)
    assert len({s["color"] for s in readme.values()}) == len({s["marker"] for s in readme.values()}) == len(readme)
    plugin = "examples/policies/first_fit.py:FirstFit"
    assert plots.policy_styles([plugin, "split"])[plugin] == plots.policy_styles(["torch", plugin])[plugin]


def test_torch_and_bestfit_differ_in_colour_marker_and_line():
    styles = plots.policy_styles(["torch", "bestfit"])
    assert all(styles["torch"][k] != styles["bestfit"][k] for k in ("color", "marker", "ls"))


def _legend_texts(fig):
    return [t.get_text() for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
            for t in leg.get_texts()]


def test_breakdown_reads_in_one_paper_column(figures, small):
    _, styles, rows = figures
    fig = plots.breakdown_figure(small, rows, styles=styles, cap_text=parse_caps(CAPS))
    fig.canvas.draw()
    width, height = fig.get_size_inches()
    assert width <= plots.COLUMN_WIDTH and len(fig.axes) == len(parse_caps(CAPS))
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_yticklabels()] == POLICIES
        assert all(t.get_rotation() == 0 for t in ax.get_yticklabels() + ax.get_xticklabels())
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["no cap", "cap 100MB (95.37 MiB)", "cap 3MB (2.86 MiB)"]


def test_bars_list_load_only_where_its_line_shows(figures, small):
    figs, styles, rows = figures
    assert "LOAD (peak live bytes)" in _legend_texts(figs["bars"])
    early = [dict(r, peak_reserved_bytes=small.load_bytes // 10) for r in rows]      # every run stopped early
    fig = plots.bars_figure(small, early, styles=styles, cap_text=parse_caps(CAPS))
    assert "LOAD (peak live bytes)" not in _legend_texts(fig)


def test_an_empty_trace_is_a_note_not_blank_axes(tmp_path):
    from allocsim.trace import TraceWriter
    empty = TraceWriter().finish()
    empty.path = str(tmp_path / "empty.bin")
    for fig in (plots.memory_figure(empty, {}), plots.bars_figure(empty, []), plots.breakdown_figure(empty, []),
                plots.latency_figure(empty, {}), plots.gc_figure(empty, []),
                plots.frontier_figure(empty, {"load_bytes": 0, "fits": []})):
        assert ["nothing to plot: the trace holds no allocation"] == _texts(fig.axes[0]), fig.texts
        assert "empty.bin" in fig._suptitle.get_text()


@pytest.fixture(scope="module")
def tuned(small):
    from allocsim.search.tune import tune
    return tune(small.path, capacity=small.load_bytes * 2, jobs=1, fit=False)


def test_tune_plot_titles_the_file_and_draws_the_target_and_the_frontier(tuned, small):
    from allocsim.search.tune import fits
    fig = plots.tune_frontier_figure(tuned)
    ax = fig.axes[0]
    assert ax.get_title().startswith(os.path.basename(small.path) + ":") and os.sep not in ax.get_title()
    legend = _legend_texts(fig)
    assert f"target: capacity {plots.fmt_bytes(small.load_bytes * 2)}" in legend
    front = [ln for ln in ax.get_lines() if ln.get_label().startswith("Pareto frontier")]
    assert len(front) == 1 and len(front[0].get_xdata()) == len(tuned.frontier) >= 1
    assert front[0].get_markerfacecolor() == "none" and front[0].get_zorder() > 3     # a ring over the star
    shown = sum(int(t) for t in _texts(ax)) + sum(1 for _ in ax.collections[0].get_offsets()) - len(_texts(ax))
    assert shown == sum(fits(r) for r in tuned.rows)          # every fitting setting counted once (not the stopped)


def test_tune_plot_with_nothing_that_fits_says_so(tuned):
    import copy
    none_fit = copy.copy(tuned)
    none_fit.rows = [dict(r, ooms=1) for r in tuned.rows]
    assert "nothing to plot: no setting fits the target" in _texts(plots.tune_frontier_figure(none_fit).axes[0])
