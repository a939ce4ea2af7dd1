"""The invariants every policy is held to — for the built-ins' tests and a plug-in author's CI.

``check_policy(MyPool)`` replays the class on generated traces (and any given) under
each runtime and raises an `AssertionError` naming the first broken invariant and
where it broke:

- "blocks overlap": two live blocks share an address;
- "block without an address": ``block(handle)`` is not a non-negative address and a size;
- "block outside every segment": a live block lies outside the memory the policy took
  from the device (``device.malloc`` or ``device.reserve_address_range``);
- "block smaller than its request";
- "reserved below allocated" / "allocated below the bytes held": the accounting order
  reserved >= allocated >= requested bytes of live objects;
- "largest free block too large": larger than reserved - allocated;
- "cap exceeded": the device holds more than the cap;
- "bytes not conserved": bytes still allocated once every object is freed (and, under
  ``gc``, a full collection has run);
- "not deterministic": two replays of one trace differ;
- "OOM without a binding cap" / "OOM while the device had room": the policy gave up
  although the device could have served the request (within `device_request_bound`);
  "OOM reported at the wrong event": not at the failed ALLOC (or the recorded OOM replayed).

No hypothesis needed: traces come from a seeded generator (the project's own tests
draw them with hypothesis and call the same checks).
"""
from __future__ import annotations

import random
from bisect import bisect_right

from .machine.device import SimulatedDevice
from .engine.replay import Replay, replay
from .engine.spec import PolicySpec
from .trace import ALLOC, OOM, Trace, TraceWriter
from .trace.events import CACHE_RELEASE

MiB = 1 << 20
RUNTIMES = ("eager", "gc")
STREAMS = (0, 7, 0xBEEF)
#: Caps as multiples of a trace's LOAD (None: no cap), and --gc-every choices.
CAP_FACTORS = (None, 1.0, 1.25, 2.0, 4.0)
GC_EVERY = (None, None, 4 * MiB, 256 * MiB)
#: Request sizes from 1 B to a few hundred MiB, weighted toward the small sizes traces are made of,
#: plus the allocators' boundaries.
SIZE_RANGES = ((1, 4096), (4097, 2 * MiB), (2 * MiB, 64 * MiB), (64 * MiB, 300 * MiB))
BOUNDARY_SIZES = (0, 512, 1 * MiB, 2 * MiB, 10 * MiB, 20 * MiB)


def device_request_bound(size: int) -> int:
    """The most any modeled allocator takes from the device to serve one request of ``size`` bytes:
    power-of-two bins double it, PyTorch takes 2 or 20 MiB segments (large sizes rounded to 2 MiB),
    CuPy rounds to 512 B. 2 size + 64 MiB bounds them all with room to spare."""
    return 2 * size + 64 * MiB


# ---- generated traces -----------------------------------------------------------------------
def random_size(rng: random.Random) -> int:
    k = rng.randrange(len(SIZE_RANGES) + 1)
    return rng.choice(BOUNDARY_SIZES) if k == len(SIZE_RANGES) else rng.randint(*SIZE_RANGES[k])


def build_trace(ops, order) -> Trace:
    """A trace from ``ops`` of ``(is_alloc, size, stream index, pick)``: a FREE (when not an ALLOC, or
    nothing is live) frees live object ``pick`` mod live; ``is_alloc`` None is a cache release; the
    objects left are freed in ``order``."""
    w = TraceWriter(meta={"producer": "allocsim.testing"})
    live: list[int] = []
    for is_alloc, size, stream, pick in ops:
        if is_alloc is None:
            w.record(CACHE_RELEASE)
        elif is_alloc or not live:
            live.append(w.alloc(size, stream=STREAMS[stream]))
        else:
            w.free(live.pop(pick % len(live)))
    for k in order:
        w.free(live[k])
    return w.finish()


def random_trace(rng: random.Random, max_ops: int = 40) -> Trace:
    """A random alloc/free sequence on up to three streams with a few cache releases, every object freed
    by the end."""
    ops = [(_alloc_free_or_release(rng.random()), random_size(rng), rng.randrange(3), rng.randrange(10**6))
           for _ in range(rng.randint(1, max_ops))]
    live = 0
    for is_alloc, *_ in ops:
        if is_alloc is not None:
            live += 1 if is_alloc or not live else -1
    order = list(range(live))
    rng.shuffle(order)
    return build_trace(ops, order)


def _alloc_free_or_release(u: float):
    """An op's kind from a uniform draw: a cache release 1 time in 20, else an ALLOC or a FREE at even odds."""
    return None if u < 0.05 else u < 0.525


def cap_for(trace: Trace, factor) -> int | None:
    return None if factor is None else int(max(trace.load_bytes, 1) * factor)


# ---- the invariants ---------------------------------------------------------------------------
class _Segments:
    """What the policy took from the device: live ``device.malloc`` ranges, and the address ranges it
    reserved (``device.reserve_address_range``, never given back; frees inside them unmap pages)."""

    def __init__(self, dev):
        self.taken: dict[int, int] = {}
        self.reserved: dict[int, int] = {}
        malloc, free, reserve = dev.malloc, dev.free, getattr(dev, "reserve_address_range", None)

        def tracked_malloc(n):
            addr = malloc(n)
            if addr is not None:
                self.taken[addr] = n
            return addr

        def tracked_free(addr, n):
            self.taken.pop(addr, None)
            free(addr, n)

        def tracked_reserve(n):
            addr = reserve(n)
            self.reserved[addr] = n
            return addr

        dev.malloc, dev.free = tracked_malloc, tracked_free
        if reserve is not None:
            dev.reserve_address_range = tracked_reserve

    def holds(self, addr: int, size: int) -> bool:
        return any(_inside(ranges, addr, size) for ranges in (self.taken, self.reserved))


def _inside(ranges: dict, addr: int, size: int) -> bool:
    starts = sorted(ranges)
    i = bisect_right(starts, addr) - 1
    return i >= 0 and addr + size <= starts[i] + ranges[starts[i]]


def replay_checked(policy, trace: Trace, runtime: str, cap, *, keep_going=True, gc_every=None):
    """Replay with the per-event invariants checked after every driving event; return (result, `Replay`)."""
    dev = SimulatedDevice(capacity=None, cap=cap)
    segments = _Segments(dev)                   # before the policy exists: some take memory when made
    id_size = trace.id_size.tolist()

    def observe(event, kind, id_, handle):
        blocks = []
        for i, (addr, size) in r.live_blocks().items():   # live ids only: 0-byte and failed ALLOCs have none
            assert isinstance(addr, int) and addr >= 0 and isinstance(size, int), \
                f"block without an address: event {event}: block of id {i} is ({addr!r}, {size!r})"
            assert size >= id_size[i], \
                f"block smaller than its request: event {event}: block of id {i} is {size} B for {id_size[i]} B"
            assert segments.holds(addr, size), \
                f"block outside every segment: event {event}: block of id {i} [{addr:#x}+{size}]"
            blocks.append((addr, size, i))
        blocks.sort()
        for (a0, s0, i0), (a1, _, i1) in zip(blocks, blocks[1:]):
            assert a0 + s0 <= a1, f"blocks overlap: event {event}: block of id {i0} [{a0:#x}+{s0}] overlaps id {i1} " \
                                  f"at {a1:#x}"
        held_bytes = sum(id_size[i] for _, _, i in blocks)
        reserved, allocated = r.reserved, r.allocated
        assert reserved >= allocated, f"reserved below allocated: event {event}: reserved {reserved} < allocated {allocated}"
        assert allocated >= held_bytes, \
            f"allocated below the bytes held: event {event}: allocated {allocated} < held {held_bytes}"
        if cap is not None:
            assert reserved <= cap, f"cap exceeded: event {event}: reserved {reserved} > cap {cap}"
        free = r.largest_free()                  # None: the policy cannot see it
        assert free is None or 0 <= free <= reserved - allocated, \
            f"largest free block too large: event {event}: {free} > reserved - allocated {reserved - allocated}"

    r = Replay(trace, PolicySpec.of(policy), runtime=runtime, cap=cap, capacity=None, gc_every=gc_every, device=dev,
               keep_going=keep_going, observer=observe, guard=False)
    try:
        res = r.run()
    finally:
        r.close()
    return res, r


def check_accounting(policy, trace: Trace, runtime: str, cap=None, gc_every=None) -> None:
    """Every per-event invariant, then: every byte returns once every object is freed."""
    res, r = replay_checked(policy, trace, runtime, cap, gc_every=gc_every)
    if len(trace) and trace.live_curve[-1] == 0:     # the trace frees every object it allocates
        if runtime == "gc":
            r.collect(True)
        assert r.allocated == 0, f"bytes not conserved: {r.allocated} bytes still allocated after every " \
                                 f"object was freed"
        assert res.frees == trace.n_allocs - res.ooms, \
            f"bytes not conserved: {res.frees} frees of {trace.n_allocs} objects with {res.ooms} OOMs"
    assert cap is None or res.peak_reserved_bytes <= cap, \
        f"cap exceeded: peak reserved {res.peak_reserved_bytes} > cap {cap}"
    assert res.peak_reserved_bytes >= res.peak_allocated_bytes >= 0, \
        f"reserved below allocated: peaks {res.peak_reserved_bytes} < {res.peak_allocated_bytes}"
    assert res.allocs == trace.n_allocs, f"bytes not conserved: {res.allocs} allocs of {trace.n_allocs} objects"


def check_deterministic(policy, trace: Trace, runtime: str, cap=None) -> None:
    """Two replays of one trace give identical results."""
    a, b = (replay(trace, PolicySpec.of(policy), runtime=runtime, cap=cap, capacity=None,
                   keep_going=True, guard=False).to_dict() for _ in range(2))
    a.pop("replay_seconds")
    b.pop("replay_seconds")
    differ = sorted(k for k in a if a[k] != b.get(k))
    assert not differ, f"not deterministic: two replays differ in {', '.join(differ)}"


def check_fast_path(policy, trace: Trace, cap=None) -> None:
    """A policy's fused loop (``walk_chunk``, docs/architecture.md) replays as its plain malloc/free walk."""
    fused = Replay(trace, PolicySpec.of(policy), cap=cap, capacity=None, keep_going=True, guard=False)
    if not fused.fast_path:
        fused.close()
        return
    plain = Replay(trace, PolicySpec.of(policy), cap=cap, capacity=None, keep_going=True, fast_path=False, guard=False)
    a, b = (r.run().to_dict() for r in (fused, plain))
    a.pop("replay_seconds")
    b.pop("replay_seconds")
    differ = sorted(k for k in a if a[k] != b.get(k))
    assert not differ, f"fast path differs from the plain walk: walk_chunk and malloc/free differ in {', '.join(differ)}"


def check_no_oom_without_binding_cap(policy, trace: Trace, runtime: str, generous: bool) -> None:
    """No OOM without a cap, nor with one above every request's generously rounded size summed."""
    alloc_sizes = trace.size[trace.kind == ALLOC].tolist()
    cap = sum(device_request_bound(s) for s in alloc_sizes) if generous else None
    res, *_ = replay_checked(policy, trace, runtime, cap, keep_going=False)
    assert res.ooms == 0, f"OOM without a binding cap: OOM at {res.first_oom} with cap {cap}"


def check_oom_only_when_full(policy, trace: Trace, runtime: str, cap) -> None:
    """An OOM only when the device could not take what the request needs, reported at the failed ALLOC;
    stopping at the first OOM stops at the same event."""
    res, r = replay_checked(policy, trace, runtime, cap, keep_going=True)
    assert cap is not None or res.ooms == 0, f"OOM without a binding cap: OOM at {res.first_oom}"
    offline = PolicySpec.of(policy).policy_class().offline
    for o in res.oom_events:
        assert trace.kind[o.event] == (OOM if o.recorded else ALLOC) and trace.size[o.event] == o.size > 0, \
            f"OOM reported at the wrong event: {o.event}"
        assert o.live_bytes == int(trace.live_curve[o.event]) - (0 if o.recorded else o.size), \
            f"OOM reported with wrong live bytes: event {o.event}"
        if offline:
            # a bound, not an allocator: its one planned heap fits the cap or nothing is placed
            assert o.reserved_bytes == 0 and r.policy.heap > cap, f"OOM while the device had room: event {o.event}"
            continue
        assert o.reserved_bytes + device_request_bound(o.size) > cap, f"OOM while the device had room: OOM at " \
            f"event {o.event} ({o.size} B) with {o.reserved_bytes} B reserved of a {cap} B cap"
        assert o.reserved_bytes <= cap, f"cap exceeded: {o.reserved_bytes} B reserved at the OOM at event {o.event}"
    if res.ooms:
        stopped, *_ = replay_checked(policy, trace, runtime, cap, keep_going=False)
        assert stopped.ooms == 1 and stopped.first_oom.event == res.first_oom.event and not stopped.completed, \
            f"not deterministic: stopping at the first OOM stopped at {stopped.first_oom}, not {res.first_oom}"


def check_policy(cls, traces=None, *, runtimes=RUNTIMES, examples: int = 30, seed: int = 0, options=None) -> None:
    """Hold the policy class ``cls`` (with ``options``, ``key=value`` texts or a dict) to every invariant
    on ``examples`` generated traces and on ``traces`` (Trace objects or paths; keep them small: every
    event checks every live block), under each runtime. Raises `AssertionError` naming the broken
    invariant, the event, the runtime and the trace."""
    spec = PolicySpec.of(cls, options)
    rng = random.Random(seed)
    cases = []
    for n in range(examples):
        t = random_trace(rng)
        cases.append((f"generated trace {n} (seed {seed})", t, cap_for(t, rng.choice(CAP_FACTORS)),
                      rng.choice(GC_EVERY)))
    for t in traces or ():
        t = t if isinstance(t, Trace) else Trace.load(t)
        cases.append((t.path or "given trace", t, None, None))
    for runtime in runtimes:
        for n, (what, trace, cap, gc_every) in enumerate(cases):
            try:
                check_accounting(spec, trace, runtime, cap, gc_every)
                check_no_oom_without_binding_cap(spec, trace, runtime, generous=n % 2 == 1)
                check_oom_only_when_full(spec, trace, runtime, cap)
                check_deterministic(spec, trace, runtime, cap)
                if runtime == "eager":
                    check_fast_path(spec, trace, cap)
            except AssertionError as e:
                raise AssertionError(f"{spec.name}: {e} (runtime {runtime}, {what}, cap {cap})") from None
