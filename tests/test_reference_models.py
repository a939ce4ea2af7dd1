"""Each fast policy against its reference model (allocsim/policies/reference/).

Both replay the same trace on their own simulated device; they must make the same
device calls (malloc and free, sizes and order), so the bump-pointer devices hand out
the same addresses, and then every block must lie at the same address with the same
size, the same requests must fail (OOM at the same event) and the counters must agree.
Traces: hypothesis-generated ones (sizes across the allocators' class boundaries,
several streams, frees in random order, caps that force the release/OOM paths) and
every shipped trace in traces/.
"""
from __future__ import annotations

import ast
import glob
import importlib.util
import inspect
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim import policies
from allocsim.policies import torch as torch_rules
from allocsim.policies.reference import torch as torch_ref_rules
from allocsim.engine.replay import Replay, make_device
from allocsim.errors import UsageError
from allocsim.policies.torch import has_pool_events
from allocsim.trace import ALLOC, Trace, TraceWriter
from allocsim.trace.events import CACHE_RELEASE, SEGMENT_ALLOC, SEGMENT_FREE, SET_LIMIT

from conftest import ROOT

MiB = 1 << 20
KiB = 1 << 10
GiB = 1 << 30

REFERENCES = sorted(n for n in policies.names() if policies.get(n).reference_of)
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")))

#: options each reference is checked under (the fast model's defaults first)
OPTIONS = {
    "torch": [[], ["max_split_size_mb:20"], ["max_split_size_mb:64,max_non_split_rounding_mb:40"],
              ["roundup_power2_divisions:4"], ["roundup_power2_divisions:[1:2,4:8,>:1]"],
              ["per_process_memory_fraction:0.5"], ["per_process_memory_fraction:0.5,garbage_collection_threshold:0.6"],
              ["per_process_memory_fraction:0.9,garbage_collection_threshold:0.2,max_split_size_mb:32"],
              ["fix_189504:true,max_split_size_mb:24"], ["trace_settings:false"],
              ["expandable_segments:true"], ["expandable_segments:true,max_split_size_mb:40"],
              ["expandable_segments:true,per_process_memory_fraction:0.8,garbage_collection_threshold:0.5"]],
    "split": [[], ["huge_exact=true"]],
    "bestfit": [[], ["release=true"], ["segment=1MiB"], ["segment=20MiB,release=true"]],
    "cupy": [[], ["version=13"], ["limit=96MiB,track_total=true"], ["version=13,limit=256MiB"]],
}
OPTION_CASES = [pytest.param(ref, opts, id=f"{ref}[{','.join(opts)}]")
                for ref in REFERENCES for opts in OPTIONS[policies.get(ref).reference_of]]


def replay_log(trace, policy, options, *, runtime="eager", cap=None, capacity="trace", pressure=None):
    """Everything a policy did on ``trace`` that the reference must reproduce; ``pressure`` maps a
    trace index to what happens after that event (`apply_pressure`)."""
    dev = make_device(trace, policy, cap=cap, capacity=capacity)
    calls = []
    malloc, free = dev.malloc, dev.free

    def logged_malloc(n):
        addr = malloc(n)
        calls.append(("malloc", n, addr))
        return addr

    def logged_free(addr, n):
        calls.append(("free", n, addr))
        free(addr, n)

    dev.malloc, dev.free = logged_malloc, logged_free
    placed, attempts = [], []

    def observe(event, kind, id_, handle):
        if kind == ALLOC and handle is not None:
            placed.append((event, *pol.block(handle)))
        if pressure and event in pressure:
            apply_pressure(pol, dev, pressure[event], attempts)

    r = Replay(trace, policy, options=options, runtime=runtime, cap=cap, device=dev, keep_going=True, observer=observe)
    pol, sec = r.policy, r.sections
    res = r.run()
    return {"device calls": calls, "blocks": placed, "pressure attempts": attempts,
            "ooms": [(o.event, o.reserved_bytes) for o in res.oom_events],
            "counters": pol.counters(), "allocated": pol.allocated, "largest free": pol.largest_free(),
            "segment log": getattr(pol, "segment_log", None), "total log": list(getattr(pol, "total_log", None) or ()),
            "open sections": sec.stack,     # every section a policy opened is closed again
            "modeled clock": dev.clock,
            "certified limits": dev.certified()}     # the limits that replay alike (`allocsim fit`): note and pin


def assert_same(trace, ref, options, **kw):
    fast = replay_log(trace, policies.get(ref).reference_of, options, **kw)
    slow = replay_log(trace, ref, options, **kw)
    for what in fast:
        if what == "counters" and fast[what].keys() != slow[what].keys():
            continue
        a, b = fast[what], slow[what]
        if what == "modeled clock":             # the same costs, summed in another order
            b = pytest.approx(b, rel=1e-9)
        if isinstance(a, list):
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert a == b, f"{what} differ at #{first}: fast {a[first:first + 2]} reference {b[first:first + 2]}"
        assert a == b, f"{what}: fast {a} reference {b}"
    return fast


def apply_pressure(pol, dev, action, attempts):
    """What the engine's walk does at a pressure event: ``("release",)`` a cache release,
    ``("limit", bytes | None)`` a new limit (SET_LIMIT), ``("oom", size, stream)`` a request the
    recorded run failed, attempted again (served: freed at once)."""
    what = action[0]
    if what == "release":
        pol.release_cache()
    elif what == "limit":
        dev.set_cap(action[1])
    else:
        h = pol.malloc(action[1], action[2])
        attempts.append(None if h is None else pol.block(h))
        if h is not None:
            pol.free(h)


# ---- generated traces --------------------------------------------------------------------
sizes = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(4 * KiB, 3 * MiB),                  # the 1 MiB small/large boundaries
    st.integers(3 * MiB, 48 * MiB),                 # 10 / 20 / 32 MiB segment and class boundaries
    st.integers(48 * MiB, 300 * MiB),               # oversize under max_split_size_mb, HUGE
    st.sampled_from([512, 513, MiB - 1, MiB, MiB + 1, 2 * MiB - 512, 9 * MiB, 10 * MiB, 19 * MiB,
                     19 * MiB + 1, 20 * MiB, 20 * MiB + 1, 31 * MiB, 32 * MiB, 32 * MiB + 1, 64 * MiB,
                     64 * MiB + 512, 84 * MiB]),    # remainders of exactly 1 MiB, segments of exactly n
)


@st.composite
def traces(draw, max_ops: int = 80):
    """Allocs and frees on up to three streams, frees in random order, some objects left live."""
    ops = draw(st.lists(st.tuples(st.integers(0, 2), sizes, st.integers(0, 2), st.integers(0, 10**6)),
                        min_size=1, max_size=max_ops))
    w = TraceWriter(meta={"producer": "hypothesis"})
    live: list[int] = []
    for what, size, stream, pick in ops:
        if what or not live:
            live.append(w.alloc(size, stream=[0, 7, 0xBEEF][stream]))
        else:
            w.free(live.pop(pick % len(live)))
    for k in draw(st.permutations(range(len(live))))[:draw(st.integers(0, len(live)))]:
        w.free(live[k])
    return w.finish()


@st.composite
def limits(draw, trace):
    """(cap, capacity): none, or a cap near the peak so that the release paths and OOMs run."""
    factor = draw(st.sampled_from([None, 0.6, 1.0, 1.3, 2.0]))
    cap = None if factor is None else int(max(trace.load_bytes, MiB) * factor)
    return cap, draw(st.sampled_from([cap, 4 * GiB])) if cap is not None else 4 * GiB


@pytest.mark.parametrize("ref, options", OPTION_CASES)
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), runtime=st.sampled_from(["eager", "gc"]))
def test_fast_policy_matches_reference_on_generated_traces(ref, options, data, runtime):
    trace = data.draw(traces())
    cap, capacity = data.draw(limits(trace))
    assert_same(trace, ref, options, runtime=runtime, cap=cap, capacity=capacity)


# ---- shipped traces ----------------------------------------------------------------------
#: `torch-ref` has no private pools (docs/models/torch.md, "Private pools"): the traces with pool events are held
#: to PyTorch itself instead (`tests/test_fidelity.py`, `tests/test_torch_pools.py`)
SHIPPED_CASES = [pytest.param(ref, p, id=f"{ref}-{os.path.basename(p)}") for ref in REFERENCES for p in SHIPPED
                 if not (policies.get(ref).reference_of == "torch" and has_pool_events(Trace.load(p)))]


@pytest.mark.parametrize("ref, path", SHIPPED_CASES)
def test_fast_policy_matches_reference_on_shipped_traces(ref, path):
    out = assert_same(Trace.load(path), ref, [])
    assert out["blocks"], "nothing was allocated"


@pytest.mark.parametrize("ref", REFERENCES)
@pytest.mark.parametrize("runtime", ["eager", "gc"])
def test_fast_policy_matches_reference_under_a_tight_cap(ref, runtime):
    """The embedded ResNet-50 trace under a cap that makes the pools flush, collect and fail."""
    trace = Trace.load(os.path.join(ROOT, "traces", "resnet50.bin"))
    for cap in (int(trace.load_bytes * 1.05), int(trace.load_bytes * 1.4)):
        assert_same(trace, ref, [], runtime=runtime, cap=cap, capacity=None)


def test_every_fast_policy_has_its_reference():
    assert {policies.get(r).reference_of for r in REFERENCES} == {"torch", "split", "bestfit", "cupy"}
    assert all(policies.get(r).params is policies.get(policies.get(r).reference_of).params for r in REFERENCES)


def _imported_from(module) -> dict[str, set[str]]:
    """``{module imported from: names}`` of every import statement in ``module``'s source, relative ones resolved."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom):
            name = importlib.util.resolve_name("." * node.level + (node.module or ""), module.__package__)
            out.setdefault(name, set()).update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                out.setdefault(a.name, set()).add("*")
    return out


@pytest.mark.parametrize("ref", REFERENCES)
def test_each_reference_takes_from_its_fast_model_only_the_class_it_restates(ref):
    """A rule the reference imported from the model it checks would be checked against itself: from its fast
    twin's module a reference takes only the class it is registered against (its name and options); sizes,
    rounding, classes, tie breaking and recorded places are its own (docs/models/, each "Reference model")."""
    cls = policies.get(ref)
    fast = policies.get(cls.reference_of)
    taken = _imported_from(sys.modules[cls.__module__]).get(fast.__module__, set())
    assert taken <= {fast.__name__}, f"{ref} imports {sorted(taken - {fast.__name__})} from {fast.__module__}"


# ---- cupy under pressure: limits set and lifted mid-run, cache releases, recorded OOMs' attempts --
@st.composite
def cupy_pressure_traces(draw):
    """Allocs and frees on up to three streams with, between them, CuPy's pressure events as its
    recorder writes them: ``free_all_blocks()`` (CACHE_RELEASE), ``set_limit`` (SET_LIMIT, 0 lifts
    it) and requests the recorded run failed (OOM records, attempted again)."""
    ops = draw(st.lists(st.tuples(st.integers(0, 6), sizes, st.integers(0, 2), st.integers(0, 10**6)),
                        min_size=1, max_size=100))
    new_limits = st.sampled_from([0, 512, 4 * MiB, 32 * MiB, 100 * MiB, 300 * MiB, GiB])
    w = TraceWriter(meta={"producer": "hypothesis", "framework": "cupy"})
    live: list[int] = []
    for what, size, stream, pick in ops:
        s = [0, 7, 0xBEEF][stream]
        if what == 4:
            w.record(CACHE_RELEASE, aux=1)
        elif what == 5:
            w.record(SET_LIMIT, size=draw(new_limits), aux=1)
        elif what == 6:
            w.oom(size, stream=s)
        elif what or not live:
            live.append(w.alloc(size, stream=s))
        else:
            w.free(live.pop(pick % len(live)))
    return w.finish()


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=cupy_pressure_traces(), options=st.sampled_from(OPTIONS["cupy"]),
       runtime=st.sampled_from(["eager", "gc"]), cap=st.sampled_from([None, None, 64 * MiB]),
       capacity=st.sampled_from([None, 200 * MiB, 4 * GiB]))
def test_cupy_matches_reference_under_limits_releases_and_recorded_ooms(trace, options, runtime, cap, capacity):
    """Recorded limits (unless a cap overrides them), cache releases and recorded OOMs' attempts, on a device
    small enough to fail too: the same device calls, blocks, failed requests and counters."""
    assert_same(trace, "cupy-ref", options, runtime=runtime, cap=cap, capacity=capacity)


def _edge_placed_recording():
    """A CuPy recording whose requests lie at every edge of the recorded segments: a segment's first byte and last
    512 B, its end (outside), below every segment, in a freed segment, in a segment made again at the same address,
    and a request with no address."""
    w = TraceWriter(meta={"producer": "edges", "framework": "cupy"})
    w.segment(SEGMENT_ALLOC, 1000 * MiB, 4 * MiB)
    w.segment(SEGMENT_ALLOC, 2000 * MiB, 2 * MiB)
    for a in (1000 * MiB, 1004 * MiB - 512, 1004 * MiB, 500 * MiB, 2001 * MiB, 0):
        w.alloc(512, addr=a)
    w.segment(SEGMENT_FREE, 1000 * MiB, 4 * MiB)
    w.alloc(512, addr=1000 * MiB + 512)
    w.segment(SEGMENT_ALLOC, 1000 * MiB, 8 * MiB)
    w.alloc(512, addr=1005 * MiB)
    return w.finish()


@pytest.mark.parametrize("path", [p for p in SHIPPED if Trace.load(p).meta.get("framework") == "cupy"] + ["edges"])
def test_cupy_recorded_places_match_the_references_statement(path):
    """Where `cupy` finds each recorded request's place (`RecordedPlaces`, followed on ties) equals cupy-ref's own
    statement of it (docs/models/cupy.md, "Ties"), record by record, with the model's segments made, all or only
    some: every ALLOC, and every other record (no place)."""
    from allocsim.policies import cupy as cupy_rules
    from allocsim.policies.reference import cupy as cupy_ref_rules
    trace = _edge_placed_recording() if path == "edges" else Trace.load(path)
    fast, ref = cupy_rules.RecordedPlaces(trace), cupy_ref_rules.RecordedPlaces(trace)
    made = sum(1 for e in trace if e.kind == SEGMENT_ALLOC)
    for model in ([(k + 1) << 40 for k in range(made)], [(k + 1) << 40 for k in range(made // 2)]):
        fast.model, ref.model = model, list(model)
        assert [fast.address(at) for at in range(len(trace))] == [ref.address(at) for at in range(len(trace))]


# ---- torch's slow path: garbage collection of old cached segments -------------------------
@st.composite
def gc_options(draw):
    """A memory fraction and GC threshold, with or without oversize and rounding options."""
    opts = [f"per_process_memory_fraction:{draw(st.sampled_from([0.5, 0.8, 1.0]))}",
            f"garbage_collection_threshold:{draw(st.sampled_from([0.3, 0.6, 0.9]))}"]
    opts += draw(st.lists(st.sampled_from(["max_split_size_mb:20", "max_split_size_mb:40",
                                           "roundup_power2_divisions:4", "fix_189504:true"]),
                          unique_by=lambda o: o.split(":")[0], max_size=2))     # one value per option
    return [",".join(opts)]


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=traces(max_ops=150), options=gc_options(), capacity=st.sampled_from([64 * MiB, 160 * MiB, 400 * MiB]))
def test_torch_slow_path_matches_reference_when_old_segments_are_collected(trace, options, capacity):
    """A small device, so reserved memory crosses the GC threshold and cached segments of every age are freed."""
    assert_same(trace, "torch-ref", options, capacity=capacity)


@pytest.mark.parametrize("policy", ["torch", "torch-ref"])
def test_torch_options_none_and_fraction_without_capacity(policy):
    cls = policies.get(policy)
    assert cls.parse_options(["max_split_size_mb:None,roundup_power2_divisions:none"]) == \
        {"max_split_size_mb": None, "roundup_power2_divisions": None}
    trace = Trace.load(os.path.join(ROOT, "traces", "resnet50.bin"))
    with pytest.raises(UsageError, match="per_process_memory_fraction needs a device capacity"):
        Replay(trace, policy, options=["per_process_memory_fraction:0.5"], capacity=None)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=traces(max_ops=150), cap=st.sampled_from([48 * MiB, 100 * MiB, 150 * MiB]),
       extra=st.sampled_from(["", ",max_split_size_mb:20", ",roundup_power2_divisions:4"]))
def test_torch_expandable_segments_match_reference_under_a_small_cap(trace, cap, extra):
    """Pages mapped and unmapped again: flushes unmap the whole free pages and keep the partial ones mapped."""
    assert_same(trace, "torch-ref", ["expandable_segments:true" + extra], cap=cap, capacity=None)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=traces(max_ops=120), share=st.sampled_from([0.3, 0.6, 0.9]),
       extra=st.sampled_from(["", ",garbage_collection_threshold:0.5"]))
def test_torch_fraction_of_the_cap_matches_reference(trace, share, extra):
    """Without --capacity the fraction is taken of the cap: the allowed memory reads the cap's very value, so
    both models pin the device (`allocsim fit` certifies no other cap) and fail the same segments."""
    cap = 2 * max(trace.load_bytes, MiB)
    assert_same(trace, "torch-ref", [f"per_process_memory_fraction:{share}{extra}"], cap=cap, capacity=None)


# ---- torch under pressure: the allowed memory from the cap, changed mid-run; releases; recorded OOMs
@st.composite
def pressure_cases(draw):
    """A trace, a starting cap near its LOAD (the allowed memory) and, after some of its events, a cache
    release, a new limit or a recorded OOM's request: retries, GC, OOMs and releases in every order."""
    trace = draw(traces(max_ops=120))
    load = max(trace.load_bytes, MiB)
    caps = st.sampled_from([None, int(load * 0.5), int(load * 0.9), int(load * 1.2), int(load * 2)])
    actions = st.one_of(st.just(("release",)), caps.map(lambda c: ("limit", c)),
                        st.tuples(st.just("oom"), sizes, st.sampled_from([0, 1])))
    events = draw(st.dictionaries(st.integers(0, max(len(trace) - 1, 0)), actions, max_size=8))
    return trace, draw(caps), events


PRESSURE_OPTIONS = ["", "garbage_collection_threshold:0.5", "garbage_collection_threshold:0.3,max_split_size_mb:20",
                    "max_split_size_mb:20", "roundup_power2_divisions:4", "expandable_segments:true",
                    "expandable_segments:true,garbage_collection_threshold:0.6",
                    "per_process_memory_fraction:0.002,garbage_collection_threshold:0.6", "fix_189504:true"]


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=pressure_cases(), options=st.sampled_from(PRESSURE_OPTIONS))
def test_torch_matches_reference_under_pressure(case, options):
    """The cap is the allowed memory (GC threshold, retries and OOMs follow from it), read again after each
    change; cache releases and recorded OOMs' attempts land between events: the two models make the same
    calls, place every block alike and fail the same requests."""
    trace, cap, pressure = case
    assert_same(trace, "torch-ref", [options] if options else [], cap=cap, capacity=4 * GiB, pressure=pressure)


# ---- the rules' boundaries, worked by hand, on the fast path and on the slow path ----------
SLOW_PATH = "per_process_memory_fraction:0.99,garbage_collection_threshold:0.99"   # a GC threshold: `malloc`, not `_malloc_fast`


def _one_after_another(sizes, free_previous=True):
    """Allocate each size in turn (one stream), freeing the previous one first if asked."""
    w = TraceWriter(meta={"producer": "boundaries"})
    prev = None
    for size in sizes:
        if prev is not None and free_previous:
            w.free(prev)
        prev = w.alloc(size)
    return w.finish()


@pytest.mark.parametrize("path", ["fast", "slow"])
@pytest.mark.parametrize("sizes, options, segments, last_block", [
    # an oversize request (n == max_split) takes a cached block < n + 20 MiB whole: not split
    ((30 * MiB, 20 * MiB), "max_split_size_mb:20", [30 * MiB], 30 * MiB),
    # ... but not a block of exactly n + max_non_split_rounding: a new segment
    ((40 * MiB, 20 * MiB), "max_split_size_mb:20", [40 * MiB, 20 * MiB], 20 * MiB),
    # a block of exactly max_split is oversize: a smaller request does not get it
    ((20 * MiB, 4 * MiB), "max_split_size_mb:20", [20 * MiB, 20 * MiB], 4 * MiB),
    # small pool: a remainder of exactly 512 B is split off (nothing freed in between)
    ((MiB, MiB - 512, 512, -1), "", [2 * MiB], 512),
    # large pool: a remainder of exactly 1 MiB is not split off
    ((19 * MiB,), "", [20 * MiB], 20 * MiB),
])
def test_torch_boundaries_match_the_rules_and_the_reference(path, sizes, options, segments, last_block):
    opts = [",".join(filter(None, [options, SLOW_PATH if path == "slow" else ""]))]
    trace = _one_after_another([n for n in sizes if n > 0], free_previous=sizes[-1] != -1)
    out = assert_same(trace, "torch-ref", opts, capacity=4 * GiB)
    assert [n for call, n, _ in out["device calls"] if call == "malloc"] == segments
    assert out["blocks"][-1][2] == last_block


# ---- torch's size rules: the fast model's functions against the reference's own statement of them ---------
def _rule_edges() -> list[int]:
    """Where the size rules change: 0 and 512 B, the small-pool bound (1 MiB), 10 MiB, every power of two of
    the division intervals (1 MiB .. 64 GiB), and 512 B times each division count."""
    return sorted({0, 512, MiB, 10 * MiB} | {1 << k for k in range(20, 37)} | {512 * d for d in (2, 4, 8, 16, 64)})


RULES = {"fast": torch_rules, "reference": torch_ref_rules}
RULE_SIZES = st.one_of(st.integers(0, 1 << 37),
                       st.sampled_from(_rule_edges()).flatmap(lambda e: st.integers(max(0, e - 2), e + 2)))
RULE_TABLES = st.one_of(st.sampled_from([0, 1, 2, 4, 8, 16, 64]).map(lambda d: (d,) * 16),
                        st.lists(st.sampled_from([0, 1, 2, 4, 8, 16, 64]), min_size=16, max_size=16).map(tuple))


@given(n=RULE_SIZES, table=RULE_TABLES)
@settings(max_examples=400, deadline=None)
def test_torch_size_rules_match_the_references_statement(n, table):
    """`round_size` and `get_allocation_size` of `torch` equal torch-ref's, which restates them (docs/models/torch.md
    rules 1 and 6) without sharing code: every size, edges included, under any divisions table."""
    assert torch_rules.round_size(n, table) == torch_ref_rules.round_size(n, table)
    assert torch_rules.get_allocation_size(n) == torch_ref_rules.get_allocation_size(n)


def test_torch_size_rules_match_the_reference_at_every_edge():
    """Every rule edge (and two bytes either side) under tables whose neighbouring intervals all differ, so a
    size read against the wrong interval rounds differently; then the segment size of every rounded size."""
    divs = (2, 4, 8, 16, 64, 0, 1)
    tables = [(d,) * 16 for d in divs] + [tuple(divs[(i + s) % len(divs)] for i in range(16)) for s in range(len(divs))]
    for e in _rule_edges() + [1 << 37]:
        for n in range(max(0, e - 2), e + 3):
            for table in tables:
                rounded = torch_rules.round_size(n, table)
                assert rounded == torch_ref_rules.round_size(n, table), (n, table)
                assert torch_rules.get_allocation_size(rounded) == torch_ref_rules.get_allocation_size(rounded), n


def test_split_size_rules_match_the_references_statement():
    """`split`'s `size_class` and `round_request` (its hot path inlines them) equal split-ref's, which restates them
    (docs/models/cuarrays.md, "split: SplittingPool"): every class and roundoff edge, two bytes either side."""
    from allocsim.policies import split as split_rules
    from allocsim.policies.reference import split as split_ref_rules
    edges = {0, 512, 128 * KiB, MiB, MiB + 128 * KiB, 32 * MiB, 33 * MiB, 1 << 40}
    for n in sorted({n for e in edges for n in range(max(0, e - 2), e + 3)} | {3 * MiB + 7, 100 * MiB + 1}):
        assert split_rules.size_class(n) == split_ref_rules.size_class(n), n
        assert split_rules.round_request(n) == split_ref_rules.round_request(n), n


@pytest.mark.parametrize("rules", ["fast", "reference"])
@pytest.mark.parametrize("n, divisions, rounded", [
    (0, 0, 512), (511, 0, 512), (513, 0, 1024),
    (1200, 4, 1536),                                 # the power-of-two steps only past 512 x d (the note's example)
    (3 * MiB + 1, 4, 3 * MiB + 512 * KiB),           # [2 MiB, 4 MiB) in 4 steps of 512 KiB
    (2 * MiB + 1, 4, 2 * MiB + 512 * KiB), (4 * MiB, 4, 4 * MiB),
])
def test_torch_round_size_worked_by_hand(rules, n, divisions, rounded):
    assert RULES[rules].round_size(n, (divisions,) * 16) == rounded


@pytest.mark.parametrize("rules", ["fast", "reference"])
@pytest.mark.parametrize("n, segment", [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB),
                                        (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB), (10 * MiB + 512, 12 * MiB)])
def test_torch_segment_size_worked_by_hand(rules, n, segment):
    assert RULES[rules].get_allocation_size(n) == segment


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_torch_releases_oversize_blocks_largest_first_until_exactly_enough(path):
    """release_available_cached_blocks: no cached block holds 50 MiB, the two oversize ones (26 + 24 MiB)
    together do exactly: both are freed, largest first, and the small segment stays cached (no flush)."""
    w = TraceWriter(meta={"producer": "release"})
    ids = [w.alloc(24 * MiB), w.alloc(26 * MiB), w.alloc(KiB)]
    for i in ids:
        w.free(i)
    w.alloc(50 * MiB)
    options = ["max_split_size_mb:20" + ("," + SLOW_PATH if path == "slow" else "")]
    out = assert_same(w.finish(), "torch-ref", options, cap=52 * MiB, capacity=4 * GiB)
    assert [n for call, n, _ in out["device calls"] if call == "free"] == [26 * MiB, 24 * MiB]
    assert out["counters"]["cache_flushes"] == 0 and not out["ooms"]
