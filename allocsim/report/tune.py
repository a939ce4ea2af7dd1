"""The text report of `allocsim tune`: the line to paste, the table, the OOM rescue (reads a `Tuning`)."""
from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from ..units import fmt_bytes, fmt_seconds
from .text import aligned_table, breakdown_shares, oom_cell


def tune_report(res, took: float) -> str:
    """The text report: target, search figures, the line to paste, the table, the OOM rescue."""
    tgt = res.target
    where = (f"capacity {fmt_bytes(tgt.capacity)}" if tgt.capacity is not None else "no capacity limit") + \
        (f", cap {fmt_bytes(tgt.cap)}" if tgt.cap is not None else "")
    objective = res.objective + (f" ({fmt_bytes(res.headroom_bytes)} headroom under the limit)"
                                 if res.objective == "fastest" and res.headroom_bytes is not None else "")
    lines = [f"{res.trace}: LOAD {fmt_bytes(res.load_bytes)}; target {where}; objective {objective}",
             *([f"tuned for {res.run}"] if getattr(res, "run", None) else []),
             f"searched {res.settings_total} settings, {res.settings_distinct} distinct on this trace"
             + (f", the first {len(res.rows)} replayed (--max-replays)" if res.bounded else "")
             + f"; {res.replays} replays in {took:.1f}s"
             + (" (those that could not be a finalist stopped early)" if res.pruned else ""), ""]
    if res.shared or res.resumed:
        rule = res.family_rule          # its space's words for how its settings share (`FamilyRule.alike`)
        lines.insert(-1, f"{res.shared + res.resumed} settings behave as another up to a point ({rule.alike}): "
                     f"{res.shared} took that setting's figures ({rule.taken}), {res.resumed} resumed from its "
                     f"checkpoint")
    best = res.best
    if best is None:
        lines.append(f"no setting of the {len(res.rows)} replayed fits this target (--max-replays: the others were not "
                     f"tried); the table shows the ones that got furthest" if res.bounded else
                     "no setting fits this target; the table shows the ones that got furthest")
    else:
        lines.append("recommended:" + (f" ({best['setting']}: already the best)" if best["recorded"] else ""))
        lines += paste_lines(best)
        if best.get("caught_ooms"):
            lines.append(f"  (it lives through {best['caught_ooms']:,} OOM{'s' if best['caught_ooms'] > 1 else ''} the "
                         f"program survives: code that catches them and goes on; docs/allocator-dependent.md)")
        if res.objective == "fastest" and res.room is not None and best["peak_reserved_bytes"] > res.room:
            lines.append(f"  (no setting fits with {fmt_bytes(res.headroom_bytes)} to spare: this is the fastest "
                         f"that fits at all)")
    lines += ["", table(res.shown, res.load_bytes, tgt)]
    lines.append(fits_legend(res.shown, tgt) + "; dominated: another setting is as good in reserved and time")
    lines.append("modeled time: every allocator call, device calls included (a cudaFree with the device sync it "
                 "implies); in brackets, the device calls' share")
    lines.append(f"{WHY}: reserved - live at the reserved peak (at the first OOM for a setting that runs out), "
                 "in % of reserved: free beside live blocks / in wholly free segments / in other streams' pools / "
                 "rounding inside blocks")
    for o in res.rescue:
        lines.append(f"recorded OOM at event {o['event']} ({fmt_bytes(o['size'])} request): under the recorded "
                     f"settings {rescued(o['recorded'])}; served by {len(o['served_by'])} of {len(res.rows)} settings"
                     + (f", most headroom under {o['served_by'][0]['setting']}"
                        + _headroom(o["served_by"][0]["headroom_bytes"]) if o["served_by"] else ""))
    return "\n".join(lines)


def paste_lines(row: dict) -> list[str]:
    """How to select a row's setting: the environment lines and their note, then, where the framework has one, the
    same in Python for a process already running (a notebook), with its own note."""
    lines = [f"  {row[k]}" for k in ("conf", "legacy_conf") if row.get(k)]
    if row.get("note"):
        lines.append(f"  ({row['note']})")
    if row.get("python"):
        lines += ["  in a running Python process (a notebook):"] + \
            [f"    {row[k]}" for k in ("python", "python_fraction") if row.get(k)] + [f"    ({row['python_note']})"]
    return lines


def rescued(o: dict) -> str:
    """What one setting does with a recorded failed request."""
    if not o["reached"]:
        return "it runs out earlier"
    return "it is served" + _headroom(o["headroom_bytes"]) if o["served"] else "it fails again"


def _headroom(room) -> str:
    return f" ({fmt_bytes(room)} headroom left)" if room is not None else ""


#: The table's free-breakdown column.
WHY = "hard/soft/stream/round %"


def table(rows: list[dict], load: int, target=None) -> str:
    """The settings side by side; ``target`` (a `allocsim.search.tune.Target`) says what "fits on" measures."""
    head = ["setting", "peak reserved", "over LOAD", "OOM", "dev mallocs/frees", "retries", "modeled time (device)",
            "fits on", WHY]
    body = []
    for r in rows:
        total = r["total_time_seconds"]
        share = f" ({r['device_time_seconds'] / total:.0%})" if total else ""
        body.append([r["setting"], fmt_bytes(r["peak_reserved_bytes"]), f"{100 * r['overhead_vs_load']:+.1f}%",
                     oom_cell(r),
                     f"{r['device_mallocs']:,} / {r['device_frees']:,}", f"{r['retries']:,}",
                     fmt_seconds(total) + share, fits_on(r, target), breakdown_shares(r.get("breakdown"))])
    return aligned_table(head, body, left=1)


def fits_on(r: dict, target=None) -> str:
    """A row's "fits on" cell, in the terms of the target the user gave (`smallest_fit`)."""
    if "fit_capacity_bytes" not in r:
        return "-" if r["pareto"] or r["recorded"] else "dominated"
    got = smallest_fit(r, target)
    if got is None:
        return "none"
    n, bound = got
    mark = "*" if bound else ""
    if target is not None and target.cap is not None and target.capacity:
        return f"{fraction_up(n, target.capacity)} ({fmt_bytes(n)}){mark}"
    return fmt_bytes(n) + mark


def fraction_up(n: int, capacity: int, digits: int = 3) -> str:
    """``n / capacity`` to ``digits`` significant figures, rounded up: the fraction a user passes on
    (``per_process_memory_fraction``) must allow at least the ``n`` bytes certified, and one rounded down runs out.
    Exact: the least ``units`` × 10**``e`` (``units`` of ``digits`` figures) at or above the fraction."""
    f = Fraction(n, capacity)
    e = math.floor(math.log10(n / capacity)) - (digits - 1)     # a guess, set right by the exact comparisons
    while f >= Fraction(10) ** (e + digits):
        e += 1
    while f < Fraction(10) ** (e + digits - 1):
        e -= 1
    units = math.ceil(f / Fraction(10) ** e)
    if units == 10 ** digits:                   # 0.9995 → 1.00
        units, e = 10 ** (digits - 1), e + 1
    return format(Decimal(units).scaleb(e), "f")


def smallest_fit(r: dict, target=None) -> tuple[int, str | None] | None:
    """(bytes, what bounded them) of the smallest limit the setting fits under: under a cap, the smallest allowed
    memory (the walk, `allocsim.search.fit`, starts at the cap and steps down); else the smallest GPU (it steps down from
    the setting's own peak). Bound ``walk``: the walk's replay budget ran out there. None: it fits under none."""
    n = r["fit_capacity_bytes"]
    if n is None:
        return None
    return n, None if r["fit_threshold"] else "walk"


def bisected(r: dict, target=None) -> bool:
    """Whether a row's "fits on" walk bisected (to ``fit_digits`` figures, `allocsim.search.fit`): it did wherever it
    found a fit where it started, under the cap or, without one, at the setting's own peak; a walk that ran out
    with no cap, or at the cap (its figure is then the peak above the cap), stopped there."""
    n = r.get("fit_capacity_bytes")
    return bool(r.get("fit_digits")) and n is not None and (target is None or target.cap is None or n <= target.cap)


def fits_legend(rows: list[dict], target=None) -> str:
    """What the "fits on" column measures, and what each mark in it says: only the marks its rows show."""
    if not any("fit_capacity_bytes" in r for r in rows):        # tune --no-fit: every cell is - or dominated
        return "fits on: - (not walked: --no-fit)"
    if target is not None and target.cap is not None:
        text = ("fits on: the smallest allowed memory " + ("(the fraction of the device, as per_process_memory_fraction "
                "takes it) " if target.capacity else "") + "under which it replays without OOM, up to the cap")
    else:
        text = "fits on: the smallest GPU (device memory) on which it replays without OOM"
    fits = [smallest_fit(r, target) or (0, None) for r in rows if "fit_capacity_bytes" in r]
    if target is not None and target.cap is not None and any(n > target.cap for n, _ in fits):
        text += " (a figure above the cap: it runs out under the cap, and fits from there)"
    digits = next((r["fit_digits"] for r in rows if bisected(r, target)), None)
    if digits:
        text += (f", bisected to {digits} significant figures of where its walk started (the cap or the setting's "
                 f"own peak): it fits there and runs out less than that step below; allocsim fit finds the limit "
                 f"from which every larger one fits")
    if target is not None and target.cap is not None and target.capacity and any(n for n, _ in fits):
        text += "; the fraction is rounded up"
    if any(r["fit_capacity_bytes"] is None for r in rows if "fit_capacity_bytes" in r):
        text += "; none: it runs out even with no limit, or (a GC threshold, which reads the limit) at its own peak"
    if any(bound for _, bound in fits):
        text += "; * bounded: the walk's replay budget ran out: it fits from there, a smaller may"
    return text


def run_report(res, took: float) -> str:
    """`allocsim tune` on a run (a `allocsim.search.tune_ranks.RunTuning`): the worst rank's report, then the
    recommended setting on every rank at its capacity (the GPU less what lay outside its allocator)."""
    from ..machine.ranks import process_words
    worst = process_words(res.labels[res.worst], res.paths[res.worst])
    again = sum(len(g["positions"]) - 1 for g in res.recordings)     # recordings of a process already counted
    n = len(res.paths) - again
    processes = f"{n} process{'es' if n != 1 else ''}" + (f" ({len(res.paths)} recordings)" if again else "")
    lines = [f"run of {processes}; the least room is {worst}'s ({res.paths[res.worst]}): tuned below, "
             "its finalists then replayed on every rank", "", tune_report(res.tuning, took), ""]
    rows = res.rank_rows
    if not rows:
        lines.append("no setting fits the worst rank: nothing to check on the others")
        return "\n".join(lines)
    shown = res.chosen or rows[res.worst]
    if res.chosen is None:
        lines.append(f"no finalist of {worst} fits every rank; the best of them, {shown['setting']}, on each:")
    else:
        best = res.tuning.best
        lines.append(f"recommended for the run: {shown['setting']}" + (
            "" if best is None or shown is best else
            f" ({best['setting']}, the worst rank's best, runs out on another rank)") + "; on each rank:")
        lines += paste_lines(shown)
    head = ["process", "trace", "capacity", "outside", "peak reserved", "device mallocs/frees", "fits"]
    body = []
    for label, out, row, path, recorded in zip(res.labels, res.outside, rows, res.paths, res.recorded_ooms):
        body.append([label, path, fmt_bytes(row["capacity_bytes"]) if row.get("capacity_bytes") else "-",
                     fmt_bytes(out) if out else "-", fmt_bytes(row["peak_reserved_bytes"]),
                     f"{row['device_mallocs']} / {row['device_frees']}",
                     "yes" if not row["ooms"] else f"no: {'the recorded ' if row['first_oom_event'] in recorded else ''}"
                                                   f"OOM at event {row['first_oom_event']}"
                                                   + (" again" if row["first_oom_event"] in recorded else "")])
    lines.append(aligned_table(head, body, 2))
    lines.append("capacity: the GPU's memory less what lay outside the rank's caching allocator when recorded "
                 "(CUDA context, NCCL, other processes on the device)")
    lines += recorded_again_lines(res)
    return "\n".join(lines)


def recorded_again_lines(res) -> list[str]:
    """What the recordings of one process say about the frees that no setting decides: per process recorded
    more than once, the frees that landed elsewhere and the range of the setting's peak; with one recording
    each, how to see that range."""
    variants = res.variants
    if not variants:
        return ["each process was recorded once: a free whose point the run's timing decides, not the setting (DDP "
                "frees its first gradient bucket at the bucket rebuild or one to two steps later), can land "
                "elsewhere in a re-run and raise its peak (traces/README.md); record the re-run and tune on both "
                "recordings (allocsim tune RUN.bin RERUN.bin) to see the range"]
    lines = []
    for v in variants:
        names = ", ".join(v["traces"])
        moved = v["moved"]
        head = f"{names}: one process recorded {len(v['traces'])} times (the same {v['allocs']:,} allocations); "
        if not moved:
            lines.append(head + "every free at the same point")
            continue
        where = "; ".join(f"{fmt_bytes(m['size'])} freed after allocation " + " / ".join(f"{a:,}" for a in m["after"])
                          for m in moved[:3]) + (f"; {len(moved) - 3} more" if len(moved) > 3 else "")
        lines.append(head + f"{len(moved)} free{'s' if len(moved) > 1 else ''} elsewhere ({where}): the run's "
                     "timing, not the setting, decided where (traces/README.md)")
        peaks = v["peak_reserved_bytes"]
        if peaks:
            lo, hi = min(peaks), max(peaks)
            lines.append(f"  under the setting its peak reserved is {fmt_bytes(lo)}" +
                         (f" to {fmt_bytes(hi)} over the recordings, device mallocs "
                          + " / ".join(str(n) for n in v["device_mallocs"]) if hi != lo else " on each recording")
                         + "; it fits only where every recording fits")
    return lines
