"""The report package: the replay summary and the compare table keep their format, every report reads a
result's dict form (JSON read back) as it reads the result, and `plot --report` replays each cell once."""
import glob
import html
import json
import os
import re

import pytest
from hypothesis import given, settings, strategies as st

import allocsim
from allocsim.search import sweep
from allocsim.cli import main
from allocsim.report.text import compare_table, replay_summary, row_label, section_table, validation_summary
from allocsim.search.sweep import Cell, run_cells
from allocsim.units import fmt_bytes, fmt_count, fmt_seconds
from allocsim.engine.replay import ReplaySettings

from conftest import ROOT, random_trace

RESNET = os.path.join(ROOT, "traces", "resnet50.bin")
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")))

#: The summary's layout, as README shows it; the values come from the result's fields.
SUMMARY = """\
policy {policy}  runtime {runtime}  cap {cap}  capacity {capacity}{options}
trace {trace}: {events} events, {allocs} allocs{stopped}

  LOAD (peak live)         {load:>12}
  peak allocated           {allocated:>12}
  peak reserved            {reserved:>12}   (final {final})
  utilization              {util:>11}%   fragmentation {frag}%
  overhead vs LOAD         {over:>11}%
  largest-free frag @peak  {lff:>12}
  reserved - live @peak    {why}
  device mallocs / frees   {mallocs:>12} / {frees}   ({malloc_bytes} / {free_bytes})
  cache flushes            {flushes:>12}
  GC calls incr / full     {gc_inc:>12} / {gc_full}   ({gc_time} paused, {gc_bytes} reclaimed)
  OOMs                     {ooms:>12}
{oom_lines}  malloc latency (modeled) p50 {p50}  p99 {p99}  max {max}  total {alloc_time}
{counters}  load {load_s:.3f}s  replay {replay_s:.3f}s  total {total_s:.3f}s"""

OOM_LINE = ("    event {event}: {size} request with {live} live, {allocated} allocated, {reserved} reserved, "
            "largest-free frag {lff:.1f}%\n")


def expected_summary(r) -> str:
    """`SUMMARY` filled from ``r``'s fields."""
    b = r.breakdown_at_peak
    why = f"{'n/a':>12}" if b is None else (
        f"{fmt_bytes(b['reserved'] - b['requested']):>12}   hard {fmt_bytes(b['hard'])} + soft {fmt_bytes(b['soft'])}"
        f" + stream {fmt_bytes(b['stream'])} + rounding {fmt_bytes(b['rounding'])}")
    ooms = "".join(OOM_LINE.format(event=o.event, size=fmt_bytes(o.size), live=fmt_bytes(o.live_bytes),
                                   allocated=fmt_bytes(o.allocated_bytes), reserved=fmt_bytes(o.reserved_bytes),
                                   lff=100 * o.largest_free_fragmentation) for o in r.oom_events[:5])
    counters = "".join(f"    {k.replace('_', ' '):<22} {v:>12,}\n" for k, v in r.counters.items()
                       if k != "cache_flushes")
    counters = counters and f"  {r.policy}'s own counters\n" + counters
    return SUMMARY.format(
        policy=r.policy, runtime=r.runtime, cap=fmt_bytes(r.cap_bytes), capacity=fmt_bytes(r.capacity_bytes),
        options=f"  options {','.join(f'{k}={v}' for k, v in r.options.items())}" if r.options else "", trace=r.trace,
        events=fmt_count(r.events), allocs=fmt_count(r.allocs), stopped="" if r.completed else
        " replayed  (stopped at the first OOM)", load=fmt_bytes(r.load_bytes), allocated=fmt_bytes(r.peak_allocated_bytes),
        reserved=fmt_bytes(r.peak_reserved_bytes), final=fmt_bytes(r.final_reserved_bytes),
        util=f"{100 * r.utilization:.1f}", frag=f"{100 * r.fragmentation:.1f}", over=f"{100 * r.overhead_vs_load:.1f}",
        lff=f"{100 * r.largest_free_fragmentation_at_peak:.1f}%", why=why, mallocs=f"{r.device_mallocs:,}",
        frees=f"{r.device_frees:,}", malloc_bytes=fmt_bytes(r.device_malloc_bytes),
        free_bytes=fmt_bytes(r.device_free_bytes), flushes=f"{r.cache_flushes:,}", gc_inc=f"{r.gc_incremental:,}",
        gc_full=f"{r.gc_full:,}", gc_time=fmt_seconds(r.gc_time_seconds), gc_bytes=fmt_bytes(r.gc_reclaimed_bytes),
        ooms=f"{r.ooms:,}", oom_lines=ooms, p50=fmt_seconds(r.latency["p50"]), p99=fmt_seconds(r.latency["p99"]),
        max=fmt_seconds(r.latency["max"]), alloc_time=fmt_seconds(r.alloc_time_seconds), counters=counters,
        load_s=r.load_seconds, replay_s=r.replay_seconds, total_s=r.load_seconds + r.replay_seconds)


@pytest.fixture(scope="module")
def resnet():
    return allocsim.Trace.load(RESNET)


@pytest.mark.parametrize("policy, cap, runtime, keep_going", [
    ("split", "4GB", "gc", False),                                  # README's first example
    ("torch[max_split_size_mb:128]", None, "eager", False),          # options on the first line
    ("bestfit", "2GB", "eager", True),                              # OOM lines, stopped or not
    ("binned", "2GB", "eager", False),
])
def test_replay_summary_keeps_its_layout_on_a_shipped_trace(resnet, policy, cap, runtime, keep_going):
    r = allocsim.replay(resnet, policy, cap=allocsim.parse_size(cap) if cap else None, runtime=runtime,
                        keep_going=keep_going)
    assert replay_summary(r) == expected_summary(r)


def test_a_replay_stopped_at_an_oom_says_its_allocs_are_those_replayed(capsys):
    """Stopped at its first OOM, a replay's ``allocs`` are the requests it replayed, not the trace's, beside the
    trace's events: its header said ``17.8k events, 358 allocs`` as if those were the trace's. It now names both;
    a replay that ran to the end is unchanged."""
    assert main(["replay", RESNET, "--policy", "torch", "--cap", "1GB", "--no-sections"]) == 1     # the OOM's status
    header = capsys.readouterr().out.splitlines()[1]
    assert header.endswith("resnet50.bin: 17.8k events, 358 of 5.9k allocs replayed  (stopped at the first OOM)")
    assert main(["replay", RESNET, "--policy", "torch", "--no-sections"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("resnet50.bin: 17.8k events, 5.9k allocs")


def test_a_replay_that_survived_an_oom_says_what_its_load_and_ooms_count():
    """A replay that refused a request the program survives went on without it, which LOAD counts: its peak may lie
    below LOAD (a negative overhead), and PyTorch's own ``num_ooms`` counts the OOM that ``ooms`` leaves out. The
    report says both beside the figures (docs/metrics.md); the fields keep their meanings."""
    from allocsim.trace import events as ev
    from test_caught_oom import MiB, workspace_trace
    r = allocsim.replay(workspace_trace(ev.CATCHES_OOM), "torch", cap=40 * MiB, capacity=None)
    assert (r.ooms, r.caught_ooms, r.counters["num_ooms"]) == (0, 1, 1) and r.overhead_vs_load < 0
    lines = replay_summary(r).splitlines()
    row = {line.split("   ")[0].strip(): line for line in lines}
    assert row["overhead vs LOAD"].endswith(f"{100 * r.overhead_vs_load:.1f}%   (LOAD counts the 1 request refused "
                                            f"and survived: no lower bound for this run)")
    assert row["OOMs"].endswith("0   (not survived; those the program survives below)")
    assert lines[lines.index("  torch's own counters") + 4] == \
        "    num ooms                          1   (every OOM PyTorch counts: the 1 survived too)"
    from allocsim.report.text import survived_note
    rows = [r.to_dict(), {**r.to_dict(), "caught_ooms": 0}]     # a compare table's rows, one that survived an OOM
    assert "no lower bound for that row" in survived_note(rows) and survived_note(rows[1:]) == ""


COMPARE_HEAD = ["policy", "cap", "runtime", "peak reserved", "util", "over LOAD", "dev mallocs", "flushes",
                "GC inc/full", "OOM", "alloc time", "p99 malloc"]


def expected_cells(row) -> list[str]:
    """A compare row's cells, from its fields."""
    oom = "-" if row["first_oom_event"] is None else f"@{row['first_oom_event']}"
    return [row_label(row), fmt_bytes(row["cap_bytes"]), row["runtime"], fmt_bytes(row["peak_reserved_bytes"]),
            f"{100 * row['utilization']:.1f}%", f"{100 * row['overhead_vs_load']:+.1f}%",
            f"{row['device_mallocs']:,}", f"{row['cache_flushes']:,}", f"{row['gc_incremental']}/{row['gc_full']}",
            oom, fmt_seconds(row["alloc_time_seconds"]), fmt_seconds(row["latency_p99"] or 0)]


def check_compare_table(text: str, rows: list[dict]) -> None:
    """``text`` is the compare table of ``rows``: the header, a rule under each column, one line per row;
    policy, cap and runtime flush left under their heading, the figures flush right."""
    head, rule, *body = text.split("\n")
    assert re.split(r" {2,}", head) == COMPARE_HEAD
    spans = [m.span() for m in re.finditer("─+", rule)]
    assert len(spans) == len(COMPARE_HEAD) and len(body) == len(rows)
    for line, cells in zip([head, *body], [COMPARE_HEAD, *map(expected_cells, rows)]):
        assert len(line) == spans[-1][1]
        for i, ((a, b), cell) in enumerate(zip(spans, cells)):
            assert line[a:b] == (cell.ljust(b - a) if i < 3 else cell.rjust(b - a)), (COMPARE_HEAD[i], line)
    for i, (a, b) in enumerate(spans):       # each column as wide as its widest entry, two spaces apart
        assert b - a == max(len(COMPARE_HEAD[i]), *(len(expected_cells(r)[i]) for r in rows))
        assert i == 0 or a == spans[i - 1][1] + 2


def test_compare_table_keeps_its_layout_on_a_shipped_trace():
    cells = [Cell(RESNET, p, cap, rt) for p in ("split", "torch[expandable_segments:True]", "cupy")
             for cap in (None, 3 << 30) for rt in ("eager", "gc")]
    rows = run_cells(cells)
    assert any(r["first_oom_event"] is not None for r in rows) and any(r["options"] for r in rows)
    check_compare_table(compare_table(rows), rows)


def _round_trip(d):
    """A result's dict form as a JSON reader gets it back (``--json``, a JSON-lines sweep)."""
    return json.loads(json.dumps(d, default=str))


@pytest.mark.parametrize("policy", ["split", "torch"])      # torch: an option whose value is a tuple
@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_reports_read_a_results_json_as_they_read_the_result(path, policy):
    t = allocsim.Trace.load(path)
    r = allocsim.replay(t, policy, cap=t.load_bytes, keep_going=True)
    back = _round_trip(r.to_dict())
    assert replay_summary(back) == replay_summary(r.to_dict()) == replay_summary(r)
    assert section_table(back["sections"]) == section_table(r.sections)
    if policy == "torch" and path.endswith(("resnet50.bin", "cupy_mlp.bin")):
        v = allocsim.validate_trace(t)
        assert validation_summary(_round_trip(v.to_dict())) == validation_summary(v)


@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["split", "torch", "bestfit", "binned", "cupy"]),
       cap=st.sampled_from([None, 2 << 20, 8 << 20]), runtime=st.sampled_from(["eager", "gc"]))
@settings(max_examples=25, deadline=None)
def test_reports_of_generated_replays(tmp_path_factory, seed, policy, cap, runtime):
    path = str(tmp_path_factory.mktemp("rep") / "t.bin")
    random_trace(300, seed=seed, max_size=1 << 20).save(path)
    row, r = sweep.run_cell(Cell(path, policy, cap, runtime), sweep.Settings(ReplaySettings(keep_going=True)),
                            full=True)
    assert replay_summary(_round_trip(r.to_dict())) == replay_summary(r)
    assert section_table(_round_trip(r.to_dict())["sections"]) == section_table(r.sections)
    check_compare_table(compare_table([row, _round_trip(row)]), [row, row])


def test_plot_report_replays_each_cell_once(tmp_path, monkeypatch, capsys):
    """The first cap's eager replays draw the memory and latency pictures and give the bars their rows."""
    replayed = []
    real = sweep.replay

    def counting(trace, policy, settings, **kw):
        replayed.append((str(policy), kw["cap"], kw["runtime"]))
        return real(trace, policy, settings, **kw)

    monkeypatch.setattr(sweep, "replay", counting)
    path = str(tmp_path / "t.bin")
    random_trace(400, seed=5, max_size=1 << 20).save(path)
    # 3MB is off fit's MiB grid: only the pictures replay at it
    assert main(["plot", path, "--policies", "split,bestfit", "--caps", "3MB,none", "-j", "1",
                 "--report", str(tmp_path / "rep")]) == 0
    at_first_cap = [c for c in replayed if c[1] == 3_000_000]
    assert sorted(at_first_cap) == [("bestfit", 3_000_000, "eager"), ("bestfit", 3_000_000, "gc"),
                                    ("split", 3_000_000, "eager"), ("split", 3_000_000, "gc")]
    monkeypatch.undo()
    fresh = [Cell(path, p, cap, rt) for rt in ("eager", "gc") for p in ("split", "bestfit") for cap in (3_000_000, None)]
    table = compare_table(run_cells(fresh[:4]) + run_cells(fresh[4:]), {3_000_000: "3MB", None: "none"})
    page = open(tmp_path / "rep" / "index.html").read()
    assert html.escape(table) in page                        # the rows a fresh replay gives
    assert "3MB (2.86 MiB)" in page                          # the cap as the user wrote it, as the pictures label it
