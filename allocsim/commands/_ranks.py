"""The commands on a run of several processes: each rank's trace in turn (docs/several-processes.md).

`each_rank` runs a command's one-trace form on every trace the argument names (`allocsim.machine.ranks.run_traces`:
``run.bin`` for ``run.rank0.bin``, ``run.rank1.bin``, ... or several files), under a heading per rank; with
``--json``, one object ``{"run", "ranks": [{"trace", "rank", "result"}]}`` of the ranks' own JSON. A file a command
writes (``--csv``, ``--snapshot``) is written per rank, named as the rank's trace is (``out.rank1.csv``). One trace
runs exactly as before.
"""
from __future__ import annotations

import contextlib
import copy
import datetime
import io
import json
import os
import sys

from ..errors import InputError, UsageError
from ..filenames import shown_name
from ..outputs import is_trace
from ..machine.ranks import process_name, process_of_name, rank_label, run_traces
from ..report.tables import dump_json
from ..trace import Trace
from ..trace.schema import check_meta
from ._common import WARNINGS

#: The options whose file each rank writes for itself.
PER_RANK_OUTPUTS = ("csv", "snapshot")


def traces_of(args) -> list[str]:
    """The traces the command's ``trace`` argument (one name, or a list) names, runs expanded and checked (one
    line for a run whose traces disagree), with a warning once the command is done for a missing rank or a
    misnamed trace."""
    names = args.trace if isinstance(args.trace, list) else [args.trace]
    found = [(name, run_traces(name)) for name in names]
    given = [(p, name) for name, paths in found for p in paths]     # each trace, and the name that gave it
    paths = [p for p, _ in given]
    seen: dict[str, int] = {}
    for i, (p, name) in enumerate(given):   # (tune a.bin a.bin: "a run of 1 process (2 recordings)")
        if p is None:
            continue                # (no trace named: the embedded one)
        j = seen.setdefault(os.path.realpath(p), i)
        if j != i:
            first = given[j][0]
            also = list(dict.fromkeys(f"in the run {shown_name(n)}" for q, n in (given[j], (p, name)) if n != q))
            also = also or ([f"as {shown_name(first)}"] if first != p else [])
            raise UsageError(f"traces: {shown_name(p)} is named twice" + (f" ({', '.join(also)})" if also else "")
                             + ": each trace is one recording; name it once")
    say(misnamed(paths) + [line for name, paths in found if paths != [name] for line in check_run(name, paths)])
    return paths


def one_trace(name: str, command: str) -> str:
    """The one trace a command that takes one (``plot``) is given: a run's name is refused in one line that names
    its traces and how to go on."""
    paths = run_traces(name)
    if len(paths) > 1:
        shown = [shown_name(p) for p in paths]
        raise UsageError(f"{shown_name(name)}: no such file; it names a run of {len(paths)} traces "
                         f"({', '.join(shown[:3])}{', ...' if len(paths) > 3 else ''}): {command} takes one; give one "
                         f"rank's trace, e.g. allocsim {command} {shown[0]} ...")
    say(misnamed(paths) + (check_run(name, paths) if paths != [name] else []))
    return paths[0]


def say(warnings: list[str]) -> None:
    """Warnings said once the command is done (`WARNINGS`): none if it fails, whose error is then the one line."""
    for line in warnings:
        WARNINGS.setdefault(line, line)


def check_run(name: str, paths: list[str]) -> list[str]:
    """The traces a run's name found belong to one run: they agree on what a run shares (`RUN_FIELDS`: one line
    naming two that do not) and hold each rank once (one line naming two traces of one rank: a copy, or two runs
    under one name). The warnings: a rank below the world size with no trace, as the run's verdict then leaves that
    process out (named in bounded words, whatever the world size), and recordings that never overlapped in time."""
    paths = [path for path in paths if is_trace(path)]      # a log or snapshot is imported, and checked, on its own
    traces = [Trace.load(path, validate=False) for path in paths]
    metas = [t.meta for t in traces]
    for path, meta in zip(paths, metas):
        check_meta(meta, path)
    for what, field in RUN_FIELDS:
        said = [(field(m), path) for m, path in zip(metas, paths) if field(m) is not None]
        for value, path in said[1:]:
            if value != said[0][0]:
                raise InputError(f"its traces disagree on {what}: {said[0][1]} says {_said(said[0][0])}, {path} says "
                                 f"{_said(value)}: traces of two runs under one name?", path=name)
    seen: dict[tuple, str] = {}        # ("rank", 1) or ("pid", 4242) -> its trace
    for path, meta in zip(paths, metas):
        key = next(((k, meta[k]) for k in ("rank", "pid") if isinstance(meta.get(k), int)), None)
        if key in seen:
            raise InputError(f"{seen[key]} and {path} are both {rank_label(meta)}: a run holds one trace per process "
                             f"(a copy, or two runs under one name?); name the traces you mean", path=name)
        if key is not None:
            seen[key] = path
    ranks = [n for k, n in seen if k == "rank"]
    sizes = [m["world_size"] for m in metas if isinstance(m.get("world_size"), int)]
    missing = [missing_ranks(name, sizes[0], ranks)] if sizes and len(ranks) < sizes[0] else []
    return missing + apart_in_time(name, traces)


#: What every trace of one run says alike, where it says it: ``(name, field)``.
RUN_FIELDS = (
    ("the world size", lambda m: m.get("world_size")),
    ("the framework", lambda m: m.get("framework")),
    ("the run's command", lambda m: m["run"].get("command") if isinstance(m.get("run"), dict) else None),
    ("the run's name", lambda m: m["run"].get("output") if isinstance(m.get("run"), dict) else None),
)


def _said(value) -> str:
    """A metadata value as a line shows it: a command as typed, at most 60 characters."""
    text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def missing_ranks(name: str, world: int, present) -> str:
    """The warning for the ranks below ``world`` with no trace, in bounded words: a few ranges of ranks (``2–999,999``)
    and their count, O(ranks present), whatever the world size."""
    gaps, lo = [], 0
    for rank in sorted(r for r in present if r < world) + [world]:
        if rank > lo:
            gaps.append((lo, rank - 1))
        lo = rank + 1
    count = sum(hi - lo + 1 for lo, hi in gaps)
    shown = ", ".join(f"{lo:,}" if lo == hi else f"{lo:,}\u2013{hi:,}" for lo, hi in gaps[:4])
    shown += ", ..." if len(gaps) > 4 else ""
    first = process_name(name, f"rank{gaps[0][0]}")
    said = ([f"{count:,} missing"] if count > 1 else []) + ([] if os.path.lexists(first) else [f"{first} does not exist"])
    return (f"{name}: no trace of {'rank' if count == 1 else 'ranks'} {shown} of its {world:,}"
            + (f" ({'; '.join(said)})" if said else "") + f": the run's figures leave {'it' if count == 1 else 'them'} out")


#: Seconds of slack when judging whether two recordings overlapped: `recorded_at` is to the second, and the ranks'
#: hosts' clocks may differ a little.
CLOCK_SLACK = 60


def apart_in_time(name: str, traces) -> list[str]:
    """A warning naming two traces whose recordings never overlapped in time (``recorded_at`` and the last event's
    time): the processes of one run run together, so these are more likely two runs under one name."""
    spans = []
    for t in traces:
        try:
            start = datetime.datetime.strptime(str(t.meta.get("recorded_at")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except ValueError:          # not said (an imported trace), or not in the recorder's form
            continue
        end = start + (int(t.records["time_ns"][-1]) / 1e9 if len(t.records) else 0)
        spans.append((start, end, t))
    spans.sort(key=lambda s: s[0])
    latest = spans[0] if spans else None            # of the recordings begun so far, the one that ended last
    for start, end, t in spans[1:]:
        if start > latest[1] + CLOCK_SLACK:
            a = latest[2]
            return [f"{name}: {shown_name(t.path)} was recorded at {t.meta['recorded_at']}, after "
                    f"{shown_name(a.path)}'s recording (from {a.meta['recorded_at']}) had ended: traces of two runs "
                    f"under one name?"]
        latest = max(latest, (start, end, t), key=lambda s: s[1])
    return []


def misnamed(paths: list[str]) -> list[str]:
    """A warning for each trace whose name says one process (``run.rank2.bin``, ``run.pid7.bin``) and its metadata
    another (a file copied under another rank's name): the commands take the metadata's word."""
    out = []
    for path in paths:
        named = process_of_name(path) if path else None
        if named is None or not is_trace(path):
            continue
        key, number = named
        try:
            meta = Trace.load(path, validate=False).meta
        except InputError:          # the command says what is wrong with it
            continue
        recorded = meta.get(key)
        if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded != number:
            out.append(f"{shown_name(path)}: its name says {key} {number}, its metadata {key} {recorded} (a copy "
                       f"under another {key}'s name?); it is reported as {key} {recorded}")
        elif recorded is None:      # (it was then counted as missing while its row stood in the table)
            label = rank_label(meta)
            out.append(f"{shown_name(path)}: its name says {key} {number}, its metadata names no {key}; it is reported "
                       + (f"as {label}" if label != "-" else "as a process of no rank and no pid (-)"))
    return out


def label_of(path: str) -> tuple[str, str]:
    """``(rank label, suffix for the rank's outputs)`` from the trace's metadata, read (and checked) without its
    events."""
    meta = Trace.load(path, validate=False).meta
    check_meta(meta, path)
    rank = meta.get("rank")
    suffix = f"rank{rank}" if isinstance(rank, int) else os.path.splitext(os.path.basename(path))[0]
    return rank_label(meta), suffix


def check_outputs_apart(args, paths: list[str], labels: list[tuple[str, str]]) -> None:
    """Two traces of one rank (a file copied under another rank's name) would write one output file: the second
    would replace the first's, or stop the command half-way. One line naming both, before anything is written."""
    given = [name for name in PER_RANK_OUTPUTS if getattr(args, name, None)]
    seen: dict[str, str] = {}
    for path, (label, suffix) in zip(paths, labels):
        if given and suffix in seen:
            from ..errors import UsageError
            name = process_name(getattr(args, given[0]), suffix)
            raise UsageError(f"{seen[suffix]} and {path} are both {label}: their --{given[0]} files would be one "
                             f"({name}); name each rank's trace once")
        seen[suffix] = path


def each_rank(args, run_one, *, summary=None) -> int:
    """``run_one(args)`` on every trace of the run; the worst exit status. ``summary(paths)``, when given, prints a
    table of the run after the ranks (not with --json)."""
    given, paths = args.trace, traces_of(args)
    if len(paths) == 1:
        args.trace = paths[0]
        return run_one(args)
    as_json = getattr(args, "json", False)
    status, ranks = 0, []
    labels = [label_of(path) for path in paths]       # every rank's header checked before any report is printed
    check_outputs_apart(args, paths, labels)
    made: list[str] = []            # the per-rank files this command writes anew: removed if a later rank fails
    report = io.StringIO()          # the ranks' reports, printed once every rank ran (none half-printed)
    try:
        with contextlib.redirect_stdout(report):
            for k, (path, (label, suffix)) in enumerate(zip(paths, labels)):
                sub = copy.copy(args)
                sub.trace = path
                for name in PER_RANK_OUTPUTS:
                    if getattr(sub, name, None):
                        setattr(sub, name, process_name(getattr(sub, name), suffix))
                        made += [] if os.path.lexists(getattr(sub, name)) else [getattr(sub, name)]
                if as_json:
                    out = io.StringIO()
                    with contextlib.redirect_stdout(out):
                        status = max(status, run_one(sub))
                    ranks.append({"trace": path, "rank": label, "result": json.loads(out.getvalue())})
                    continue
                print(("" if k == 0 else "\n") + f"== {label}: {path} ==")
                status = max(status, run_one(sub))
    except BaseException:
        for path in made:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    sys.stdout.write(report.getvalue())
    if as_json:
        dump_json({"run": given[0] if isinstance(given, list) and len(given) == 1 else given, "ranks": ranks})
    elif summary is not None:
        print()
        summary(paths)
    return status
