"""Programs whose allocations go to PyTorch private pools: CUDA graphs, torch.compile's graph trees, MemPool.

Three workloads (``--workload``), each small and quick:

- ``compile``: a small MLP trained a few steps with ``torch.compile(mode="reduce-overhead")`` (CUDA graph
  trees: warm-up runs in the trees' pool, then the forward and backward graphs captured into it);
- ``capture``: inference with ``torch.cuda.graph``, one graph per batch size, all sharing one pool
  (``pool=``), replayed on a random batch size per step; then the graphs are deleted and the cache emptied,
  and one more graph with a pool of its own is captured, replayed, reset and its memory released;
- ``mempool``: ``torch.cuda.MemPool`` and ``use_mem_pool`` directly: tensors made inside and outside the
  pool, freed inside and after, a pool entered twice, and the pools deleted (their segments go with them).

``--snapshot PATH`` records the allocator's history from the start and dumps a memory snapshot at the end
(for ``allocsim import``), and for ``capture`` and ``mempool`` one more (``PATH`` with ``-mid`` before its
suffix) before the pools are released, while their segments, which name their pool, are still there; leave
it out under ``allocsim record``, which records the history itself.
"""
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import mark, parser  # noqa: E402


def mlp(width: int, depth: int, dev) -> torch.nn.Module:
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)]
    return torch.nn.Sequential(*layers).to(dev)


def snapshot_now(a, tag: str) -> None:
    """With ``--snapshot``: a snapshot now, beside the final one (``PATH-TAG.pickle``)."""
    if a.snapshot:
        root, ext = os.path.splitext(a.snapshot)
        torch.cuda.memory._dump_snapshot(f"{root}-{tag}{ext or '.pickle'}")


def compiled_training(a, dev) -> None:
    model = mlp(a.width, 2, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_model = torch.compile(model, mode="reduce-overhead")
    for i in range(a.iters):
        x = torch.randn(a.batch, a.width, device=dev)
        y = torch.randn(a.batch, a.width, device=dev)
        torch.compiler.cudagraph_mark_step_begin()
        loss = torch.nn.functional.mse_loss(step_model(x), y)
        loss.backward()
        opt.step()                     # a MARK per step under allocsim record
        opt.zero_grad(set_to_none=True)
        print(f"step {i}: loss {loss.item():.4f}", flush=True)


def captured_inference(a, dev) -> None:
    model = mlp(a.width, 2, dev).eval()
    sizes = sorted({max(1, a.batch >> k) for k in range(4)}, reverse=True)     # largest first: the pool is reused
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                 # warm-up off the capture, as torch.cuda.graph's docs ask
            for n in sizes:
                model(torch.randn(n, a.width, device=dev))
        torch.cuda.current_stream().wait_stream(side)
        for n in sizes:
            static_in = torch.zeros(n, a.width, device=dev)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                static_out = model(static_in)
            graphs[n] = (g, static_in, static_out)
        mark("captured")
        gen = torch.Generator().manual_seed(a.seed)
        total = 0.0
        for i in range(a.iters):
            n = sizes[int(torch.randint(len(sizes), (1,), generator=gen))]
            g, static_in, static_out = graphs[n]
            static_in.copy_(torch.randn(n, a.width, device=dev))
            g.replay()
            total += float(static_out.sum())          # an eager allocation beside the graphs' pool
        print(f"{a.iters} replays over batch sizes {sizes}: checksum {total:.3f}", flush=True)
        mark("replayed")
        snapshot_now(a, "mid")
        del g, static_in, static_out
        graphs.clear()                                # every graph of the shared pool gone: it may be freed
        gc.collect()
        torch.cuda.empty_cache()
        mark("shared pool released")
        static_in = torch.zeros(a.batch, a.width, device=dev)
        own = torch.cuda.CUDAGraph()
        with torch.cuda.graph(own):                   # a pool of its own
            static_out = model(static_in)
        own.replay()
        kept = static_out.clone()
        own.reset()                                   # the pool released; its output tensor still holds a block
        torch.cuda.empty_cache()                      # that segment stays
        del static_out
        torch.cuda.empty_cache()                      # now it goes
        print(f"own-pool graph: output norm {float(kept.norm()):.3f}", flush=True)


def mempool_direct(a, dev) -> None:
    w = a.width
    pool = torch.cuda.MemPool()
    keep_default = torch.randn(a.batch, w, device=dev)
    with torch.cuda.use_mem_pool(pool):
        inside = [torch.randn(a.batch * k, w, device=dev) for k in (1, 2, 4)]
        small = [torch.randn(64, device=dev) for _ in range(8)]
        scratch = torch.randn(a.batch * 8, w, device=dev)
        del scratch                                   # freed inside: back to the pool's own blocks
        again = torch.randn(a.batch * 3, w, device=dev)   # best fit in the pool's blocks
    outside = torch.randn(a.batch * 3, w, device=dev)     # the default pool: a segment of its own
    del inside[1]                                     # freed outside the context: still into the pool
    with torch.cuda.use_mem_pool(pool):               # entered again: the freed block is reused
        reuse = torch.randn(a.batch * 2, w, device=dev)
    mark("first pool used twice")
    snapshot_now(a, "mid")
    torch.cuda.empty_cache()                          # the pool has a user (the MemPool): its segments stay
    second = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(second):
        b = [torch.randn(a.batch * k, w, device=dev) for k in (5, 1)]
    del b
    del second                                        # deleted with nothing live: its segments are freed now
    gc.collect()
    mark("second pool deleted")
    checksum = float(sum(t.sum() for t in (*inside, *small, again, outside, reuse, keep_default)))
    del inside, small, again, reuse
    del pool                                          # the first pool deleted: its segments go too
    gc.collect()
    torch.cuda.empty_cache()
    print(f"mempool checksum {checksum:.3f}", flush=True)


WORKLOADS = {"compile": compiled_training, "capture": captured_inference, "mempool": mempool_direct}


def main():
    p = parser(__doc__, iters=6, batch=64)
    p.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    p.add_argument("--width", type=int, default=512, help="model width (default 512)")
    p.add_argument("--snapshot", help="record the allocator's history and dump a memory snapshot here at the end")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    dev = torch.device("cuda")
    if a.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    WORKLOADS[a.workload](a, dev)
    torch.cuda.synchronize()
    if a.snapshot:
        torch.cuda.memory._dump_snapshot(a.snapshot)
        print(f"wrote {a.snapshot}", flush=True)


if __name__ == "__main__":
    main()
