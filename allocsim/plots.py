"""Pictures of replays, drawn with matplotlib's Agg backend (no display needed).

Each function takes figures already computed (replay results, comparison rows, a
fit frontier) and writes one PNG (or SVG): readers and reporters stay separate.
Long traces are decimated to a few thousand points, keeping each bucket's maximum
so peaks survive.
"""
from __future__ import annotations

import html
import os

import numpy as np

GiB, MiB = 1 << 30, 1 << 20


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _unit(maxbytes: float):
    return (GiB, "GiB") if maxbytes >= GiB else (MiB, "MiB")


def _decimate_max(x: np.ndarray, y: np.ndarray, n: int = 4000):
    if len(x) <= n:
        return x, y
    edges = np.linspace(0, len(x), n + 1).astype(int)
    return x[edges[:-1]], np.maximum.reduceat(y, edges[:-1])


def _time_axis(trace):
    t = np.asarray(trace.time_ns, dtype=np.float64)
    if len(t) and t[-1] > t[0]:
        return t / 1e9, "time (s)"
    return np.arange(len(trace), dtype=np.float64), "event"


def _save(fig, path: str):
    from .outputs import atomic_path
    fmt = "svg" if path.endswith(".svg") else "png"
    import matplotlib
    with atomic_path(path) as tmp, matplotlib.rc_context({"svg.fonttype": "none"}):   # SVG keeps text as text
        fig.savefig(tmp, format=fmt, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def _title(trace, what: str) -> str:
    name = os.path.basename(trace.path) if trace.path else "trace"
    return f"{what} — {name}"


def memory_timeline(trace, results: dict, path: str):
    """Live bytes and each policy's reserved bytes on one time axis; marks shaded; OOMs marked."""
    plt = _plt()
    tx, xlabel = _time_axis(trace)
    live = trace.live_curve
    peak = max([int(live.max()) if len(live) else 0] + [max(r.timeline["reserved"] or [0]) for r in results.values()])
    scale, unit = _unit(peak)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    marks = [i for i, _ in trace.marks()]
    for k in range(0, len(marks) - 1, 2):
        ax.axvspan(tx[marks[k]], tx[marks[k + 1]], color="0.92", lw=0)
    xs, ys = _decimate_max(tx, live)
    ax.plot(xs, ys / scale, color="k", lw=1.2, label="live (requested)")
    for label, r in results.items():
        ev = np.asarray(r.timeline["event"], dtype=np.int64)
        if not len(ev):
            continue
        res = np.asarray(r.timeline["reserved"], dtype=np.float64)
        line, = ax.step(tx[ev], res / scale, where="post", lw=1.1, label=f"{label} reserved")
        for o in r.timeline.get("oom_events", []):
            ax.plot([tx[o]], [r.oom_events[0].reserved_bytes / scale], "x", ms=10, mew=2, color=line.get_color())
    if any(r.ooms for r in results.values()):
        ax.plot([], [], "kx", label="OOM")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(bottom=0)
    ax.set_title(_title(trace, "Memory over time" + (" (iterations shaded)" if marks else "")))
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _label(r):
    from .units import fmt_bytes
    cap = "no cap" if r["cap_bytes"] is None else f"cap {fmt_bytes(r['cap_bytes'], 1)}"
    return cap + ("" if r["runtime"] == "eager" else f" ({r['runtime']})")


def _grouped(ax, rows, value, ylabel, log=False):
    """Bars per policy, one colour per cap/runtime; runs that stopped at an OOM are hatched."""
    from .sweep import policy_label
    pols = list(dict.fromkeys(policy_label(r["policy"], tuple(filter(None, (r.get("options") or "").split(";"))))
                              for r in rows))
    groups = list(dict.fromkeys(_label(r) for r in rows))
    width = 0.8 / max(1, len(groups))
    for gi, g in enumerate(groups):
        vals, oom = [], []
        for p in pols:
            match = [r for r in rows if _label(r) == g and
                     policy_label(r["policy"], tuple(filter(None, (r.get("options") or "").split(";")))) == p]
            vals.append(value(match[0]) if match else np.nan)
            oom.append(bool(match and match[0]["ooms"]))
        bars = ax.bar(np.arange(len(pols)) + gi * width - 0.4 + width / 2, vals, width, label=g)
        for b, o in zip(bars, oom):
            if o:
                b.set_hatch("///")
                b.set_edgecolor("k")
    if log:
        ax.set_yscale("log")
    ax.set_xticks(np.arange(len(pols)))
    ax.set_xticklabels(pols, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def comparison_bars(trace, rows: list[dict], path: str):
    """Peak reserved, utilization, device mallocs and modeled allocation time per policy × cap."""
    plt = _plt()
    peak = max([r["peak_reserved_bytes"] for r in rows] + [trace.load_bytes, 1])
    scale, unit = _unit(peak)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    _grouped(axes[0, 0], rows, lambda r: r["peak_reserved_bytes"] / scale, f"peak reserved ({unit})")
    axes[0, 0].axhline(trace.load_bytes / scale, color="k", ls="--", lw=1, label="LOAD")
    _grouped(axes[0, 1], rows, lambda r: 100 * r["utilization"], "utilization (%)")
    _grouped(axes[1, 0], rows, lambda r: max(r["device_mallocs"], 1), "device mallocs (log)", log=True)
    _grouped(axes[1, 1], rows, lambda r: max(1e3 * r["alloc_time_seconds"], 1e-3), "modeled allocation time (ms, log)",
             log=True)
    if any(r["ooms"] for r in rows):
        from matplotlib.patches import Patch
        axes[0, 0].legend(handles=axes[0, 0].get_legend_handles_labels()[0]
                          + [Patch(facecolor="white", edgecolor="k", hatch="///", label="stopped at an OOM")],
                          fontsize=7)
    else:
        axes[0, 0].legend(fontsize=7)
    fig.suptitle(_title(trace, "Policies side by side"))
    fig.tight_layout()
    return _save(fig, path)


def frontier_plot(trace, fit: dict, path: str):
    """Safe capacity of each policy (and any smaller passing island), against LOAD and the oracle's peak."""
    from .fit import by_capacity, fit_label
    plt = _plt()
    fits = by_capacity(fit["fits"])
    scale, unit = _unit(max([f["capacity_bytes"] or 0 for f in fits] + [fit["load_bytes"], 1]))
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(fits) + 2))
    labels = [fit_label(f) + ("" if f["capacity_bytes"] is not None else " (OOM with no cap)") for f in fits]
    ax.barh(labels, [(f["capacity_bytes"] or 0) / scale for f in fits], color="tab:blue", label="safe capacity")
    islands = [(f["island_bytes"] / scale, label) for f, label in zip(fits, labels) if f["island_bytes"] is not None]
    if islands:
        ax.scatter([x for x, _ in islands], [y for _, y in islands], marker="x", color="tab:red", zorder=3,
                   label="island (passes below a failing capacity)")
    ax.axvline(fit["load_bytes"] / scale, color="k", ls="--", label="LOAD")
    if "oracle_peak_bytes" in fit:
        ax.axvline(fit["oracle_peak_bytes"] / scale, color="tab:green", ls=":", label="oracle peak")
    ax.set_xlabel(f"device capacity ({unit})")
    ax.set_title(_title(trace, "Capacity frontier: the smallest GPU each allocator is safe on"))
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def latency_cdf(trace, results: dict, path: str, measured: bool = False):
    """Cumulative distribution of per-malloc latency per policy (log scale)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for label, r in results.items():
        q = np.asarray(r.timeline.get("latency_quantiles") or [], dtype=np.float64)
        if len(q):
            ax.step(np.maximum(q, 1e-9) * 1e6, np.linspace(0, 1, len(q)), where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel(f"malloc latency, {'measured' if measured else 'modeled'} (μs)")
    ax.set_ylabel("fraction of mallocs")
    ax.set_title(_title(trace, "Malloc latency CDF"))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def gc_plot(trace, rows: list[dict], path: str):
    """GC calls (incremental, full) and GC time per policy under each cap."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    _grouped(axes[0], rows, lambda r: r["gc_incremental"] + r["gc_full"], "GC calls (incremental + full)")
    axes[0].set_title("hatched: stopped at an OOM", fontsize=8)
    _grouped(axes[1], rows, lambda r: r["gc_time_seconds"], "GC pause time (s, modeled)")
    axes[0].legend(fontsize=7)
    fig.suptitle(_title(trace, "Garbage collections per policy and cap"))
    fig.tight_layout()
    return _save(fig, path)


def index_html(outdir: str, trace, images: list[tuple[str, str]], table_rows: list[dict], fit: dict | None) -> str:
    """An index.html that shows the pictures with the comparison table."""
    from .outputs import atomic_open
    from .sweep import format_table
    from .units import fmt_bytes
    name = os.path.basename(trace.path or "trace")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>allocsim report — {html.escape(name)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}pre{font-size:12px;"
             "background:#f6f6f6;padding:1em;overflow-x:auto}img{max-width:100%;border:1px solid #ddd}</style></head><body>",
             f"<h1>allocsim report — {html.escape(name)}</h1>",
             f"<p>{len(trace):,} events, {trace.n_allocs:,} allocations, LOAD {fmt_bytes(trace.load_bytes)}.</p>",
             "<h2>Comparison</h2><pre>" + html.escape(format_table(table_rows)) + "</pre>"]
    if fit:
        from .fit import by_capacity, fit_label
        parts.append("<h2>Capacity frontier (safe capacity, island below)</h2><pre>" + "\n".join(
            f"{fit_label(f):<34} {fmt_bytes(c) if (c := f['capacity_bytes']) is not None else 'none (OOM)':>12}"
            f"{'  island ' + fmt_bytes(f['island_bytes']) if f['island_bytes'] is not None else ''}"
            for f in by_capacity(fit["fits"])) + "</pre>")
    for title, img in images:
        parts.append(f"<h2>{html.escape(title)}</h2><img src='{html.escape(img)}' alt='{html.escape(title)}'>")
    parts.append("</body></html>")
    path = os.path.join(outdir, "index.html")
    with atomic_open(path) as f:
        f.write("\n".join(parts))
    return path
