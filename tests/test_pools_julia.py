"""The Julia pools: `binned` (CuArrays BinnedPool), `simple` (SimplePool), `knet` (Knet v1.1.1).

Each test builds a small trace by hand and works out, from the rules in
docs/models/cuarrays.md and docs/models/knet.md, what the real allocator would do: which
section runs, in which order, which block is reused, when memory goes back.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.engine.replay import replay
from allocsim.engine.replay import Replay
from allocsim.policies import binned
from allocsim.policies.knet import blocksize, icbrt
from allocsim.policies.simple import max_oversize
from allocsim.machine.sections import Sections
from allocsim.trace import ALLOC, TraceWriter
from conftest import ROOT

KiB, MiB = 1 << 10, 1 << 20
SEC = 1_000_000_000


@pytest.fixture
def pushed(monkeypatch):
    """The names of the sections pushed during a replay, in the order they were opened."""
    names: list[str] = []
    orig = Sections.push

    def push(self, name, clock):
        names.append(name)
        orig(self, name, clock)

    monkeypatch.setattr(Sections, "push", push)
    return names


def build(ops, times=None):
    """A trace from ``ops``: ("a", key, size) allocates, ("f", key) frees; ``times`` in ns per op."""
    w = TraceWriter()
    ids = {}
    for j, op in enumerate(ops):
        t = times[j] if times is not None else None
        if op[0] == "a":
            ids[op[1]] = w.alloc(op[2], t=t)
        else:
            w.free(ids[op[1]], t=t)
    return w.finish()


def run(ops, policy, *, runtime="eager", cap=None, options=None, times=None):
    """Replay; return (result, {key: handle of its ALLOC})."""
    trace = build(ops, times)
    keys = [op[1] for op in ops if op[0] == "a"]
    got = {}

    def observer(ev, kind, i, h):
        if kind == ALLOC:
            got[keys[i]] = h

    res = replay(trace, policy, runtime=runtime, cap=cap, capacity=None, options=options,
                        keep_going=True, observer=observer)
    return res, got


def paths(res):
    return {r["path"] for r in res.sections}


# ---------------------------------------------------------------- binned ----

def test_binned_rounds_up_to_a_power_of_two():
    sizes = [1, 1000, 1024, 1025, 3 * MiB, 2**27]
    res, h = run([("a", s, s) for s in sizes], "binned", options={"background": False})
    for s in sizes:
        assert h[s][1] == 1 << max(0, math.ceil(math.log2(s)))
    assert res.device_malloc_bytes == sum(h[s][1] for s in sizes)
    assert res.peak_allocated_bytes == res.device_malloc_bytes


def test_binned_reuses_its_exact_bin_last_in_first_out():
    ops = [("a", "x", 1000), ("a", "y", 900), ("a", "z", 600), ("f", "x"), ("f", "y"),
           ("a", "p", 1024), ("a", "q", 513), ("a", "r", 1000)]
    res, h = run(ops, "binned", options={"background": False})
    assert h["p"][0] == h["y"][0]          # freed last, reused first
    assert h["q"][0] == h["x"][0]
    assert h["r"][0] not in (h["x"][0], h["y"][0], h["z"][0])
    assert res.device_mallocs == 4


def test_binned_never_falls_back_to_a_larger_bin():
    res, h = run([("a", "big", 2048), ("f", "big"), ("a", "small", 1000)], "binned", options={"background": False})
    assert h["small"][0] != h["big"][0]
    assert res.device_mallocs == 2 and res.final_reserved_bytes == 2048 + 1024


def test_binned_collects_before_it_reclaims(pushed):
    # cap 4 KiB full of two dead 2 KiB blocks: gc(false) refills the bin, no reclaim
    ops = [("a", "a", 2048), ("a", "b", 2048), ("f", "a"), ("f", "b"), ("a", "c", 2000)]
    res, h = run(ops, "binned", runtime="gc", cap=4 * KiB, options={"background": False})
    assert pushed == ["2. gc(false)"]
    assert (res.gc_incremental, res.gc_full, res.device_mallocs, res.ooms) == (1, 0, 2, 0)
    assert h["c"][0] == h["b"][0]          # the collection returned a then b: LIFO hands out b
    assert "pooled alloc/2. gc(false)/pooled free" in paths(res)


def test_binned_reclaims_largest_bin_first_then_needs_a_full_gc(pushed):
    ops = [("a", "a", 2048), ("a", "b", 2048), ("f", "a"),
           ("a", "c", 1024),      # gc(false) returns a to bin 2048; reclaim frees it; alloc fits
           ("f", "b"),            # b survived a collection: gc(false) no longer sees it
           ("a", "d", 2048)]
    res, h = run(ops, "binned", runtime="gc", cap=4 * KiB, options={"background": False})
    assert pushed == ["2. gc(false)", "3. reclaim unused", "scan", "reclaim", "4. try alloc",
                      "2. gc(false)", "3. reclaim unused", "scan", "reclaim", "4. try alloc", "5. gc(true)"]
    assert (res.gc_incremental, res.gc_full, res.ooms) == (2, 1, 0)
    assert h["d"][0] == h["b"][0]
    assert res.device_frees == 1 and res.device_malloc_bytes == 2048 * 2 + 1024


def test_binned_full_escalation_to_oom(pushed):
    res, _ = run([("a", "x", 4096), ("a", "y", 16)], "binned", cap=4 * KiB, options={"background": False})
    steps = [n for n in pushed if n[0].isdigit()]
    assert steps == ["2. gc(false)", "3. reclaim unused", "4. try alloc", "5. gc(true)", "6. reclaim unused",
                     "7. try alloc", "8. reclaim everything", "9. try alloc"]
    assert pushed.count("scan") == pushed.count("reclaim") == 3
    assert res.ooms == 1 and res.cache_flushes == 1
    assert "pooled alloc/8. reclaim everything/scan" in paths(res)


def test_binned_reclaim_stops_at_the_target_largest_bin_first():
    # 3 KiB cached (2 x 1 KiB, 2 x 512 B); a 2 KiB request under a 4 KiB cap: step 3 frees
    # from the largest bin down until 2 KiB are freed, which leaves the 512 B blocks cached
    ops = [("a", "k", 1024), ("a", "l", 1024), ("a", "m", 512), ("a", "n", 512),
           ("f", "k"), ("f", "l"), ("f", "m"), ("f", "n"), ("a", "big", 2048)]
    res, _ = run(ops, "binned", cap=4 * KiB, options={"background": False})
    assert res.ooms == 0 and res.device_frees == 2 and res.final_reserved_bytes == 2048 + 1024
    assert res.counters["cached_bytes"] == 1024 and res.cache_flushes == 0


def test_binned_unpooled_requests_are_exact_and_freed_at_once():
    big = 2**27 + 1
    res, h = run([("a", "u", big), ("a", "p", 2**27), ("f", "u"), ("f", "p")], "binned",
                 options={"background": False})
    assert h["u"][1] == big and res.device_frees == 1
    assert res.final_reserved_bytes == 2**27 and res.counters["unpooled_allocs"] == 1


def test_binned_v121_max_pool_of_100_mib():
    ops = [("a", "u", 100 * MiB + 1), ("a", "p", 100 * MiB), ("f", "u"), ("f", "p")]
    res, h = run(ops, "binned", options={"background": False, "max_pool": 100 * MiB})
    assert h["p"][1] == 128 * MiB and h["u"][1] == 100 * MiB + 1
    assert res.final_reserved_bytes == 128 * MiB


def test_binned_unpooled_path_has_no_bin_retry(pushed):
    # a 1 KiB pool: the dead 2 KiB block is returned (cudaFree'd) by gc(false), but an unpooled
    # request does not retry a bin after it: it goes on to reclaim and try alloc
    ops = [("a", "a", 2048), ("f", "a"), ("a", "b", 3000)]
    res, h = run(ops, "binned", runtime="gc", cap=4 * KiB, options={"background": False, "max_pool": 1024})
    assert pushed == ["2. gc(false)", "3. reclaim unused", "scan", "reclaim", "4. try alloc"]
    assert res.ooms == 0 and res.device_frees == 1 and h["b"][1] == 3000


def _background_trace(last_s):
    """Four 1 KiB blocks used at t=0 and freed at 0.1 s; then one live 16 B block each second."""
    ops = [("a", k, 1024) for k in "wxyz"] + [("f", k) for k in "wxyz"]
    times = [0] * 4 + [SEC // 10] * 4
    for s in range(1, last_s + 1):
        ops.append(("a", f"t{s}", 16))
        times.append(s * SEC)
    return ops, times


def test_binned_background_task_releases_after_five_idle_ticks():
    # ticks (trace time): 0 (no bins: idle, delay 2), 2 (bin 1 KiB usage 1 -> 0: active, delay 1),
    # 3 (delay 2), 5 (4), 9 (5), 14 (5), 19: the window holds five 0s -> floor((1-0)*4) = 4 freed
    ops, times = _background_trace(18)
    res18, _ = run(ops, "binned", times=times)
    ops, times = _background_trace(19)
    res19, _ = run(ops, "binned", times=times)
    assert res18.counters["background_ticks"] == 6 and res18.device_frees == 0
    assert res19.counters["background_ticks"] == 7 and res19.device_frees == 4
    assert res19.counters["background_released"] == 4
    assert res19.gc_incremental == 7                  # one GC.gc(false) per tick
    assert {"background task", "background task/scan", "background task/reclaim"} <= paths(res19)


def test_binned_background_can_be_switched_off():
    ops, times = _background_trace(30)
    res, _ = run(ops, "binned", times=times, options={"background": False})
    assert res.device_frees == 0 and res.gc_incremental == 0
    assert not any(p.startswith("background") for p in paths(res))


def test_binned_background_gc_returns_frees_in_the_gc_runtime():
    ops, times = _background_trace(3)
    res, _ = run(ops, "binned", runtime="gc", times=times)
    assert "background task/pooled free" in paths(res)
    assert res.gc_reclaimed_bytes == 4 * 1024


# ---------------------------------------------------------------- simple ----

def test_simple_allocates_exact_sizes():
    res, h = run([("a", "x", 1000), ("a", "y", 5 * MiB + 3)], "simple")
    assert res.device_malloc_bytes == 1000 + 5 * MiB + 3 and h["x"][1] == 1000


def test_simple_max_oversize_as_written():
    assert max_oversize(MiB) == math.inf
    assert max_oversize(MiB + 1) == max_oversize(32 * MiB) == 4 * MiB   # the 1 MiB branch is dead


@pytest.mark.parametrize("cached, want, reused", [
    (5 * MiB, 5 * MiB, False),      # over 4 MiB: never reused by a request over 1 MiB
    (5 * MiB, 2 * MiB, False),
    (5 * MiB, 1000, True),          # ... but a request of at most 1 MiB takes anything large enough
    (3 * MiB, 2 * MiB, True),       # 2 MiB <= 3 MiB <= 4 MiB
    (4 * MiB, MiB + 1, True),
    (4 * MiB + 1, MiB + 1, False),
    (MiB, MiB + 1, False),          # too small
])
def test_simple_reuse_window(cached, want, reused):
    res, h = run([("a", "c", cached), ("f", "c"), ("a", "r", want)], "simple")
    assert (h["r"][0] == h["c"][0]) is reused
    assert res.device_mallocs == (1 if reused else 2)
    if reused:
        assert h["r"][1] == cached      # the whole buffer, no split


def test_simple_first_fit_in_insertion_order_not_best_fit():
    ops = [("a", "p", 3000), ("a", "q", 1000), ("a", "r", 2000), ("f", "p"), ("f", "q"), ("f", "r"),
           ("a", "s", 900), ("a", "t", 900)]
    _, h = run(ops, "simple")
    assert h["s"][0] == h["p"][0] and h["t"][0] == h["q"][0]


def test_simple_reclaims_before_it_collects(pushed):
    ops = [("a", "a", 5 * MiB), ("f", "a"), ("a", "b", 5 * MiB)]
    res, _ = run(ops, "simple", cap=8 * MiB)
    assert pushed == ["1.3 reclaim + alloc"]
    assert res.device_frees == 1 and res.gc_incremental == res.gc_full == 0
    res, _ = run(ops, "simple", runtime="gc", cap=8 * MiB)
    assert pushed[1:] == ["1.3 reclaim + alloc", "2.0 gc(false)", "2.1 scan", "2.2 alloc", "2.3 reclaim + alloc"]
    assert res.ooms == 0 and res.gc_incremental == 1 and res.device_frees == 1


def test_simple_escalation_to_oom(pushed):
    res, _ = run([("a", "x", 6 * MiB), ("a", "y", 4 * MiB)], "simple", cap=8 * MiB)
    assert pushed == ["1.3 reclaim + alloc", "2.0 gc(false)", "2.1 scan", "2.2 alloc", "2.3 reclaim + alloc",
                      "3.0 gc(true)", "3.1 scan", "3.2 alloc", "3.3 reclaim + alloc"]
    assert res.ooms == 1
    assert {"pooled alloc/1.1 scan", "pooled alloc/1.2 alloc"} <= paths(res)


def test_simple_reclaim_pops_oldest_until_enough():
    ops = [("a", "a", 5 * MiB), ("a", "b", 6 * MiB), ("a", "c", 7 * MiB), ("f", "a"), ("f", "b"), ("f", "c"),
           ("a", "d", 10 * MiB)]
    res, _ = run(ops, "simple", cap=20 * MiB)
    # 18 MiB cached; 10 MiB more needs 8 MiB back: a (5) then b (6) go, c stays
    assert res.device_frees == 2 and res.final_reserved_bytes == 17 * MiB


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([100, 900, 1000, MiB, MiB + 7, 3 * MiB, 4 * MiB,
                                                          5 * MiB])), min_size=1, max_size=60))
def test_simple_matches_a_linear_first_fit_model(steps):
    """The tiered scan picks exactly what one linear insertion-order scan of the whole set picks."""
    ops, live, n = [], [], 0
    for do_free, size in steps:
        if do_free and live:
            ops.append(("f", live.pop(0)))
        else:
            ops.append(("a", n, size))
            live.append(n)
            n += 1
    _, h = run(ops, "simple")
    cached: list[tuple[int, int]] = []      # (addr, size), insertion order
    for op in ops:
        if op[0] == "f":
            cached.append(h[op[1]])
            continue
        sz = op[2]
        fit = next((b for b in cached if sz <= b[1] <= max_oversize(sz)), None)
        if fit is None:
            assert h[op[1]][0] not in {b[0] for b in cached} and h[op[1]][1] == sz
        else:
            cached.remove(fit)
            assert h[op[1]] == fit


# ------------------------------------------------------------------ knet ----

def test_knet_blocksize_hand_values():
    # b = 2^(1/3): b^k for k = 0..9 is 1, 1.26, 1.59, 2, 2.52, 3.17, 4, 5.04, 6.35, 8
    assert [blocksize(n) for n in range(1, 9)] == [1, 2, 3, 4, 5, 6, 8, 8]
    assert blocksize(1000) == 1024            # 1000^3 <= 2^30
    assert blocksize(1024) == 1024            # exactly b^30: no float round-up to b^31
    assert blocksize(1025) == 1290            # floor(2^(31/3)) = floor(1290.16)
    assert blocksize(4 * MiB) == 4 * MiB


def test_knet_icbrt():
    for x in list(range(0, 3000)) + [2**k + d for k in range(1, 190) for d in (-1, 0, 1)]:
        m = icbrt(x)
        assert m**3 <= x < (m + 1) ** 3


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=2**40))
def test_knet_blocksize_against_the_formula(n):
    b = blocksize(n)
    k = (n**3 - 1).bit_length()
    assert 2 ** (k - 1) < n**3 <= 2**k            # k = ceil(log_b n), exactly
    assert b**3 <= 2**k < (b + 1) ** 3            # b = floor(b^k), exactly
    assert n <= b < n * 2 ** (1 / 3) + 1          # at most ~26 % rounding
    x = math.log(n, 2 ** (1 / 3))
    if abs(x - round(x)) > 1e-6:                  # away from a bin edge floats agree
        assert b == math.floor((2 ** (1 / 3)) ** math.ceil(x))


def test_knet_reuses_per_exact_block_size():
    ops = [("a", "x", 1000), ("f", "x"), ("a", "y", 1020), ("a", "z", 1025)]
    res, h = run(ops, "knet")
    assert h["y"][0] == h["x"][0] and h["y"][1] == 1024     # 1000 and 1020 share the 1024 bin
    assert h["z"][1] == 1290 and res.device_mallocs == 2


def test_knet_soft_limit_growth(pushed):
    # 16 MiB soft limit: four 4 MiB blocks fit; the 5th is a size seen before -> GC.gc(), limit*6/5,
    # list still empty -> limit = bytes + 2*block = 24 MiB; the 6th fits; the 7th -> GC.gc(),
    # 24 MiB*6/5 = 30198988 < 28 + 8 MiB -> limit 32 MiB
    res, _ = run([("a", i, 4 * MiB) for i in range(7)], "knet")
    assert res.gc_full == 2 and res.device_mallocs == 7
    assert res.counters["soft_limit_bytes"] == 32 * MiB
    assert pushed == ["3. GC.gc() (size seen before)", "4. raise limit + alloc"] * 2
    assert "pooled alloc/2. alloc (under limit)" in paths(res)


def test_knet_limit_x6_5_stays_when_it_is_the_larger():
    # 1 MiB blocks (2^20 = b^60 exactly): 16 fill the limit; the 17th: GC.gc(), limit 16 MiB*6/5,
    # and bytes + 2*block = 18 MiB is below that, so the x6/5 limit stays; 19 MiB still fit under it
    res, _ = run([("a", i, MiB) for i in range(19)], "knet")
    assert res.gc_full == 1 and res.counters["soft_limit_bytes"] == 16 * MiB * 6 // 5
    res, _ = run([("a", i, MiB) for i in range(20)], "knet")
    assert res.gc_full == 2 and res.counters["soft_limit_bytes"] == (16 * MiB * 6 // 5) * 6 // 5


def test_knet_new_size_over_the_limit_skips_the_gc(pushed):
    res, _ = run([("a", "x", 20 * MiB)], "knet")
    assert pushed == ["4. raise limit + alloc"] and res.gc_full == 0
    assert res.counters["soft_limit_bytes"] == 2 * blocksize(20 * MiB)


def test_knet_gc_returns_a_dead_block_of_the_same_size():
    ops = [("a", i, 4 * MiB) for i in range(4)] + [("f", 0), ("a", "n", 4 * MiB)]
    res, h = run(ops, "knet", runtime="gc")
    assert h["n"][0] == h[0][0] and res.gc_full == 1 and res.counters["gc_retry_hits"] == 1
    assert res.device_mallocs == 4


def test_knet_gc_flushes_every_cached_block_then_ooms(pushed):
    ops = [("a", "s", 1000), ("f", "s"), ("a", "x", 6 * MiB), ("a", "y", 6 * MiB)]
    res, _ = run(ops, "knet", cap=8 * MiB)
    # y: 1 KiB + 2 x 6.35 MiB is under the 16 MiB soft limit, so step 2 tries and fails on the cap;
    # x had y's block size: GC.gc(); raise + alloc fails; Knet.gc() frees the cached 1 KiB block;
    # the last alloc still fails -> OOM
    assert pushed == ["3. GC.gc() (size seen before)", "4. raise limit + alloc", "5a. Knet.gc()", "5b. alloc"]
    assert res.ooms == 1 and res.cache_flushes == 1 and res.device_frees == 1
    assert res.gc_full == 3                       # step 3, and Knet.gc()'s two GC.gc() calls


def test_knet_gc_makes_room():
    ops = [("a", "s", 3 * MiB), ("f", "s"), ("a", "x", 6 * MiB)]
    res, _ = run(ops, "knet", cap=8 * MiB)
    assert res.ooms == 0 and res.cache_flushes == 1 and res.final_reserved_bytes == blocksize(6 * MiB)


# ------------------------------------------------------------ invariants ----

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["binned", "simple", "knet"]), runtime=st.sampled_from(["eager", "gc"]),
       cap=st.sampled_from([None, 64 * KiB, 1 * MiB, 6 * MiB]),
       steps=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3 * MiB), st.integers(0, 3 * SEC)),
                      min_size=1, max_size=80))
def test_pools_keep_blocks_apart_and_account_bytes(policy, runtime, cap, steps):
    w, live, t = TraceWriter(), [], 0
    for kind, size, dt in steps:
        t += dt
        if kind == 0 and live:
            w.free(live.pop(size % len(live)), t=t)
        else:
            live.append(w.alloc(size, t=t))
    trace = w.finish()
    r = Replay(trace, policy, runtime=runtime, cap=cap, capacity=None, keep_going=True, observer=lambda *a: observer(*a))
    pol, dev = r.policy, r.device
    sizes = trace.id_size.tolist()
    held: dict[int, tuple] = {}

    def observer(ev, kind, i, h):
        if kind == ALLOC and h is not None:
            addr, n = pol.block(h)
            assert n >= sizes[i]
            held[i] = (addr, n)
        elif kind != ALLOC:
            held.pop(i, None)
        spans = sorted(held.values())
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert pol.allocated <= dev.reserved <= (cap or 2**63)
        if runtime == "eager":
            assert pol.allocated == sum(n for _, n in held.values())

    res = r.run()
    assert res.device_malloc_bytes - res.device_free_bytes == res.final_reserved_bytes
    assert 0 <= pol.largest_free() <= dev.reserved - pol.allocated


def test_binned_background_survives_a_clock_jump_to_2_60_ns(tmp_path):
    # the background task used to step 5 s at a time through 2^60 ns: ~2.3e8 iterations
    ops, times = _background_trace(2)
    ops += [("a", "late", 16), ("f", "late")]
    times += [1 << 60, (1 << 60) + 1]
    path = str(tmp_path / "jump.bin")
    build(ops, times).save(path)
    done = subprocess.run([sys.executable, "-m", "allocsim", "replay", path, "--policy", "binned",
                           "--runtime", "gc", "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    counters = json.loads(done.stdout)["counters"]
    assert counters["background_ticks"] > (1 << 60) // (5 * SEC)    # every iteration counted
    assert counters["background_released"] == 4


idle_ops = st.lists(st.tuples(st.sampled_from(["a", "f"]), st.sampled_from([16, 1024, 3000, 5000]),
                              st.integers(0, 200 * SEC)), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=idle_ops, runtime=st.sampled_from(["eager", "gc"]))
def test_binned_fast_forward_equals_stepping_tick_by_tick(monkeypatch, steps, runtime):
    ops, times, live, t = [], [], [], 0
    for j, (kind, size, gap) in enumerate(steps):
        t += gap
        if kind == "a" or not live:
            live.append(f"k{j}")
            ops.append(("a", live[-1], size))
        else:
            ops.append(("f", live.pop(0)))
        times.append(t)

    def replay(after):
        monkeypatch.setattr(binned, "FAST_FORWARD_AFTER", after)
        return run(ops, "binned", runtime=runtime, times=times)[0]

    stepped, jumped = replay(10**9), replay(0)
    for field in ("background_ticks", "background_released"):
        assert jumped.counters[field] == stepped.counters[field]
    assert (jumped.gc_incremental, jumped.device_frees, jumped.final_reserved_bytes) == \
        (stepped.gc_incremental, stepped.device_frees, stepped.final_reserved_bytes)
    assert jumped.total_time_seconds == pytest.approx(stepped.total_time_seconds, rel=1e-9)
    assert jumped.gc_time_seconds == pytest.approx(stepped.gc_time_seconds, rel=1e-9)
    assert [(r["path"], r["ncalls"]) for r in jumped.sections] == [(r["path"], r["ncalls"]) for r in stepped.sections]
    for a, b in zip(jumped.sections, stepped.sections):
        assert a["seconds"] == pytest.approx(b["seconds"], rel=1e-9, abs=1e-15)
