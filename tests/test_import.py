"""`allocsim import`: PyTorch snapshots, RMM CSV logs, CuPy DebugPrintHook JSONL.

Expected values come from the hand-written fixtures (tests/fixtures/make_fixtures.py,
whose docstrings say what each holds) or, for the property test, from a small
allocator simulation that knows the true state where the ring buffer was cut.
"""
from __future__ import annotations

import os
import pickle
import random
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from allocsim.errors import InputError
from allocsim.formats.importers import detect, import_file, safe_pickle
from allocsim.formats.importers.torch_snapshot import (StartState, _Where, convert, inferred_pool_runs, inferred_releases,
                                               private_incarnations)
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev
from conftest import run_cli

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
MiB = 1024**2


def fixture(name):
    return os.path.join(FIX, name)


def load_fixture_dict(name):
    with open(fixture(name), "rb") as f:
        return pickle.load(f)   # our own fixture, so plain pickle is fine here


def imported(tmp_path, name, **kw):
    out = str(tmp_path / "out.bin")
    stats = import_file(fixture(name), out, force=True, **kw)     # (imported again over the last: force)
    return Trace.load(out), stats


def rows(trace):
    """(kind name, original stream, id or None, size, addr) per event."""
    return [(ev.KIND_NAMES[e.kind], trace.streams[e.stream], None if e.id == ev.NO_ID else e.id, e.size, e.addr)
            for e in trace]


def live_addresses(trace):
    """Addresses of the blocks allocated and not FREEd by the end of ``trace``."""
    addr = {e.id: e.addr for e in trace if e.kind == ev.ALLOC}
    for e in trace:
        if e.kind == ev.FREE:
            del addr[e.id]
    return sorted(addr.values())


# ---- PyTorch snapshots -------------------------------------------------------------------

def test_torch_snapshot_events_in_order(tmp_path):
    t, s = imported(tmp_path, "snapshot.pickle")
    # entries of device_traces[0] minus the `snapshot` and `annotate` ones, in order
    assert rows(t) == [
        ("SEGMENT_ALLOC", 0, None, 2 * MiB, 0x10000000),
        ("ALLOC", 0, 0, 1000, 0x10000000),
        ("ALLOC", 0, 1, 512, 0x10000400),
        ("SEGMENT_ALLOC", 7, None, 20 * MiB, 0x20000000),
        ("ALLOC", 7, 2, 5_000_000, 0x20000000),
        ("FREE_REQUESTED", 0, 0, 1000, 0x10000000),
        ("FREE", 0, 0, 1000, 0x10000000),
        ("ALLOC", 0, 3, 700, 0x10000000),          # the address is reused by a new block
        ("OOM", 0, None, 100 * MiB, 1234),         # addr holds device_free
        ("FREE_REQUESTED", 7, 2, 5_000_000, 0x20000000),
        ("FREE", 7, 2, 5_000_000, 0x20000000),
        ("CACHE_RELEASE", 0, None, 0, 0),          # inferred: the only empty segment freed, no oom after it
        ("SEGMENT_FREE", 7, None, 20 * MiB, 0x20000000),
        ("FREE_REQUESTED", 0, 1, 512, 0x10000400),
    ]
    assert list(t.time_ns) == [us * 1000 for us in (0, 5, 9, 20, 21, 30, 31, 50, 60, 70, 72, 72, 80, 90)]
    assert not t.flags.any()
    assert [t.sites[i] if i != ev.NO_SITE else None for i in t.site[t.kind == ev.ALLOC]] == [
        "/home/u/train.py:10:step", "/home/u/train.py:11:step", None, None]
    assert (s["allocs"], s["frees"], s["free_requested"], s["segment_allocs"], s["segment_frees"], s["ooms"]) == \
        (4, 2, 3, 2, 1, 1)
    assert s["cache_releases_inferred"] == 1
    assert s["unknown_actions"] == {"annotate": 1} and s["snapshots_ignored"] == 1
    assert s["seeded"] == 0 and not s["wrapped"] and s["warnings"] == [
        "ignored unknown actions: annotate x1", "device 1 also holds 2 trace entries: --device 1 imports them"]
    assert t.meta["framework"] == "torch" and not t.meta["wrapped"] and t.meta["initial_segments"] == []
    assert t.meta["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    # the end state: 0x10000000 (allocated) and 0x10000400 (free requested) are live
    assert live_addresses(t) == [0x10000000, 0x10000400]


def test_torch_snapshot_other_device_and_device_info(tmp_path):
    t, s = imported(tmp_path, "snapshot.pickle", device=1, total_memory=80 * 2**30)
    assert rows(t) == [("SEGMENT_ALLOC", 0, None, 2 * MiB, 0x90000000), ("ALLOC", 0, 0, 8, 0x90000000)]
    assert s["seeded"] == 0 and s["warnings"] == ["device 0 also holds 15 trace entries: --device 0 imports them"]
    assert t.meta["device"] == {"index": 1, "total_memory": 80 * 2**30}
    with pytest.raises(InputError, match=r"no trace for device 2 \(the snapshot has devices 0\.\.1\)"):
        import_file(fixture("snapshot.pickle"), str(tmp_path / "x.bin"), device=2)


def test_torch_wrapped_snapshot_is_seeded_backwards(tmp_path):
    t, s = imported(tmp_path, "snapshot_wrapped.pickle")
    seeds = [(e.size, e.addr, e.time_ns) for e in t if e.flags & ev.PRE_EXISTING]
    # the four blocks the docstring of snapshot_wrapped() lists, in address order, at t=0, first
    assert seeds == [(4000, 0x10000000, 0), (100, 0x10001000, 0), (15_000_000, 0x30000000, 0),
                     (20_000_000, 0x40000000, 0)]
    assert all(e.flags & ev.PRE_EXISTING for e in list(t)[:4])
    assert s["wrapped"] and t.meta["wrapped"] and s["seeded"] == 4 and s["seeded_pending_free"] == 1
    assert t.meta["initial_segments"] == [
        {"address": 0x10000000, "total_size": 2 * MiB, "stream": 0, "is_expandable": False, "segment_type": "small"},
        {"address": 0x30000000, "total_size": 20 * MiB, "stream": 0, "is_expandable": False,
         "segment_type": "large"},
        {"address": 0x40000000, "total_size": 20 * MiB, "stream": 0, "is_expandable": True, "segment_type": "large"},
    ]
    # no time_us: the entry index is the time
    # entry 1 frees the only empty segment, with no oom after it: an inferred cache release (at entry 0's time)
    assert t.meta["time_source"] == "entry index" and list(t.time_ns[4:]) == [0, 0, *range(1, 8)]
    assert t.kind[5] == ev.CACHE_RELEASE and s["cache_releases_inferred"] == 1
    snap = load_fixture_dict("snapshot_wrapped.pickle")
    final_active = sorted(b["address"] for seg in snap["segments"] for b in seg["blocks"]
                          if b["state"].startswith("active"))
    assert live_addresses(t) == final_active
    assert s["inconsistent"] == 0 and s["final_mismatch"] == 0 and s["warnings"] == []


def test_convert_api_on_an_in_memory_writer():
    snap = load_fixture_dict("snapshot_wrapped.pickle")
    w = TraceWriter(meta={"producer": "recorder"})
    stats = convert(snap, w, device=0, source="live")
    t = w.finish()
    t.validate()
    assert stats["seeded"] == 4 and t.meta["wrapped"] and t.meta["producer"] == "allocsim import"
    assert len(t) == 13             # 4 seeded blocks, 8 entries, 1 inferred cache release


class _Sim:
    """A toy caching allocator that writes a PyTorch-style history and knows its true state.

    Regular segments hold 8 slots of 4 KiB; one expandable range grows and shrinks by 2 MiB pages.
    """

    SLOT, SLOTS, PAGE = 4096, 8, 2 * MiB

    def __init__(self, rng):
        self.rng = rng
        self.history = []
        self.segments = {}      # base -> stream
        self.free_slots = {}    # base -> [addr]
        self.blocks = {}        # addr -> [requested, stream, base, state]
        self.allocated, self.pending = [], []
        self.exp_base, self.exp_mapped = 0x7000_0000_0000, 0

    def log(self, action, addr, size, stream=0):
        self.history.append({"action": action, "addr": addr, "size": size, "stream": stream})

    def step(self):
        r = self.rng.random()
        if r < 0.35:
            stream = self.rng.choice((0, 0, 3))
            bases = [b for b, s in self.segments.items() if s == stream and self.free_slots[b]]
            if not bases or self.rng.random() < 0.1:
                base = 0x1000_0000 + len(self.history) * 0x10_0000
                self.segments[base], self.free_slots[base] = stream, [base + i * self.SLOT for i in range(self.SLOTS)]
                self.log("segment_alloc", base, self.SLOT * self.SLOTS, stream)
                bases = [base]
            base = self.rng.choice(bases)
            addr = self.free_slots[base].pop(self.rng.randrange(len(self.free_slots[base])))
            size = self.rng.randint(1, self.SLOT)
            self.blocks[addr] = [size, stream, base, "active_allocated"]
            self.allocated.append(addr)
            self.log("alloc", addr, size, stream)
        elif r < 0.6 and self.allocated:
            addr = self.allocated.pop(self.rng.randrange(len(self.allocated)))
            self.blocks[addr][3] = "active_pending_free"
            self.pending.append(addr)
            self.log("free_requested", addr, self.blocks[addr][0], self.blocks[addr][1])
        elif r < 0.85 and self.pending:
            addr = self.pending.pop(0)
            size, stream, base, _ = self.blocks.pop(addr)
            self.free_slots[base].append(addr)
            self.log("free_completed", addr, size, stream)
        elif r < 0.9:
            empty = [b for b in self.segments if len(self.free_slots[b]) == self.SLOTS]
            if empty:
                base = self.rng.choice(empty)
                self.log("segment_free", base, self.SLOT * self.SLOTS, self.segments.pop(base))
                del self.free_slots[base]
        elif r < 0.96:
            self.log("segment_map", self.exp_base + self.exp_mapped, self.PAGE)
            self.exp_mapped += self.PAGE
        elif self.exp_mapped:
            self.exp_mapped -= self.PAGE
            self.log("segment_unmap", self.exp_base + self.exp_mapped, self.PAGE)

    def state(self):
        """(live blocks as (addr, requested), segments as (address, total_size, stream, expandable))."""
        segs = [(b, self.SLOT * self.SLOTS, s, False) for b, s in self.segments.items()]
        if self.exp_mapped:
            segs.append((self.exp_base, self.exp_mapped, 0, True))
        return sorted((a, b[0]) for a, b in self.blocks.items()), sorted(segs)

    def snapshot(self, cut):
        segs = [{"device": 0, "address": base, "total_size": self.SLOT * self.SLOTS, "stream": s,
                 "segment_type": "small", "is_expandable": False,
                 "blocks": [{"address": a, "size": self.SLOT, "requested_size": b[0], "state": b[3]}
                            for a, b in sorted(self.blocks.items()) if b[2] == base]}
                for base, s in sorted(self.segments.items())]
        if self.exp_mapped:
            segs.append({"device": 0, "address": self.exp_base, "total_size": self.exp_mapped, "stream": 0,
                         "segment_type": "small", "is_expandable": True, "blocks": []})
        return {"segments": segs, "device_traces": [self.history[cut:]], "allocator_settings": {}}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 300), cut_frac=st.floats(0, 1))
def test_wrapped_seeding_matches_the_true_state_at_the_cut(seed, n, cut_frac):
    sim = _Sim(random.Random(seed))
    cut, truth = int(n * cut_frac), None
    for k in range(n + 1):
        if truth is None and (len(sim.history) >= cut or k == n):
            cut, truth = len(sim.history), sim.state()      # one step may log two entries
        if k < n:
            sim.step()
    retained = sim.history[cut:]
    w = TraceWriter()
    stats = convert(sim.snapshot(cut), w)
    t = w.finish()
    t.validate()
    seeds = sorted((e.addr, e.size) for e in t if e.flags & ev.PRE_EXISTING)
    assert seeds == truth[0]
    assert sorted((s["address"], s["total_size"], s["stream"], s["is_expandable"])
                  for s in t.meta["initial_segments"]) == truth[1]
    assert live_addresses(t) == [a for a, _ in sim.state()[0]]
    assert stats["frees"] == sum(e["action"] == "free_completed" for e in retained)
    assert stats["allocs"] == sum(e["action"] == "alloc" for e in retained)
    assert stats["inconsistent"] == 0 and stats["final_mismatch"] == 0
    frees_of_unseen = any(e["action"].startswith("free") and e["addr"] not in
                          {x["addr"] for x in retained[:i] if x["action"] == "alloc"} for i, e in enumerate(retained))
    if frees_of_unseen:
        assert t.meta["wrapped"]


# ---- real snapshots (recorded on an H100 by tests/fixtures/record_real_fixtures.py, torch 2.11) ----

def _forward_state(entries):
    """Live blocks {addr: requested}, regular segments {addr: size} and mapped bytes after ``entries``."""
    blocks, segments, mapped = {}, {}, 0
    for e in entries:
        a = e["action"]
        if a == "alloc":
            blocks[e["addr"]] = e["size"]
        elif a == "free_completed":
            del blocks[e["addr"]]
        elif a == "segment_alloc":
            segments[e["addr"]] = e["size"]
        elif a == "segment_free":
            del segments[e["addr"]]
        elif a in ("segment_map", "segment_unmap"):
            mapped += e["size"] if a == "segment_map" else -e["size"]
    return blocks, segments, mapped


@pytest.mark.parametrize("name", ["torch_real.pickle", "torch_real_expandable.pickle"])
def test_real_snapshot_counts_match_the_allocator(tmp_path, name):
    import json
    snap = load_fixture_dict(name)
    with open(fixture("torch_real_stats.json")) as f:
        counters = json.load(f)[name]
    t, s = imported(tmp_path, name)
    entries = snap["device_traces"][0]
    assert s["allocs"] == counters["allocation.all.allocated"] == sum(e["action"] == "alloc" for e in entries)
    assert s["segment_allocs"] == counters["segment.all.allocated"]
    assert s["segment_frees"] == counters["segment.all.freed"]
    # the allocator counts a block freed at free_requested; the trace keeps it live until free_completed
    assert s["allocs"] - s["free_requested"] == counters["allocation.all.current"]
    assert (s["seeded"], s["wrapped"], s["inconsistent"], s["final_mismatch"]) == (0, False, 0, 0)
    assert sorted(t.size[t.kind == ev.ALLOC]) == sorted(e["size"] for e in entries if e["action"] == "alloc")
    final_active = sorted(b["address"] for seg in snap["segments"] for b in seg["blocks"]
                          if b["state"].startswith("active"))
    assert live_addresses(t) == final_active


@pytest.mark.parametrize("name", ["torch_real.pickle", "torch_real_expandable.pickle"])
def test_real_snapshot_cut_anywhere_seeds_the_true_state(name):
    snap = load_fixture_dict(name)
    entries = snap["device_traces"][0]
    for cut in range(0, len(entries), 23):
        blocks, segments, mapped = _forward_state(entries[:cut])
        w = TraceWriter()
        stats = convert({**snap, "device_traces": [entries[cut:]]}, w)
        t = w.finish()
        t.validate()
        assert {e.addr: e.size for e in t if e.flags & ev.PRE_EXISTING} == blocks, cut
        init = t.meta["initial_segments"]
        assert {s["address"]: s["total_size"] for s in init if not s["is_expandable"]} == segments, cut
        assert sum(s["total_size"] for s in init if s["is_expandable"]) == mapped, cut
        assert stats["inconsistent"] == 0 and stats["final_mismatch"] == 0


def test_real_wrapped_snapshot(tmp_path):
    snap = load_fixture_dict("torch_real_wrapped.pickle")
    t, s = imported(tmp_path, "torch_real_wrapped.pickle")
    assert len(snap["device_traces"][0]) == 400          # max_entries: the ring buffer is full
    assert s["wrapped"] and s["seeded"] > 0 and s["inconsistent"] == 0 and s["final_mismatch"] == 0
    final_active = sorted(b["address"] for seg in snap["segments"] for b in seg["blocks"]
                          if b["state"].startswith("active"))
    assert live_addresses(t) == final_active


def test_real_cupy_log(tmp_path):
    import json
    with open(fixture("cupy_real.jsonl")) as f:
        hooks = [json.loads(line) for line in f]
    t, s = imported(tmp_path, "cupy_real.jsonl")
    assert [e.size for e in t if e.kind == ev.ALLOC] == [h["size"] for h in hooks if h["hook"] == "malloc"]
    assert s["frees"] == sum(h["hook"] == "free" for h in hooks) and s["live_at_end"] == 0
    assert s["segment_allocs"] == sum(h["hook"] == "alloc" for h in hooks)


@pytest.mark.parametrize("snap, message", [
    ([{"address": 1}], "bare segment list"),
    ({"segments": [{"address": 1, "blocks": [{"address": 1, "history": []}]}]}, "legacy snapshot format"),
    ({"segments": []}, "no 'device_traces'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1}]]}, r"device_traces\[0\]\[0\]: missing key 'size'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": -4}]]}, r"\[0\]: size is -4"),
    ({"segments": [], "device_traces": [[{"action": "free_completed", "addr": 1, "size": 4}] * 2]},
     r"device_traces\[0\]\[1\]: free_completed of address 0x1, which holds no live block"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 4}] * 2]},
     r"\[0\]\[1\]: alloc at address 0x1, which is still live"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 4, "time_us": "x"}]]},
     "time_us is 'x'"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 4, "time_us": 5},
                                         {"action": "free_completed", "addr": 1, "size": 4}]]},
     r"device_traces\[0\]\[1\]: no time_us, where device_traces\[0\]\[0\] has one"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 4},
                                         {"action": "free_completed", "addr": 1, "size": 4, "time_us": 5}]]},
     r"device_traces\[0\]\[1\]: time_us is 5, where device_traces\[0\]\[0\] has none"),
])
def test_malformed_snapshots(snap, message):
    with pytest.raises(InputError, match=message) as e:
        convert(snap, TraceWriter(), source="s.pickle")
    assert e.value.path == "s.pickle"


# ---- the restricted unpickler ----------------------------------------------------------------

class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"segments": [], "device_traces": [[]], "x": _Evil(marker)})
    with pytest.raises(InputError, match=r"refusing to load global (os|posix)\.system") as e:
        safe_pickle.loads(payload, "evil.pickle")
    assert e.value.path == "evil.pickle" and not marker.exists()
    pickle.loads(payload)        # the control: an ordinary unpickler does run it
    assert marker.exists()


def test_malicious_pickle_through_the_cli_leaves_nothing(tmp_path):
    marker = tmp_path / "pwned"
    src = tmp_path / "snap.pickle"
    src.write_bytes(pickle.dumps(_Evil(marker), protocol=0))     # protocol 0: no \x80 header
    r = run_cli("import", str(src), "-o", str(tmp_path / "t.bin"), "--format", "torch")
    assert r.returncode == 2 and not marker.exists()
    assert r.stderr.count("\n") == 1 and "system" in r.stderr and str(src) in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["snap.pickle"]


@pytest.mark.parametrize("proto", [0, 1])
def test_old_protocol_snapshot_is_detected(tmp_path, proto):
    """A snapshot pickled with protocol 0 or 1 (no PROTO opcode) is found a torch snapshot without --format,
    and imports to the same records as the protocol-2 fixture; a CSV or JSON first line is not taken for one."""
    old, new = tmp_path / "old.pickle", tmp_path / "new.pickle"
    old.write_bytes(pickle.dumps(load_fixture_dict("snapshot.pickle"), protocol=proto))
    shutil.copy(fixture("snapshot.pickle"), new)
    assert detect(str(old)) == "torch"
    for src in (old, new):
        import_file(str(src), str(src) + ".bin")
    assert (Trace.load(str(old) + ".bin").records == Trace.load(str(new) + ".bin").records).all()
    for text in (b"Thread,Time,Action,Pointer,Size,Stream\n", b'{"hook": "malloc"}\n', b"(data is here\n"):
        assert not safe_pickle.looks_like_pickle(text)
    for text in (b"....s.s.....x...sss...\n", b"0000000000\n"):     # (opcode-like: STOP, POP on an empty stack)
        assert not safe_pickle.looks_like_pickle(text, any_object=True)


def test_plain_containers_load_in_every_protocol():
    from collections import OrderedDict
    obj = {"a": [1, 2.5, None, True, "s", -2**70, (0, 0)], "s": {1, 2}, "f": frozenset({3}), "o": OrderedDict(x=1)}
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        assert safe_pickle.loads(pickle.dumps(obj, protocol=proto)) == obj
    # bytes need a global (_codecs.encode) below protocol 3; snapshots hold none, so that stays refused
    assert safe_pickle.loads(pickle.dumps([b"b"], protocol=3)) == [b"b"]
    with pytest.raises(InputError, match="truncated pickle"):
        safe_pickle.loads(pickle.dumps(obj)[:-5])


# ---- RMM CSV ---------------------------------------------------------------------------------

RMM_STREAM = 0x5603B2C0


def test_rmm_csv(tmp_path):
    t, s = imported(tmp_path, "log.csv")
    assert rows(t) == [
        ("ALLOC", 0, 0, 1048576, 0x7F0000000000),
        ("ALLOC", RMM_STREAM, 1, 256, 0x7F0000100000),
        ("FREE", 0, 0, 1048576, 0x7F0000000000),
        ("OOM", 0, None, 99999999999, 0),
        ("ALLOC", RMM_STREAM, 2, 4096, 0x7F0000000000),
        ("FREE", RMM_STREAM, 1, 256, 0x7F0000100000),
    ]
    # 23:59:59.1 is the origin; the clock passes midnight after the third row
    assert list(t.time_ns) == [0, 100_000_000, 800_000_000, 1_200_000_000, 1_900_000_000, 2_400_000_000]
    assert (s["allocs"], s["frees"], s["ooms"], s["threads"], s["days_crossed"]) == (3, 2, 1, 2, 1)
    assert t.meta["framework"] == "rmm"


def _rmm(tmp_path, body: str) -> tuple:
    src = tmp_path / "log.csv"
    src.write_text("Thread,Time,Action,Pointer,Size,Stream\n" + body)
    s = import_file(str(src), str(tmp_path / "o.bin"), force=True)
    return Trace.load(str(tmp_path / "o.bin")), s


def test_rmm_a_row_from_before_midnight_logged_after_one_past_it_is_a_step_back_not_a_day(tmp_path):
    t, s = _rmm(tmp_path, "1,23:59:59.800000,allocate,0x10,5,0\n1,00:00:00.100000,allocate,0x20,5,0\n"
                          "2,23:59:59.900000,allocate,0x30,5,0\n1,00:00:00.200000,allocate,0x40,5,0\n")
    assert list(t.time_ns) == [0, 300_000_000, 300_000_000, 400_000_000]   # (the third clamped, not a day on)
    assert s["days_crossed"] == 1
    t, s = _rmm(tmp_path, "1,00:00:00.100000,allocate,0x10,5,0\n2,23:59:59.900000,allocate,0x30,5,0\n"
                          "1,00:00:00.200000,allocate,0x40,5,0\n")     # (a log begun just past midnight)
    assert list(t.time_ns) == [0, 0, 100_000_000] and s["days_crossed"] == 0


def test_rmm_zero_byte_allocations_at_nullptr_may_be_live_together(tmp_path):
    """RMM's pools return nullptr for 0 bytes: two live at once, each freed (the oldest first); a third free of
    nullptr, with none live, is still refused."""
    t, s = _rmm(tmp_path, "1,00:00:00.1,allocate,0x0,0,0\n1,00:00:00.2,allocate,0x0,0,0\n"
                          "1,00:00:00.3,free,0x0,0,0\n1,00:00:00.4,allocate,0x10,8,0\n1,00:00:00.5,free,0x0,0,0\n")
    assert [(k, i, size) for k, _, i, size, _ in rows(t)] == [("ALLOC", 0, 0), ("ALLOC", 1, 0), ("FREE", 0, 0),
                                                              ("ALLOC", 2, 8), ("FREE", 1, 0)]
    assert s["live_at_end"] == 1
    with pytest.raises(InputError, match="free of unknown pointer 0x0") as e:
        _rmm(tmp_path, "1,00:00:00.1,allocate,0x0,0,0\n1,00:00:00.2,free,0x0,0,0\n1,00:00:00.3,free,0x0,0,0\n")
    assert e.value.position == "line 4"


@pytest.mark.parametrize("fmt", [None, "rmm", "cupy", "torch"])
def test_a_compressed_input_is_told_to_be_unpacked(tmp_path, fmt):
    """A gzip'd log said "cannot tell the format ... pass --format", and with --format rmm, "a binary file"."""
    import gzip
    src = tmp_path / "log.csv.gz"
    src.write_bytes(gzip.compress(open(fixture("log.csv"), "rb").read()))
    with pytest.raises(InputError, match=r"it is gzip-compressed; unpack it first \(gunzip -k ") as e:
        import_file(str(src), str(tmp_path / "o.bin"), format=fmt)
    assert e.value.position == "byte 0" and not (tmp_path / "o.bin").exists()


def test_a_log_of_segments_alone_is_refused_with_nothing_written(tmp_path):
    src = tmp_path / "segs.jsonl"
    src.write_text('{"hook":"alloc","mem_size":512,"mem_ptr":4096}\n')
    with pytest.raises(InputError, match="holds no allocation request, only 1 event of the allocator's own"):
        import_file(str(src), str(tmp_path / "o.bin"))
    assert not (tmp_path / "o.bin").exists()


def test_rmm_columns_by_name_and_cut_tail(tmp_path):
    src = tmp_path / "log.txt"
    src.write_text("Stream,Size,Pointer,Action,Time,Thread\n"
                   "0x10,64,0xa000,allocate,10:00:00.000001,1\n"
                   "0x10,64,0xa000,free,10:00:00.000002,1\n"
                   "0,128,0xb0")                           # cut off by a crash
    out = tmp_path / "o.bin"
    s = import_file(str(src), str(out))
    t = Trace.load(str(out))
    assert rows(t) == [("ALLOC", 16, 0, 64, 0xA000), ("FREE", 16, 0, 64, 0xA000)]
    assert list(t.time_ns) == [0, 1000]
    assert s["dropped_line"] == 4 and "line 4" in s["warnings"][0]


@pytest.mark.parametrize("body, line, message", [
    ("Thread,Time,Action,Pointer,Size\n1,10:00:00.0,allocate,0x1,8\n", 1, "missing column 'Stream'"),
    ("1,10:00:00.0,allocate,0x1,8x,0\n", 2, "bad size '8x'"),
    ("1,10:00:00.0,allocate,0x1,-8,0\n", 2, "negative size -8"),
    ("1,10:00:00.0,allocate,0x1,8,0\n1,10:00:00.1,free,0x2,8,0\n", 3, "free of unknown pointer 0x2"),
    ("1,10:00:00.0,allocate,0x1,8,0\n1,10:00:00.1,allocate,0x1,8,0\n", 3, "pointer 0x1 allocated twice"),
    ("1,10:00:00.0,reallocate,0x1,8,0\n", 2, "unknown action 'reallocate'"),
    ("1,10:00:00.0,allocate,0x1,8\n1,10:00:00.0,allocate,0x2,8,0\n", 2, "expected 6 fields, found 5"),
    ("1,25:00:00.0,allocate,0x1,8,0\n", 2, "bad time '25:00:00.0'"),
    ("1,10:00:00.0,allocate,0xZZ,8,0\n", 2, "bad pointer '0xZZ'"),
])
def test_rmm_malformed(tmp_path, body, line, message):
    src = tmp_path / "log.csv"
    src.write_text(body if body.startswith("Thread") else "Thread,Time,Action,Pointer,Size,Stream\n" + body)
    with pytest.raises(InputError, match=message) as e:
        import_file(str(src), str(tmp_path / "o.bin"), format="rmm")
    assert e.value.path == str(src) and e.value.position == f"line {line}"
    assert not (tmp_path / "o.bin").exists()


# ---- CuPy JSONL ------------------------------------------------------------------------------

def test_cupy_jsonl(tmp_path):
    t, s = imported(tmp_path, "hooks.jsonl")
    p = 150496608256
    assert rows(t) == [
        ("SEGMENT_ALLOC", 0, None, 512, p),
        ("ALLOC", 0, 0, 24, p),
        ("ALLOC", 0, 1, 1000, p + 512),
        ("FREE", 0, 0, 512, p),              # pmem_id ...5278 closes its first malloc
        ("ALLOC", 0, 2, 500, p),             # ... which Python then reuses
        ("OOM", 0, None, (1 << 40) - 7, 0),  # the failed request; the failed upstream attempt is only counted
        ("FREE", 0, 1, 1024, p + 512),
    ]
    assert list(t.time_ns) == [0, 1, 2, 3, 4, 6, 8]
    assert (s["allocs"], s["frees"], s["segment_allocs"], s["ooms"], s["failed_upstream"], s["other_devices"]) == \
        (3, 2, 1, 1, 1, 1)
    t1, _ = imported(tmp_path, "hooks.jsonl", device=1)
    assert rows(t1) == [("ALLOC", 0, 0, 8, 250496608256)]


def test_cupy_zero_byte_requests_count_as_allocs_like_the_recorder(tmp_path):
    src = tmp_path / "h.jsonl"
    src.write_text('{"hook":"malloc","size":0,"mem_size":0,"mem_ptr":0,"pmem_id":"0x0"}\n'
                   '{"hook":"malloc","size":9,"mem_size":512,"mem_ptr":0,"pmem_id":"0x0"}\n')
    stats = import_file(str(src), str(tmp_path / "z.bin"))
    t = Trace.load(str(tmp_path / "z.bin"))
    assert rows(t) == [("ALLOC", 0, 0, 0, 0), ("OOM", 0, None, 9, 0)]     # a null pointer for 9 bytes: it raised
    assert (stats["allocs"], stats["zero_allocs"], stats["ooms"]) == (1, 1, 1)


def test_cupy_free_closes_the_newest_open_malloc(tmp_path):
    src = tmp_path / "h.jsonl"
    src.write_text('{"hook":"malloc","size":1,"mem_size":512,"mem_ptr":512,"pmem_id":"0xa"}\n'
                   '{"hook":"malloc","size":2,"mem_size":512,"mem_ptr":1024,"pmem_id":"0xa"}\n'
                   '{"hook":"free","mem_size":512,"mem_ptr":1024,"pmem_id":"0xa"}\n')
    import_file(str(src), str(tmp_path / "o.bin"))
    t = Trace.load(str(tmp_path / "o.bin"))
    assert [(e.kind, e.id) for e in t] == [(ev.ALLOC, 0), (ev.ALLOC, 1), (ev.FREE, 1)]


@pytest.mark.parametrize("lines, line, message", [
    (['{"hook":"malloc","size":1,"mem_size":512,"mem_ptr":5,"pmem_id":"0x1"}', '{"hook": "free",'], 2, "bad JSON"),
    (['{"hook":"malloc","size":1,"mem_size":512,"mem_ptr":5,"pmem_id":"0x1"}', '[1]'], 2, "not a JSON object"),
    (['{"hook":"realloc","mem_size":1}'], 1, "unknown hook 'realloc'"),
    (['{"hook":"free","mem_size":512,"mem_ptr":5,"pmem_id":"0x9"}'], 1, "free of unknown pmem_id '0x9'"),
    (['{"hook":"malloc","mem_size":512,"mem_ptr":5}'], 1, "malloc line without size, pmem_id"),
    (['{"hook":"malloc","size":-1,"mem_size":512,"mem_ptr":5,"pmem_id":"0x1"}'], 1, "size is -1"),
])
def test_cupy_malformed(tmp_path, lines, line, message):
    src = tmp_path / "h.jsonl"
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=message) as e:
        import_file(str(src), str(tmp_path / "o.bin"), format="cupy")
    assert e.value.position == f"line {line}"
    assert not (tmp_path / "o.bin").exists()


# ---- detection, CLI, atomic output -----------------------------------------------------------

def test_detect_by_content_not_extension(tmp_path):
    for name, fmt, alias in (("snapshot.pickle", "torch", "a.csv"), ("log.csv", "rmm", "b.jsonl"),
                             ("hooks.jsonl", "cupy", "c.pickle")):
        shutil.copy(fixture(name), tmp_path / alias)
        assert detect(str(tmp_path / alias)) == fmt
    (tmp_path / "d.txt").write_text("hello\n")
    with pytest.raises(InputError, match="cannot tell the format"):
        detect(str(tmp_path / "d.txt"))
    TraceWriter().finish().save(str(tmp_path / "e.bin"))
    with pytest.raises(InputError, match="already an allocsim trace"):
        detect(str(tmp_path / "e.bin"))


def test_cli_success_and_summary(tmp_path):
    out = tmp_path / "t.bin"
    r = run_cli("import", fixture("snapshot_wrapped.pickle"), "-o", str(out), "--total-memory", "80GiB")
    assert r.returncode == 0, r.stderr
    assert "13 events" in r.stdout and "wrapped: yes, seeded 4 pre-existing blocks" in r.stdout
    assert Trace.load(str(out)).meta["device"]["total_memory"] == 80 * 2**30


def test_cli_error_late_in_the_input_leaves_no_file(tmp_path):
    src = tmp_path / "log.csv"
    good = "".join(f"1,10:00:00.{i:06d},allocate,{0x1000 + 16 * i:#x},8,0\n" for i in range(20000))
    src.write_text("Thread,Time,Action,Pointer,Size,Stream\n" + good + "1,10:00:01.0,free,0x9,8,0\n")
    r = run_cli("import", str(src), "-o", str(tmp_path / "t.bin"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"allocsim: {src}: line 20002: free of unknown pointer 0x9 (not allocated, or already freed)\n"
    assert sorted(os.listdir(tmp_path)) == ["log.csv"]


def test_cuda_graph_private_pools_are_marked_named_and_routed(tmp_path):
    """A segment in a private pool (``segment_pool_id`` not (0, 0)) is flagged on its SEGMENT_ALLOC, counted in
    the metadata and warned about on import; the requests that landed in it are routed to its pool (a POOL_BEGIN
    before the run, with the segment allocation it made, a POOL_END after), so `info` shows the pool events and
    `validate` follows them and never says "not modelled"."""
    snap = load_fixture_dict("snapshot.pickle")
    for seg in snap["segments"]:
        seg["segment_pool_id"] = (1, 0) if seg["address"] == 0x10000000 else (0, 0)
    src = str(tmp_path / "graph.pickle")
    with open(src, "wb") as f:
        pickle.dump(snap, f)
    out = str(tmp_path / "graph.bin")
    stats = import_file(src, out)
    t = Trace.load(out)
    seg = t.kind == ev.SEGMENT_ALLOC
    private = (t.flags & ev.PRIVATE_POOL) != 0
    assert t.addr[seg & private].tolist() == [0x10000000] and not (private & ~seg & ~np.isin(t.kind, ev.POOL)).any()
    assert t.meta["private_pools"] == {"segments": 1, "bytes": 2 * MiB}
    assert any("belong to 1 private pools" in w for w in stats["warnings"]) and stats["pool_runs_inferred"] == 2
    # every ALLOC in the pool's segment lies between a begin and an end of pool 1, every other outside
    routed, inside = [], False
    for k, a in zip(t.kind.tolist(), t.addr.tolist()):
        if k in (ev.POOL_BEGIN, ev.POOL_END):
            inside = k == ev.POOL_BEGIN
        elif k == ev.ALLOC:
            routed.append((0x10000000 <= a < 0x10000000 + 2 * MiB, inside))
    assert routed and all(x == y for x, y in routed) and any(x for x, _ in routed)
    begins = np.flatnonzero(t.kind == ev.POOL_BEGIN)
    assert t.kind[begins[0] + 1] == ev.SEGMENT_ALLOC and (t.flags[begins] == ev.POOL_CAPTURE).all()
    assert (t.aux[begins] == 1).all() and (t.addr[begins] == ev.pool_id_bits((1, 0))).all()
    p = run_cli("info", out)
    assert p.returncode == 0 and "private pools: begin 2, end 2" in p.stdout
    text = run_cli("validate", out).stdout
    assert "private pools: 4 pool events followed, 1 recorded segment allocations in them" in text
    assert "not modelled" not in text
    plain = str(tmp_path / "plain.bin")
    import_file(fixture("snapshot.pickle"), plain)
    assert "private pool" not in run_cli("validate", plain).stdout + run_cli("info", plain).stdout


def _pool_snapshot(entries, segments):
    return {"segments": segments, "device_traces": [entries]}


def test_a_pools_earlier_segment_at_a_reused_address_and_a_mempool_stream():
    """Only a segment's last incarnation is named by the final state: a request in an earlier segment at the
    same address stays in the default pools. A MemPool's pool ((0, n)) routes every stream."""
    e = [{"action": "segment_alloc", "addr": 0x1000, "size": 2 * MiB, "stream": 5},
         {"action": "alloc", "addr": 0x1000, "size": 512, "stream": 5},                 # default (earlier life)
         {"action": "free_completed", "addr": 0x1000, "size": 512, "stream": 5},
         {"action": "segment_free", "addr": 0x1000, "size": 2 * MiB, "stream": 5},
         {"action": "segment_alloc", "addr": 0x1000, "size": 2 * MiB, "stream": 5},
         {"action": "alloc", "addr": 0x1000, "size": 512, "stream": 5},                 # the MemPool's
         {"action": "alloc", "addr": 0x1200, "size": 512, "stream": 5}]
    seg = {"address": 0x1000, "total_size": 2 * MiB, "stream": 5, "segment_pool_id": (0, 3),
           "blocks": [{"address": 0x1000, "size": 512, "requested_size": 512, "state": "active_allocated"},
                      {"address": 0x1200, "size": 512, "requested_size": 512, "state": "active_allocated"}]}
    start = StartState(_pool_snapshot(e, [seg]), e, 0, _Where("x"))
    runs = inferred_pool_runs(e, start, private_incarnations(e, start, {0x1000: (0, 3)}))
    assert runs == {4: [(ev.POOL_BEGIN, (0, 3), 0, ev.POOL_ANY_STREAM)], 7: [(ev.POOL_END, (0, 3), 0, 0)]}


def test_a_release_that_keeps_a_pools_empty_segment_is_still_empty_cache_and_ends_the_pools_run():
    """``empty_cache()`` frees every default segment with no live block, but a private pool's only once the pool
    has no users: a release that frees the empty default segment and keeps the pool's segments is a release all
    the same (a graph tree's capture begins with one). While a pool is begun the default pools are not released,
    so the release also ends the run of the pool's requests before it (its end written before the release) and
    the requests after it are a new run."""
    e = [{"action": "segment_alloc", "addr": 0x100000, "size": 20 * MiB, "stream": 0},
         {"action": "alloc", "addr": 0x100000, "size": 4 * MiB, "stream": 0},
         {"action": "free_completed", "addr": 0x100000, "size": 4 * MiB, "stream": 0},
         {"action": "segment_alloc", "addr": 0x8000000, "size": 20 * MiB, "stream": 7},     # pool (2, 0)
         {"action": "alloc", "addr": 0x8000000, "size": 4 * MiB, "stream": 7},
         {"action": "free_completed", "addr": 0x8000000, "size": 4 * MiB, "stream": 7},     # now empty
         {"action": "segment_alloc", "addr": 0x4000000, "size": 30 * MiB, "stream": 7},     # pool (2, 0)
         {"action": "alloc", "addr": 0x4000000, "size": 30 * MiB, "stream": 7},
         {"action": "segment_free", "addr": 0x100000, "size": 20 * MiB, "stream": 0},        # empty_cache()
         {"action": "alloc", "addr": 0x8000000, "size": 1 * MiB, "stream": 7}]
    segs = [{"address": 0x4000000, "total_size": 30 * MiB, "stream": 7, "segment_pool_id": (2, 0), "blocks": [
                {"address": 0x4000000, "size": 30 * MiB, "requested_size": 30 * MiB, "state": "active_allocated"}]},
            {"address": 0x8000000, "total_size": 20 * MiB, "stream": 7, "segment_pool_id": (2, 0), "blocks": [
                {"address": 0x8000000, "size": MiB, "requested_size": MiB, "state": "active_allocated"}]}]
    start = StartState(_pool_snapshot(e, segs), e, 0, _Where("x"))
    private = private_incarnations(e, start, {0x4000000: (2, 0), 0x8000000: (2, 0)})
    assert inferred_releases(e, start, False) == []    # blind to the pool: the empty pool segment stayed, "partial"
    assert inferred_releases(e, start, False, private) == [8]
    runs = inferred_pool_runs(e, start, private, [8])
    begin, end = (ev.POOL_BEGIN, (2, 0), 7, ev.POOL_CAPTURE), (ev.POOL_END, (2, 0), 0, 0)
    assert runs == {3: [begin], 8: [end], 9: [begin], 10: [end]}
    w = TraceWriter({})
    convert(_pool_snapshot(e, segs), w)
    kinds = [ev.KIND_NAMES[int(k)] for k in w.finish().kind]
    assert kinds == ["SEGMENT_ALLOC", "ALLOC", "FREE", "POOL_BEGIN", "SEGMENT_ALLOC", "ALLOC", "FREE", "SEGMENT_ALLOC",
                     "ALLOC", "POOL_END", "CACHE_RELEASE", "SEGMENT_FREE", "POOL_BEGIN", "ALLOC", "POOL_END"]
