"""Record the memory-pressure workloads of issue 11 with `allocsim record`, and prove the recorder changes nothing.

Each PyTorch scenario of `gpu_pressure_snapshots.SCENARIOS` (ResNet-18, batch 96, 8 SGD steps: a memory fraction
that forces retries, one that forces a caught OOM, garbage_collection_threshold and max_split_size_mb under a
fraction, empty_cache every second step, a side stream with record_stream, expandable segments under a
fraction) and the CuPy MLP of `gpu_cupy_pressure.py` (set_limit, free_all_blocks, one OOM) runs twice in its
own process: plainly, and under ``allocsim record -o OUTDIR/pressure-NAME.bin``. Both runs write the
allocator's own figures (torch ``memory_stats()``; the CuPy pool's counters) to ``NAME.plain.json`` and
``NAME.recorded.json``; ``compare.txt`` says, figure by figure, whether they are equal. Fractions are relative
to the peak reserved of a plain run of the ``plain`` scenario, measured first. Four runs at a time.

Usage (on a GPU machine, repo root): python3 benchmarks/gpu_pressure_record.py OUTDIR
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpu_pressure_snapshots import SCENARIOS, train  # noqa: E402

#: The torch figures compared between the plain and the recorded run.
TORCH_FIGURES = ("reserved_bytes.all.peak", "reserved_bytes.all.current", "num_alloc_retries", "num_ooms",
                 "segment.all.allocated", "segment.all.freed", "allocation.all.allocated",
                 "active_bytes.all.peak", "requested_bytes.all.peak", "num_device_alloc", "num_device_free")
CUPY_FIGURES = ("peak_total_bytes_after_steps", "total_bytes", "used_bytes", "ooms", "limit")


def one(name, peak, figures):
    """The program: train scenario ``name`` and write the allocator's figures to ``figures``."""
    import torch
    fraction, ooms = train(name, peak)
    ms = torch.cuda.memory_stats()
    with open(figures, "w") as f:
        json.dump({"fraction": fraction, "ooms_caught": ooms, **{k: ms.get(k) for k in TORCH_FIGURES}}, f, indent=1)


def runs(outdir, name, peak, record=True):
    """The plain and (``record``) the recorded run of one scenario: (name, plain figures, recorded figures, log)."""
    conf = SCENARIOS[name][0] if name in SCENARIOS else ""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if name in SCENARIOS:
        program = [os.path.join(HERE, "gpu_pressure_record.py"), "--one", name, str(peak)]
        fw = "torch"
    else:
        program = [os.path.join(HERE, "gpu_cupy_pressure.py")]
        fw = "cupy"
    plain, recorded = (os.path.join(outdir, f"{name}.{k}.json") for k in ("plain", "recorded"))
    log = []
    both = ((plain, []), (recorded, ["-m", "allocsim", "record", "--framework", fw, "-o",
                                     os.path.join(outdir, f"pressure-{name}.bin")]))
    for figures, prefix in both[:2 if record else 1]:
        r = subprocess.run([sys.executable, *prefix, *program, figures], env=env, capture_output=True, text=True)
        what = "recorded" if prefix else "plain"
        log.append(f"== {name} {what}: rc {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    load = lambda p: json.load(open(p)) if os.path.exists(p) else {}   # noqa: E731
    return name, load(plain), load(recorded), "\n".join(log)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    _, base, _, log = runs(outdir, "plain", 0, record=False)
    peak = base["reserved_bytes.all.peak"]
    names = [n for n in SCENARIOS if n != "plain"] + ["cupy-limit"]
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda n: runs(outdir, n, peak), names))
    lines = [f"plain peak reserved {peak}"]
    for name, plain, recorded, run_log in results:
        log += "\n" + run_log
        keys = TORCH_FIGURES if name in SCENARIOS else CUPY_FIGURES
        same = all(plain.get(k) == recorded.get(k) for k in keys) and bool(plain)
        lines.append(f"{name}: {'SAME' if same else 'DIFFERENT'}")
        lines += [f"  {k:<30} {plain.get(k)!s:>14} {recorded.get(k)!s:>14}" for k in keys]
    with open(os.path.join(outdir, "runs.log"), "w") as f:
        f.write(log)
    with open(os.path.join(outdir, "compare.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        one(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main(sys.argv[1])
