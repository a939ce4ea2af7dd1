"""`allocsim sweep`: traces × policies × caps × runtimes -> one CSV or JSON-lines table.

Rows are appended to ``OUT.partial`` as cells finish, so an interrupted sweep
restarted with the same ``-o OUT`` skips the cells it already has (rows written under
other shared options are refused, `shared_key`); when every cell is done the rows are
written, sorted by cell, to ``OUT`` atomically. The partial table starts with `PARTIAL_MARK`:
a file of that name that a sweep did not write (no mark, a symbolic link, a pipe) is the
user's, refused and left as it is, never read, appended to or deleted (`_open_partial`).
"""
from __future__ import annotations

import json
import math
import os
import stat
import sys

from ..errors import InputError, UsageError
from ..filenames import clipped
from ..engine.spec import is_plugin
from ..outputs import claim_outputs, signals_unwind, temp_path
from ..report.tables import COLUMNS, dump_json, write_rows
from ..search.sweep import Cell, run_cells
from ._command import Command
from ._common import add_dask_arguments, check_scheduler, dask_cluster, inputs_of
from ._progress import count_progress
from ._ranks import traces_of
from .compare import add_arguments as _compare_arguments
from .compare import build_cells

COMMAND = Command(
    name="sweep",
    help="run many traces × policies × caps × runtimes to one result table, locally or on Dask",
    example=("allocsim sweep traces/*.bin --policies split,binned,torch --caps none,4GB,8GB "
             "--runtime eager,gc -o results.csv --dask-local 2"))


@COMMAND.arguments
def add_arguments(p):
    _compare_arguments(p, many_traces=True)
    p.add_argument("-o", "--output", required=True, help="result table: .csv or .jsonl")
    p.add_argument("--format", choices=["csv", "jsonl"], help="default: from the output's extension")
    add_dask_arguments(p)


_ROW_KEYS = set(COLUMNS) - {"replay_seconds"}       # what a row of the partial file holds (wall time is dropped)

#: The first line of every partial table a sweep writes: what says the file is a sweep's to resume from and delete.
PARTIAL_MARK = b'{"allocsim sweep": "partial table: one row per finished cell; the same command resumes from it"}\n'


def shared_key(settings) -> str:
    """What every cell of a sweep shares and its rows depend on (the cost model, --gc-every, --keep-going,
    --backend), as text: a partial table's rows are resumed only under the same, else a row of other options would
    stand in a table that claims this command's."""
    r = settings.replay
    costs = None if r.costs is None else {k: v for k, v in r.costs.to_dict().items() if k != "source"}
    return json.dumps({"costs": costs, "gc_every": r.gc_every, "keep_going": r.keep_going, "backend": r.backend},
                      sort_keys=True)


#: The kinds of value a row's columns hold (`_wrong_value`): text, a flag, a breakdown, a whole number, else a finite
#: number (`_FRACTIONAL`, every other column: tests/test_compare_fit_sweep.py holds every column to one of them).
_TEXT = {"trace", "policy", "runtime", "options"}
_WHOLE = {"cache_flushes", "device_mallocs", "device_frees", "gc_full", "gc_incremental", "ooms", "caught_ooms",
          "first_oom_event"} | {k for k in _ROW_KEYS if k.endswith("_bytes")}
_FRACTIONAL = {"utilization", "fragmentation", "overhead_vs_load", "gc_time_seconds", "alloc_time_seconds",
               "total_time_seconds", "device_time_seconds", "latency_p50", "latency_p99"}


def _wrong_value(row: dict) -> str | None:
    """What in a partial table's ``row`` no sweep writes (None: nothing): a column's value of the wrong kind -- a
    hand-edited ``"peak_reserved_bytes": "lots"`` or a NaN went into the result as it was."""
    for k in sorted(_ROW_KEYS):
        v = row[k]
        if k in _TEXT:
            ok = isinstance(v, str)
        elif k == "completed":
            ok = isinstance(v, bool)
        elif k == "breakdown_at_peak":
            ok = v is None or isinstance(v, dict)
        elif k in _WHOLE:
            ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        elif k in _FRACTIONAL:
            ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
        else:
            ok = True                   # (a column of none of the kinds: its test says so)
        if not ok:
            return f"column {k!r} holds {clipped(repr(v), 80)}"
    return None


def _done_rows(partial: str, shared: str) -> dict[str, dict]:
    """Rows already finished under the options ``shared`` (`shared_key`), keyed by cell; a torn last line (a crash
    mid-write) is cut off the file, in place: the file stays the one a running sweep holds locked and appends to
    (`_lock_table`)."""
    done = {}
    if not os.path.exists(partial):
        return done
    with open(partial, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text ({e.reason})", path=partial, position=f"byte {e.start}") from None
    lines = data[len(PARTIAL_MARK):].split(b"\n")       # `_open_partial` saw the mark
    good_end = len(PARTIAL_MARK)        # bytes up to the end of the last whole row
    for n, line in enumerate(lines, 2):
        if line.strip():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                if n >= len(lines):          # the torn tail of an interrupted sweep
                    break
                raise InputError("not a JSON row", path=partial, position=f"line {n}") from None
            if not (isinstance(row, dict) and isinstance(row.get("cell"), str) and _ROW_KEYS <= set(row)):
                raise InputError("not a row of this sweep (a JSON object with every column and the cell)",
                                 path=partial, position=f"line {n}")
            if row.get("shared") != shared:
                raise InputError("a row of a sweep under other options (--cost-model, --gc-every, --keep-going or "
                                 "--backend differ, or an older allocsim wrote it): rerun the command that wrote it to "
                                 "resume that sweep, or delete the file to start this one over",
                                 path=partial, position=f"line {n}")
            wrong = _wrong_value(row)       # (after the options: an older allocsim's row is told as one)
            if wrong:
                raise InputError(f"not a row this sweep wrote: {wrong}", path=partial, position=f"line {n}")
            done[row["cell"]] = row
        good_end += len(line) + 1
    if good_end < len(data):            # drop a torn tail before appending again (a kill now loses nothing)
        os.truncate(partial, good_end)
    return done


def _open_partial(partial: str, output: str) -> int:
    """Open ``OUT.partial`` for appending rows, made with `PARTIAL_MARK` if it is not there (whole: linked
    into place once the mark is written); return its descriptor, held locked (`_lock_table`).

    A file there that a sweep did not write is the user's: a symbolic link (``O_NOFOLLOW``: a row is never
    written through it), a pipe or device, or a file not starting with the mark is refused in one line and
    left as it is."""
    tmp = temp_path(partial)
    try:
        with open(tmp, "xb") as f:
            f.write(PARTIAL_MARK)
        try:
            os.link(tmp, partial)       # only if nothing is there: a kill leaves no file without its mark
        except FileExistsError:
            pass
        except OSError:                 # no hard links on this file system: made in place, never through a link
            with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                                   0o644), "wb") as f:
                f.write(PARTIAL_MARK)
    except FileExistsError:
        pass
    except OSError as e:
        raise InputError(f"cannot write: {e.strerror or e}", path=partial) from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    try:
        fd = os.open(partial, os.O_RDWR | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if os.path.islink(partial):
            raise InputError("is a symbolic link, not a partial table a sweep wrote; it is left as it is: remove it "
                             "or name another -o", path=partial) from None
        raise InputError(f"cannot write: {e.strerror or e}", path=partial) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError("is a pipe or a device, not a partial table a sweep wrote; name another -o", path=partial)
        os.set_blocking(fd, True)
        _lock_table(fd, output)
        if os.pread(fd, len(PARTIAL_MARK), 0) != PARTIAL_MARK:
            raise InputError("exists and is not a partial table a sweep wrote (its first line is not a sweep's mark); "
                             "it is left as it is: move it away, or name another -o", path=partial, position="line 1")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _append(fd: int, data: bytes, partial: str) -> None:
    """Append ``data`` (one row) to the partial table whole, or cut the table back to where it was and refuse in
    one line naming it: a disk that fills leaves no torn row, and nothing is left buffered to fail again."""
    start = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        raise InputError(f"cannot write: {e.strerror or e}", path=partial) from None


def _lock_table(fd: int, output: str) -> None:
    """Hold ``OUT.partial`` (open as ``fd``) for this sweep alone: a second sweep of the same ``-o``
    started meanwhile is refused with one line, instead of both rewriting one file and failing."""
    try:
        import fcntl
    except ImportError:                 # not POSIX: no lock
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise InputError("another allocsim sweep is writing this table now; wait for it to finish (the same "
                         "command then resumes from its rows)", path=output, position="-o") from None


def _tell_what_is_kept(fd: int, partial: str, n_cells: int, shared: str) -> None:
    """A stopped sweep's finished rows stay in ``partial`` for the same command to resume from; one with
    none finished leaves nothing behind."""
    if os.fstat(fd).st_size <= len(PARTIAL_MARK):
        os.unlink(partial)
        return
    print(f"sweep: {len(_done_rows(partial, shared))} of {n_cells} cells kept in {partial}; the same command resumes "
          f"from them", file=sys.stderr)


def _still_done(row: dict | None, cell: Cell) -> bool:
    """A partial table's row stands for ``cell`` while its trace, and its plug-in's file if it has one, are the files
    it was replayed from (as many bytes, last written at the same time, `_inputs_stamp`): a trace recorded again
    under the same name, or a plug-in edited, is replayed again, its new row the one kept. (By size alone, a trace
    made again at the same size was resumed from the old one's rows: one table, two traces.)"""
    return row is not None and row.get("inputs_stamp") == _inputs_stamp(cell)    # (its first pair: the trace's size)


def _inputs_stamp(cell: Cell) -> list:
    """``[bytes, modification time in ns]`` of the cell's trace and of its plug-in's module file (given as a file,
    a module or an entry point; not the modules it imports)."""
    cls = cell.policy.policy_class()
    module = sys.modules.get(cls.__module__) if is_plugin(cls) else None
    source = getattr(module, "__file__", None)      # (None: a module of no file)
    files = [cell.trace] + ([source] if source else [])
    return [[st.st_size, st.st_mtime_ns] for st in map(os.stat, files)]


def _table_format(output: str, given: str | None) -> str:
    """csv or jsonl, from --format or the output's name; a name that says the other format, or ``.json``
    (JSON lines are not one JSON document), is refused rather than given a table it does not name."""
    ext = os.path.splitext(output)[1].lower()
    named = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(ext)     # .json: JSON, as the lines are
    if given and named and given != named:
        raise UsageError(f"-o {output}: --format {given} contradicts the {ext} name")
    if ext == ".json" and given != "jsonl":
        raise UsageError(f"-o {output}: sweep writes JSON lines (one object per line), not one JSON document; "
                         f"name it .jsonl (or pass --format jsonl)")
    if not (given or named):
        raise UsageError(f"-o {output}: say --format csv or jsonl (or use a .csv / .jsonl name)")
    return given or named


def _run_todo(args, cells, todo, settings, log: int, partial, shared: str) -> list[dict]:
    """Run the cells not done yet, each row appended to ``log`` (a descriptor) as it comes (marked ``shared``,
    `shared_key`); return every row, in cell order."""
    update, close = count_progress("sweep", len(todo), "cells", args.quiet)    # off a terminal: a line now and then
    finished = [0]
    try:
        with dask_cluster(args) as (executor, _):
            def on_row(cell, row):
                stamp = _inputs_stamp(cell)
                row = dict(row, cell=cell.key(), shared=shared, trace_bytes=stamp[0][0], inputs_stamp=stamp)
                row.pop("sections", None)
                row.pop("replay_seconds", None)      # wall time differs run to run; the table must not
                _append(log, (json.dumps(row, sort_keys=True) + "\n").encode(), partial)
                finished[0] += 1
                update(finished[0])
            run_cells(todo, settings, jobs=args.jobs, executor=executor, on_row=on_row)
    except BaseException:           # interrupted or failed: say what is kept and how to go on
        _tell_what_is_kept(log, partial, len(cells), shared)
        raise
    finally:
        close()
    rows = _done_rows(partial, shared)
    ordered = [rows[c.key()] for c in sorted(cells, key=Cell.sort_key)]
    for r in ordered:
        for k in ("cell", "shared", "trace_bytes", "inputs_stamp"):
            r.pop(k, None)
    return ordered


@COMMAND.runs
def run(args) -> int:
    check_scheduler(args)
    fmt = _table_format(args.output, args.format)
    traces = traces_of(args)        # (a run's name: its ranks' traces; a trace named twice is refused there)
    claim_outputs([("-o", args.output), ("-o", args.output + ".partial")], inputs_of(args, traces), force=args.force)
    cells: list[Cell] = []
    settings = None
    for t in traces:
        args.trace = t
        c, settings = build_cells(args)
        cells += c
    partial = args.output + ".partial"
    with signals_unwind():
        log = _open_partial(partial, args.output)
        try:
            shared = shared_key(settings)
            done = _done_rows(partial, shared)
            todo = [c for c in cells if not _still_done(done.get(c.key()), c)]
            if len(todo) < len(cells):
                print(f"sweep: {len(cells) - len(todo)} of {len(cells)} cells already done, resuming",
                      file=sys.stderr)
            ordered = _run_todo(args, cells, todo, settings, log, partial, shared)
            write_rows(ordered, args.output, fmt)
            os.unlink(partial)
        finally:
            os.close(log)
    if args.json:
        dump_json(ordered)
    else:
        print(f"sweep: {len(ordered)} rows -> {args.output}")
    return 0
