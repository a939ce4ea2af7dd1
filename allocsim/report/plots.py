"""Pictures of replays, drawn with matplotlib's Agg backend (no display needed).

Each ``*_figure`` function takes figures already computed (replay results,
comparison rows, a fit frontier) and returns a matplotlib figure; the writer
beside it saves that figure as PNG, SVG or PDF: readers and reporters stay
separate, and tests can inspect the figure.

Conventions shared by every picture, so that a report reads as one:
each policy keeps one colour, marker and line style (`policy_styles`); caps are
labelled as the user wrote them, with the binary size beside a decimal one
(``cap 3.5GB (3.26 GiB)``); legends sit outside the data area; runs that
stopped at an OOM are hatched and labelled; counts and times spanning decades
use log axes, where a zero is written as "0" instead of vanishing.
Long traces are decimated to a few thousand points, keeping each bucket's
maximum so peaks survive.
"""
from __future__ import annotations

import os

import numpy as np

from ..filenames import shown_name
from ..machine.metrics import PARTS
from ..units import fmt_bytes
from .text import by_capacity, cap_spelling, row_label

GiB, MiB = 1 << 30, 1 << 20
FORMATS = (".png", ".svg", ".pdf")
LINESTYLES = ("-", "--", "-.", ":")
OOM_HATCH = "///"
#: One colour per part of the free breakdown (`breakdown_figure`).
PART_COLORS = {"hard": "tab:red", "soft": "tab:blue", "stream": "tab:purple", "rounding": "0.6"}
PART_HELP = {"hard": "hard: free beside live blocks", "soft": "soft: free in wholly free segments",
             "stream": "stream: free in other streams' pools", "rounding": "rounding: inside allocated blocks"}


def _matplotlib():
    """matplotlib, on its Agg backend. It is imported without ``MPLBACKEND``: allocsim draws to files with Agg
    whatever the environment says, and matplotlib's import refuses (a ValueError) a backend it does not know."""
    saved = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib
    finally:
        if saved is not None:
            os.environ["MPLBACKEND"] = saved
    matplotlib.use("Agg", force=True)
    return matplotlib


def _plt():
    _matplotlib()
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
                         "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 12})
    return plt


def _unit(maxbytes: float):
    return (GiB, "GiB") if maxbytes >= GiB else (MiB, "MiB")


def _decimate_max(x: np.ndarray, y: np.ndarray, n: int = 4000):
    if len(x) <= n:
        return x, y
    edges = np.linspace(0, len(x), n + 1).astype(int)
    return x[edges[:-1]], np.maximum.reduceat(y, edges[:-1])


def _time_axis(trace):
    """Seconds since the trace's first event (a recording starts when the program does, not at 0)."""
    t = np.asarray(trace.time_ns, dtype=np.float64)
    if len(t) and t[-1] > t[0]:
        return (t - t[0]) / 1e9, "time since the trace's first event (s)"
    return np.arange(len(trace), dtype=np.float64), "event index"


def picture_format(path: str) -> str:
    """The format a picture path asks for (png, svg, pdf), from its extension; '' if none of them."""
    ext = os.path.splitext(path)[1].lower()
    return ext[1:] if ext in FORMATS else ""


def save(fig, path: str) -> str:
    """Write ``fig`` whole to ``path`` (PNG, SVG or PDF by extension) and close it."""
    from ..outputs import atomic_path
    matplotlib = _matplotlib()
    fmt = picture_format(path)
    if not fmt:
        raise ValueError(f"{path}: not a .png, .svg or .pdf path")
    with atomic_path(path) as tmp, matplotlib.rc_context({"svg.fonttype": "none"}):   # SVG keeps text as text
        fig.savefig(tmp, format=fmt, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def _title(trace, what: str, setting: str = "") -> str:
    name = shown_name(os.path.basename(trace.path)) if trace.path else "trace"
    return f"{what} — {name}" + (f"\n{setting}" if setting else "")


def _notes_an_empty_trace(what: str):
    """A picture function drawing, for a trace without allocations, a note saying so instead of blank axes."""
    import functools

    def wrap(figure):
        @functools.wraps(figure)
        def draw(trace, *args, **kw):
            if trace.n_allocs:
                return figure(trace, *args, **kw)
            fig, ax = _plt().subplots(figsize=(6, 3), layout="constrained")
            fig.suptitle(_title(trace, what, kw.get("setting", "")))
            _nothing_to_plot(ax, "the trace holds no allocation")
            return fig
        return draw
    return wrap


def _nothing_to_plot(ax, why: str) -> None:
    """A note in the middle of empty axes, instead of blank axes that look like a failed drawing."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, f"nothing to plot: {why}", ha="center", va="center", transform=ax.transAxes, fontsize=10,
            color="0.3")


#: Each built-in policy's look: a tab10 colour index, a marker and a line style, fixed so that a policy looks the
#: same in every report whatever ``--policies`` says (and no two differ in dash style alone).
POLICY_LOOKS = {"binned": (0, "o", "-"), "split": (1, "s", "--"), "knet": (2, "D", "-."), "torch": (3, "^", "-"),
                "cupy": (4, "v", "--"), "none": (5, "<", ":"), "simple": (6, ">", "-."), "oracle": (7, "*", ":"),
                "bestfit": (9, "P", "-.")}
#: The marker of a built-in's light shade (a setting with options), by its hue; markers of any other label
#: (no "x" or "X": the frontier's islands are crosses).
SHADE_MARKERS = "hHdp8hdH8p"
OTHER_MARKERS = "ph8Hd"


def policy_styles(labels) -> dict:
    """One colour, marker and line style per policy label, in the order given, the same in every report.

    A built-in policy has its own (`POLICY_LOOKS`); its first setting with options
    (``torch[expandable_segments:True]``), a reference model or a real allocator of it takes the light shade of
    its hue with another marker and line style; anything else (a plug-in, a further setting) a colour chosen by
    its label (a checksum, so stable across reports) among those no built-in uses.
    """
    import zlib

    matplotlib = _matplotlib()
    from matplotlib.colors import to_hex
    tab20, others = (lambda k, m=matplotlib.colormaps[name]: to_hex(m(k)) for name in ("tab20", "tab20b"))
    out, shaded = {}, set()
    for lab in dict.fromkeys(labels):
        base = lab.split("[", 1)[0]
        base = base.rsplit("-", 1)[0] if base.endswith(("-ref", "-real")) else base
        crc = zlib.crc32(lab.encode())
        if lab in POLICY_LOOKS:
            hue, marker, ls = POLICY_LOOKS[lab]
            out[lab] = {"color": tab20(2 * hue), "marker": marker, "ls": ls}
        elif base in POLICY_LOOKS and base not in shaded:
            shaded.add(base)
            hue, marker, ls = POLICY_LOOKS[base]
            out[lab] = {"color": tab20(2 * hue + 1), "marker": SHADE_MARKERS[hue],
                        "ls": LINESTYLES[(LINESTYLES.index(ls) + 1) % len(LINESTYLES)]}
        else:
            out[lab] = {"color": others(crc % 20), "marker": OTHER_MARKERS[crc % len(OTHER_MARKERS)],
                        "ls": LINESTYLES[crc % len(LINESTYLES)]}
    return out


def cap_label(cap_bytes: int | None, cap_text: dict | None = None) -> str:
    """``no cap``, ``cap 4GiB``, or ``cap 3.5GB (3.26 GiB)``: the user's spelling, then the binary size
    (`cap_spelling`), so that a ``4GB`` cap is not mistaken for the ``3.73 GiB`` the tables print."""
    return "no cap" if cap_bytes is None else f"cap {cap_spelling(cap_bytes, cap_text)}"


def _outside_legend(fig, handles, ncol=None):
    """A figure legend below every axes, so that it never covers data."""
    ncol = ncol or min(4, len(handles))
    return fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False)


@_notes_an_empty_trace("Memory over time")
def memory_figure(trace, results: dict, *, styles=None, cap_text=None, setting=""):
    """Live bytes and each policy's reserved bytes on one time axis; iterations shaded; OOMs marked."""
    plt = _plt()
    styles = styles or policy_styles(results)
    tx, xlabel = _time_axis(trace)
    live = trace.live_curve
    peak = max([int(live.max()) if len(live) else 0] + [max(r.timeline["reserved"] or [0]) for r in results.values()])
    scale, unit = _unit(peak)
    fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
    marks = [i for i, _ in trace.marks()]
    for k in range(0, len(marks) - 1, 2):
        ax.axvspan(tx[marks[k]], tx[marks[k + 1]], color="0.92", lw=0)
    xs, ys = _decimate_max(tx, live)
    ax.plot(xs, ys / scale, color="k", lw=1.4, label="live (requested)")
    for label, r in results.items():
        ev = np.asarray(r.timeline["event"], dtype=np.int64)
        if not len(ev):
            continue
        st = styles[label]
        res = np.asarray(r.timeline["reserved"], dtype=np.float64)
        ax.step(tx[ev], res / scale, where="post", lw=1.3, color=st["color"], ls=st["ls"], label=f"{label} reserved")
        for o in r.oom_events:
            ax.plot([tx[o.event]], [o.reserved_bytes / scale], "X", ms=11, mec="k", color=st["color"])
    caps = {r.cap_bytes for r in results.values()}
    if len(caps) == 1 and None not in caps:
        cap = caps.pop()
        ax.axhline(cap / scale, color="0.3", ls=(0, (1, 3)), lw=1.2, label=cap_label(cap, cap_text))
    if any(r.ooms for r in results.values()):
        ax.plot([], [], "X", ms=9, mec="k", color="0.6", ls="none", label="OOM (the replay stopped)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(bottom=0)
    start = tx[0] if len(tx) else 0
    end = tx[-1] if len(tx) and tx[-1] > start else start + 1     # one instant: a span, not matplotlib's warning
    ax.set_xlim(start, end)
    shaded = "; alternate iterations shaded" if len(marks) > 1 else ""
    ax.set_title(_title(trace, "Memory over time", setting + shaded))
    _outside_legend(fig, ax.get_legend_handles_labels()[0], ncol=3)
    ax.grid(alpha=0.3)
    return fig


def _plain(v, _pos=None) -> str:
    """A tick label as a plain number: 0.1, 1, 10, 1,000 (no 10^x, no 2×10^0)."""
    return f"{v:,.6g}"


def _log_axis(ax, which: str, lo: float, hi: float, *, bars: bool = False) -> None:
    """A log axis from just below ``lo`` to ``hi``, at least two decades, ticks as plain numbers.

    Two decades keep labelled powers of ten on the axis (a narrower log axis is
    labelled with 2×10^0-style minor ticks). For ``bars`` it starts at a power of
    ten at least twice below ``lo``, so that the shortest bar stays visible.
    """
    from matplotlib.ticker import FuncFormatter, NullFormatter
    e = np.floor(np.log10(lo))
    bottom = 10.0 ** (e - (lo < 2 * 10.0 ** e)) if bars else lo / 1.6
    getattr(ax, f"set_{which}scale")("log")
    getattr(ax, f"set_{which}lim")(bottom, max(hi, bottom * 100))
    getattr(ax, f"{which}axis").set_major_formatter(FuncFormatter(_plain))
    getattr(ax, f"{which}axis").set_minor_formatter(NullFormatter())


def _by_cap(rows, cap_text=None):
    """The caps of ``rows`` in the order the user gave them (else as they come), and each
    ``(policy label, cap)``'s row."""
    caps = list(dict.fromkeys(r["cap_bytes"] for r in rows))
    caps = [c for c in cap_text or {} if c in caps] or caps
    return caps, {(row_label(r), r["cap_bytes"]): r for r in rows}


def _grouped(ax, rows, value, ylabel, *, styles, cap_text=None, log=False, fmt="{:.3g}"):
    """Bars grouped by cap, one bar (and colour) per policy; OOM runs hatched and labelled, zeros written."""
    import matplotlib.transforms as mtrans
    pols = list(styles)
    caps, by = _by_cap(rows, cap_text)
    width = 0.84 / max(1, len(pols))
    base = mtrans.blended_transform_factory(ax.transData, ax.transAxes)
    for pi, p in enumerate(pols):
        xs = np.arange(len(caps)) - 0.42 + (pi + 0.5) * width
        runs = [by.get((p, c)) for c in caps]
        vals = [np.nan if r is None else value(r) for r in runs]
        ax.bar(xs, [v if not (log and v <= 0) else np.nan for v in vals], width, color=styles[p]["color"], label=p)
        for x, v, r in zip(xs, vals, runs):
            zero = log and v <= 0                   # no bar on a log axis: write the 0 at its foot
            if zero:
                ax.annotate("0", (x, 0.01), xycoords=base, ha="center", va="bottom", fontsize=8)
            if r is not None and r["ooms"]:
                ax.bar([x], [np.nan if zero else v], width, fill=False, hatch=OOM_HATCH, edgecolor="k")
                ax.annotate("OOM", (x, 0.01) if zero else (x, v), xycoords=base if zero else "data",
                            xytext=(0, 12 if zero else 2), textcoords="offset points", rotation=90, ha="center",
                            va="bottom", fontsize=8)
    positive = [v for v in map(value, rows) if v > 0]
    if log:
        _log_axis(ax, "y", min(positive, default=1), max(positive, default=1) * 4, bars=True)   # headroom for OOM labels
    else:
        ax.set_ylim(0, max(positive, default=1) * 1.2)
    ax.set_xlim(-0.5, len(caps) - 0.5)              # every group shown, even one of zeros only
    ax.set_xticks(np.arange(len(caps)), [cap_label(c, cap_text).replace(" (", "\n(") for c in caps])
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3, which="major")


def _oom_handles(rows):
    from matplotlib.patches import Patch
    if not any(r["ooms"] for r in rows):
        return []
    return [Patch(facecolor="white", edgecolor="k", hatch=OOM_HATCH, label="hatched, OOM: the run stopped at an OOM (figures up to it)")]


@_notes_an_empty_trace("Policies side by side")
def bars_figure(trace, rows: list[dict], *, styles=None, cap_text=None, setting="eager runtime"):
    """Peak reserved, utilization, device mallocs and modeled allocation time per cap × policy."""
    from matplotlib.lines import Line2D
    plt = _plt()
    styles = styles or policy_styles(row_label(r) for r in rows)
    peak = max([r["peak_reserved_bytes"] for r in rows] + [trace.load_bytes, 1])
    scale, unit = _unit(peak)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), layout="constrained")
    kw = {"styles": styles, "cap_text": cap_text}
    _grouped(axes[0, 0], rows, lambda r: r["peak_reserved_bytes"] / scale, f"peak reserved ({unit})", **kw)
    axes[0, 0].axhline(trace.load_bytes / scale, color="k", ls="--", lw=1)
    _grouped(axes[0, 1], rows, lambda r: 100 * r["utilization"], "utilization (%)", **kw)
    axes[0, 1].set_ylim(0, 120)
    axes[0, 1].set_yticks(range(0, 101, 20))
    _grouped(axes[1, 0], rows, lambda r: r["device_mallocs"], "device mallocs (count, log)", log=True, **kw)
    _grouped(axes[1, 1], rows, lambda r: 1e3 * r["alloc_time_seconds"], "allocation time, modeled (ms, log)",
             log=True, **kw)
    handles = [Line2D([], [], color=s["color"], lw=8, label=p) for p, s in styles.items()]
    if trace.load_bytes / scale <= axes[0, 0].get_ylim()[1]:       # off the scale (every run stopped early): no line
        handles.append(Line2D([], [], color="k", ls="--", lw=1, label="LOAD (peak live bytes)"))
    _outside_legend(fig, handles + _oom_handles(rows))
    fig.suptitle(_title(trace, "Policies side by side", setting))
    return fig


#: Width of the pictures meant for one paper column (`breakdown_figure`), in inches.
COLUMN_WIDTH = 4.8


@_notes_an_empty_trace("Why reserved > live")
def breakdown_figure(trace, rows: list[dict], *, styles=None, cap_text=None, setting="eager runtime"):
    """Why reserved > live at each run's reserved peak: per cap a panel, in it a horizontal bar per policy, stacked
    hard, soft, stream and rounding (they add up to reserved - live); a policy that cannot say is written n/a.

    Horizontal bars in panels stacked down the page: the labels read level and the picture keeps one paper
    column's width however many policies and caps it holds."""
    from matplotlib.patches import Patch
    plt = _plt()
    styles = styles or policy_styles(row_label(r) for r in rows)
    pols = list(styles)
    caps, by = _by_cap(rows, cap_text)
    caps = caps or [None]
    totals = [r["breakdown_at_peak"]["reserved"] - r["breakdown_at_peak"]["requested"]
              for r in by.values() if r.get("breakdown_at_peak")]
    scale, unit = _unit(max(totals + [1]))
    height = 1.9 + len(caps) * (0.35 + 0.26 * len(pols))
    fig, axes = plt.subplots(len(caps), 1, figsize=(COLUMN_WIDTH, height), sharex=True, squeeze=False,
                             layout="constrained")
    for ax, cap in zip(axes[:, 0], caps):
        for y, p in enumerate(pols):
            r = by.get((p, cap))
            b = r and r.get("breakdown_at_peak")
            if not b:
                ax.text(0, y, " n/a" if r is not None else "", ha="left", va="center", fontsize=8)
                continue
            left = 0.0
            for part in PARTS:
                ax.barh([y], [b[part] / scale], 0.7, left=left, color=PART_COLORS[part])
                left += b[part] / scale
            if r["ooms"]:
                ax.barh([y], [left], 0.7, fill=False, hatch=OOM_HATCH, edgecolor="k")
        ax.set_yticks(range(len(pols)), [p.replace("[", "\n[") if len(p) > 14 else p for p in pols], fontsize=8)
        ax.set_ylim(len(pols) - 0.5, -0.5)          # the first policy on top, as in --policies
        ax.set_title(cap_label(cap, cap_text) if len(caps) > 1 or cap is not None else "", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlim(0, max(totals + [1]) / scale * 1.1)
    axes[-1, 0].set_xlabel(f"reserved - live at the reserved peak ({unit})")
    handles = [Patch(color=PART_COLORS[p], label=PART_HELP[p]) for p in PARTS]
    _outside_legend(fig, handles + _oom_handles(rows), ncol=1)
    fig.suptitle(_title(trace, "Why reserved > live", setting + ("" if len(caps) > 1 or caps[0] is not None
                                                                  else ", no cap")))
    return fig


@_notes_an_empty_trace("Capacity frontier")
def frontier_figure(trace, fit: dict, *, styles=None, setting="eager runtime"):
    """Safe capacity of each policy as dots (and any smaller passing island as a cross), against LOAD
    and the oracle's peak; a policy with none (OOM even without a cap) is listed, with no dot.

    Dots, not bars: the axis starts near LOAD, where the differences are, and a bar
    cut off at a non-zero origin would exaggerate them.
    """
    plt = _plt()
    fits = by_capacity(fit["fits"])
    styles = styles or policy_styles(row_label(f) for f in fits)
    load = fit["load_bytes"]
    refs = [load] + ([fit["oracle_peak_bytes"]] if "oracle_peak_bytes" in fit else [])
    values = [v for f in fits for v in (f["capacity_bytes"], f["island_bytes"]) if v is not None] + refs
    scale, unit = _unit(max(values + [1]))
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(fits) + 2.6), layout="constrained")
    ys = np.arange(len(fits))
    island_shown = False
    for y, f in zip(ys, fits):
        st = styles[row_label(f)]
        if f["capacity_bytes"] is None:
            ax.annotate("none: OOM even with no cap", (load / scale, y), xytext=(9, 0), textcoords="offset points",
                        va="center", fontsize=9, color="0.3")
            continue
        x = f["capacity_bytes"] / scale
        ax.hlines(y, 0, x, color="0.85", lw=1)
        ax.plot([x], [y], st["marker"], ms=10, color=st["color"], mec="k")
        over = f" ({100 * (f['capacity_bytes'] / load - 1):+.1f}% vs LOAD)" if load else ""
        star = "" if f.get("threshold", True) else "*"
        ax.annotate(fmt_bytes(f["capacity_bytes"]) + star + over, (x, y), xytext=(9, 0), textcoords="offset points",
                    va="center", fontsize=9)
        if f.get("island_bytes") is not None:
            ax.plot([f["island_bytes"] / scale], [y], "x", ms=9, mew=2, color="tab:red",
                    label=None if island_shown else "island: a smaller capacity that passes, below one that fails")
            island_shown = True
    ax.axvline(load / scale, color="k", ls="--", lw=1.2, label=f"LOAD (peak live bytes) {fmt_bytes(load)}")
    if "oracle_peak_bytes" in fit:
        ax.axvline(fit["oracle_peak_bytes"] / scale, color="0.35", ls=":", lw=1.5,
                   label=f"oracle peak {fmt_bytes(fit['oracle_peak_bytes'])}")
    lo, hi = min(values) / scale, max(values) / scale
    span = max(hi - lo, 0.02 * hi, 1e-9)
    ax.set_xlim(lo - 0.08 * span, hi + 0.45 * span)        # room on the right for the value labels
    ax.set_yticks(ys, [row_label(f) for f in fits])
    ax.set_ylim(len(fits) - 0.5, -0.5)                      # the best fit on top
    ax.set_xlabel(f"safe device capacity: no OOM from it up ({unit}; the axis starts near LOAD, not at 0)")
    ax.set_title(_title(trace, "Capacity frontier: the smallest GPU each allocator is safe on", setting))
    _outside_legend(fig, ax.get_legend_handles_labels()[0], ncol=2)
    ax.grid(axis="x", alpha=0.3)
    return fig


def tune_frontier_figure(res):
    """Peak reserved vs modeled allocation time of every fitting setting: the Pareto frontier drawn as a
    staircase (rings, so that one point still shows beside the recommendation), the target's limit as a line,
    the recorded settings and the recommendation marked. Settings that land on the same point are drawn once,
    the larger the more they are, with their number beside it; with none that fits, a note says so. Settings
    whose replay stopped early (dominated: `allocsim.search.tune.Bound`) have no point; the title counts them."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    fitting = res.fitting
    pruned = f" ({res.pruned} dominated, stopped early: not drawn)" if res.pruned else ""
    ax.set_title(f"{os.path.basename(res.trace)}: {len(fitting)} of {len(res.rows)} settings fit{pruned}, objective "
                 f"{res.objective}", fontsize=9)
    ax.set_xlabel("modeled time (ms)")
    ax.set_ylabel("peak reserved (GiB)")
    if not fitting or not res.load_bytes:
        _nothing_to_plot(ax, "the trace holds no allocation" if not res.load_bytes else "no setting fits the target")
        return fig
    point = lambda r: (r["total_time_seconds"] * 1e3, r["peak_reserved_bytes"] / GiB)     # noqa: E731
    xy = np.array([point(r) for r in fitting], dtype=float)
    span = np.maximum(xy.max(axis=0) - xy.min(axis=0), 1e-12)
    groups: dict = {}          # points closer than about a marker's width are drawn as one
    for key, p in zip(map(tuple, np.round((xy - xy.min(axis=0)) / span * (100, 50)).astype(int)), xy):
        groups.setdefault(key, []).append(p)
    centres = np.array([np.mean(g, axis=0) for g in groups.values()])
    counts = [len(g) for g in groups.values()]
    ax.scatter(centres[:, 0], centres[:, 1], s=[12 + 10 * np.sqrt(n - 1) for n in counts], color="0.6", alpha=0.8,
               label="settings that fit (a number: how many share the point)")
    for (x, y), n in zip(centres, counts):
        if n > 1:
            ax.annotate(str(n), (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7, color="0.35")
    front = sorted(res.frontier, key=lambda r: r["total_time_seconds"])
    ax.step(*zip(*map(point, front)), where="post", marker="o", ms=13, mfc="none", mew=1.6, color="tab:blue",
            zorder=4, label=f"Pareto frontier ({len(front)} {'setting' if len(front) == 1 else 'settings'})")
    for row, style in ((res.recorded, dict(marker="s", color="tab:orange", label="recorded")),
                       (res.best, dict(marker="*", s=160, color="tab:red", label="recommended"))):
        if row is not None and not row["ooms"]:
            ax.scatter(*zip(point(row)), zorder=3, **style)
    if res.recorded is not None and res.recorded["ooms"]:
        ax.plot([], [], "s", color="tab:orange", label="recorded: runs out (not drawn)")
    limit = res.target.limit
    if limit is not None:
        which = "cap" if limit == res.target.cap else "capacity"
        ax.axhline(limit / GiB, color="k", ls="--", lw=1, label=f"target: {which} {fmt_bytes(limit)}")
        low, high = ax.get_ylim()
        ax.set_ylim(low, max(high, limit / GiB + 0.03 * (high - low)))
    ax.legend(fontsize=8, loc="best")
    return fig


@_notes_an_empty_trace("Malloc latency")
def latency_figure(trace, results: dict, *, styles=None, setting="", measured: bool = False):
    """Per-malloc latency as the fraction of mallocs at least x slow, log-log: tails stay apart."""
    plt = _plt()
    styles = styles or policy_styles(results)
    fig, ax = plt.subplots(figsize=(9, 5.2), layout="constrained")
    lat_us, frac = [1.0], [1.0]                     # the axes' extent, seeded for a trace without mallocs
    for label, r in results.items():
        q = np.sort(np.maximum(np.asarray(r.timeline.get("latency_quantiles") or [], dtype=np.float64), 1e-9))
        if not len(q):
            continue
        x = np.unique(q)
        at_least = 1 - np.searchsorted(q, x, side="left") / len(q)
        st = styles[label]
        ax.step(x * 1e6, at_least, where="pre", color=st["color"], ls=st["ls"], lw=1.4, marker=st["marker"],
                mfc="none", mew=1.4, ms=8, markevery=slice(int(len(x) > 1), None, max(1, len(x) // 25)),
                label=label + (" (stopped at an OOM: mallocs up to it)" if r.ooms else ""))
        lat_us += [x[0] * 1e6, x[-1] * 1e6]
        frac.append(at_least[-1])
    _log_axis(ax, "x", min(lat_us), max(lat_us) * 2)
    _log_axis(ax, "y", min(frac), 1.3)
    ax.set_xlabel(f"malloc latency x, {'measured' if measured else 'modeled'} (μs, log)")
    ax.set_ylabel("fraction of mallocs taking ≥ x (log)")
    ax.set_title(_title(trace, "Malloc latency: how many mallocs are at least this slow", setting))
    _outside_legend(fig, ax.get_legend_handles_labels()[0], ncol=3)
    ax.grid(alpha=0.3, which="both")
    return fig


@_notes_an_empty_trace("Garbage collections")
def gc_figure(trace, rows: list[dict], *, styles=None, cap_text=None, setting="gc runtime"):
    """GC calls (incremental + full) and modeled GC pause time per cap × policy, log scale."""
    from matplotlib.lines import Line2D
    plt = _plt()
    styles = styles or policy_styles(row_label(r) for r in rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), layout="constrained")
    kw = {"styles": styles, "cap_text": cap_text, "log": True}
    _grouped(axes[0], rows, lambda r: r["gc_incremental"] + r["gc_full"], "GC calls, incremental + full (log)", **kw)
    _grouped(axes[1], rows, lambda r: r["gc_time_seconds"], "GC pause time, modeled (s, log)", **kw)
    handles = [Line2D([], [], color=s["color"], lw=8, label=p) for p, s in styles.items()]
    _outside_legend(fig, handles + _oom_handles(rows))
    fig.suptitle(_title(trace, "Garbage collections per policy and cap", setting))
    return fig


def memory_timeline(trace, results: dict, path: str, **kw):
    return save(memory_figure(trace, results, **kw), path)


def comparison_bars(trace, rows: list[dict], path: str, **kw):
    return save(bars_figure(trace, rows, **kw), path)


def breakdown_plot(trace, rows: list[dict], path: str, **kw):
    return save(breakdown_figure(trace, rows, **kw), path)


def frontier_plot(trace, fit: dict, path: str, **kw):
    return save(frontier_figure(trace, fit, **kw), path)


def latency_plot(trace, results: dict, path: str, **kw):
    return save(latency_figure(trace, results, **kw), path)


def gc_plot(trace, rows: list[dict], path: str, **kw):
    return save(gc_figure(trace, rows, **kw), path)
