"""`allocsim synth`: write a synthetic training-workload trace (see `allocsim.formats.synth`)."""
from __future__ import annotations

from ..formats import synth
from ..errors import InputError, UsageError
from ..outputs import add_force_argument, atomic_path, claim_outputs
from ..units import fmt_bytes, fmt_count
from ._command import Command
from ._common import count, load_trace, progress_bar, real_number

COMMAND = Command(
    name="synth",
    help="generate a synthetic training-workload trace (mlp, cnn, transformer, alloc-heavy)",
    example=("allocsim synth transformer -o traces/gpt.bin --iterations 20 --variable --param batch=4\n"
             "  allocsim synth alloc-heavy -o traces/heavy.bin --param n_allocs=200000\n"
             "  allocsim synth --list"))


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("preset", nargs="?", help=f"workload preset: {', '.join(synth.PRESETS)}")
    p.add_argument("-o", "--output", help="output trace file (.bin), written atomically")
    add_force_argument(p)
    p.add_argument("--seed", type=count(0), default=0, help="random seed (same seed, same bytes); default 0")
    p.add_argument("--iterations", "-n", type=count(1), help="training iterations (one MARK each); default per preset")
    p.add_argument("--scale", type=real_number, default=1.0, help="multiply every requested size by X; default 1")
    p.add_argument("--variable", action="store_true",
                   help="redraw the batch / image size / sequence length every iteration")
    p.add_argument("--param", "-P", action="append", default=[], metavar="KEY=VALUE",
                   help="preset parameter (repeatable; see --list)")
    p.add_argument("--list", action="store_true", help="list the presets and their parameters")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress timer")


def _params(items) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param {item!r}: expected KEY=VALUE")
        if key.strip() in out:
            raise UsageError(f"--param {key.strip()} is given twice")
        out[key.strip()] = value.strip()
    return out


def _listing() -> str:
    lines = []
    for pr in synth.PRESETS.values():
        lines.append(f"{pr.name}: {pr.summary} (default iterations {pr.iterations})")
        lines += [f"    {p.name:<12} {str(p.default):<10} {p.help}" for p in pr.params]
    return "\n".join(lines)


@COMMAND.runs
def run(args) -> int:
    if args.list:
        print(_listing())
        return 0
    if not args.preset:
        raise UsageError(f"synth: name a preset ({', '.join(synth.PRESETS)}) or use --list")
    if not args.output:
        raise UsageError("synth: -o/--output FILE is required")
    params = _params(args.param)
    claim_outputs([("-o", args.output)], force=args.force)
    _, close = progress_bar(None, f"synth {args.preset}", args.quiet, unit=None)
    try:
        with atomic_path(args.output) as tmp:
            synth.generate(args.preset, seed=args.seed, iterations=args.iterations, scale=args.scale,
                           variable=args.variable, path=tmp, **params)
    except OSError as e:
        raise InputError(f"cannot write the trace ({e.strerror or e})", path=args.output) from None
    finally:
        close()
    t = load_trace(args.output, args.quiet)
    print(f"{args.output}: {args.preset}, {fmt_count(len(t))} events, {fmt_count(t.n_allocs)} allocs, "
          f"{len(t.marks())} iterations, LOAD {fmt_bytes(t.load_bytes)}")
    return 0
