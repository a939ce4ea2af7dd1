"""Data-parallel training of a small transformer over several processes, for recording one trace per rank.

Run it under torchrun (``allocsim record -o run.bin -- torchrun --standalone --nproc-per-node 2
examples/dist_train.py --backend gloo``). DDP (``--mode ddp``) or FSDP2 (``--mode fsdp``:
``torch.distributed.fsdp.fully_shard`` on each block, then the model); ``--backend gloo`` lets two ranks share one
GPU. The model is GPT-2 from transformers with random weights (``--model gpt2``) or a hand-written pre-norm
transformer (``--model tiny``, no transformers needed). Rank 0 keeps what real runs keep on their first rank: a
copy of the loss history on the GPU and an evaluation pass every few steps, so the ranks' peaks differ.

``--fraction F`` calls ``torch.cuda.set_per_process_memory_fraction(F)`` on the ranks named by ``--fraction-ranks``
(default: the last rank); ``--oom-probe GiB`` (or ``over``: 1 GiB over what the fraction allows) makes every rank try
one buffer of that size at step 2 (an eval cache) and catch the OOM where the fraction forbids it, so one rank
survives an OOM while the others go on.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import mark, print_memory_stats  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        n = x.shape[1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Tiny(nn.Module):
    """A pre-norm decoder: embedding, blocks, head (``.blocks`` is what FSDP shards one by one)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def build(args, vocab: int):
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=vocab, n_positions=args.seq, n_embd=args.dim, n_layer=args.layers,
                         n_head=args.heads)
        model = GPT2LMHeadModel(cfg)
        return model, list(model.transformer.h), (lambda m, ids: m(ids).logits)
    model = Tiny(vocab, args.dim, args.layers, args.heads, args.seq)
    return model, list(model.blocks), (lambda m, ids: m(ids))


def _cycles_per_s(torch, dev) -> float:
    """The GPU's clock for ``torch.cuda._sleep``, measured: a spin of 10**7 cycles timed with CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(10**7)
    b.record()
    b.synchronize()
    return 10**7 / (a.elapsed_time(b) * 1e-3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="nccl")
    p.add_argument("--model", choices=["gpt2", "tiny"], default="tiny")
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--fraction", type=float, help="set_per_process_memory_fraction on --fraction-ranks")
    p.add_argument("--fraction-ranks", default="last", help="comma-separated ranks, or last (default), or all")
    p.add_argument("--oom-probe", default="0", metavar="GiB",
                   help="every rank tries one buffer of this many GiB at step 2 and catches the OOM; over: 1 GiB "
                        "more than --fraction allows (the ranks with the fraction run out, the others not)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (gloo): a smoke test of the program itself")
    p.add_argument("--memory-stats", action="store_true",
                   help="end with each rank's MEMORY_STATS line (the allocator's counters, to compare runs)")
    # issue 21's experiment on when DDP's first bucket is freed (benchmarks/gpu_defer.sh, examples/_defer_probe.py)
    p.add_argument("--sync-steps", action="store_true", help="torch.cuda.synchronize() after every optimizer step")
    p.add_argument("--gpu-lag-ms", type=float, default=0.0,
                   help="hold the GPU this long (torch.cuda._sleep) before the first backward: the host runs ahead")
    p.add_argument("--probe", metavar="FILE", help="write each step's GPU timeline to FILE.rank<R>.json")
    p.add_argument("--probe-stacks", action="store_true", help="with --probe: the frees of large blocks, with stacks")
    args = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cpu") if args.cpu else torch.device("cuda", local % torch.cuda.device_count())
    if not args.cpu:
        torch.cuda.set_device(dev)
    dist.init_process_group(args.backend, device_id=dev if args.backend == "nccl" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.fraction:
        chosen = (set(range(world)) if args.fraction_ranks == "all" else {world - 1} if args.fraction_ranks == "last"
                  else {int(r) for r in args.fraction_ranks.split(",")})
        if rank in chosen:
            torch.cuda.set_per_process_memory_fraction(args.fraction, dev)
    torch.manual_seed(0)
    model, blocks, logits_of = build(args, args.vocab)
    model.to(dev)
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        train_model = DDP(model, device_ids=None if args.cpu else [dev.index])
    else:
        from torch.distributed.fsdp import fully_shard
        for b in blocks:
            fully_shard(b)
        fully_shard(model)
        train_model = model
    opt = torch.optim.AdamW(train_model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(rank)
    history = torch.zeros(0, device=dev) if rank == 0 else None
    oomed = 0
    if args.oom_probe == "over":
        probe = int((args.fraction or 1.0) * torch.cuda.get_device_properties(dev).total_memory) + 2**30
    else:
        probe = int(float(args.oom_probe) * 2**30)
    probe_ = None
    if args.probe and not args.cpu:
        from _defer_probe import DeferProbe
        probe_ = DeferProbe(torch, dev, rank, args.probe, args.probe_stacks)
    t0 = time.perf_counter()
    for step in range(args.iters):
        if probe_:
            probe_.step_start(step)
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(dev)
        out = logits_of(train_model, ids)
        loss = nn.functional.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]).float(), ids[:, 1:].reshape(-1))
        if step == 0 and args.gpu_lag_ms > 0 and not args.cpu:
            torch.cuda._sleep(int(args.gpu_lag_ms * 1e-3 * _cycles_per_s(torch, dev)))
        loss.backward()
        if probe_:
            probe_.after_backward()
        opt.step()
        if args.sync_steps and not args.cpu:
            torch.cuda.synchronize(dev)
        if probe_:
            probe_.after_step(step)
        opt.zero_grad(set_to_none=True)
        del out
        if rank == 0:                             # the first rank's extra: loss history and an eval pass
            history = torch.cat([history, loss.detach().reshape(1)])
            if step % 3 == 2 and args.mode == "ddp":
                with torch.no_grad():
                    held = torch.randint(0, args.vocab, (2 * args.batch, args.seq), generator=g).to(dev)
                    accuracy = (logits_of(model, held).argmax(-1) == held).float().mean()
                history = torch.cat([history, accuracy.reshape(1)])
                mark(f"eval {step}")
        if step == 2 and probe:
            try:
                torch.empty(probe, dtype=torch.uint8, device=dev).fill_(0)
            except torch.cuda.OutOfMemoryError:
                oomed += 1
                print(f"rank {rank}: caught OOM on a {probe / 2**30:.2f} GiB buffer at step {step}", flush=True)
    if args.cpu:
        print(f"rank {rank}/{world} {args.mode} on the CPU: loss {loss.item():.3f}", flush=True)
        dist.destroy_process_group()
        return 0
    torch.cuda.synchronize()
    if probe_:
        probe_.finish()
    peak = torch.cuda.max_memory_reserved(dev)
    free, total = torch.cuda.mem_get_info(dev)
    print(f"rank {rank}/{world} {args.mode} {args.backend} {args.model}: {args.iters} steps in "
          f"{time.perf_counter() - t0:.1f}s, loss {loss.item():.3f}, peak reserved {peak / 2**30:.3f} GiB, "
          f"device used {(total - free) / 2**30:.3f} GiB, OOMs caught {oomed}", flush=True)
    if args.memory_stats:
        print_memory_stats(torch, f"rank{rank}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
