"""Record PyTorch memory snapshots of training under memory pressure (raw material for issue 11).

Each scenario runs in its own process (the allocator reads PYTORCH_CUDA_ALLOC_CONF once) and trains a
small ResNet-18 for a few steps under one kind of pressure: a memory fraction that forces retries, one
that forces an OOM (caught; the snapshot is taken in the handler, then training goes on with half the
batch), garbage_collection_threshold and max_split_size_mb under a fraction, empty_cache every two steps,
a side stream with record_stream, expandable segments under a fraction. It writes, per scenario,
NAME.pickle (torch.cuda.memory._dump_snapshot, no stacks) and NAME.stats.json (memory_stats and the
settings used).

Usage (on a GPU machine): python3 benchmarks/gpu_pressure_snapshots.py OUTDIR
"""
import json
import os
import subprocess
import sys

SCENARIOS = {
    # name: (PYTORCH_CUDA_ALLOC_CONF, fraction of the unconstrained peak reserved or None, extra)
    "plain": ("", None, ""),
    "fraction-retry": ("", 0.93, ""),
    "fraction-oom": ("", 0.55, ""),
    "gc-threshold": ("garbage_collection_threshold:0.6", 0.95, ""),
    "maxsplit-cap": ("max_split_size_mb:64", 0.9, ""),
    "empty-cache": ("", None, "empty_cache"),
    "side-stream": ("", None, "side_stream"),
    "expandable-cap": ("expandable_segments:True", 0.7, ""),
}


def train(name, peak, after_setup=lambda: None):
    """Train ResNet-18 under scenario ``name`` (fractions relative to ``peak``); return the fraction and OOMs caught.

    ``after_setup`` runs once the fraction is set, before the model is built (the snapshot starts there).
    """
    import torch
    import torchvision
    conf, frac, extra = SCENARIOS[name]
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = None
    if frac is not None:
        fraction = frac * peak / total
        torch.cuda.set_per_process_memory_fraction(fraction)
    after_setup()
    model = torchvision.models.resnet18().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    side = torch.cuda.Stream() if extra == "side_stream" else None
    batch, ooms, steps = 96, [], 8
    for step in range(steps):
        try:
            x = torch.randn(batch, 3, 224, 224, device="cuda")
            y = torch.randint(0, 1000, (batch,), device="cuda")
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if side is not None:            # a copy made on a side stream, consumed on the main one
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    z = torch.empty(batch * 3 * 224 * 224, device="cuda")
                    z.copy_(x.flatten())
                z.record_stream(torch.cuda.current_stream())
                torch.cuda.current_stream().wait_stream(side)
                w = z * 2
                del z, w
            del x, y, loss
        except torch.cuda.OutOfMemoryError as e:
            ooms.append({"step": step, "batch": batch, "message": str(e).splitlines()[0]})
            x = y = loss = None
            opt.zero_grad(set_to_none=True)
            batch //= 2
        if extra == "empty_cache" and step % 2 == 1:
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return fraction, ooms


def scenario(outdir, name, peak):
    import torch
    conf, frac, extra = SCENARIOS[name]
    total = torch.cuda.get_device_properties(0).total_memory
    fraction, ooms = train(name, peak, lambda: torch.cuda.memory._record_memory_history(
        max_entries=2_000_000, context=None, stacks="python"))
    torch.cuda.memory._dump_snapshot(os.path.join(outdir, f"{name}.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = {"scenario": name, "alloc_conf": conf, "fraction": fraction, "fraction_of_peak": frac,
             "extra": extra, "total_memory": total, "unconstrained_peak_reserved": peak, "ooms": ooms,
             "memory_stats": {k: v for k, v in torch.cuda.memory_stats().items()},
             "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    with open(os.path.join(outdir, f"{name}.stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(name, "peak reserved", stats["memory_stats"]["reserved_bytes.all.peak"], "retries",
          stats["memory_stats"]["num_alloc_retries"], "ooms", stats["memory_stats"]["num_ooms"], flush=True)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    me = os.path.abspath(__file__)
    subprocess.run([sys.executable, me, "--one", outdir, "plain", "0"], check=True)
    with open(os.path.join(outdir, "plain.stats.json")) as f:
        peak = json.load(f)["memory_stats"]["reserved_bytes.all.peak"]
    for name, (conf, _, _) in SCENARIOS.items():
        if name == "plain":
            continue
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None) if not conf else None
        r = subprocess.run([sys.executable, me, "--one", outdir, name, str(peak)], env=env)
        if r.returncode:
            print(name, "failed with status", r.returncode, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        scenario(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main(sys.argv[1])
