"""`allocsim record`: run a training script under a recorder and write its allocation trace."""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from ..errors import UsageError
from ..outputs import add_force_argument, claim_outputs
from ._command import Command
from ._common import count
from ._parser import Parser

COMMAND = Command(
    name="record",
    help="run a PyTorch or CuPy training script and record its GPU allocation trace",
    example="allocsim record -o traces/resnet50.bin examples/resnet50_train.py --iters 8")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("-o", "--output", metavar="TRACE", help="trace file to write (default: <script name>.bin)")
    add_force_argument(p)
    p.add_argument("--framework", default="auto", choices=["auto", "torch", "cupy"],
                   help="recorder to use; auto reads the script's imports")
    p.add_argument("--stacks", action="store_const", const="python",
                   help="torch: keep Python stacks of allocations (call sites; slower); --stacks all (or "
                        "--stacks=all): C++ frames too, which flag the requests PyTorch survives failing "
                        "(docs/allocator-dependent.md)")
    p.add_argument("--stacks=all", dest="stacks", action="store_const", const="all", help=argparse.SUPPRESS)
    p.add_argument("--stacks=python", dest="stacks", action="store_const", const="python", help=argparse.SUPPRESS)
    p.add_argument("--max-events", type=count(1), metavar="N",
                   help="torch: ring-buffer entries per drain (default 1000000; drained every optimizer step)")
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                   help="run a module as `python -m MODULE args` would (the rest of the line is its arguments)")
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="script.py [args ...]",
                   help="the script and its arguments, as you would pass them to python; or a program of several "
                        "processes (-- torchrun --nproc-per-node 2 train.py, -- accelerate launch train.py, -- python "
                        "spawns.py): one trace per process that uses CUDA, OUT.rank<R>.bin")


def parse_target(args):
    """``(Target, default output name)`` from the parsed arguments."""
    from ..formats.recorders import Target
    stacks_choice(args)
    target = list(args.target or [])
    if target and target[0] == "--":
        target = target[1:]
    if args.module is not None:
        if not args.module or not args.module[0]:      # -m "": no module either
            raise UsageError("-m needs a module name")
        if target:
            raise UsageError("give either a script or -m MODULE, not both")
        t = Target(module=args.module[0], args=args.module[1:])
        return t, args.module[0].rsplit(".", 1)[-1] + ".bin"
    if not target or not target[0]:         # `record -- ""`: an empty name is no script either
        raise UsageError("no script given (allocsim record [options] train.py [args ...])")
    return Target(script=target[0], args=target[1:]), os.path.splitext(os.path.basename(target[0]))[0] + ".bin"


def _named_files(program_args) -> list[str]:
    """Existing files the program's arguments name (``data.bin``, ``--resume=run.bin``): likely its inputs."""
    values = [a.partition("=")[2] if a.startswith("-") else a for a in program_args]
    return [v for v in values if v and os.path.isfile(v)]


def own_options_after_target(program_args) -> list[str]:
    """allocsim record's own output options found among the program's arguments (``train.py -o run.bin``):
    everything after the script is the script's, so they go to it and the trace gets the default name."""
    return [a for a in program_args if a in ("-o", "--force") or a.startswith("--output")]


def program_argv(args) -> list[str] | None:
    """The command line of a program whose processes are recorded one by one (docs/several-processes.md): a
    launcher or any other program (`_is_program`: ``torchrun ...``, ``accelerate launch ...``, ``python -m
    torch.distributed.run ...``, ``bash run.sh``), or ``-m`` with a launcher module (`LAUNCHER_MODULES`); None for a
    Python script or module run inside allocsim, as before."""
    from ..formats.recorders.processes import LAUNCHER_MODULES
    if args.module:
        return [sys.executable, "-m", *args.module] if args.module[0] in LAUNCHER_MODULES else None
    target = list(args.target or [])
    if target and target[0] == "--":
        target = target[1:]
    if not target or not _is_program(target[0]):
        return None
    return [_beside_python(target[0]) or target[0], *target[1:]]


def _beside_python(name: str) -> str | None:
    """``name`` as a command installed beside this Python (a virtual environment's ``bin/``, where ``torchrun`` and
    ``accelerate`` are when it is not activated), when PATH has no command of that name; else None."""
    if os.sep in name or os.path.exists(name) or shutil.which(name) is not None:
        return None
    return shutil.which(name, path=os.path.dirname(sys.executable))


def _is_program(name: str) -> bool:
    """A program to start, not a Python script to run inside allocsim: a command on PATH (or beside this Python)
    with no file of that name here, an executable file that is a binary (ELF) or a script for another interpreter
    (``#!/bin/bash``), or a launcher's own script (`LAUNCHER_PROGRAMS`: ``venv/bin/torchrun``, a Python script whose
    work is done by the processes it starts)."""
    from ..formats.recorders.processes import LAUNCHER_PROGRAMS
    if not os.path.exists(name):
        return shutil.which(name) is not None or _beside_python(name) is not None
    if name.endswith(".py") or not os.path.isfile(name) or not os.access(name, os.X_OK):
        return False
    if os.path.basename(name) in LAUNCHER_PROGRAMS:
        return True
    with open(name, "rb") as f:
        head = f.readline(256)
    return head.startswith(b"\x7fELF") or (head.startswith(b"#!") and b"python" not in head)


def run_program(args, argv: list[str]) -> int:
    from ..formats.recorders.processes import default_output, record_program
    if args.framework == "cupy":
        raise UsageError(f"{argv[0]}: recording each process of a program is for PyTorch (--framework torch)")
    return record_program(argv, default_output(argv) if args.output is None else args.output, force=args.force,
                          stacks=args.stacks, max_events=args.max_events)


def stacks_choice(args) -> None:
    """``--stacks all``: argparse read ``all`` as the start of the program (``--stacks`` alone keeps Python
    stacks, as before, so that ``--stacks train.py`` still names the script); take it back when a script or
    ``-m`` follows it, and read allocsim's own options between it and the script."""
    target = args.target or []
    if args.stacks != "python" or not target or target[0] not in ("all", "python"):
        return
    p = Parser(prog="allocsim record")
    add_arguments(p)
    rest = p.parse_args(target[1:])
    for name, value in vars(rest).items():
        if value != p.get_default(name) and name != "stacks":
            setattr(args, name, value)
    args.stacks = target[0]
    if args.module is None and not args.target:
        raise UsageError(f"--stacks {target[0]} needs the script after it (allocsim record --stacks "
                         f"{target[0]} train.py ...)")


@COMMAND.runs
def run(args) -> int:
    from ..formats.recorders import record
    stacks_choice(args)
    torch_only = [o for o, v in (("--stacks", args.stacks), ("--max-events", args.max_events)) if v is not None]
    if args.framework == "cupy" and torch_only:     # (CuPy's recorder took them and did nothing with them)
        raise UsageError(f"{' and '.join(torch_only)}: for PyTorch's recorder, not --framework cupy")
    argv = program_argv(args)
    if argv is not None:
        return run_program(args, argv)
    target, default_out = parse_target(args)
    out = default_out if args.output is None else args.output    # (-o "": refused by its name, not the default)
    misplaced = own_options_after_target(target.args)
    if misplaced and args.output is None:
        print(f"allocsim record: note: {' '.join(misplaced)} after the script goes to the script; allocsim's own "
              f"options go before it (allocsim record -o run.bin train.py ...); writing {out}", file=sys.stderr)
    claim_outputs([("-o", out), ("-o", f"{out}.stats.json")], [target.source_path(), *_named_files(target.args)],
                  force=args.force)
    status, _ = record(target, out, args.framework, stacks=args.stacks,
                       max_events=args.max_events)
    return status
