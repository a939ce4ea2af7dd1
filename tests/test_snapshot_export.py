"""`replay --snapshot`: a replay as a PyTorch memory snapshot (allocsim.formats.exporters.torch_snapshot).

The export of a replay of a recorded snapshot must equal the recording where the model is
exact (the final segments and blocks, and every trace entry), import back to the replayed
events, stay consistent at every entry as PyTorch's visualizer walks it, and render with
the functions of ``torch.cuda._memory_viz`` (the ``render`` extra, CPU build of torch; those tests skip,
with the reason, without it — the rest check the format and need no torch).
"""
from __future__ import annotations

import base64
import bisect
import os
import pickle
import pickletools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.engine.replay import replay
from allocsim.formats.importers.torch_snapshot import convert
from allocsim.formats.exporters.torch_snapshot import History, write_snapshot
from allocsim.formats.exporters.torch_snapshot import replay_snapshot
from allocsim.testing import SIZE_RANGES, STREAMS, build_trace
from allocsim.trace import ALLOC, FREE, SEGMENT_ALLOC, Trace, TraceWriter
from allocsim.trace.events import SEGMENT_FREE
from conftest import ROOT, run_cli

PLAIN = os.path.join(ROOT, "traces", "raw", "pressure", "plain.pickle")
#: recordings the model replays exactly without a cap: plain, and a side stream with record_stream (frees
#: requested before they complete, three still pending at the end)
EXACT = ["plain", "side-stream"]
EXPANDABLE = os.path.join(ROOT, "traces", "resnet50-expandable.bin")
MAXSPLIT = os.path.join(ROOT, "traces", "gpt2-maxsplit128-rp2div4.bin")

#: the pickle opcodes MemoryViz.js's own unpickler knows (torch/utils/viz/MemoryViz.js, `unpickle`)
MEMORYVIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}


def load_pickle(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def imported(snapshot) -> Trace:
    """The trace `allocsim import` makes of a snapshot dict."""
    w = TraceWriter()
    stats = convert(snapshot, w)
    trace = w.finish()
    trace.import_stats = stats
    return trace


def recorded_run(name):
    """The recorded snapshot, its trace, the replay of that trace through `torch` and its export."""
    recorded = load_pickle(os.path.join(ROOT, "traces", "raw", "pressure", f"{name}.pickle"))
    trace = imported(recorded)
    res, export = replay_snapshot(trace, "torch")
    assert res.replay_seconds > 0                   # timed as `replay` is
    return recorded, trace, res, export


@pytest.fixture(scope="module")
def plain():
    return recorded_run("plain")


@pytest.fixture(scope="module", params=EXACT)
def exact(request, plain):
    return plain if request.param == "plain" else recorded_run(request.param)


def block_layout(snapshot) -> list:
    """What a snapshot says of each segment and block, for comparing two snapshots."""
    out = []
    for s in sorted(snapshot["segments"], key=lambda s: s["address"]):
        blocks = [(b["address"], b["size"], b["state"],
                   b["requested_size"] if b["state"] == "active_allocated" else None) for b in s["blocks"]]
        out.append((s["address"], s["total_size"], s["stream"], s["segment_type"], s["is_expandable"],
                    s["allocated_size"], s["active_size"], s["requested_size"], blocks))
    return out


def entries(snapshot) -> list:
    return [(e["action"], e.get("addr"), e["size"], e["stream"]) for e in snapshot["device_traces"][0]]


def driving(trace: Trace, skip_ids=frozenset()) -> list:
    """The driving events as (kind, object, requested size of an ALLOC, stream value), objects numbered in
    order of their ALLOC (as an import numbers them), those in ``skip_ids`` left out."""
    streams, number = trace.streams, {}
    out = []
    for k, i, s, si in zip(trace.kind.tolist(), trace.id.tolist(), trace.size.tolist(), trace.stream.tolist()):
        if k in (ALLOC, FREE) and i not in skip_ids:
            n = number.setdefault(i, len(number))
            out.append((k, n, s, int(streams[si])) if k == ALLOC else (k, n, 0, 0))
    return out


# ---- the recorded plain run: where the model is exact --------------------------------------
def test_export_of_the_recording_is_the_recording(exact):
    """Compared: every segment's address, total/allocated/active/requested size, stream, type and
    expandability, every block's address, size and state and an active block's requested size;
    and every trace entry's action, address, size and stream, in order."""
    recorded, _, res, export = exact
    assert res.ooms == 0 and len(export["segments"]) == len(recorded["segments"]) > 40
    assert block_layout(export) == block_layout(recorded)
    assert entries(export) == entries(recorded)


def test_import_of_the_export_gives_back_the_events(exact):
    recorded, trace, _, export = exact
    again = imported(export)
    assert driving(again) == driving(trace)
    assert again.import_stats["inconsistent"] == 0 and again.import_stats["final_mismatch"] == 0
    assert not again.import_stats["wrapped"]
    # the model was exact, so the round trip also keeps the recorded segment calls (stamped with the time of
    # the ALLOC whose malloc made them) and the driving events' times (an import counts from its first entry)
    assert (again.kind.tolist(), again.addr.tolist()) == (trace.kind.tolist(), trace.addr.tolist())
    drive = (trace.kind == ALLOC) | (trace.kind == FREE)
    t, t_again = trace.time_ns[drive].astype(int), again.time_ns[drive].astype(int)
    assert (t_again - t_again[0]).tolist() == (t - t[0]).tolist()


@pytest.mark.parametrize("path", [EXPANDABLE, MAXSPLIT], ids=["expandable", "maxsplit"])
def test_settings_survive_the_round_trip(path):
    """Replaying the imported export goes as the replay did: its allocator_settings are the ones in force."""
    trace = Trace.load(path)
    res, export = replay_snapshot(trace, "torch")
    again = imported(export)
    assert driving(again) == driving(trace)
    res2 = replay(again, "torch")
    assert (res2.peak_reserved_bytes, res2.device_mallocs, res2.device_frees, res2.counters) == \
        (res.peak_reserved_bytes, res.device_mallocs, res.device_frees, res.counters)
    if path == EXPANDABLE:
        assert {"segment_map", "segment_unmap"} & {e[0] for e in entries(export)}


def test_segment_calls_are_stamped_with_the_event_that_made_them():
    """A malloc's calls carry its ALLOC (one the observer never saw too: it failed); the calls of an event
    that is not an ALLOC (empty_cache, where the log still names the last ALLOC) are that event's."""
    history = History(build_trace([(True, 1, 0, 0)], []))
    log = [(SEGMENT_ALLOC, 1, 5)]
    history.stamp(log, 5)                           # ALLOC 5 made a segment
    log += [(SEGMENT_FREE, 1, 7), (SEGMENT_ALLOC, 1, 7), (SEGMENT_FREE, 1, 7)]
    history.stamp(log, 8)                           # ALLOC 7 failed after a flush; FREE 8 is seen
    log += [(SEGMENT_FREE, 1, 7)]
    history.stamp(log, 9)                           # event 9, an empty_cache, released a segment
    history.stamp(log, 12)
    assert history.stamps == [5, 7, 7, 7, 9]


# ---- what PyTorch's visualizer needs -----------------------------------------------------------
def walk_as_memoryviz(snapshot) -> None:
    """Walk the entries forward as the visualizer replays them; assert every step is possible.

    An alloc lands in mapped memory and overlaps no live block; a free names a live block; a
    segment is released or unmapped only when no live block is inside, and a released one is a
    whole segment allocated before (MemoryViz finds it by address); the end state is the
    snapshot's segments and active blocks.
    """
    mapped: list[list[int]] = []                  # sorted, coalesced [start, end) ranges
    whole: dict[int, int] = {}                    # segment_alloc'd segments: address -> size
    asked: set[int] = set()                       # live blocks whose free was requested
    live: dict[int, int] = {}
    addrs: list[int] = []

    def inside(a, n):
        k = bisect.bisect_right(mapped, [a, float("inf")]) - 1
        return k >= 0 and mapped[k][0] <= a and a + n <= mapped[k][1]

    def add_range(a, n):
        assert not any(s < a + n and a < e for s, e in mapped), ("mapped twice", a, n)
        bisect.insort(mapped, [a, a + n])
        merged = []
        for r in mapped:
            if merged and merged[-1][1] == r[0]:
                merged[-1][1] = r[1]
            else:
                merged.append(r)
        mapped[:] = merged

    def remove_range(a, n):
        k = bisect.bisect_right(mapped, [a, float("inf")]) - 1
        assert k >= 0 and inside(a, n), ("released memory that is not mapped", a, n)
        j = bisect.bisect_left(addrs, a)
        assert j == len(addrs) or addrs[j] >= a + n, ("released under a live block", a, n)
        s, e = mapped.pop(k)
        mapped[k:k] = [r for r in ([s, a], [a + n, e]) if r[1] > r[0]]

    for e in snapshot["device_traces"][0]:
        act, a, n = e["action"], e.get("addr"), e["size"]
        if act in ("segment_alloc", "segment_map"):
            add_range(a, n)
            if act == "segment_alloc":
                whole[a] = n
        elif act in ("segment_free", "segment_unmap"):
            remove_range(a, n)
            if act == "segment_free":
                assert whole.pop(a, None) == n, ("segment_free of no whole segment", e)
        elif act == "alloc":
            assert a not in live and inside(a, max(n, 1)), ("alloc outside mapped memory", e)
            j = bisect.bisect_left(addrs, a)
            assert j == len(addrs) or addrs[j] >= a + n
            assert j == 0 or addrs[j - 1] + live[addrs[j - 1]] <= a, ("alloc over a live block", e)
            live[a] = n
            addrs.insert(j, a)
        elif act == "free_requested":
            assert live.get(a) == n and a not in asked, ("free of no live block", e)
            asked.add(a)
        elif act == "free_completed":
            assert live.pop(a) == n and a in asked, ("free completed before it was requested", e)
            asked.remove(a)
            addrs.remove(a)
    final = [[s["address"], s["address"] + s["total_size"]] for s in sorted(snapshot["segments"],
                                                                           key=lambda s: s["address"])]
    coalesced = []
    for r in final:
        if coalesced and coalesced[-1][1] == r[0]:
            coalesced[-1][1] = r[1]
        else:
            coalesced.append(list(r))
    assert mapped == coalesced
    active = {b["address"]: b["requested_size"] for s in snapshot["segments"] for b in s["blocks"]
              if b["state"] != "inactive"}
    assert live == active
    assert asked == {b["address"] for s in snapshot["segments"] for b in s["blocks"]
                     if b["state"] == "active_pending_free"}
    for s in snapshot["segments"]:
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
        assert [b["address"] for b in s["blocks"]] == \
            [s["address"] + sum(b["size"] for b in s["blocks"][:k]) for k in range(len(s["blocks"]))]


def test_recorded_exports_walk_as_the_visualizer_walks(exact):
    recorded, _, _, export = exact
    walk_as_memoryviz(export)
    walk_as_memoryviz(recorded)                     # the check itself holds for what PyTorch wrote


def test_the_pickle_is_one_memoryviz_reads(plain, tmp_path):
    """MemoryViz.js unpickles protocols 2-4 with a fixed set of opcodes: no numpy scalar, set or bytes."""
    path = str(tmp_path / "s.pickle")
    write_snapshot(plain[3], path)
    with open(path, "rb") as f:
        data = f.read()
    ops = [op for op, arg, _ in pickletools.genops(data)]
    assert ops[0].name == "PROTO" and 2 <= next(pickletools.genops(data))[1] <= 4
    assert {op.name for op in ops} <= MEMORYVIZ_OPCODES
    assert pickle.loads(data) == plain[3]


sizes = st.one_of(*[st.integers(lo, hi) for lo, hi in SIZE_RANGES[:3]])     # up to 64 MiB: a cap of 48 MiB binds
ops = st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 2), st.integers(0, 10**6)), min_size=1, max_size=60)
options = st.fixed_dictionaries({}, optional={"expandable_segments": st.just(True),
                                              "max_split_size_mb": st.sampled_from([20, 64]),
                                              "roundup_power2_divisions": st.sampled_from(["2", "[64:4,>:1]"]),
                                              "garbage_collection_threshold": st.sampled_from([0.5])})


def requesting_trace(ops, keep: int) -> Trace:
    """A run of ``ops`` (as `build_trace`'s) where a non-ALLOC op with an odd pick requests the free of a
    live object, as ``record_stream`` delays it (its FREE comes later, or never); the first ``keep`` objects
    live at the end are freed."""
    w = TraceWriter()
    live, asked = [], set()
    for is_alloc, size, stream, pick in ops:
        if is_alloc or not live:
            live.append(w.alloc(size, stream=STREAMS[stream]))
        elif pick % 2 and live[pick % len(live)] not in asked:
            asked.add(live[pick % len(live)])
            w.free_requested(live[pick % len(live)])
        else:
            w.free(live.pop(pick % len(live)))
    for i in live[:keep % (len(live) + 1)]:
        w.free(i)
    return w.finish()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, keep=st.integers(0, 10**6), options=options, cap=st.sampled_from([None, 48 << 20, 160 << 20]))
def test_every_export_walks_and_imports_back(ops, keep, options, cap):
    """Random runs, settings and caps (OOMs included, under --keep-going), frees requested early and some
    never completed: the export is consistent at every entry, ends in the layout it reports, and imports
    back to the events served."""
    trace = requesting_trace(ops, keep)
    res, export = replay_snapshot(trace, "torch", options=dict(options), cap=cap, capacity=1 << 30,
                                  keep_going=True)
    walk_as_memoryviz(export)
    failed = {int(trace.id[o.event]) for o in res.oom_events}
    assert sum(e[0] == "oom" for e in entries(export)) == res.ooms
    assert driving(imported(export)) == driving(trace, failed)


def test_call_sites_are_the_stacks_the_visualizer_shows():
    """An ALLOC's call site is the frame of its entries and of its block, and imports back as the same site."""
    w = TraceWriter()
    sites = ["train.py:12:forward", "/opt/lib/model.py:7:<lambda>", None]
    ids = [w.alloc(3 << 20, site=sites[k % 3]) for k in range(9)]
    for i in ids[::2]:
        w.free(i)
    trace = w.finish()
    _, export = replay_snapshot(trace, "torch")
    allocs = [e for e in export["device_traces"][0] if e["action"] == "alloc"]
    shown = [f"{f[0]['filename']}:{f[0]['line']}:{f[0]['name']}" if f else None for f in (e["frames"] for e in allocs)]
    assert shown == [sites[k % 3] for k in range(9)]
    frees = [e for e in export["device_traces"][0] if e["action"] == "free_completed"]
    assert [e["frames"] for e in frees] == [allocs[k]["frames"] for k in range(0, 9, 2)]
    blocks = {b["address"]: b["frames"] for s in export["segments"] for b in s["blocks"] if b["state"] != "inactive"}
    assert sorted(map(str, blocks.values())) == sorted(str(allocs[k]["frames"]) for k in range(1, 9, 2))
    again = imported(export)
    at = again.kind == ALLOC
    assert [again.sites[s] if s != 0xFFFFFFFF else None for s in again.site[at].tolist()] == shown


# ---- the command ---------------------------------------------------------------------------------
def test_replay_snapshot_command_writes_the_export(tmp_path):
    trace = str(tmp_path / "plain.bin")
    imported(load_pickle(PLAIN)).save(trace)
    out = str(tmp_path / "out.pickle")
    p = run_cli("replay", trace, "-p", "torch", "--snapshot", out, "-q", "--no-sections")
    assert p.returncode == 0, p.stderr
    export = load_pickle(out)
    assert block_layout(export) == block_layout(load_pickle(PLAIN))
    said = f"allocsim: wrote {out}: the replay under torch as a PyTorch memory snapshot ({len(export['segments'])} " \
           f"segments, {len(export['device_traces'][0])} trace entries; open it in https://pytorch.org/memory_viz)"
    assert p.stderr.splitlines() == [said]
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def test_an_oomed_replay_still_writes_its_snapshot(tmp_path):
    """The user looking at an OOM wants the snapshot of it: exit 1, and the export ends in the oom."""
    out = str(tmp_path / "oom.pickle")
    p = run_cli("replay", MAXSPLIT, "-p", "torch", "--cap", "1GB", "--snapshot", out, "-q", "--no-sections")
    assert p.returncode == 1 and "out of memory" in p.stderr
    export = load_pickle(out)
    last = export["device_traces"][0][-1]
    assert last["action"] == "oom" and last["device_free"] > 0 and last["size"] > 0
    walk_as_memoryviz(export)


# ---- torch.cuda._memory_viz renders the exports ---------------------------------------------------
def lines_of(flamegraph: str) -> list[tuple[str, int]]:
    out = []
    for line in flamegraph.splitlines():
        stack, _, n = line.rpartition(" ")
        out.append((stack, int(n)))
    return out


@pytest.fixture(scope="module")
def memory_viz():
    pytest.importorskip("torch", reason="PyTorch is not installed: the renderer checks need the render extra "
                        "(pip install -e '.[render]'); the export is checked against the format without it")
    from torch.cuda import _memory_viz
    return _memory_viz


@pytest.fixture(scope="module")
def expandable_export():
    return replay_snapshot(Trace.load(EXPANDABLE), "torch")


@pytest.mark.parametrize("which", ["plain", "expandable"])
def test_memory_viz_renders_the_export(which, memory_viz, plain, expandable_export):
    res, export = (plain[2], plain[3]) if which == "plain" else expandable_export
    reserved = sum(s["total_size"] for s in export["segments"])
    assert reserved == res.final_reserved_bytes
    same = lambda text: text                            # noqa: E731 -- the flamegraph's input lines, not an SVG
    for render in (memory_viz.segments, memory_viz.memory):
        assert sum(n for _, n in lines_of(render(export, format_flamegraph=same))) == reserved
    summary = memory_viz.segsum(export)              # asserts its own accounting adds up
    assert f"segments: {len(export['segments'])}\n" in summary
    assert re.search(r"total_reserved: \S+", summary).group(0) == f"total_reserved: {memory_viz.Bytes(reserved)}"
    text = memory_viz.trace(export)
    assert text.startswith(f"Device 0 ----------------\n{len(export['device_traces'][0])} entries\n")
    if res.ooms == 0:
        assert text.count("cudaMalloc(") == sum(e["action"] == "segment_alloc"
                                                for e in export["device_traces"][0])
    for html in (memory_viz.trace_plot(export), memory_viz.trace_plot(export, plot_segments=True),
                 memory_viz.segment_plot(export)):
        b64 = re.search(r'"base64": "([^"]+)"', html).group(1)
        assert pickle.loads(base64.b64decode(b64)) == export


def test_memory_viz_compare_finds_no_difference_with_the_recording(memory_viz, plain, capsys):
    recorded, _, _, export = plain
    diff = memory_viz.compare(recorded["segments"], export["segments"], format_flamegraph=lambda t: t)
    assert diff == ""
    assert "only_before = []\nonly_after = []" in capsys.readouterr().out
    # and it does see a difference where there is one
    fewer = memory_viz.compare(recorded["segments"], export["segments"][1:], format_flamegraph=lambda t: t)
    assert fewer.startswith("only_before;")


def test_the_exporter_does_not_import_torch():
    import subprocess
    import sys
    code = ("import sys, allocsim.formats.exporters.torch_snapshot, allocsim.commands.replay; "
            "print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.stdout.strip() == "False", p.stderr

