"""The recorder's pool events (`allocsim.formats.recorders.torch_pools`): on the CPU against a stand-in for the
``torch`` calls it wraps (order, numbering, flags, what each wrapper records and passes on); on a GPU
(marked gpu) a real program with a MemPool and a CUDA graph, whose trace must hold the pool events the
program's calls imply and replay to the real allocator's own figures."""
from __future__ import annotations

import types

import pytest

from allocsim.formats.recorders.torch_pools import PoolHooks
from allocsim.trace import events as ev

from test_record import _check_torch, _gpu_ok, _recorded


# ---- a stand-in for the wrapped torch calls (CPU) -------------------------------------------------
class _Log:
    """The recorder's side as PoolHooks sees it: drains and records land in one list, in order."""

    def __init__(self):
        self.items = []

    def record(self, kind, **kw):
        self.items.append((ev.KIND_NAMES[kind], kw["aux"], kw["flags"], kw["stream"], kw["addr"]))


def _fake_torch(log):
    calls = log.items

    class CUDAGraph:
        counter = [0]

        def capture_begin(self, pool=None, capture_error_mode="global"):
            if pool is None:
                self.counter[0] += 1
                pool = (self.counter[0], 0)
            self._pool, self._ended = pool, False
            calls.append(("capture_begin", pool))

        def capture_end(self):
            self._ended = True
            calls.append(("capture_end",))

        def replay(self):
            calls.append(("replay",))

        def reset(self):
            calls.append(("reset",))

        def pool(self):                 # as PyTorch 2.11: only after a finished capture
            if not getattr(self, "_ended", False):
                raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
            return self._pool

    class MemPool:
        made = [0]

        def __init__(self):
            self.made[0] += 1
            self.id = (0, self.made[0])
            calls.append(("MemPool",))

    def c_call(name):
        return lambda device, pool, *a: calls.append((name, device, pool))

    names = ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_beginAllocateCurrentStreamToPool",
             "_cuda_endAllocateToPool", "_cuda_releasePool", "_cuda_setCheckpointPoolState")
    C = types.SimpleNamespace(**{n: c_call(n) for n in names})
    C._cuda_getCheckpointState = lambda device, pool: types.SimpleNamespace(pool=pool)
    memory = types.SimpleNamespace(MemPool=MemPool, _cuda_endAllocateToPool=C._cuda_endAllocateToPool,
                                   _cuda_releasePool=C._cuda_releasePool,
                                   _cuda_beginAllocateCurrentThreadToPool=C._cuda_beginAllocateCurrentThreadToPool)
    stream = types.SimpleNamespace(cuda_stream=0x77)
    cuda = types.SimpleNamespace(CUDAGraph=CUDAGraph, memory=memory, MemPool=MemPool,
                                 current_stream=lambda device=None: stream)
    return types.SimpleNamespace(_C=C, cuda=cuda)


def _hooks():
    log = _Log()
    rec = types.SimpleNamespace(device=0, writer=object(), conv=types.SimpleNamespace(w=log), draining=False)
    rec.drain = lambda: log.items.append(("drain",))
    rec.mark = lambda label: log.items.append(("mark", label))
    rec.torch = _fake_torch(log)
    hooks = PoolHooks(rec)
    hooks.install()
    return hooks, rec, log


def test_a_capture_into_a_new_pool_is_begun_at_its_end_before_its_entries_are_drained():
    """A new pool's id is known only after the capture (``CUDAGraph.pool()`` refuses before): the begin, on the
    captured stream, is written after ``capture_end`` and before the drain that writes the capture's entries
    (they stay in the allocator's history until then); the end after that drain; the release at reset."""
    hooks, rec, log = _hooks()
    g = rec.torch.cuda.CUDAGraph()
    g.capture_begin()
    g.capture_end()
    g.replay()
    g.reset()
    g.reset()                           # a second reset holds no pool: nothing recorded
    bits = ev.pool_id_bits((g._pool[0], 0))
    assert log.items == [
        ("drain",), ("capture_begin", g._pool), ("drain",), ("capture_end",),
        ("POOL_BEGIN", 1, ev.POOL_CAPTURE, 0x77, bits),
        ("drain",), ("POOL_END", 1, 0, 0, bits),
        ("drain",), ("GRAPH_REPLAY", 1, 0, 0, bits), ("replay",),
        ("drain",), ("POOL_RELEASE", 1, 0, 0, bits), ("reset",), ("reset",)]
    assert hooks.errors == 0


def test_a_capture_into_a_named_pool_is_begun_at_once():
    hooks, rec, log = _hooks()
    g = rec.torch.cuda.CUDAGraph()
    g.capture_begin(pool=(0, 9))        # a MemPool's id, or graph_pool_handle()'s
    # capture_begin's own allocations (the RNG's seed and offset, default pools) are drained before the begin
    assert [x[0] for x in log.items] == ["drain", "capture_begin", "drain", "POOL_BEGIN"]
    mempool = rec.torch.cuda.MemPool()
    g2 = rec.torch.cuda.CUDAGraph()
    g2.capture_begin(mempool)
    assert log.items[-1][:3] == ("POOL_BEGIN", hooks.numbers[mempool.id], ev.POOL_CAPTURE)


def test_a_failing_hook_never_breaks_the_program():
    """A hook's own error is noted and the wrapped call still runs, once."""
    hooks, rec, log = _hooks()
    notes = []
    rec.note = notes.append
    rec.drain = lambda: 1 / 0
    g = rec.torch.cuda.CUDAGraph()
    g.capture_begin()
    g.capture_end()
    assert [x for x in log.items if x[0] in ("capture_begin", "capture_end")] == [("capture_begin", g._pool),
                                                                                 ("capture_end",)]
    assert hooks.errors >= 1 and "ZeroDivisionError" in notes[0]


def test_graphs_sharing_a_pool_share_its_number_and_a_deleted_graph_releases_it():
    hooks, rec, log = _hooks()
    a, b = rec.torch.cuda.CUDAGraph(), rec.torch.cuda.CUDAGraph()
    a.capture_begin()
    a.capture_end()
    b.capture_begin(pool=a.pool())
    b.capture_end()
    c = rec.torch.cuda.CUDAGraph()
    c.capture_begin()
    c.capture_end()
    log.items.clear()
    del b                               # no reset: the graph's deletion releases its pool
    assert [x[:2] for x in log.items if x[0].startswith("POOL")] == [("POOL_RELEASE", 1)]
    assert hooks.numbers == {(a.pool()[0], 0): 1, (c.pool()[0], 0): 2}


def test_mempool_and_use_mem_pool_calls():
    hooks, rec, log = _hooks()
    torch = rec.torch
    p = torch.cuda.MemPool()
    torch.cuda.memory._cuda_beginAllocateCurrentThreadToPool(0, p.id)
    torch.cuda.memory._cuda_endAllocateToPool(0, p.id)
    torch.cuda.memory._cuda_releasePool(0, p.id)
    torch._C._cuda_beginAllocateCurrentStreamToPool(0, p.id)
    torch._C._cuda_beginAllocateCurrentStreamToPool(1, p.id)        # another device: passed on, not recorded
    torch._C._cuda_setCheckpointPoolState(0, "a state never taken")    # counted and marked only
    del p
    events = [x[:4] for x in log.items if x[0] in ev.KINDS_BY_NAME]
    assert events == [("POOL_RETAIN", 1, 0, 0), ("POOL_BEGIN", 1, ev.POOL_ANY_STREAM, 0),
                      ("POOL_END", 1, 0, 0), ("POOL_RELEASE", 1, 0, 0), ("POOL_BEGIN", 1, 0, 0x77),
                      ("POOL_RELEASE", 1, ev.POOL_EMPTY, 0)]
    assert ("_cuda_beginAllocateCurrentStreamToPool", 1, (0, 1)) in log.items
    assert hooks.checkpoints == 1 and ("mark", "pool checkpoint restored (1)") in log.items
    # the release is recorded before the call (its segment frees follow it), the end after (its entries precede)
    order = [x[0] for x in log.items]
    assert order.index("_cuda_releasePool") == order.index("POOL_RELEASE") + 1
    assert order.index("POOL_END") > order.index("_cuda_endAllocateToPool")


def test_remove_puts_every_original_back():
    hooks, rec, log = _hooks()
    torch = rec.torch
    wrapped = torch._C._cuda_releasePool
    hooks.remove()
    assert torch._C._cuda_releasePool is not wrapped and torch.cuda.memory._cuda_releasePool is torch._C._cuda_releasePool
    assert "capture_begin" in vars(torch.cuda.CUDAGraph) and not hasattr(torch.cuda.CUDAGraph.capture_begin, "__wrapped__")
    log.items.clear()
    torch.cuda.MemPool()
    assert log.items == [("MemPool",)]


def test_nothing_is_recorded_once_the_trace_is_closed():
    hooks, rec, log = _hooks()
    p = rec.torch.cuda.MemPool()
    rec.writer = None
    log.items.clear()
    del p
    assert log.items == []


# ---- a real program (GPU) ------------------------------------------------------------------------
POOLS_SCRIPT = """
    import gc
    import torch
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.randn(1 << 20, device="cuda")          # 4 MiB: the pool's large blocks
        s = torch.randn(1000, device="cuda")             # the pool's small blocks
    b = torch.randn(1 << 20, device="cuda")              # the default pool
    del a
    with torch.cuda.use_mem_pool(pool):
        c = torch.randn(1 << 19, device="cuda")          # reuses a's block
    x = torch.zeros(256, 256, device="cuda")
    warm = x @ x + 1                                     # cuBLAS is set up outside the capture
    del warm
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x @ x + 1
    g.replay(); g.replay()
    del g, y, c, s
    gc.collect()                                         # the graph is gone here, not at exit
    del pool
    gc.collect()
    torch.cuda.empty_cache()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("torch"), reason="needs torch with a CUDA GPU")
def test_a_recorded_program_with_pools_has_their_events_and_replays_exactly(tmp_path):
    from allocsim.search.validate import validate
    t, stats, out = _recorded(tmp_path, "pools.py", POOLS_SCRIPT)
    _check_torch(t, stats["memory_stats"])
    n = {name: int((t.kind == k).sum()) for k, name in ev.KIND_NAMES.items()}
    assert (n["POOL_RETAIN"], n["POOL_BEGIN"], n["POOL_END"], n["GRAPH_REPLAY"]) == (1, 3, 3, 2)
    assert n["POOL_RELEASE"] == 4          # two use_mem_pool exits, the graph, the MemPool (with POOL_EMPTY)
    assert stats["private_pools"]["pools"] == 2
    v = validate(out)
    assert v.match, v.checks


def test_an_event_met_inside_a_drain_is_written_after_it():
    """A MemPool's finalizer run by a collection inside a drain: no nested drain (it would feed the same entries
    twice); the release is written once the running drain has written its entries."""
    hooks, rec, log = _hooks()
    p = rec.torch.cuda.MemPool()
    log.items.clear()
    rec.draining = True
    del p
    assert log.items == [] and len(hooks.deferred) == 1
    rec.draining = False
    hooks.flush_deferred()
    assert [x[:3] for x in log.items] == [("POOL_RELEASE", 1, ev.POOL_EMPTY)]


def test_a_restored_checkpoint_is_made_inside_its_pool():
    """`_cuda_setCheckpointPoolState` re-makes the pool's blocks in the pool: its entries (drained before the
    end) lie between a begin (every stream) and an end of the pool the state was taken of, and the begin's user
    is taken back."""
    hooks, rec, log = _hooks()
    torch = rec.torch
    state = torch._C._cuda_getCheckpointState(0, (5, 0))
    log.items.clear()
    torch._C._cuda_setCheckpointPoolState(0, state, [], [])
    assert [x[:3] for x in log.items if x[0] not in ("drain",)] == [
        ("mark", "pool checkpoint restored (1)"), ("POOL_BEGIN", 1, ev.POOL_ANY_STREAM),
        ("_cuda_setCheckpointPoolState", 0, state), ("POOL_END", 1, 0), ("POOL_RELEASE", 1, 0)]
    assert log.items.index(("drain",), log.items.index(("_cuda_setCheckpointPoolState", 0, state))) \
        < log.items.index(("POOL_END", 1, 0, 0, ev.pool_id_bits((5, 0))))
