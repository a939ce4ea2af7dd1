"""`allocsim calibrate`: measure this GPU's cudaMalloc/cudaFree and pool latencies into a cost model."""
from __future__ import annotations

from ..outputs import add_force_argument, claim_outputs
from ..units import fmt_bytes, fmt_seconds
from ._command import Command
from ._common import positive_int

COMMAND = Command(
    name="calibrate",
    help="measure this GPU's device-call and pool latencies; write a cost model for --cost-model",
    example="allocsim calibrate -o costs.json && allocsim replay t.bin --policy split --cost-model costs.json")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("-o", "--output", default="costs.json", help="cost model JSON to write (default costs.json)")
    add_force_argument(p)
    p.add_argument("--reps", type=positive_int, default=20, help="repetitions per size (default 20)")


@COMMAND.runs
def run(args) -> int:
    from ..machine.calibrate import measure
    claim_outputs([("-o", args.output)], force=args.force)     # before minutes of measuring, not after
    model, extra = measure(args.reps)
    model.save(args.output)
    print(f"{extra['device']}:")
    print(f"  {'size':>10} {'cudaMalloc':>11} {'cudaFree':>10}")
    for n, row in extra["table"].items():
        print(f"  {fmt_bytes(int(n)):>10} {fmt_seconds(row['cudaMalloc_s']):>11} {fmt_seconds(row['cudaFree_s']):>10}")
    print(f"  CuPy pool hit (1 MiB) {fmt_seconds(extra['cupy_pool_hit_s'])}"
          + (f", cudaMallocAsync {fmt_seconds(extra['cupy_async_malloc_s'])}" if extra["cupy_async_malloc_s"] else ""))
    sync = extra["free_sync"]
    print(f"  cudaFree's device sync: {fmt_seconds(sync['free_sync_s'])} added to a {fmt_seconds(sync['step_s'])} "
          f"step beyond its idle-device {fmt_seconds(sync['idle_free_s'])} (free_sync_s)")
    print(f"wrote {args.output}")
    return 0
