"""The free breakdown: why reserved > live, split into hard, soft, stream and rounding.

Generated traces are walked one event at a time against a reference computed apart from the
policies' own bookkeeping (the device segments a logging device saw, the live blocks, the
engine's table of held objects); hand-built traces show each part on its own; the reports
carry it.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

import allocsim
from allocsim.cli import main
from allocsim.machine.metrics import PARTS
from allocsim.engine.replay import Replay, make_device
from allocsim.report.text import breakdown_table, replay_summary
from allocsim.search.sweep import Cell, run_cells
from allocsim.trace import ALLOC, TraceWriter
from allocsim.units import fmt_bytes

from conftest import random_trace

KiB, MiB = 1 << 10, 1 << 20
#: The policies that implement `free_breakdown`, and whether their pools are per stream.
PER_STREAM = {"torch": True, "torch[expandable_segments:True]": True, "cupy": True, "split": False, "bestfit": False}


def adds_up(b: dict) -> bool:
    parts = [b[p] for p in PARTS]
    return min(parts) >= 0 and sum(parts) == b["reserved"] - b["requested"]


# ---- generated traces, against a reference ---------------------------------------------------
def reference(r: Replay, segments: dict, stream: int, per_stream: bool) -> dict:
    """The free bytes by part, from the segments the device handed out (``addr -> (bytes, stream of the
    request that made it)``) and the live blocks: another stream's segment is ``stream``, one holding a live
    block ``hard``, the rest ``soft``. Expandable segments are mapped page by page: their runs come from
    the model's own snapshot layout instead."""
    out = dict.fromkeys(("hard", "soft", "stream"), 0)
    if getattr(r.policy, "expandable", False):
        for seg in r.policy.layout([r.handles[i] for i in r.handles]):
            free = sum(size for _, size, _, allocated in seg["blocks"] if not allocated)
            live = any(allocated for *_, allocated in seg["blocks"])
            out["stream" if seg["stream"] != stream else "hard" if live else "soft"] += free
        return out
    blocks = list(r.live_blocks().values())
    for addr, (n, owner) in segments.items():
        inside = [size for a, size in blocks if addr <= a < addr + n]
        part = "stream" if per_stream and owner != stream else "hard" if inside else "soft"
        out[part] += n - sum(inside)
    return out


def checked_walk(trace, policy: str, runtime: str, cap):
    """Walk ``trace`` an event at a time; at each new reserved peak and each OOM compare the policy's free
    breakdown with `reference`, and the requested bytes with those of the engine's held objects. Returns
    the result, the expected peak breakdown and the expected OOM breakdowns."""
    dev = make_device(trace, policy, cap=cap)
    segments, now = {}, {"stream": 0}
    malloc, free = dev.malloc, dev.free

    def logged_malloc(n):
        addr = malloc(n)
        if addr is not None:
            segments[addr] = (n, now["stream"])
        return addr

    def logged_free(addr, n):
        segments.pop(addr, None)         # expandable segments unmap pages the device never named
        free(addr, n)

    dev.malloc, dev.free = logged_malloc, logged_free
    r = Replay(trace, policy, runtime=runtime, cap=cap, device=dev, keep_going=True)
    per_stream = PER_STREAM[policy]
    rec, sizes = trace.records, trace.id_size
    peak, at_peak, at_ooms = 0, None, []
    while not r.at_end:
        at = r.events_done              # no marks, no 0-byte requests: driving index = trace index
        st_ = now["stream"] = int(rec["stream"][at])
        n_ooms = len(r.ooms)
        if not r.step(1):
            break
        if not r.at_end and r.events_done != at + 1:
            raise AssertionError("the walk skipped an event")

        def expected(stream=st_):
            held = sum(int(sizes[i]) for i in r.handles)
            return {"reserved": r.reserved, "requested": held, **reference(r, segments, stream, per_stream),
                    "rounding": r.allocated - held}
        if len(r.ooms) > n_ooms:
            at_ooms.append(expected())
        elif rec["kind"][at] == ALLOC and r.reserved > peak:
            peak, at_peak = r.reserved, {"event": at, **expected()}
    return r.finish(), at_peak, at_ooms


@given(seed=st.integers(0, 10_000), policy=st.sampled_from(sorted(PER_STREAM)),
       runtime=st.sampled_from(["eager", "gc"]), streams=st.sampled_from([1, 2, 3]),
       cap=st.sampled_from([None, 3 * MiB, 24 * MiB]))
@settings(max_examples=150, deadline=None)
def test_parts_add_up_and_match_the_segments_at_the_peak_and_each_oom(seed, policy, runtime, streams, cap):
    trace = random_trace(160, seed=seed, max_size=3 * MiB, streams=streams)
    res, at_peak, at_ooms = checked_walk(trace, policy, runtime, cap)
    assert res.breakdown_at_peak == at_peak
    assert adds_up(at_peak) and at_peak["reserved"] == res.peak_reserved_bytes
    assert [o.breakdown for o in res.oom_events] == at_ooms
    assert all(adds_up(b) for b in at_ooms)


def test_a_served_recorded_oom_at_the_peak_counts_its_request():
    """A recorded failed request served at a new peak is held then: its bytes are live in the breakdown."""
    w = TraceWriter()
    w.alloc(1000)
    w.oom(5 * MiB)
    res = allocsim.replay(w.finish(), "torch")
    assert res.ooms_avoided and res.breakdown_at_peak["requested"] == 1000 + 5 * MiB
    assert adds_up(res.breakdown_at_peak)


# ---- hand-built: each part on its own ----------------------------------------------------------
def trace_of(*events):
    """``("a", id, size[, stream])`` allocates (ids in order from 0), ``("f", id)`` frees."""
    w = TraceWriter()
    for e in events:
        if e[0] == "a":
            assert w.alloc(e[2], e[3] if len(e) > 3 else 0) == e[1]
        else:
            w.free(e[1])
    return w.finish()


def after(policy: str, *events, stream: int = 0) -> dict:
    """The policy's free breakdown for a request on stream index ``stream`` once ``events`` are replayed."""
    r = Replay(trace_of(*events), policy)
    r.run()
    return r.policy.free_breakdown(stream)


HOLE = {      # events leaving one segment with a live block and a hole beside it, and the hole's bytes
    "torch": ([("a", 0, 1000)], 2 * MiB - 1024),                                      # a 2 MiB small segment
    "bestfit": ([("a", 0, 1000)], 2 * MiB - 1024),                                    # a 2 MiB segment
    "cupy": ([("a", 0, 4 * KiB), ("f", 0), ("a", 1, 1000)], 3 * KiB),                 # a split chunk
    "split": ([("a", 0, MiB), ("f", 0), ("a", 1, 1000)], MiB - 1024),                 # a split buffer
}


@pytest.mark.parametrize("policy", sorted(HOLE))
def test_a_hole_beside_a_live_block_is_hard(policy):
    events, hole = HOLE[policy]
    assert after(policy, *events) == {"hard": hole, "soft": 0, "stream": 0}


@pytest.mark.parametrize("policy", sorted(HOLE))
def test_a_wholly_free_cached_segment_is_soft(policy):
    events, hole = HOLE[policy]
    freed = [("f", e[1]) for e in events if e[0] == "a" and ("f", e[1]) not in events]
    b = after(policy, *events, *freed)
    assert b["hard"] == b["stream"] == 0 and b["soft"] > hole


def test_split_counts_freed_pieces_not_yet_merged_as_soft():
    """split merges a freed block at the next malloc: until then a buffer of free pieces is still wholly free."""
    b = after("split", ("a", 0, MiB), ("f", 0), ("a", 1, 1000), ("f", 1))
    assert b == {"hard": 0, "soft": MiB, "stream": 0}


@pytest.mark.parametrize("policy", ["torch", "cupy"])
def test_another_streams_cached_segment_is_stream(policy):
    b = after(policy, ("a", 0, 1000, 7), ("f", 0), ("a", 1, 1000, 0), stream=1)   # stream 7 is index 0, 0 is 1
    seg = 2 * MiB if policy == "torch" else 1024
    assert b["stream"] == seg and b["soft"] == 0


@pytest.mark.parametrize("policy", ["split", "bestfit"])
def test_a_pool_without_streams_has_no_stream_part(policy):
    b = after(policy, ("a", 0, 1000, 7), ("f", 0), ("a", 1, 1000, 0), stream=1)
    assert b["stream"] == 0


def test_a_one_byte_request_rounded_to_512_is_rounding():
    res = allocsim.replay(trace_of(("a", 0, 1)), "torch")
    assert res.breakdown_at_peak == {"event": 0, "reserved": 2 * MiB, "requested": 1, "hard": 2 * MiB - 512,
                                     "soft": 0, "stream": 0, "rounding": 511}


def test_the_breakdown_at_an_oom_names_the_stream_that_failed():
    """cupy never lends a cached chunk to another stream; at the limit a request on the other stream fails
    after a flush that cannot release the split chunk of the first: its free bytes are the stream part."""
    t = trace_of(("a", 0, 4 * KiB, 7), ("f", 0), ("a", 1, 1000, 7), ("a", 2, 3 * KiB, 0))
    res = allocsim.replay(t, "cupy", options={"limit": 4 * KiB}, keep_going=True)
    (oom,) = res.oom_events
    assert oom.breakdown == {"reserved": 4 * KiB, "requested": 1000, "hard": 0, "soft": 0, "stream": 3 * KiB,
                             "rounding": 24}


def test_under_gc_dead_objects_not_yet_collected_count_as_requested():
    """Under gc a FREE only marks the object dead: its block stays allocated, its bytes stay requested."""
    res = allocsim.replay(trace_of(("a", 0, 1000), ("f", 0), ("a", 1, 3 * MiB)), "torch", runtime="gc")
    assert res.breakdown_at_peak["requested"] == 1000 + 3 * MiB and adds_up(res.breakdown_at_peak)


def test_keep_going_leaves_the_failed_objects_out():
    t = trace_of(("a", 0, 1000), ("a", 1, 30 * MiB), ("a", 2, 1000), ("f", 1))
    r = Replay(t, "torch", cap=4 * MiB, keep_going=True)
    res = r.run()
    assert res.ooms == 1 and res.oom_events[0].breakdown["requested"] == 1000
    assert res.breakdown_at_peak["requested"] == 1000     # the peak: the first ALLOC's segment


def test_a_policy_that_cannot_say_gives_none():
    res = allocsim.replay(trace_of(("a", 0, 1000)), "binned", cap=1, keep_going=True)
    assert res.breakdown_at_peak is None and all(o.breakdown is None for o in res.oom_events)
    assert "reserved - live @peak             n/a" in replay_summary(res)


# ---- reports ------------------------------------------------------------------------------------
def test_json_and_summary_carry_the_breakdown(tmp_path, capsys):
    path = str(tmp_path / "t.bin")
    trace_of(("a", 0, 1)).save(path)
    assert main(["replay", path, "--policy", "torch", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    b = d["breakdown_at_peak"]
    assert b["rounding"] == 511 and adds_up(b)
    assert main(["replay", path, "--policy", "torch"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "reserved - live @peak" in ln)
    assert line.split() == ["reserved", "-", "live", "@peak", *fmt_bytes(2 * MiB - 1).split(), "hard",
                            *fmt_bytes(2 * MiB - 512).split(), "+", "soft", "0", "B", "+", "stream", "0", "B", "+",
                            "rounding", "511", "B"]


def test_compare_breakdown_table_and_csv(tmp_path, capsys):
    path = str(tmp_path / "t.bin")
    random_trace(300, seed=4, max_size=MiB, streams=2).save(path)
    csv_path = str(tmp_path / "rows.csv")
    assert main(["compare", path, "--policies", "torch,binned", "--breakdown", "-q", "-j", "1",
                 "--csv", csv_path]) == 0
    out = capsys.readouterr().out
    table = out.split("reserved - live requested bytes at the reserved peak")[1].split("\n", 1)[1]
    rows = run_cells([Cell(path, p, None, "eager") for p in ("torch", "binned")])
    assert table.strip() == breakdown_table(rows).strip()
    head, _, *body = table.strip().splitlines()
    assert head.split()[-4:] == list(PARTS) and len(body) == 2
    torch_row = next(r for r in rows if r["policy"] == "torch")
    b = torch_row["breakdown_at_peak"]
    assert body[1].split()[0] == "torch" and body[1].split()[-2:] == fmt_bytes(b["rounding"]).split()
    assert body[0].split()[:4] == ["binned", "none", "eager", "n/a"]
    import csv
    with open(csv_path) as f:
        cells = {r["policy"]: r["breakdown_at_peak"] for r in csv.DictReader(f)}
    assert json.loads(cells["torch"]) == b and cells["binned"] == ""


def test_tune_table_has_the_breakdown_column():
    from allocsim.report.tune import WHY, table
    from allocsim.search.tune import tune
    t = trace_of(("a", 0, 1), ("a", 1, 3 * MiB))
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.bin")
        t.save(path)
        res = tune(path, jobs=1, fit=False, max_replays=2)
    row = res.rows[0]
    assert adds_up(row["breakdown"]) and row["breakdown"] == {k: v for k, v in row["breakdown_at_peak"].items()}
    text = table([row], res.load_bytes)
    assert WHY in text.splitlines()[0]
    shares = "/".join(f"{100 * row['breakdown'][p] / row['breakdown']['reserved']:.1f}" for p in PARTS)
    assert text.splitlines()[2].endswith(shares)


def test_breakdown_plot(tmp_path):
    path = str(tmp_path / "t.bin")
    random_trace(300, seed=4, max_size=MiB, streams=2).save(path)
    svg = str(tmp_path / "b.svg")
    assert main(["plot", path, "--kind", "breakdown", "--policies", "torch,binned", "--caps", "none,8MB",
                 "-o", svg, "-j", "1"]) == 0
    text = open(svg).read()
    assert "Why reserved &gt; live" in text and "n/a" in text and "soft: free in wholly free segments" in text
