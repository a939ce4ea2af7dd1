"""The text report of `allocsim tune`: the line to paste, the table, the OOM rescue (reads a `Tuning`)."""
from __future__ import annotations

from ..units import fmt_bytes, fmt_seconds
from .text import aligned_table, breakdown_shares


def tune_report(res, took: float) -> str:
    """The text report: target, search figures, the line to paste, the table, the OOM rescue."""
    tgt = res.target
    where = (f"capacity {fmt_bytes(tgt.capacity)}" if tgt.capacity is not None else "no capacity limit") + \
        (f", cap {fmt_bytes(tgt.cap)}" if tgt.cap is not None else "")
    lines = [f"{res.trace}: LOAD {fmt_bytes(res.load_bytes)}; target {where}; objective {res.objective}",
             f"searched {res.settings_total} settings, {res.settings_distinct} distinct on this trace"
             + (f", the first {len(res.rows)} replayed (--max-replays)" if res.bounded else "")
             + f"; {res.replays} replays in {took:.1f}s", ""]
    best = res.best
    if best is None:
        lines.append("no setting fits this target; the table shows the ones that got furthest")
    else:
        lines.append("recommended:" + (f" ({best['setting']}: already the best)" if best["recorded"] else ""))
        lines += [f"  {best[k]}" for k in ("conf", "legacy_conf") if best.get(k)]
        if best.get("note"):
            lines.append(f"  ({best['note']})")
    lines += ["", table(res.shown, res.load_bytes)]
    lines.append("fits on: the smallest device capacity from which every capacity up replays without OOM "
                 "(certified walk; * bounded); dominated: another setting is as good in reserved and time")
    lines.append(f"{WHY}: reserved - live at the reserved peak (at the first OOM for a setting that runs out), "
                 "in % of reserved: free beside live blocks / in wholly free segments / in other streams' pools / "
                 "rounding inside blocks")
    for o in res.rescue:
        lines.append(f"recorded OOM at event {o['event']} ({fmt_bytes(o['size'])} request): under the recorded "
                     f"settings {rescued(o['recorded'])}; served by {len(o['served_by'])} of {len(res.rows)} settings"
                     + (f", most headroom under {o['served_by'][0]['setting']}"
                        + _headroom(o["served_by"][0]["headroom_bytes"]) if o["served_by"] else ""))
    return "\n".join(lines)


def rescued(o: dict) -> str:
    """What one setting does with a recorded failed request."""
    if not o["reached"]:
        return "it runs out earlier"
    return "it is served" + _headroom(o["headroom_bytes"]) if o["served"] else "it fails again"


def _headroom(room) -> str:
    return f" ({fmt_bytes(room)} headroom left)" if room is not None else ""


#: The table's free-breakdown column.
WHY = "hard/soft/stream/round %"


def table(rows: list[dict], load: int) -> str:
    head = ["setting", "peak reserved", "over LOAD", "OOM", "dev mallocs/frees", "retries", "alloc time", "fits on", WHY]
    body = []
    for r in rows:
        if "fit_capacity_bytes" in r:
            fits = r["fit_capacity_bytes"]
            fits = "none" if fits is None else fmt_bytes(fits) + ("" if r["fit_threshold"] else "*")
        else:
            fits = "-" if r["pareto"] or r["recorded"] else "dominated"
        body.append([r["setting"], fmt_bytes(r["peak_reserved_bytes"]), f"{100 * r['overhead_vs_load']:+.1f}%",
                     "-" if r["first_oom_event"] is None else f"@{r['first_oom_event']}",
                     f"{r['device_mallocs']:,} / {r['device_frees']:,}", f"{r['retries']:,}",
                     fmt_seconds(r["alloc_time_seconds"]), fits, breakdown_shares(r.get("breakdown"))])
    return aligned_table(head, body, left=1)
