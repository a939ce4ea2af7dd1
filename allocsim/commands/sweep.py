"""`allocsim sweep`: traces × policies × caps × runtimes -> one CSV or JSON-lines table.

Rows are appended to ``OUT.partial`` as cells finish, so an interrupted sweep
restarted with the same ``-o OUT`` skips the cells it already has; when every
cell is done the rows are written, sorted by cell, to ``OUT`` atomically.
"""
from __future__ import annotations

import json
import os
import sys

from ..errors import InputError, UsageError
from ..outputs import atomic_open, claim_outputs
from ..report.tables import COLUMNS, dump_json, write_rows
from ..sweep import Cell, dask_executor, run_cells
from ._common import distinct, positive_int
from .compare import add_arguments as _compare_arguments
from .compare import build_cells

NAME = "sweep"
HELP = "run many traces × policies × caps × runtimes to one result table, locally or on Dask"
EXAMPLE = ("allocsim sweep traces/*.bin --policies split,binned,torch --caps none,4GB,8GB "
           "--runtime eager,gc -o results.csv --dask-local 2")


def add_arguments(p):
    _compare_arguments(p, many_traces=True)
    p.add_argument("-o", "--output", required=True, help="result table: .csv or .jsonl")
    p.add_argument("--format", choices=["csv", "jsonl"], help="default: from the output's extension")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler, e.g. tcp://host:8786")
    g.add_argument("--dask-local", type=positive_int, metavar="N", help="run on a local Dask cluster of N workers")


_ROW_KEYS = set(COLUMNS) - {"replay_seconds"}       # what a row of the partial file holds (wall time is dropped)


def _done_rows(partial: str) -> dict[str, dict]:
    """Rows already finished, keyed by cell; a torn last line (a crash mid-write) is dropped."""
    done = {}
    if not os.path.exists(partial):
        return done
    try:
        with open(partial, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason})", path=partial, position=f"byte {e.start}") from None
    good = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            if n >= len(lines) - 1:      # the torn tail of an interrupted sweep
                break
            raise InputError("not a JSON row", path=partial, position=f"line {n}") from None
        if not (isinstance(row, dict) and isinstance(row.get("cell"), str) and _ROW_KEYS <= set(row)):
            raise InputError("not a row of this sweep (a JSON object with every column and the cell)", path=partial,
                             position=f"line {n}")
        done[row["cell"]] = row
        good.append(line)
    with atomic_open(partial) as f:      # drop a torn tail before appending again (a kill now loses nothing)
        f.write("".join(l + "\n" for l in good))
    return done


def _tell_what_is_kept(log, partial: str, n_cells: int) -> None:
    """A stopped sweep's finished rows stay in ``partial`` for the same command to resume from; one with
    none finished leaves nothing behind."""
    if log.tell() == 0:
        log.close()
        os.unlink(partial)
        return
    log.flush()
    print(f"sweep: {len(_done_rows(partial))} of {n_cells} cells kept in {partial}; the same command resumes "
          f"from them", file=sys.stderr)


def _table_format(output: str, given: str | None) -> str:
    """csv or jsonl, from --format or the output's name; a name that says the other format, or ``.json``
    (JSON lines are not one JSON document), is refused rather than given a table it does not name."""
    named = {".csv": "csv", ".jsonl": "jsonl"}.get(os.path.splitext(output)[1].lower())
    if given and named and given != named:
        raise UsageError(f"-o {output}: --format {given} contradicts the .{named} name")
    if output.lower().endswith(".json") and given != "jsonl":
        raise UsageError(f"-o {output}: sweep writes JSON lines (one object per line), not one JSON document; "
                         f"name it .jsonl (or pass --format jsonl)")
    if not (given or named):
        raise UsageError(f"-o {output}: say --format csv or jsonl (or use a .csv / .jsonl name)")
    return given or named


def run(args) -> int:
    if args.scheduler is not None and not args.scheduler.strip():
        raise UsageError("--scheduler: empty address (expected e.g. tcp://host:8786)")
    fmt = _table_format(args.output, args.format)
    traces = distinct(args.trace, "traces", key=os.path.realpath)
    claim_outputs([("-o", args.output), ("-o", args.output + ".partial")], [*traces, args.cost_model],
                  force=args.force)
    cells: list[Cell] = []
    settings = None
    for t in traces:
        args.trace = t
        c, settings = build_cells(args)
        cells += c
    partial = args.output + ".partial"
    done = _done_rows(partial)
    todo = [c for c in cells if c.key() not in done]
    if done:
        print(f"sweep: {len(cells) - len(todo)} of {len(cells)} cells already done, resuming", file=sys.stderr)
    executor = client = None
    if args.scheduler or args.dask_local:
        client = dask_executor(args.scheduler, args.dask_local)
        executor = client.get_executor()
    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc="sweep", unit="run", leave=False)
    with open(partial, "a") as log:
        def on_row(cell, row):
            row = dict(row, cell=cell.key())
            row.pop("sections", None)
            row.pop("replay_seconds", None)      # wall time differs run to run; the table must not
            log.write(json.dumps(row, sort_keys=True) + "\n")
            log.flush()
            if bar:
                bar.update()
        try:
            run_cells(todo, settings, jobs=args.jobs, executor=executor, on_row=on_row)
        except BaseException:           # interrupted or failed: say what is kept and how to go on
            _tell_what_is_kept(log, partial, len(cells))
            raise
        finally:
            if bar:
                bar.close()
            if client is not None:
                client.close()
    rows = _done_rows(partial)
    ordered = [rows[c.key()] for c in sorted(cells, key=Cell.sort_key)]
    for r in ordered:
        r.pop("cell", None)
    write_rows(ordered, args.output, fmt)
    os.unlink(partial)
    if args.json:
        dump_json(ordered)
    else:
        print(f"sweep: {len(ordered)} rows -> {args.output}")
    return 0
