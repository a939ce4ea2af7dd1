"""The ``allocsim plot --report`` page: the pictures, the compare table and the fit table on one index.html."""
from __future__ import annotations

import html
import os

from ..filenames import shown_name
from ..outputs import atomic_open
from ..units import fmt_bytes
from .text import compare_table, fit_table, survived_note

STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}pre{font-size:12px;"
         "background:#f6f6f6;padding:1em;overflow-x:auto}img{max-width:100%;border:1px solid #ddd}")


def index_html(outdir: str, trace, images: list[tuple[str, str]], table_rows: list[dict], fit: dict | None,
               max_replays: int, cap_text: dict | None = None) -> str:
    """Write ``outdir/index.html``: ``images`` (title, file name) below the comparison table (caps as the user
    wrote them, ``cap_text``, as the pictures label them) and the fit table (the one ``allocsim fit`` prints,
    ``*`` where a walk stopped after ``max_replays``); its path."""
    name = html.escape(shown_name(os.path.basename(trace.path or "trace")))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>allocsim report — {name}</title>",
             f"<style>{STYLE}</style></head><body>",
             f"<h1>allocsim report — {name}</h1>",
             f"<p>{len(trace):,} events, {trace.n_allocs:,} allocations, LOAD {fmt_bytes(trace.load_bytes)}.</p>",
             "<h2>Comparison</h2><pre>" + html.escape("\n".join(
                 t for t in (compare_table(table_rows, cap_text), survived_note(table_rows)) if t)) + "</pre>"]
    if fit:
        parts.append("<h2>Capacity frontier (safe capacity, island below)</h2><pre>"
                     + html.escape(fit_table(fit, max_replays)) + "</pre>")
    for title, img in images:
        parts.append(f"<h2>{html.escape(title)}</h2><img src='{html.escape(img)}' alt='{html.escape(title)}'>")
    parts.append("</body></html>")
    path = os.path.join(outdir, "index.html")
    with atomic_open(path) as f:
        f.write("\n".join(parts))
    return path
