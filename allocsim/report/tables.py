"""Machine-readable reports: result rows as CSV or JSON lines, one result as a JSON document.

A row is the flat dict `sweep.result_row` makes of a replay (the same figures as
``allocsim replay --json``); `COLUMNS` (`allocsim.machine.metrics`) is its schema and the CSV column order.
"""
from __future__ import annotations

import csv
import json
import math
import sys

from ..machine.metrics import COLUMNS
from ..outputs import atomic_open



def write_rows(rows: list[dict], path: str, fmt: str) -> None:
    """Write rows to ``path`` as CSV (`COLUMNS` first, then any others; a dict cell, such as the free
    breakdown, as JSON text) or JSON lines, whole or not at all."""
    with atomic_open(path) as f:
        if fmt == "csv":
            names = [c for c in COLUMNS if not rows or c in rows[0]]
            names += [c for c in (rows[0] if rows else ()) if c not in names]
            w = csv.DictWriter(f, fieldnames=names, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v for k, v in r.items()})
        else:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")


def dump_json(obj, out=None) -> None:
    """One JSON document (a result's ``to_dict()``, rows, a fit) to ``out`` (stdout), as every ``--json`` prints it.

    Strict JSON, as jq and JavaScript read it: a NaN or infinity (which a trace's metadata may hold: Python's
    reader takes them) is written as null, not as the ``NaN`` only Python reads back."""
    try:
        text = json.dumps(obj, indent=1, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), indent=1, default=str, allow_nan=False)
    (out or sys.stdout).write(text + "\n")


def _finite(obj):
    """``obj`` with every float that is not finite replaced by None (JSON's null)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
