"""`allocsim import`: turn a PyTorch snapshot, an RMM CSV log or a CuPy hook log into a trace file."""
from __future__ import annotations

import sys

from ..filenames import printable, shown_name
from ..formats.importers import FORMATS, check_device, import_file
from ..outputs import add_force_argument, claim_outputs
from ..units import fmt_count
from ._command import Command
from ._common import count, positive_size

COMMAND = Command(
    name="import",
    help="convert a PyTorch snapshot pickle, an RMM CSV log or a CuPy DebugPrintHook JSONL into a trace",
    example="allocsim import snapshot.pickle -o resnet50.bin --total-memory 80GiB --device-name 'NVIDIA H100'")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("file", help="input: snapshot.pickle, log.csv or hooks.jsonl (format found from the content)")
    p.add_argument("-o", "--output", required=True, metavar="TRACE", help="trace file to write (.bin)")
    add_force_argument(p)
    p.add_argument("--format", default="auto", choices=("auto",) + FORMATS, help="input format (default: auto)")
    p.add_argument("--device", type=count(0), metavar="N",
                   help="device index to import (torch: device_traces[N]; cupy: device_id N); default: a snapshot's "
                        "device that holds the events (a rank's on cuda:1 too), 0 for a log")
    p.add_argument("--total-memory", metavar="SIZE",
                   help="the recorded GPU's memory, e.g. 80GiB (the inputs do not carry it); replays use it "
                        "as the default capacity")
    p.add_argument("--device-name", metavar="NAME", help="the recorded GPU's name, kept in the metadata")


@COMMAND.runs
def run(args) -> int:
    total = positive_size(args.total_memory, "--total-memory") if args.total_memory is not None else None
    check_device(args.device, total, args.device_name, names=("--device", "--total-memory", "--device-name"))
    claim_outputs([("-o", args.output)], [args.file], force=args.force)
    st = import_file(args.file, args.output, format=args.format, device=args.device, total_memory=total,
                     device_name=args.device_name, force=args.force)
    show_warnings(args.file, st)
    print(summary(args.file, args.output, st))
    return 0


def show_warnings(src: str, st: dict) -> None:
    """The importer's warnings about ``src`` (a cut-off last line, a free of another size), a line each on stderr:
    `allocsim import` and the imports that tune makes on the fly show them alike."""
    for w in st.get("warnings", []):
        print(f"allocsim: warning: {shown_name(src)}: {printable(w, keep='')}", file=sys.stderr)


def summary(src: str, out: str, st: dict) -> str:
    """One line: what was written, and whether the trace was seeded with blocks from before its start."""
    parts = [_n(st["events"], "event"), _n(st["allocs"], "alloc"), _n(st["frees"], "free")]
    segs = st.get("segment_allocs", 0) + st.get("segment_maps", 0)
    if segs or st["format"] != "rmm":
        parts.append(_n(segs, "segment"))
    if st.get("ooms"):
        parts.append(_n(st["ooms"], "OOM"))
    if st["format"] == "torch":
        parts.append(f"wrapped: {'yes' if st['wrapped'] else 'no'}, seeded {_n(st['seeded'], 'pre-existing block')}, "
                     f"{_n(st['initial_segments'], 'starting segment')}")
    return f"{src} ({st['format']}) -> {out}: " + ", ".join(parts)


def _n(count: int, noun: str) -> str:
    return f"{fmt_count(count)} {noun}{'' if count == 1 else 's'}"
