"""`allocsim policies`: the registered policies and their options, from their declarations."""
from __future__ import annotations

import sys

from .. import policies
from ..errors import UsageError
from ._command import Command

COMMAND = Command(
    name="policies",
    help="list allocator policies and their options",
    example="allocsim policies split")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("name", nargs="?", metavar="policy", help="show one policy's options (a plug-in too: file.py:Class)")


@COMMAND.runs
def run(args) -> int:
    from ..engine.spec import ENTRY_POINT_GROUP, PolicySpec, entry_points
    one = args.name is not None             # "" is one (bad) name, not "list them all"
    installed = {} if one else entry_points()
    shadowed = sorted(set(installed) & set(policies.names()))
    names = [args.name] if one else policies.names() + sorted(set(installed) - set(shadowed))
    for n in shadowed:      # -p NAME is the built-in: say so once, not list the built-in twice
        print(f"allocsim: note: the installed entry point {n} ({installed[n].value}) has a built-in policy's name; "
              f"-p {n} is the built-in", file=sys.stderr)
    broken = 0
    for n in names:
        try:
            cls = PolicySpec.parse(n).policy_class()
        except UsageError as e:
            if one:
                raise
            broken += 1     # one broken installed package must not hide every other policy
            print(f"allocsim: {e} (an installed entry point of {ENTRY_POINT_GROUP}; listed without it)",
                  file=sys.stderr)
            continue
        ref = f"  [reference model of {cls.reference_of}]" if cls.reference_of else ""
        print(f"{n:<12} {cls.summary}{ref}")        # (the name -p takes: an entry point's, not its class's name)
        if one:
            if cls.models:
                print(f"  models: {cls.models}")
            for p in cls.params:
                kind = "|".join(p.kind) if isinstance(p.kind, tuple) else p.kind
                print(f"  --policy-opt {p.name}=<{kind}>  (default {p.default})  {p.help}")
    return 2 if broken else 0
