"""`allocsim validate`: does the allocator model reproduce what the recorded allocator did?

Exit status 0 when every check matches, 1 on a mismatch (the first diverging
segment event is printed), 2 on bad input.
"""
from __future__ import annotations

from ..report.tables import dump_json
from ..report.text import validation_summary
from ..errors import UsageError
from ..search.validate import validate, validate_warm
from ._command import Command
from ._common import capacity_arg, load_trace, option_text
from ._ranks import each_rank

COMMAND = Command(
    name="validate",
    help="replay a trace with its recorder's allocator model and compare segment calls",
    example="allocsim validate traces/resnet50.bin --json")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("trace", nargs="+", help="trace file (.bin) recorded under torch or cupy; several, or a run's name "
                                            "(run.bin for run.rank0.bin, run.rank1.bin, ...): each rank")
    p.add_argument("--capacity", default="trace",
                   help="device memory, e.g. 80GB; default: the recorded device's, else unlimited")
    p.add_argument("--policy-opt", "-O", action="append", default=[], metavar="KEY=VALUE", type=option_text,
                   help="override a recorded allocator setting (repeatable)")
    p.add_argument("--warm-cache", metavar="WARM", help="check the prediction of a later run with warm compile caches "
                   "(replay/compare/tune --warm-cache) from the trace, a recording of a first run, against WARM, a "
                   "recording of that later run: the requests, segment calls, reserved bytes and OOMs "
                   "(docs/compile.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


@COMMAND.runs
def run(args) -> int:
    if args.warm_cache is not None and len(args.trace) > 1:
        raise UsageError(f"--warm-cache {args.warm_cache}: give one trace, the recording of the first run it follows")
    return each_rank(args, run_one)


def run_one(args) -> int:
    if args.warm_cache is not None:
        v = validate_warm(load_trace(args.trace), load_trace(args.warm_cache), options=args.policy_opt,
                          capacity=capacity_arg(args.capacity))
    else:
        v = validate(load_trace(args.trace), options=args.policy_opt, capacity=capacity_arg(args.capacity))
    if args.json:
        dump_json(v.to_dict())
    else:
        print(validation_summary(v))
    return 0 if v.match else 1
