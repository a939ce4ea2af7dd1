"""The text reports: a replay's summary, its section table, the compare table, the fit table and
validate's verdict.

Each function reads a result — the dataclass (`ReplayResult`, `OOMRecord`, `Validation`) or its
dict form (``to_dict()``, a compare/sweep row, a fit result, JSON read back) — and returns text;
none of them replays or looks inside the engine, so a result stored as JSON prints the same.
"""
from __future__ import annotations

from dataclasses import is_dataclass

from ..filenames import shown_name
from ..machine.metrics import PARTS
from ..units import fmt_bytes, fmt_count, fmt_seconds


def _fields(result) -> dict:
    """A result's fields by name: its dict form as it is, a dataclass's own (not copied) attributes."""
    return vars(result) if is_dataclass(result) else result


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _options(options: dict) -> str:
    """``k=v,...``; a list is a tuple read back from JSON (option values are immutable), shown as one."""
    return ",".join(f"{k}={tuple(v) if isinstance(v, list) else v}" for k, v in options.items())


def oom_line(oom) -> str:
    """One OOM: the event, the request and the pool's state (the report's and stderr's OOM line)."""
    o = _fields(oom)
    return (f"event {o['event']}: {fmt_bytes(o['size'])} request with {fmt_bytes(o['live_bytes'])} live, "
            f"{fmt_bytes(o['allocated_bytes'])} allocated, {fmt_bytes(o['reserved_bytes'])} reserved, "
            f"largest-free frag {_pct(o['largest_free_fragmentation'])}")


def breakdown_line(b: dict | None) -> str:
    """A free breakdown in one line: reserved - requested, then its four parts (``n/a``: the policy cannot say)."""
    if b is None:
        return f"{'n/a':>12}"
    return (f"{fmt_bytes(b['reserved'] - b['requested']):>12}   "
            + " + ".join(f"{p} {fmt_bytes(b[p])}" for p in PARTS))


def phase_lines(shares: dict, allocs: int, peak: str) -> list[str]:
    """What each phase of a run (PHASE scopes: compilation, autotuning, ...) requested, and the live bytes it
    held at ``peak`` (`allocsim.trace.phases.PhaseTally.summary`; ``allocs``: the trace's requests)."""
    live = shares["live_bytes"]
    where = f"event {shares['event']:,}" if shares["event"] is not None else "not reached"
    lines = [f"  phases: requests made inside them, and their live bytes at {peak} ({where}, "
             f"{fmt_bytes(live)} live)"]
    for name, p in shares["phases"].items():
        lines.append(f"    {name:<12} {p['scopes']:>7,} scopes {p['requests']:>10,} requests "
                     f"({100 * p['requests'] / max(allocs, 1):.1f}%, {fmt_bytes(p['request_bytes'])})"
                     f"   {fmt_bytes(p['live_bytes'])} live ({100 * p['live_bytes'] / max(live, 1):.1f}%)")
    return lines


def breakdown_shares(b: dict | None) -> str:
    """The four parts as percentages of reserved, ``h/s/st/r`` (a table cell); ``n/a`` when the policy cannot say."""
    if b is None:
        return "n/a"
    return "/".join(f"{100 * b[p] / b['reserved']:.1f}" if b["reserved"] else "0" for p in PARTS)


def replay_summary(result, trace_allocs: int | None = None) -> str:
    """The human summary ``allocsim replay`` prints above the section table. ``trace_allocs``: the trace's requests,
    which a replay stopped at an OOM names beside those it replayed (its ``allocs``, not the trace's)."""
    r = _fields(result)
    capacity = fmt_bytes(r["capacity_bytes"]) if r["capacity_bytes"] is not None else "unlimited"
    lat = r["latency"]
    lines = [
        f"policy {r['policy']}  runtime {r['runtime']}  cap {fmt_bytes(r['cap_bytes'])}  capacity {capacity}"
        + (f"  options {_options(r['options'])}" if r["options"] else ""),
        f"trace {r['trace'] or '-'}: {fmt_count(r['events'])} events, {fmt_count(r['allocs'])}"
        + ("" if r["completed"] or trace_allocs is None else f" of {fmt_count(trace_allocs)}") + " allocs"
        + ("" if r["completed"] else " replayed  (stopped at the first OOM)"),
        "",
        f"  LOAD (peak live)         {fmt_bytes(r['load_bytes']):>12}",
        f"  peak allocated           {fmt_bytes(r['peak_allocated_bytes']):>12}",
        f"  peak reserved            {fmt_bytes(r['peak_reserved_bytes']):>12}"
        f"   (final {fmt_bytes(r['final_reserved_bytes'])})",
        f"  utilization              {100 * r['utilization']:>11.1f}%   fragmentation {100 * r['fragmentation']:.1f}%",
        f"  overhead vs LOAD         {100 * r['overhead_vs_load']:>11.1f}%" + _refused_note(r),
        f"  largest-free frag @peak  {_pct(r['largest_free_fragmentation_at_peak']):>12}",
        f"  reserved - live @peak    {breakdown_line(r.get('breakdown_at_peak'))}",
        f"  device mallocs / frees   {r['device_mallocs']:>12,} / {r['device_frees']:,}"
        f"   ({fmt_bytes(r['device_malloc_bytes'])} / {fmt_bytes(r['device_free_bytes'])})",
        f"  cache flushes            {r['cache_flushes']:>12,}",
        f"  GC calls incr / full     {r['gc_incremental']:>12,} / {r['gc_full']:,}"
        f"   ({fmt_seconds(r['gc_time_seconds'])} paused, {fmt_bytes(r['gc_reclaimed_bytes'])} reclaimed)",
        f"  OOMs                     {r['ooms']:>12,}"
        + ("   (not survived; those the program survives below)" if r.get("caught_ooms") else ""),
    ]
    lines += [f"    {oom_line(o)}" + ("  (recorded OOM)" if _fields(o).get("recorded") else "")
              for o in r["oom_events"][:5]]
    lines += [f"    recorded OOM at event {at}: served under this policy/setting (would not have happened)"
              for at in r.get("ooms_avoided", ())[:5]]
    if r.get("caught_ooms"):
        lines.append(f"  OOMs survived            {r['caught_ooms']:>12,}   (the program catches them and goes on: "
                     f"the replay went on without the request" + (
                         f"; its tries dropped {r['unwound_blocks']:,} blocks and skipped {r['skipped_allocs']:,} "
                         f"requests" if r.get("unwound_blocks") or r.get("skipped_allocs") else "") + ")")
        lines += [f"    {oom_line(o)}" + (f"  (in try \"{_fields(o)['scope']}\")" if _fields(o).get("scope") else "")
                  for o in r["caught_oom_events"][:3]]
    if lat:
        lines.append(f"  malloc latency ({'measured' if r['latency_measured'] else 'modeled'}) "
                     f"p50 {fmt_seconds(lat['p50'])}  p99 {fmt_seconds(lat['p99'])}"
                     f"  max {fmt_seconds(lat['max'])}  total {fmt_seconds(r['alloc_time_seconds'])}")
    shown = {k: v for k, v in r["counters"].items() if k != "cache_flushes"}
    if shown:                       # the policy's own names and counts, apart from the figures above (metrics.md)
        lines.append(f"  {r['policy']}'s own counters")
    for k, v in shown.items():      # (a counter named as a figure of the result's, said to be the policy's own)
        note = (f"   (every OOM PyTorch counts: the {r['caught_ooms']:,} survived too)"
                if k == "num_ooms" and r.get("caught_ooms") else "")
        k = f"{k} (policy counter)" if k in r else k
        lines.append(f"    {k.replace('_', ' '):<22} {v:>12,}{note}" if isinstance(v, int) else f"    {k}: {v}")
    lines.append(f"  load {r['load_seconds']:.3f}s  replay {r['replay_seconds']:.3f}s  "
                 f"total {r['load_seconds'] + r['replay_seconds']:.3f}s")
    folded = getattr(result, "folded", None)
    if folded:
        lines.append(f"  {folded_line(folded)}")
    return "\n".join(lines)


def _refused_note(r: dict) -> str:
    """Beside ``overhead vs LOAD`` where the program survived OOMs: LOAD counts the requests this replay refused (and
    those an unwound try skipped), which it went on without, so its peak may lie below LOAD (docs/metrics.md)."""
    if not r.get("caught_ooms"):
        return ""
    n, skipped = r["caught_ooms"], r.get("skipped_allocs") or 0
    return (f"   (LOAD counts the {n:,} request{'s' * (n > 1)} refused and survived"
            + (f" and the {skipped:,} an unwound try skipped" if skipped else "") + ": no lower bound for this run)")


def survived_note(rows: list[dict]) -> str:
    """The line under a compare table some of whose rows survived OOMs: their ``over LOAD`` is against a LOAD that
    counts the requests they refused (`_refused_note`); "" when none did."""
    if not any(r.get("caught_ooms") for r in rows):
        return ""
    return ("over LOAD: a row with OOMs survived went on without the requests it refused, which LOAD counts: "
            "no lower bound for that row")


def folded_line(folded: dict) -> str:
    """How much of a replay was folded (`ReplayResult.folded`): its repeats added, not walked (allocsim/engine/fold.py)."""
    more = f", {folded['folds']} folds" if folded["folds"] > 1 else ""
    return (f"folded {fmt_count(folded['steps'])} of {fmt_count(folded['of_steps'])} steps "
            f"(period {folded['period']} from step {folded['from_step']}{more}; "
            f"{fmt_count(folded['events'])} events not walked; --no-fold walks them)")


def section_table(rows: list[dict], title: str | None = None) -> str:
    """The section table in the layout of the CuArrays TimerOutputs tables, from a result's ``sections``
    rows (``{name, depth, ncalls, seconds}``, depth-first)."""
    total = sum(r["seconds"] for r in rows if r["depth"] == 0) or 1.0
    width = max([len("Section")] + [2 * r["depth"] + len(r["name"]) for r in rows]) + 2
    lines = [f" {title}"] if title else []
    head = f" {'Section':<{width}}{'ncalls':>8} {'time':>8} {'%tot':>6} {'avg':>8}"
    rule = " " + "─" * (len(head) - 1)
    lines += [rule, head, rule]
    for r in rows:
        name = "  " * r["depth"] + r["name"]
        avg = r["seconds"] / r["ncalls"] if r["ncalls"] else 0.0
        pct = 100 * r["seconds"] / total
        pct_s = f"{pct:.3g}%" if pct >= 0.01 or pct == 0 else "<0.01%"
        lines.append(f" {name:<{width}}{fmt_count(r['ncalls']):>8} {fmt_seconds(r['seconds']):>8} "
                     f"{pct_s:>6} {fmt_seconds(avg):>8}")
    lines.append(rule)
    return "\n".join(lines)


def row_label(row: dict) -> str:
    """How a table or a plot names a row's (or a fit's) policy: ``torch[expandable_segments:True]``."""
    return f"{row['policy']}[{row['options']}]" if row.get("options") else row["policy"]


def trace_heading(path: str, trace) -> str:
    """The line above the compare table: the trace's size and LOAD."""
    return f"{shown_name(path)}: {len(trace):,} events, {trace.n_allocs:,} allocs, LOAD {fmt_bytes(trace.load_bytes)}"


def cap_spelling(cap_bytes: int | None, cap_text: dict | None = None) -> str:
    """``none``, ``4GiB`` or ``3.5GB (3.26 GiB)``: a cap as the user wrote it (``cap_text``: bytes to their
    text), the binary size beside a decimal spelling so that it is not mistaken for the GiB the tables print."""
    if cap_bytes is None:
        return "none"
    text = (cap_text or {}).get(cap_bytes)
    if not text:
        return fmt_bytes(cap_bytes)
    return text + ("" if text.lower().endswith("ib") else f" ({fmt_bytes(cap_bytes)})")


def compare_table(rows: list[dict], cap_text: dict | None = None) -> str:
    """The comparison table: one line per policy × cap × runtime, from compare/sweep rows; caps as the user
    wrote them where ``cap_text`` says (`cap_spelling`)."""
    head = ["policy", "cap", "runtime", "peak reserved", "util", "over LOAD", "dev mallocs", "flushes",
            "GC inc/full", "OOM", "alloc time", "p99 malloc"]
    body = []
    for r in rows:
        body.append([
            row_label(r),
            cap_spelling(r["cap_bytes"], cap_text), r["runtime"],
            fmt_bytes(r["peak_reserved_bytes"]), f"{100 * r['utilization']:.1f}%",
            f"{100 * r['overhead_vs_load']:+.1f}%", f"{r['device_mallocs']:,}", f"{r['cache_flushes']:,}",
            f"{r['gc_incremental']}/{r['gc_full']}", oom_cell(r), fmt_seconds(r["alloc_time_seconds"]),
            fmt_seconds(r["latency_p99"] or 0)])
    return aligned_table(head, body, left=3)


def oom_cell(r: dict) -> str:
    """A row's OOM cell: where it ran out (``@event``) or ``-``, and the OOMs the program survived (it lives through
    them)."""
    oom = f"@{r['first_oom_event']}" if r.get("first_oom_event") is not None else "-"
    return oom + (f" ({r['caught_ooms']:,} survived)" if r.get("caught_ooms") else "")


def breakdown_table(rows: list[dict], cap_text: dict | None = None) -> str:
    """``compare --breakdown``: per row, why reserved > live requested bytes at the reserved peak; caps as
    `compare_table` shows them."""
    head = ["policy", "cap", "runtime", "event", "reserved", "live", "reserved - live", *PARTS]
    body = []
    for r in rows:
        b = r.get("breakdown_at_peak")
        cells = ([f"{b['event']:,}", fmt_bytes(b["reserved"]), fmt_bytes(b["requested"]),
                  fmt_bytes(b["reserved"] - b["requested"])] + [fmt_bytes(b[p]) for p in PARTS]
                 if b else ["n/a"] + ["-"] * (len(head) - 4))
        body.append([row_label(r), cap_spelling(r["cap_bytes"], cap_text), r["runtime"], *cells])
    return aligned_table(head, body, left=3)


def aligned_table(head: list[str], body: list[list[str]], left: int) -> str:
    """Columns two spaces apart, each as wide as its widest cell: the first ``left`` flush left, the rest right."""
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]

    def line(cols):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))

    return "\n".join([line(head), line(["─" * w for w in widths])] + [line(b) for b in body])


def row_sections(row: dict) -> str:
    """``compare --sections``: a row's heading line and the section table of the rows it carries."""
    return f"\n{row_label(row)} cap {fmt_bytes(row['cap_bytes'])} {row['runtime']}\n{section_table(row['sections'])}"


def by_capacity(fits: list[dict]) -> list[dict]:
    """Fits ordered by safe capacity, those with none (OOM even without a cap) last."""
    return sorted(fits, key=lambda f: (f["capacity_bytes"] is None, f["capacity_bytes"] or 0))


def fit_table(fit: dict, max_replays: int, note: str | None = None) -> str:
    """``allocsim fit``'s table from a fit result (`commands.fit.frontier`); a capacity whose walk stopped
    after ``max_replays`` replays is marked ``*``, with a note saying what that means. ``note``, a line under the
    heading (`commands._common.recorded_settings`: the trace's allocator settings a plain ``torch`` label hides)."""
    load = fit["load_bytes"]
    lines = [f"{fit['trace']}: LOAD {fmt_bytes(load)}"
             + (f", oracle peak {fmt_bytes(fit['oracle_peak_bytes'])}" if "oracle_peak_bytes" in fit else "")]
    lines += [note] if note else []
    w = max([len("policy")] + [len(row_label(f)) for f in fit["fits"]]) + 2
    lines.append(f"{'policy':<{w}}{'safe capacity':>14}{'vs LOAD':>10}{'island below':>14}{'no-limit peak':>16}"
                 f"{'replays':>9}")
    for f in by_capacity(fit["fits"]):
        cap, island = f["capacity_bytes"], f["island_bytes"]
        vs = f"{100 * (cap / load - 1):+.1f}%" if cap is not None and load else "-"
        shown = "none (OOM)" if cap is None else fmt_bytes(cap) + ("" if f["threshold"] else "*")
        lines.append(f"{row_label(f):<{w}}{shown:>14}{vs:>10}"
                     f"{fmt_bytes(island) if island is not None else '-':>14}"
                     f"{fmt_bytes(f['unlimited_peak_bytes']):>16}{f['replays']:>9}")
    lines.append(f"safe: every capacity from it up to the no-limit peak ({fmt_bytes(fit['resolution_bytes'])} grid) "
                 f"replayed without OOM; island: a smaller capacity that passes, below one that fails")
    lines += [f"{row_label(f)}: at {fmt_bytes(f['capacity_bytes'])} the program lives through "
              f"{f['survived_ooms']:,} OOM{'s' if f['survived_ooms'] > 1 else ''} it catches (OOMs survived: "
              f"docs/allocator-dependent.md)" for f in by_capacity(fit["fits"]) if f.get("survived_ooms")]
    if not all(f["threshold"] for f in fit["fits"]):
        lines.append(f"*: the walk stopped after --max-replays {max_replays}: safe, but a lower safe capacity may "
                     f"exist")
    return "\n".join(lines)


def validation_summary(validation) -> str:
    """``allocsim validate``'s report: the checks side by side, the first divergence, the verdict."""
    from ..trace.events import KIND_NAMES
    v = _fields(validation)
    lines = [f"validate {v['trace'] or '-'}: framework {v['framework']}, model {v['policy']}"
             + (f" ({_options(v['options'])})" if v["options"] else ""),
             f"  compared: {', '.join(KIND_NAMES[k] for k in v['kinds_compared'])}"]
    if v["pre_existing"]:
        lines.append(f"  note: {v['pre_existing']} pre-existing blocks (ring buffer wrapped); the model is not "
                     f"seeded with the recorded layout, so early segment calls may differ (unseeded)")
    unseen = v.get("private_pool_segments") and not v.get("pool_events")
    if unseen:
        lines.append(f"  note: {v['private_pool_segments']} recorded segment allocations belong to private pools "
                     f"(torch.cuda.graph, torch.compile mode=\"reduce-overhead\", MemPool) whose calls the trace does "
                     f"not hold (no pool events): the model serves those requests from the default pools, so the "
                     f"segment calls, reserved bytes and OOMs below cannot be trusted")
    elif v.get("pool_events"):
        lines.append(f"  private pools: {v['pool_events']} pool events followed"
                     + (f", {v['private_pool_segments']} recorded segment allocations in them"
                        if v.get("private_pool_segments") else ""))
    if v.get("catches_oom"):
        lines.append(f"  note: {v['catches_oom']:,} requests the program survives failing (cuDNN workspace tries, "
                     f"flagged from C++ stacks); the replay follows them: one that fails is a caught OOM and the "
                     f"walk goes on without it (docs/allocator-dependent.md)")
    if v.get("try_scopes"):
        lines.append(f"  note: {v['try_scopes']:,} try scopes (code that catches an OOM raised inside it and goes on); "
                     f"the recorded run's OOMs are its OOM records, replayed as recorded; a request the model fails "
                     f"inside one is an OOM survived, where the recorded run served it: a divergence")
    width = max([22] + [len(c["name"]) + 2 for c in v["checks"]])     # the longest name still two blanks clear
    lines.append(f"  {'check':<{width}}{'recorded':>14}{'model':>14}")
    for c in v["checks"]:
        fmt = fmt_bytes if c["name"].endswith("reserved") else str
        lines.append(f"  {c['name']:<{width}}{fmt(c['recorded']):>14}{fmt(c['model']):>14}   "
                     f"{'shown' if c['ok'] is None else 'ok' if c['ok'] else 'MISMATCH'}")
    d = v["first_divergence"]
    if d:
        lines.append(f"  first divergence at segment event #{d['index']}:")
        for side in ("recorded", "model"):
            s = d[side]
            if s is None:
                lines.append(f"    {side:<9} (no more segment events; reserved {fmt_bytes(d[side + '_reserved'])})")
            else:
                request = "no later ALLOC" if s["request"] < 0 else f"for the ALLOC at {s['request']}"
                lines.append(f"    {side:<9} event {s['event']} ({request}): "
                             f"{s['kind']} {fmt_bytes(s['size'])} "
                             f"(reserved {fmt_bytes(s['reserved_before'])} -> {fmt_bytes(s['reserved_after'])})")
    verdict = "MATCH" if v["match"] else "MISMATCH"
    lines.append(f"verdict: {verdict}" + (" (unseeded)" if v["pre_existing"] and not v["seeded"] else "")
                 + (" (private pools: not modelled)" if unseen else ""))
    return "\n".join(lines)
