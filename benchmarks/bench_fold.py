"""Folding periodic runs (allocsim/engine/fold.py): long runs cost what is distinct.

1. A fixed-shape model (`allocsim.formats.synth`'s ``transformer``, 10 iterations, extended to ``--steps`` by
   `allocsim.formats.synth.repeat_steps`): each policy replays the 10-step trace (too short for a folder since
   2026-12-04: `MIN_RECORDS`, as every 10-step trace here) and the long one, folded and
   with ``fold=False``; the table gives CPU seconds and the ratio long / 10 steps (target: <= 3 for 1,000
   steps, folded), each the best of ``--repeat`` runs, the variants alternated within one run.
2. The recorded traces (``traces/*.bin``): how much folds as they are (nothing since 2026-12-04: each is under
   `MIN_RECORDS`), and extended to ``--extend`` steps.
3. ``--long TRACE``: a long recording against its first 10 steps (target: <= 10x folded), with ``fold=False``
   for comparison. The 300-step recordings of GPT-2 and ResNet-50 made on an H200 for this are shipped
   compressed in ``benchmarks/data/`` (``--long benchmarks/data/gpt2-300.bin.xz``: an ``.xz`` is unpacked to a
   temporary file first).
4. ``--real`` (instead of 1 and 2): the real fixed-shape runs of ``traces/fold/`` (issue 31), each folded against
   its first 10 steps as a default replay makes them (too short for a folder since 2026-12-04: `MIN_RECORDS`) and
   against its whole ``fold=False`` (targets: 300 steps <= 3x their first 10, <= 5x
   with an evaluation every 50; 1,000 steps with an evaluation every 100 <= half their ``fold=False`` time), and
   what folding costs where nothing repeats (``--give-up``, default ``traces/gpt2_variable.bin``: <= 5 % over
   ``fold=False``).
5. ``--real --cold``: the same runs as ``allocsim replay --json`` runs them, each replay in a fresh process (its
   first touch of memory, its lazy imports): the median ``replay_seconds`` (wall time, the figure the command
   prints) of ``--repeat`` runs of the first 10 steps (no folder), all folded and all with ``--no-fold``, and how many
   steps each folded run folded.

6. ``--short`` (instead of 1 and 2): what folding costs a short run, where no fold can pay its folder back (target:
   <= 5 % over ``fold=False``): every shipped recording (``traces/*.bin``) and the real runs cut to their first 10
   to 100 steps, folded / ``fold=False``, best of ``--repeat`` alternated, and whether a folder was made.
7. ``--states TRACE``: the allocator's state at each step boundary of a walk of ``TRACE`` with ``fold=False``, as
   numbers (equal numbers, equal fingerprints: what a fold can start from and come back to), each policy's in a
   line, runs of a cycle written once with how many times they repeat.
8. ``--walked TRACE``: what bounds a folded replay's x10. Each policy's folded replay of ``TRACE`` walks some of its
   steps and folds the rest; the first that many steps replayed with ``fold=False`` cost what walking them costs
   with no folder at all, so their time over the first 10 steps' is the least x10 any folder that walks as much can
   have, and the folded time less theirs is what the folder itself costs (its looks, fingerprints, folds and the
   stops it makes the walk take), given here in the first 10 steps' time. Best of ``--repeat``, alternated.
9. ``--parts TRACE``: where a folded replay of ``TRACE`` spends its time, piece by piece: the folder's methods
   (`PARTS`) and the walk timed each without what it calls of the others (exclusive), averaged over ``--repeat``
   replays and given in milliseconds and in the first 10 steps' time. The timers add a few per cent of their own.

Every folded result is checked against the full walk's (`ReplayResult.to_dict`, bit for bit).

    python3 benchmarks/bench_fold.py [--steps 1000] [--extend 300] [--policies torch,split,bestfit,cupy]
                                     [--long trace.bin] [--real [--give-up trace.bin] [--cold]] [--json out.json]
                                     [--kept] [--short] [--states trace.bin] [--walked trace.bin]
                                     [--parts trace.bin]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from allocsim.engine import fold as fold_module  # noqa: E402
from allocsim.engine import replay as replay_module  # noqa: E402
from allocsim.formats import synth  # noqa: E402
from allocsim.errors import UsageError  # noqa: E402
from allocsim.outputs import atomic_open  # noqa: E402
from allocsim.engine.replay import Replay  # noqa: E402
from allocsim.trace import Trace  # noqa: E402


#: ``--kept``: replays keep what a tune or fit keeps between its replays of one trace (its steps excepted).
KEPT = False


def timed(trace: Trace, policy: str, fold: bool):
    """``(CPU seconds, result dict without timings, folded summary)`` of one replay to the end, as `allocsim
    replay` runs it: the trace's steps read afresh, and (unless ``--kept``) a short trace's walk chunks and
    segments made afresh too (a tune or fit makes them once for all its replays of a trace of at most
    `replay_module.KEEP_RECORDS` records: until 2026-12-03 only the 10 steps had them kept, the long runs, larger,
    never)."""
    fold_module._STEPS.clear()
    if not KEPT:
        replay_module._KEPT.clear()
        replay_module._LIVE.clear()
    c0 = time.process_time()
    r = Replay(trace, policy, fold=fold)
    res = r.run()
    cpu = time.process_time() - c0
    d = res.to_dict()
    d.pop("replay_seconds")
    d.pop("load_seconds")
    return cpu, d, res.folded


def best(trace: Trace, policy: str, repeat: int) -> dict:
    """Folded and full, alternated ``repeat`` times: the best CPU time of each, the results checked equal."""
    times = {True: [], False: []}
    folded = None
    for _ in range(repeat):
        for fold in (True, False):
            cpu, d, how = timed(trace, policy, fold)
            times[fold].append(cpu)
            if fold:
                folded, d_fold = how, d
            elif d != d_fold:
                raise SystemExit(f"bench_fold: {policy}: the folded result differs from the full walk's")
    return {"folded_s": min(times[True]), "full_s": min(times[False]), "folded": folded}


def against(short: Trace, long_: Trace, policy: str, repeat: int) -> dict:
    """The long trace's folded and full CPU seconds against the short one's folded, and their ratios."""
    s, lg = best(short, policy, repeat), best(long_, policy, repeat)
    return {"policy": policy, "short_s": s["folded_s"], "long_s": lg["folded_s"], "long_full_s": lg["full_s"],
            "ratio": lg["folded_s"] / s["folded_s"], "ratio_full": lg["full_s"] / s["folded_s"],
            "folded": lg["folded"]}


def first_steps(trace: Trace, n: int) -> Trace:
    """The records before ``trace``'s ``n``-th MARK (its first ``n`` steps and what precedes them)."""
    marks = [at for at, _ in trace.marks()]
    end = marks[n] if len(marks) > n else len(trace)
    return Trace(np.asarray(trace.records[:end]), dict(trace.meta), streams=trace.streams, sites=trace.sites,
                 labels=trace.labels, path=trace.path)


def walked(trace: Trace, policy: str, repeat: int) -> dict:
    """``--walked``: the folded replay of ``trace`` (checked against the full walk), its first 10 steps as a default
    replay makes them, and its first as many steps as the folded replay walks, with ``fold=False``: best CPU seconds
    of ``repeat``, alternated."""
    folded = best(trace, policy, repeat)
    how = folded["folded"]
    steps = len(trace.marks()) if not how else how["of_steps"] - how["steps"]     # (no fold: all of it)
    head, walk = first_steps(trace, 10), first_steps(trace, steps)
    t10 = min(timed(head, policy, True)[0] for _ in range(repeat))
    tw = min(timed(walk, policy, False)[0] for _ in range(repeat))
    return {"policy": policy, "walked": steps, "first10_s": t10, "walked_s": tw, "folded_s": folded["folded_s"],
            "least_x10": tw / t10, "x10": folded["folded_s"] / t10, "folder_x": (folded["folded_s"] - tw) / t10}


#: ``--parts``: the pieces timed, as (label, class, method); what a piece calls of another is that other's.
PARTS = (("walk", replay_module.Replay, "_walk_chunk"), ("moving the walk", replay_module.Replay, "move_to"),
         ("making the replay", replay_module.Replay, "__init__"), ("result", replay_module.Replay, "_build_result"),
         ("folder: making", fold_module.Folder, "__init__"), ("folder: looks (the rest)", fold_module.Folder, "at"),
         ("folder: steps asked", fold_module.Steps, "useful"),
         ("folder: fingerprints", fold_module.Folder, "_fingerprint"),
         ("folder: first tries", fold_module.Folder, "_try"), ("folder: window ends", fold_module.Folder, "_end_window"),
         ("folder: reuses", fold_module.Folder, "_reuse"), ("folder: resumes", fold_module.Folder, "_resume"),
         ("folder: laps", fold_module.Folder, "_lap_close"), ("folder: additions", fold_module.Folder, "_skip"))


def parts(trace: Trace, policy: str, repeat: int) -> dict:
    """``--parts``: milliseconds a folded replay of ``trace`` spends in each of `PARTS`, exclusive of the others it
    calls, averaged over ``repeat`` replays after one untimed; the first 10 steps' best time and the whole replay's
    mean beside them."""
    spent = {label: 0.0 for label, _, _ in PARTS}
    stack: list = []

    def timer(label, method):
        def timed_part(*args, **kw):
            t0 = time.perf_counter()
            stack.append(0.0)
            try:
                return method(*args, **kw)
            finally:
                inner = stack.pop()
                took = time.perf_counter() - t0
                spent[label] += took - inner
                if stack:
                    stack[-1] += took
        return timed_part

    t10 = min(timed(first_steps(trace, 10), policy, True)[0] for _ in range(repeat))
    saved = [(cls, name, cls.__dict__[name]) for _, cls, name in PARTS]
    for label, cls, name in PARTS:
        setattr(cls, name, timer(label, cls.__dict__[name]))
    try:
        timed(trace, policy, True)
        for label in spent:
            spent[label] = 0.0
        t0 = time.perf_counter()
        for _ in range(repeat):
            timed(trace, policy, True)
        whole = (time.perf_counter() - t0) / repeat
    finally:
        for cls, name, method in saved:
            setattr(cls, name, method)
    ms = {label: s / repeat * 1e3 for label, s in spent.items()}
    return {"policy": policy, "first10_ms": t10 * 1e3, "whole_ms": whole * 1e3, "parts_ms": ms}


def fmt_fold(how) -> str:
    return "-" if not how else f"{how['steps']}/{how['of_steps']} steps, period {how['period']} from {how['from_step']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1000, help="steps of the long fixed-shape run (default 1000)")
    ap.add_argument("--extend", type=int, default=300, help="recorded traces extended to this many steps (0: not)")
    ap.add_argument("--policies", default="torch,split,bestfit,cupy")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each variant (the best is kept)")
    ap.add_argument("--long", metavar="TRACE", help="a long recording: its whole against its first 10 steps")
    only = ap.add_mutually_exclusive_group()      # (each instead of sections 1 to 3)
    only.add_argument("--real", action="store_true", help="the real runs of traces/fold/ and the give-up cost only")
    ap.add_argument("--give-up", default=os.path.join(ROOT, "traces", "gpt2_variable.bin"), metavar="TRACE",
                    help="with --real: a trace whose steps do not repeat (default traces/gpt2_variable.bin)")
    ap.add_argument("--cold", action="store_true",
                    help="with --real: each replay in a fresh process, as `allocsim replay --json` runs it")
    ap.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    ap.add_argument("--kept", action="store_true",
                    help="keep a short trace's walk chunks between its replays, as a tune or fit does (the figures "
                         "before 2026-12-03 kept them)")
    only.add_argument("--short", action="store_true",
                      help="what folding costs short runs: the shipped recordings and the real runs cut short")
    only.add_argument("--states", metavar="TRACE", help="the state at each step boundary of TRACE, as numbers")
    only.add_argument("--walked", metavar="TRACE",
                      help="the least x10 a folded replay of TRACE can have, walking the steps it walks")
    only.add_argument("--parts", metavar="TRACE", help="where a folded replay of TRACE spends its time, piece by piece")
    a = ap.parse_args(argv)
    global KEPT
    KEPT = a.kept
    print(f"each replay {'keeps' if KEPT else 'makes afresh'} a short trace's walk chunks (--kept: "
          f"{'on' if KEPT else 'off'})")
    policies = a.policies.split(",")
    out: dict = {"fixed_shape": [], "recorded": [], "long": [], "real": [], "give_up": [], "cold": [], "short": [],
                 "states": [], "walked": [], "parts": []}
    if a.real and a.cold:
        cold_runs(policies, a.repeat, out)
        return write_json(a.json, out)
    if a.real:
        real_runs(policies, a.repeat, a.give_up, out)
        return write_json(a.json, out)
    if a.short:
        short_runs(policies, a.repeat, out)
        return write_json(a.json, out)
    if a.states:
        trace = Trace.load(unpacked(a.states))
        for p in policies:
            out["states"].append(dict(policy=p, states=states(trace, p)))
            print(f"{p:<8}{runs_of(out['states'][-1]['states'])}")
        return write_json(a.json, out)
    if a.walked:
        trace = Trace.load(unpacked(a.walked))
        print(f"{a.walked}: the folded replay against its first 10 steps and against the steps it walks, replayed "
              f"with --no-fold (CPU ms, best of {a.repeat}; x: over the first 10 steps' time)")
        print(f"{'policy':<9}{'first 10':>9}{'walked':>8}{'them':>8}{'folded':>9}{'least x':>9}{'x10':>7}{'folder x':>10}")
        for p in policies:
            row = walked(trace, p, a.repeat)
            out["walked"].append(row)
            print(f"{p:<9}{row['first10_s'] * 1e3:>9.2f}{row['walked']:>8}{row['walked_s'] * 1e3:>8.2f}"
                  f"{row['folded_s'] * 1e3:>9.2f}{row['least_x10']:>9.2f}{row['x10']:>7.2f}{row['folder_x']:>10.2f}")
        return write_json(a.json, out)
    if a.parts:
        trace = Trace.load(unpacked(a.parts))
        for p in policies:
            row = parts(trace, p, a.repeat)
            out["parts"].append(row)
            print(f"{a.parts} under {p}: a folded replay {row['whole_ms']:.2f} ms (timed, mean of {a.repeat}), its "
                  f"first 10 steps {row['first10_ms']:.2f} ms (untimed, best); exclusive ms, and x the first 10")
            rest = row["whole_ms"] - sum(row["parts_ms"].values())
            for label, ms in [*row["parts_ms"].items(), ("the rest (timers, run loop)", rest)]:
                print(f"  {label:<30}{ms:>8.2f}{ms / row['first10_ms']:>8.2f}")
        return write_json(a.json, out)

    short = synth.generate("transformer", iterations=10)
    long_ = synth.repeat_steps(short, a.steps)
    print(f"fixed-shape transformer: 10 steps ({len(short):,} records) vs {a.steps} steps ({len(long_):,} records), "
          f"CPU seconds, best of {a.repeat}")
    print(f"{'policy':<10}{'10 steps':>10}{'long':>10}{'x10':>8}{'long full':>11}{'x10 full':>10}  folded")
    for p in policies:
        row = against(short, long_, p, a.repeat)
        out["fixed_shape"].append(row)
        print(f"{p:<10}{row['short_s']:>10.3f}{row['long_s']:>10.3f}{row['ratio']:>8.2f}{row['long_full_s']:>11.3f}"
              f"{row['ratio_full']:>10.1f}  {fmt_fold(row['folded'])}")

    print(f"\nrecorded traces: folded as they are, and extended to {a.extend} steps (folded / full CPU seconds)")
    for path in sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin"))):
        trace = Trace.load(path)
        if len(trace.marks()) < 3:
            continue
        try:
            ext = synth.repeat_steps(trace, a.extend) if a.extend and len(trace.marks()) <= a.extend else None
        except UsageError:          # its steps cannot be repeated as they are (allocsim.formats.synth.repeat_steps)
            ext = None
        for p in policies:
            as_is = timed(trace, p, True)[2]
            row = {"trace": os.path.basename(path), "policy": p, "as_is": as_is}
            if ext is not None:
                row.update(best(ext, p, 1))
            out["recorded"].append(row)
            more = "" if ext is None else (f"  x{a.extend}: {fmt_fold(row['folded'])}, "
                                           f"{row['folded_s']:.3f}s / {row['full_s']:.3f}s")
            print(f"  {row['trace']:<36}{p:<8} as is: {fmt_fold(as_is)}{more}")

    if a.long:
        trace = Trace.load(unpacked(a.long))
        head = first_steps(trace, 10)
        print(f"\n{a.long}: {len(trace.marks())} steps vs its first 10")
        for p in policies:
            row = against(head, trace, p, a.repeat)
            out["long"].append(row)
            print(f"  {p:<8} first 10 {row['short_s']:.3f}s  all {row['long_s']:.3f}s (x{row['ratio']:.2f})  "
                  f"--no-fold {row['long_full_s']:.3f}s (x{row['ratio_full']:.1f})  {fmt_fold(row['folded'])}")
    return write_json(a.json, out)


def write_json(path: str | None, out: dict) -> int:
    if path:
        with atomic_open(path, "w") as f:
            json.dump(out, f, indent=1)
    return 0


#: traces/fold/'s runs and the most their folded replay may take: times their first 10 steps' folded replay
#: ("x10"), or times their whole fold=False replay ("full")
REAL = (("gpt-fixed", "x10", 3), ("gpt2s-fixed", "x10", 3), ("gpt-eval50", "x10", 5), ("gpt2s-eval50", "x10", 5),
        ("resnet18-eval100", "full", 0.5))


def real_runs(policies: list[str], repeat: int, give_up: str, out: dict) -> None:
    """Section 4: the real runs against their first 10 steps and their full walk; the give-up cost."""
    print(f"real runs (traces/fold/), CPU seconds, best of {repeat}: first 10 steps (no folder: too short), all folded, "
          f"all with fold=False")
    print(f"{'trace':<18}{'policy':<9}{'10 steps':>9}{'all':>8}{'x10':>7}{'full':>8}{'/full':>7}  {'target':<12}folded")
    for name, against_what, most in REAL:
        trace = Trace.load(unpacked(os.path.join(ROOT, "traces", "fold", name + ".bin.xz")))
        head = first_steps(trace, 10)
        for p in policies:
            row = against(head, trace, p, repeat)
            row.update(trace=name, over_full=row["long_s"] / row["long_full_s"], target=f"{against_what} <= {most}")
            row["met"] = (row["ratio"] if against_what == "x10" else row["over_full"]) <= most
            out["real"].append(row)
            print(f"{name:<18}{p:<9}{row['short_s']:>9.3f}{row['long_s']:>8.3f}{row['ratio']:>7.2f}"
                  f"{row['long_full_s']:>8.3f}{row['over_full']:>7.2f}  {row['target']:<12}{'' if row['met'] else '(missed) '}"
                  f"{fmt_fold(row['folded'])}, {row['folded']['folds'] if row['folded'] else 0} folds")
    trace = Trace.load(unpacked(give_up))
    print(f"\nwhere nothing repeats ({os.path.basename(give_up)}): folded / fold=False, best of {3 * repeat}")
    for p in policies:
        row = best(trace, p, 3 * repeat)
        row.update(trace=os.path.basename(give_up), policy=p, over=row["folded_s"] / row["full_s"] - 1)
        out["give_up"].append(row)
        print(f"  {p:<8}{row['folded_s']:.4f}s / {row['full_s']:.4f}s  {row['over']:+.1%}  (target <= +5 %)  "
              f"{fmt_fold(row['folded'])}")


#: ``--short``: the real runs' first steps replayed
SHORT_STEPS = (10, 30, 60, 100)


def short_runs(policies: list[str], repeat: int, out: dict) -> None:
    """Section 6: short runs, folded against ``fold=False``: the shipped recordings and the real runs cut short."""
    print(f"short runs: folded / fold=False CPU seconds, best of {repeat} alternated (target <= +5 %); "
          f"folder: made (and what it folded) or none")
    paths = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")))
    runs = [(os.path.basename(path), Trace.load(path)) for path in paths]
    for name, _, _ in REAL:
        trace = Trace.load(unpacked(os.path.join(ROOT, "traces", "fold", name + ".bin.xz")))
        runs += [(f"{name}[:{n}]", first_steps(trace, n)) for n in SHORT_STEPS]
    for name, trace in runs:
        for p in policies:
            row = best(trace, p, repeat)
            probe = Replay(trace, p)
            made = probe._folder is not None
            probe.close()
            row.update(trace=name, policy=p, records=len(trace), over=row["folded_s"] / row["full_s"] - 1, folder=made)
            out["short"].append(row)
            print(f"  {name:<30} {p:<8}{len(trace):>8} records  {row['folded_s']:.4f}s / {row['full_s']:.4f}s "
                  f"{row['over']:+6.1%}  {('folder: ' + fmt_fold(row['folded'])) if made else 'no folder'}")


def states(trace: Trace, policy: str) -> list[int]:
    """The state at each MARK of a walk of ``trace`` under ``policy`` with ``fold=False``, numbered in the order first
    seen (`allocsim.engine.fold.fingerprint`: what a fold compares; -1 where the state cannot be folded)."""
    r = Replay(trace, policy, fold=False)
    seen: dict = {}
    out = []
    for at in fold_module.steps_of(trace).marks.tolist():
        r.run(until=at)
        got = fold_module.fingerprint(r)
        out.append(-1 if got is None else seen.setdefault(got[0], len(seen)))
    return out


def runs_of(seq: list[int], longest: int = 32) -> str:
    """``seq`` with each stretch that repeats a cycle of up to ``longest`` values written ``(a b c)xN`` (from each
    place, the cycle that covers the most values, the shortest of those), the rest as it is."""
    parts, i = [], 0
    while i < len(seq):
        widest = (0, 0, 0)                      # (values covered, -period, repeats)
        for p in range(1, longest + 1):
            n = 1
            while seq[i + n * p:i + (n + 1) * p] == seq[i:i + p]:
                n += 1
            if n >= 2:
                widest = max(widest, (n * p, -p, n))
        if widest[0]:
            p, n = -widest[1], widest[2]
            parts.append(f"({' '.join(map(str, seq[i:i + p]))})x{n}")
            i += n * p
        else:
            parts.append(str(seq[i]))
            i += 1
    return " ".join(parts)


def cold_runs(policies: list[str], repeat: int, out: dict) -> None:
    """Section 5: the real runs through `allocsim replay --json`, a fresh process each -- the first 10 steps, all
    folded, all with ``--no-fold``, by turns: their ``replay_seconds`` (medians; a fresh process's set-up inside the
    replay, its policy's import and first touch of memory, is in each) and the steps each folded run folded."""
    import statistics
    import tempfile
    print(f"real runs (traces/fold/) as `allocsim replay --json` runs them, a fresh process each: median wall "
          f"replay_seconds of {repeat}: the first 10 steps (no folder: too short), all folded, all with --no-fold")
    print(f"{'trace':<18}{'policy':<9}{'10 steps':>9}{'all':>8}{'x10':>7}{'full':>8}{'/full':>7}  "
          f"steps folded, run by run")
    with tempfile.TemporaryDirectory() as tmp:
        for name, _, _ in REAL:
            path = unpacked(os.path.join(ROOT, "traces", "fold", name + ".bin.xz"))
            head = os.path.join(tmp, name + "-10.bin")
            first_steps(Trace.load(path), 10).save(head)
            for p in policies:
                seconds: dict = {"head": [], "fold": [], "full": []}
                steps = []
                for _ in range(repeat):
                    for what, trace, more in (("head", head, []), ("fold", path, []), ("full", path, ["--no-fold"])):
                        d = replayed(trace, p, more)
                        seconds[what].append(d["replay_seconds"])
                        if what == "fold":
                            steps.append((d.get("folded") or {}).get("steps", 0))
                h, f, n = (statistics.median(seconds[w]) for w in ("head", "fold", "full"))
                row = dict(trace=name, policy=p, short_s=h, folded_s=f, full_s=n, ratio=f / h, over_full=f / n,
                           steps=steps)
                out["cold"].append(row)
                print(f"{name:<18}{p:<9}{h:>9.3f}{f:>8.3f}{f / h:>7.2f}{n:>8.3f}{f / n:>7.2f}  "
                      f"{' '.join(map(str, steps))}")


def replayed(path: str, policy: str, more: list[str]) -> dict:
    """`allocsim replay --json`'s result of ``path`` under ``policy``, in a fresh process (this checkout's package)."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "allocsim", "replay", path, "--policy", policy, "--json", *more],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def unpacked(path: str) -> str:
    """``path``, or for an ``.xz`` file a temporary copy of what it holds (removed at exit)."""
    if not path.endswith(".xz"):
        return path
    import atexit
    import lzma
    import shutil
    import tempfile
    fd, tmp = tempfile.mkstemp(suffix=".bin")
    atexit.register(os.unlink, tmp)
    with lzma.open(path) as src, os.fdopen(fd, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return tmp


if __name__ == "__main__":
    sys.exit(main())
