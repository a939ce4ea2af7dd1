"""The `oracle` policy: known optima on constructed traces, no overlap in time x
address, LOAD <= oracle <= an independent online best-fit packing, and refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import random_trace, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.cli import main
from allocsim.engine.replay import replay
from allocsim.errors import UsageError
from allocsim.policies.oracle import buffer_lifetimes, plan
from allocsim.trace import TraceWriter


def trace_of(script):
    """``script``: list of ("a", name, size) / ("f", name) steps."""
    w = TraceWriter()
    ids = {}
    for step in script:
        if step[0] == "a":
            ids[step[1]] = w.alloc(step[2])
        else:
            w.free(ids[step[1]])
    return w.finish()


def oracle_heap(t, **opts):
    return replay(t, "oracle", options=opts).peak_reserved_bytes


def test_disjoint_lifetimes_need_only_the_largest():
    t = trace_of([("a", "x", 1000), ("f", "x"), ("a", "y", 5000), ("f", "y"), ("a", "z", 3000), ("f", "z")])
    assert oracle_heap(t) == 5120          # 5000 rounded to 512 B


def test_nested_lifetimes_need_the_sum():
    t = trace_of([("a", "x", 4096), ("a", "y", 2048), ("a", "z", 1024), ("f", "z"), ("f", "y"), ("f", "x")])
    r = replay(t, "oracle")
    assert r.peak_reserved_bytes == 7168 == r.load_bytes


def test_beats_online_best_fit_where_the_optimum_is_known():
    # online: a at 0, b at 512, a freed leaves a 512 hole too small for c -> 2560.
    # The optimum is LOAD = b + c = 2048: put b at 0, c at 1024, a at 1024 (a and c never meet).
    t = trace_of([("a", "a", 512), ("a", "b", 1024), ("f", "a"), ("a", "c", 1024), ("f", "b"), ("f", "c")])
    r = replay(t, "oracle")
    assert r.load_bytes == 2048 and r.peak_reserved_bytes == 2048
    assert r.counters["heap_arrival_bytes"] == 2560 and r.counters["heap_spatial_bytes"] == 2048
    assert naive_best_fit_heap(t) == 2560


def test_several_orders_on_the_command_line_in_brackets_and_max_buffers_below_1_refused(tmp_path, capsys):
    """``-O orders=[spatial,temporal]`` (the brackets keep -O from cutting at the comma) tries just those two; a
    max_buffers below 1 is the option's fault, not the trace's."""
    t = trace_of([("a", "a", 512), ("a", "b", 1024), ("f", "a"), ("a", "c", 1024), ("f", "b"), ("f", "c")])
    path = str(tmp_path / "t.bin")
    t.save(path)
    assert main(["replay", path, "-p", "oracle", "-O", "orders=[spatial,temporal]", "--json"]) == 0
    counters = json.loads(capsys.readouterr().out)["counters"]
    assert "heap_spatial_bytes" in counters and "heap_temporal_bytes" in counters
    assert "heap_arrival_bytes" not in counters
    assert main(["replay", path, "-p", "oracle", "-O", "max_buffers=-5"]) == 2
    assert "option max_buffers: expected an integer of at least 1, got -5" in capsys.readouterr().err


def test_unit_option_rounds_or_keeps_exact_bytes():
    t = trace_of([("a", "x", 1000), ("a", "y", 100), ("f", "x"), ("f", "y")])
    assert oracle_heap(t) == 1536            # 1024 + 512
    assert oracle_heap(t, unit=1) == 1100 == replay(t, "none").peak_reserved_bytes
    with pytest.raises(UsageError, match="unit"):
        replay(t, "oracle", options={"unit": 0})


def test_never_freed_objects_live_to_the_end():
    t = trace_of([("a", "x", 1024), ("a", "y", 1024), ("f", "y"), ("a", "z", 1024)])
    start, end, size = buffer_lifetimes(t)
    assert end.tolist() == [4, 2, 4] and start.tolist() == [0, 1, 3]
    assert oracle_heap(t) == 2048


def test_handles_are_the_planned_offsets_in_one_segment():
    t = random_trace(300, seed=7)
    r = replay(t, "oracle")
    assert r.device_mallocs == 1 and r.device_malloc_bytes == r.peak_reserved_bytes == r.counters["heap_bytes"]
    assert r.load_bytes <= r.peak_reserved_bytes


def test_cap_below_the_heap_fails_at_the_first_malloc():
    t = trace_of([("a", "x", 4096), ("a", "y", 4096), ("f", "x"), ("f", "y")])
    r = replay(t, "oracle", cap=6000)
    assert r.ooms == 1 and r.oom_events[0].event == 0
    assert replay(t, "oracle", cap=8192).ooms == 0


def test_orders_option_and_refusal():
    t = random_trace(200, seed=2)
    with pytest.raises(UsageError, match="orders"):
        replay(t, "oracle", options={"orders": "spatial,bogus"})
    with pytest.raises(UsageError, match="max_buffers"):
        replay(t, "oracle", options={"max_buffers": 10})
    one = replay(t, "oracle", options={"orders": "spatial"})
    assert set(k for k in one.counters if k.startswith("heap_")) == {"heap_bytes", "heap_spatial_bytes"}


def test_cli_refusal_is_one_line(tmp_path):
    p = str(tmp_path / "t.bin")
    random_trace(200, seed=2).save(p)
    cp = run_cli("replay", p, "--policy", "oracle", "-O", "max_buffers=10", "-q")
    assert cp.returncode == 2
    assert len(cp.stderr.strip().splitlines()) == 1 and "max_buffers" in cp.stderr and "Traceback" not in cp.stderr


def test_not_above_the_cupy_model_on_a_training_like_trace():
    w = TraceWriter()
    rng = np.random.default_rng(0)
    act = rng.choice([1 << 16, 3 << 16, 1 << 18, 12345], 60).tolist()
    for _ in range(4):
        live = []
        for n in act:
            tmp = w.alloc(n // 3 + 1)
            live.append(w.alloc(n))
            w.free(tmp)
        for n in reversed(act):
            g = w.alloc(n)
            w.free(live.pop())
            w.free(g)
    t = w.finish()
    o = replay(t, "oracle")
    c = replay(t, "cupy")
    assert o.load_bytes <= o.peak_reserved_bytes <= c.peak_reserved_bytes


# ---- properties on random traces ---------------------------------------------------------

def naive_best_fit_heap(t) -> int:
    """Online best fit with coalescing over one unbounded address space, written plainly:
    the live blocks sorted by address; the smallest hole that fits, lowest address on
    ties, else just above the highest live block. Sizes rounded to 512 B."""
    live = {}        # id -> (offset, size)
    heap = 0
    for e in t:
        if e.kind == 1 and e.size > 0:
            n = -(-e.size // 512) * 512
            spans = sorted(live.values())
            holes, top = [], 0
            for off, sz in spans:
                if off > top:
                    holes.append((off - top, top))
                top = max(top, off + sz)
            fits = [h for h in holes if h[0] >= n]
            at = min(fits)[1] if fits else top
            live[e.id] = (at, n)
            heap = max(heap, at + n)
        elif e.kind == 2:
            live.pop(e.id, None)
    return heap


traces = st.builds(lambda n, seed, big: random_trace(n, seed=seed, max_size=big),
                   st.integers(2, 160), st.integers(0, 10**6), st.sampled_from([2048, 1 << 16, 1 << 22]))


@settings(max_examples=40, deadline=None)
@given(traces, st.sampled_from([1, 3, 16, 256]))
def test_no_two_time_overlapping_buffers_overlap_in_address(t, min_block):
    start, end, req = buffer_lifetimes(t)
    size = (req + 511) // 512 * 512
    heaps = {}
    for orders in (("spatial",), ("temporal",), ("arrival",)):
        off, heap, _, _ = plan(start, end, size, orders, min_block=min_block)
        heaps[orders[0]] = heap
        assert (off >= 0).all() and (off % 512 == 0).all()
        assert heap == int((off + size).max()) if len(off) else heap == 0
        t_over = (start[:, None] < end[None, :]) & (start[None, :] < end[:, None])
        a_over = (off[:, None] < (off + size)[None, :]) & (off[None, :] < (off + size)[:, None])
        both = t_over & a_over
        np.fill_diagonal(both, False)
        assert not both.any()
    # the time blocks only speed the search up: the placement does not depend on them
    assert plan(start, end, size, min_block=10**9)[3] == heaps


@settings(max_examples=40, deadline=None)
@given(traces)
def test_load_le_oracle_le_online_best_fit(t):
    r = replay(t, "oracle")
    assert r.load_bytes <= r.peak_reserved_bytes <= naive_best_fit_heap(t)
    assert r.counters["heap_arrival_bytes"] == naive_best_fit_heap(t)   # arrival order is online best fit


def test_gc_runtime_collects_when_dead_objects_hold_the_planned_slot():
    t = trace_of([("a", "x", 1024), ("f", "x"), ("a", "y", 1024), ("f", "y")])
    r = replay(t, "oracle", runtime="gc")
    assert r.peak_reserved_bytes == 1024 and r.gc_full == 1 and r.counters["planned_collections"] == 1
    r = replay(t, "oracle", runtime="eager")
    assert r.gc_full == 0 and r.counters["planned_collections"] == 0
