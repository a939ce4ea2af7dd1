"""Recorders observe, never replace: limits, cache releases and failed requests are recorded, and the
allocator's own figures are the same with and without `allocsim record` (marked gpu: run the same script
both ways). On the CPU: the importer's inferred cache releases (real snapshots in traces/raw/pressure and
hand-made entries), the CuPy recorder's bookkeeping against a fake pool, and SET_LIMIT's encoding."""
from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
import types

import pytest

from allocsim.formats.importers import import_file, safe_pickle
from allocsim.formats.importers.torch_snapshot import StartState, _Where, inferred_releases
from allocsim.formats.recorders.torch import fraction_bits
from allocsim.trace import Trace
from allocsim.trace import events as ev

from test_record import _check_cupy, _check_torch, _gpu_ok, _script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAW = os.path.join(REPO, "traces", "raw", "pressure")
PRESSURE = sorted(glob.glob(os.path.join(REPO, "traces", "pressure-*.bin")))


# ---- import: cache releases inferred from a snapshot ------------------------------------------------
def _releases(name):
    snap = safe_pickle.load(os.path.join(RAW, f"{name}.pickle"))
    entries = snap["device_traces"][0]
    gc = (snap.get("allocator_settings") or {}).get("garbage_collection_threshold", 0) > 0
    return entries, inferred_releases(entries, StartState(snap, entries, 0, _Where(name)), gc)


@pytest.mark.skipif(not os.path.isdir(RAW), reason="no raw pressure snapshots")
def test_empty_cache_every_second_step_is_four_releases_each_before_its_frees():
    entries, at = _releases("empty-cache")
    assert len(at) == 4                     # steps 2, 4, 6, 8 of 8
    for i in at:
        assert entries[i]["action"] == "segment_free" and entries[i - 1]["action"] != "segment_free"


@pytest.mark.skipif(not os.path.isdir(RAW), reason="no raw pressure snapshots")
@pytest.mark.parametrize("name", ["fraction-oom", "gc-threshold", "maxsplit-cap", "plain", "side-stream"])
def test_the_allocators_own_frees_are_no_release(name):
    assert _releases(name)[1] == []


def _e(action, addr, size=2 << 20, **kw):
    return {"action": action, "addr": addr, "size": size, "stream": 0, **kw}


def _infer(entries, gc=False):
    return inferred_releases(entries, StartState({"segments": []}, entries, 0, _Where("x")), gc)


def test_release_rules_on_made_up_entries():
    two_segments = [_e("segment_alloc", 0x1000), _e("alloc", 0x1000, 512), _e("segment_alloc", 0x400000),
                    _e("alloc", 0x400000, 512), _e("free_completed", 0x1000, 512)]
    # every empty segment freed, then a cache miss: empty_cache() (also what a retry looks like)
    assert _infer(two_segments + [_e("segment_free", 0x1000), _e("segment_alloc", 0x1000)]) == [5]
    # the same run right before an oom entry: the allocator's OOM path
    assert _infer(two_segments + [_e("segment_free", 0x1000), _e("oom", 0, 1 << 30, device_free=0)]) == []
    # with a garbage_collection_threshold, a run followed by a segment alloc is its collection
    assert _infer(two_segments + [_e("segment_free", 0x1000), _e("segment_alloc", 0x1000)], gc=True) == []
    # only some of the empty segments: a partial release is the allocator's own
    both_empty = two_segments + [_e("free_completed", 0x400000, 512)]
    assert _infer(both_empty + [_e("segment_free", 0x1000)]) == []
    assert _infer(both_empty + [_e("segment_free", 0x400000), _e("segment_free", 0x1000), _e("alloc", 9, 1)]) == [6]


@pytest.mark.skipif(not os.path.isdir(RAW), reason="no raw pressure snapshots")
def test_import_writes_the_releases_before_their_frees(tmp_path):
    stats = import_file(os.path.join(RAW, "empty-cache.pickle"), str(tmp_path / "e.bin"))
    t = Trace.load(str(tmp_path / "e.bin"))
    at = [int(i) for i in (t.kind == ev.CACHE_RELEASE).nonzero()[0]]
    assert stats["cache_releases_inferred"] == len(at) == 4
    assert all(t.kind[i + 1] == ev.SEGMENT_FREE and t.aux[i] == 0 for i in at)
    assert int((t.kind == ev.SEGMENT_FREE).sum()) == stats["segment_frees"] == 127


# ---- SET_LIMIT's encoding ---------------------------------------------------------------------------
def test_fraction_bits_round_trip():
    for f in (0.5, 0.0462, 1.0):
        assert struct.unpack("<d", struct.pack("<Q", fraction_bits(f)))[0] == f


# ---- the CuPy recorder's bookkeeping, against a fake pool (CPU) -------------------------------------
class FakePool:
    """Enough of CuPy's MemoryPool: total/used bytes, limit, free_all_blocks releasing whole empty segments."""

    def __init__(self):
        self.total = self.used = self.limit = 0
        self.segments = {}          # base -> [size, live chunks]
        self.calls = []

    def total_bytes(self):
        return self.total

    def used_bytes(self):
        return self.used

    def n_free_blocks(self):
        return 0

    def get_limit(self):
        return self.limit

    def set_limit(self, size=None, fraction=None):
        self.calls.append(("set_limit", size))
        self.limit = size or 0

    def free_all_blocks(self, stream=None):
        self.calls.append(("free_all_blocks", stream))
        for b, (size, live) in list(self.segments.items()):
            if not live:
                del self.segments[b]
                self.total -= size


def _fake_cupy(monkeypatch, pool):
    hooks = []

    class MemoryHook:
        def __enter__(self):
            hooks.append(self)

        def __exit__(self, *a):
            hooks.remove(self)

    stream = types.SimpleNamespace(ptr=0)
    cuda = types.SimpleNamespace(
        is_available=lambda: True, Device=lambda: types.SimpleNamespace(id=0, synchronize=lambda: None),
        get_current_stream=lambda: stream, memory_hook=types.SimpleNamespace(MemoryHook=MemoryHook),
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"name": b"Fake", "totalGlobalMem": 1 << 34},
                                      runtimeGetVersion=lambda: 13000, memGetInfo=lambda: (123, 1 << 34)),
        get_allocator=lambda: pool.malloc)
    cupy = types.SimpleNamespace(__version__="14.2.0", cuda=cuda, get_default_memory_pool=lambda: pool)
    pool.malloc = types.MethodType(lambda self, n: None, pool)
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.memory_hook", cuda.memory_hook),
                      ("cupy.cuda.runtime", cuda.runtime)):
        monkeypatch.setitem(sys.modules, name, mod)
    return cupy, hooks


def _recording(monkeypatch, tmp_path):
    """A CuPy recorder started on a fake CuPy: ``(pool, cupy, recorder, its memory hook)``."""
    from allocsim.formats.recorders.cupy import CupyRecorder
    pool = FakePool()
    cupy, hooks = _fake_cupy(monkeypatch, pool)
    rec = CupyRecorder(str(tmp_path / "c.bin"), command=["x"])
    rec.start()
    hook, = hooks
    return pool, cupy, rec, hook


def test_cupy_recorder_observes_the_programs_pool(monkeypatch, tmp_path):
    pool, cupy, rec, hook = _recording(monkeypatch, tmp_path)
    view = cupy.get_default_memory_pool()
    assert view is not pool and view.total_bytes() == 0

    def malloc(size, base=None, seg=0, pid=None):
        """One request, as CuPy's hooks report it; ``seg`` > 0: the pool went upstream for a segment at ``base``."""
        hook.malloc_preprocess(size=size, mem_size=-(-size // 512) * 512)
        if seg:
            pool.segments[base] = [seg, 0]
            pool.total += seg
            hook.alloc_postprocess(mem_size=seg, mem_ptr=base)
        if base is None:
            return hook.malloc_postprocess(size=size, mem_size=-(-size // 512) * 512, mem_ptr=0, pmem_id=0)
        pool.segments[base][1] += 1
        hook.malloc_postprocess(size=size, mem_size=-(-size // 512) * 512, mem_ptr=base, pmem_id=pid or base)

    def free(base, pid=None):
        pool.segments[base][1] -= 1
        hook.free_postprocess(mem_size=0, mem_ptr=base, pmem_id=pid or base)

    view.set_limit(size=1 << 30)
    malloc(1000, 0x1000, seg=1 << 20)
    malloc(5000, 0x200000, seg=2 << 20)
    malloc(0)                                   # a 0-byte request: a null pointer, no failure
    free(0x1000)
    view.free_all_blocks()                      # releases the empty first segment
    free(0x200000)
    pool.free_all_blocks()                      # behind the view's back: seen at the next request
    malloc(1 << 31)                             # fails
    rec.finish()
    t = Trace.load(str(tmp_path / "c.bin"))
    kinds = [ev.KIND_NAMES[k] for k in t.kind]
    assert kinds == ["SET_LIMIT", "SEGMENT_ALLOC", "ALLOC", "SEGMENT_ALLOC", "ALLOC", "ALLOC", "FREE",
                     "CACHE_RELEASE", "SEGMENT_FREE", "FREE", "CACHE_RELEASE", "SEGMENT_FREE", "OOM"]
    assert t.size[0] == 1 << 30 and t.aux[0] == 1 and pool.calls[0] == ("set_limit", 1 << 30)
    assert list(t.addr[t.kind == ev.SEGMENT_FREE]) == [0x1000, 0x200000]
    assert t.size[-1] == 1 << 31 and t.addr[-1] == 123 and t.n_allocs == 3
    stats = json.load(open(str(tmp_path / "c.bin") + ".stats.json"))
    assert stats["counts"]["unseen_release"] == 1 and stats["pool"]["total_bytes"] == 0
    assert any("other than through" in n for n in stats["notes"])
    assert cupy.get_default_memory_pool() is pool       # given back


def test_cupy_recorder_flags_the_frees_a_collection_makes_inside_a_request(monkeypatch, tmp_path):
    """CuPy 14.2's ``_try_malloc`` runs ``gc.collect()`` after its best-fit lookup failed (limit path: between
    two ``free_all_blocks``): the arrays it collects are freed inside the request, before its
    ``malloc_postprocess``. Those FREEs are flagged IN_REQUEST with the collection's number; a free outside a
    request is not; a request a finalizer makes during that collection does not end the outer one. Python's
    own collections are off inside a request and back on after it."""
    import gc
    pool, _, rec, hook = _recording(monkeypatch, tmp_path)
    was = gc.isenabled()
    gc.enable()
    try:
        pool.segments[0x1000] = [1 << 20, 0]
        pool.total += 1 << 20
        for base in (0x1000, 0x1800):
            hook.malloc_preprocess(size=2048, mem_size=2048)
            if base == 0x1000:
                hook.alloc_postprocess(mem_size=1 << 20, mem_ptr=0x1000)
            pool.segments[0x1000][1] += 1
            hook.malloc_postprocess(size=2048, mem_size=2048, mem_ptr=base, pmem_id=base)
        hook.free_postprocess(mem_size=2048, mem_ptr=0x1000, pmem_id=0x1000)   # an ordinary free
        hook.malloc_preprocess(size=4096, mem_size=4096)
        assert not gc.isenabled()                       # paused for the request
        rec._on_gc("start", {"generation": 2})          # the pool's gc.collect() on its limit path
        hook.malloc_preprocess(size=512, mem_size=512)  # a finalizer it ran makes a request of its own
        pool.segments[0x1000][1] += 1
        hook.malloc_postprocess(size=512, mem_size=512, mem_ptr=0x1c00, pmem_id=0x1c00)
        assert not gc.isenabled()                       # still inside the outer request
        hook.free_postprocess(mem_size=2048, mem_ptr=0x1800, pmem_id=0x1800)   # a cycle it collected
        hook.malloc_postprocess(size=4096, mem_size=4096, mem_ptr=0x1000, pmem_id=0x2000)
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
    rec.finish()
    t = Trace.load(str(tmp_path / "c.bin"))
    kinds = [ev.KIND_NAMES[k] for k in t.kind]
    assert kinds == ["SEGMENT_ALLOC", "ALLOC", "ALLOC", "FREE", "GC", "ALLOC", "FREE", "ALLOC"]
    frees = t.kind == ev.FREE
    assert list(t.flags[frees]) == [0, ev.IN_REQUEST] and list(t.aux[frees]) == [0, 1]
    assert list(t.id[frees]) == [0, 1]
    stats = json.load(open(str(tmp_path / "c.bin") + ".stats.json"))
    assert stats["counts"]["free_in_request"] == 1 and stats["counts"]["gc_in_request"] == 1


# ---- the same script with and without `allocsim record` (GPU) --------------------------------------------
def _both_ways(tmp_path, name, body, fw):
    """Run ``body`` plainly and under `allocsim record`; return (plain figures, recorded figures, trace, stats)."""
    s = _script(tmp_path, name, body)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    figures = []
    out = str(tmp_path / "t.bin")
    for prefix in ([], ["-m", "allocsim", "record", "--framework", fw, "-o", out]):
        f = str(tmp_path / f"figures{len(figures)}.json")
        r = subprocess.run([sys.executable, *prefix, s, f], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        figures.append(json.load(open(f)))
    return figures[0], figures[1], Trace.load(out), json.load(open(out + ".stats.json"))


TORCH_PRESSURE = """
    import json, sys, torch
    MB = 1 << 20
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(560 * MB / total)
    a = torch.empty(200 * MB, dtype=torch.uint8, device="cuda")
    b = torch.empty(150 * MB, dtype=torch.uint8, device="cuda")
    del a
    c = torch.empty(250 * MB, dtype=torch.uint8, device="cuda")    # 350 + 250 > 560: frees a's segment, retries
    try:
        d = torch.empty(1024 * MB, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        pass
    del b
    torch.cuda.empty_cache()
    e = torch.empty(100 * MB, dtype=torch.uint8, device="cuda")
    del c, e
    torch.cuda.memory.empty_cache()
    keys = ("reserved_bytes.all.peak", "reserved_bytes.all.current", "num_alloc_retries", "num_ooms",
            "segment.all.allocated", "segment.all.freed", "allocation.all.allocated", "num_device_alloc")
    json.dump({k: torch.cuda.memory_stats()[k] for k in keys}, open(sys.argv[1], "w"))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("torch"), reason="needs torch with a CUDA GPU")
def test_torch_figures_are_the_same_recorded(tmp_path):
    plain, recorded, t, stats = _both_ways(tmp_path, "pressure_torch.py", TORCH_PRESSURE, "torch")
    assert plain == recorded and plain["num_alloc_retries"] >= 1 and plain["num_ooms"] == 1
    _check_torch(t, stats["memory_stats"])
    limit = t.kind == ev.SET_LIMIT
    assert int(limit.sum()) == 1 and t.aux[limit][0] == 0
    fraction = struct.unpack("<d", struct.pack("<Q", int(t.addr[limit][0])))[0]
    assert t.size[limit][0] == int(fraction * t.meta["device"]["total_memory"])
    assert abs(int(t.size[limit][0]) - (560 << 20)) <= 1
    assert int((t.kind == ev.CACHE_RELEASE).sum()) == 2 == stats["cache_releases"]
    assert int((t.kind == ev.OOM).sum()) == 1
    first = int((t.kind == ev.CACHE_RELEASE).nonzero()[0][0])
    assert t.kind[first + 1] == ev.SEGMENT_FREE            # empty_cache's frees follow it


CUPY_PRESSURE = """
    import gc, json, sys, cupy as cp
    MB = 1 << 20
    pool = cp.get_default_memory_pool()
    pool.set_limit(size=560 * MB)
    a = cp.empty(200 * MB, cp.uint8)
    b = cp.empty(150 * MB, cp.uint8)
    del a
    c = cp.empty(250 * MB, cp.uint8)         # 350 + 250 > 560: the pool frees a's segment first
    ooms = 0
    try:
        d = cp.empty(1024 * MB, cp.uint8)
    except cp.cuda.memory.OutOfMemoryError:
        ooms += 1
    z = cp.empty(0, cp.uint8)
    figures = {"mid_total": pool.total_bytes(), "mid_used": pool.used_bytes()}
    del b
    pool.free_all_blocks()
    e = cp.empty(100 * MB, cp.uint8)
    del c, e
    pool.free_all_blocks()
    gc.collect()
    figures.update(total=pool.total_bytes(), used=pool.used_bytes(), limit=pool.get_limit(), ooms=ooms)
    json.dump(figures, open(sys.argv[1], "w"))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("cupy"), reason="needs cupy with a CUDA GPU")
def test_cupy_figures_are_the_same_recorded(tmp_path):
    plain, recorded, t, stats = _both_ways(tmp_path, "pressure_cupy.py", CUPY_PRESSURE, "cupy")
    assert plain == recorded and plain["ooms"] == 1 and plain["mid_total"] == 400 * (1 << 20)
    _check_cupy(t, stats["pool"])
    limit = t.kind == ev.SET_LIMIT
    assert list(t.size[limit]) == [560 << 20] and t.aux[limit][0] == 1
    assert int((t.kind == ev.CACHE_RELEASE).sum()) == 2 and int((t.kind == ev.OOM).sum()) == 1
    assert int((t.kind == ev.SEGMENT_FREE).sum()) >= 3          # a's in the limit path, then b's, c's and e's
    assert stats["counts"]["unseen_release"] == 0 and not stats["notes"]


@pytest.mark.skipif(not PRESSURE, reason="no pressure traces recorded yet")
@pytest.mark.parametrize("path", PRESSURE, ids=[os.path.basename(p) for p in PRESSURE])
def test_pressure_traces_hold_what_the_program_did(path):
    t = Trace.load(path)
    stats = json.load(open(path + ".stats.json"))
    name = os.path.basename(path)[len("pressure-"):-len(".bin")]
    releases, limits, ooms = (int((t.kind == k).sum()) for k in (ev.CACHE_RELEASE, ev.SET_LIMIT, ev.OOM))
    if t.meta["framework"] == "cupy":
        # benchmarks/gpu_cupy_pressure.py: free_all_blocks() after every third step (9 steps for cupy-limit, the
        # issue 11 program, 12 for the others); one set_limit, four in oom-backoff; the OOMs the program caught,
        # from its own figures where they were kept (traces/raw/cupy-unseen/recorded/)
        workload = name[len("cupy-"):]
        assert releases == (3 if workload == "limit" else 4) and limits == (4 if workload == "oom-backoff" else 1)
        figures = os.path.join(REPO, "traces", "raw", "cupy-unseen", "recorded", f"{workload}.recorded.json")
        assert ooms == (json.load(open(figures))["ooms"] if os.path.exists(figures) else 1)
        return
    ms = stats["memory_stats"]
    assert ooms == ms["num_ooms"] and releases == (4 if name == "empty-cache" else 0)
    assert limits == (0 if name in ("empty-cache", "side-stream", "plain") else 1)


# ---- info shows what the program set and released ------------------------------------------------
@pytest.mark.skipif(not PRESSURE, reason="no pressure traces recorded yet")
def test_info_shows_recorded_limits_and_cache_releases():
    from allocsim.commands.info import format_summary
    from allocsim.trace.analysis import summarize
    t = Trace.load(os.path.join(REPO, "traces", "pressure-fraction-oom.bin"))
    d = summarize(t)
    lim, = d["limits"]
    assert lim["bytes"] == int(lim["fraction"] * t.meta["device"]["total_memory"]) and d["cache_releases"] == 0
    assert "(fraction 0.02708) at event 0" in format_summary(d)
    d = summarize(Trace.load(os.path.join(REPO, "traces", "pressure-cupy-limit.bin")))
    assert d["cache_releases"] == 3 and d["limits"] == [{"event": 0, "bytes": 1_500_000_000, "by": "cupy set_limit"}]
