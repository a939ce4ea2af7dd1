"""Many replays: cells of trace × policy × cap × runtime, run by an executor.

A `Cell` names one replay; `run_cell` performs it and returns one flat row — the
same figures `allocsim replay --json` reports, so a table built from rows equals
the single replays. Executors: in-process (``jobs=1``), a local process pool, or a
Dask cluster (`dask_executor`); all give identical rows because a replay is
deterministic and rows are sorted by cell at the end.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, InvalidStateError, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from copy import deepcopy
from dataclasses import dataclass, fields
from functools import partial

from ..errors import WorkerDied
from ..filenames import shown_name
from ..machine.metrics import COLUMNS
from ..engine.replay import ReplaySettings, replay
from ..engine.spec import PolicySpec
from ..outputs import check_input_file
from ..params import count_argument, kind_of
from ..trace import Trace, trace_path

@dataclass(frozen=True)
class Cell:
    """One replay. ``policy`` is a `PolicySpec` (its text is parsed); ``options``, ``key=value`` texts
    from Python callers, are folded into it, so two cells of one policy and options are equal."""

    trace: str
    policy: PolicySpec
    cap: int | None = None
    runtime: str = "eager"
    options: tuple = ()
    capacity: object = "trace"

    def __post_init__(self):
        if self.options or not isinstance(self.policy, PolicySpec):
            object.__setattr__(self, "policy", PolicySpec.of(self.policy, list(self.options)))
            object.__setattr__(self, "options", ())

    def key(self) -> str:
        """The cell's identity in a sweep's partial file (the same text for a built-in as before specs)."""
        opts = [self.policy.option_text] if self.policy.options else []
        return json.dumps([self.trace, self.policy.ref, self.cap, self.runtime, opts, self.capacity])

    def sort_key(self):
        return (self.trace, self.policy.ref, -1 if self.cap is None else self.cap, self.runtime,
                self.policy.option_text, str(self.capacity))


@dataclass(frozen=True)
class Settings:
    """What every cell of one sweep shares: how each replays (a cell sets its cap, runtime and capacity
    over ``replay``), and whether its row keeps the section table's rows."""

    replay: ReplaySettings = ReplaySettings()
    sections: bool = False

    @classmethod
    def of(cls, settings: "Settings | ReplaySettings | None") -> "Settings | None":
        """What a Python caller gives as a sweep's settings: a `Settings`, None (the defaults), or the
        `ReplaySettings` every replay runs under."""
        if settings is not None and not isinstance(settings, (cls, ReplaySettings)):     # (a dict failed deep inside)
            raise TypeError(f"settings: a Settings or a ReplaySettings, not {type(settings).__name__}")
        return cls(replay=settings) if isinstance(settings, ReplaySettings) else settings


def trace_file(trace) -> str:
    """A trace's file name as a caller gives it (a str, a `pathlib.Path`, bytes: `allocsim.trace.trace_path`),
    refused at once in one line where no such file is (the cells would meet it in ``os.stat``)."""
    path = trace_path(trace)
    check_input_file(path)
    return path


@contextmanager
def trace_on_disk(trace):
    """The file a sweep's cells read ``trace`` from (they name their trace by its file: a worker loads it), and the
    name to show for it: a file's name as given (`trace_file`); a `Trace` that `Trace.load` read, its file, where it
    still holds the trace as it is (`Trace.file_as_read`); another `Trace` (built, cut or changed in memory, or its
    file replaced since) saved to a temporary file for the length of the block."""
    if not isinstance(trace, Trace):
        path = trace_file(trace)
        yield path, path
        return
    path = trace.file_as_read()
    if path is not None:
        yield path, trace.path
        return
    import tempfile
    with tempfile.TemporaryDirectory(prefix="allocsim-") as d:
        out = os.path.join(d, "trace.bin")
        trace.save(out)
        yield out, trace.path or "<trace in memory>"


#: Traces a process keeps loaded for its next cells (a worker replays many cells of few traces).
TRACES_KEPT = 4
_loaded: OrderedDict = OrderedDict()


def cached_trace(path: str) -> Trace:
    """``Trace.load(path)``, kept for the next cells of this process: the `TRACES_KEPT` traces used last, each
    until its file changes (a trace is memory-mapped, so one kept costs its open file, not its size)."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_ino, st.st_mtime_ns, st.st_size)
    t = _loaded.pop(key, None)
    if t is None:
        t = Trace.load(path)
    _loaded[key] = t
    while len(_loaded) > TRACES_KEPT:
        _loaded.popitem(last=False)
    return t


def run_cell(cell: Cell, settings: Settings | None = None, *, full: bool = False):
    """Replay one cell; return its row (and the full result with ``full=True``)."""
    s = settings or Settings()
    res = replay(cached_trace(cell.trace), cell.policy, s.replay, runtime=cell.runtime, cap=cell.cap,
                 capacity=cell.capacity)
    row = result_row(res, cell)
    if s.sections:
        row["sections"] = res.sections
    return (row, res) if full else row


def result_row(res, cell: Cell) -> dict:
    """The table row of a replay's result: its `COLUMNS`, read from the result (copies of its dicts, as
    ``to_dict`` gives them; not the whole ``to_dict``, which copies every OOM record and section too: a
    tenth of a `tune` whose replays stop early)."""
    known = _fields_of(type(res))
    row = {k: deepcopy(getattr(res, k)) if k in known else None for k in COLUMNS}
    row.update(trace=shown_name(cell.trace), policy=cell.policy.name, cap_bytes=cell.cap, runtime=cell.runtime,
               options=cell.policy.option_text,
               first_oom_event=res.first_oom.event if res.first_oom else None,
               latency_p50=res.latency.get("p50"), latency_p99=res.latency.get("p99"))
    return row


def _fields_of(cls) -> frozenset:
    """The dataclass field names of ``cls`` (what its ``to_dict`` holds)."""
    return frozenset(f.name for f in fields(cls))


def _pool_run(args):
    cell, settings = args
    return cell, run_cell(cell, settings)


def _pool_worker_init(parent: int):
    """Workers leave Ctrl-C to the parent (a terminal sends it to the whole group), which stops them,
    and die on the other signals (a handler inherited from the parent must not unwind them).
    A worker also ends when its parent dies, however it dies (``kill -9`` included): it must not
    compute on, orphaned (`end_with_parent`)."""
    from ..outputs import CATCHABLE
    for s in CATCHABLE:
        signal.signal(s, signal.SIG_IGN if s == signal.SIGINT else signal.SIG_DFL)
    end_with_parent(parent)


#: prctl(2)'s option that asks the kernel for a signal when the parent dies (Linux).
PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """End this process when process ``parent`` is gone: on Linux the kernel sends SIGKILL the moment
    it dies (``prctl(PR_SET_PDEATHSIG)``); everywhere a daemon thread checks the parent pid every
    ``poll_s`` seconds (an orphan is adopted by another process) and exits."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass                    # no libc prctl: the watch below still ends the worker

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    if os.getppid() != parent:      # the parent died before the kernel was asked
        os._exit(1)
    threading.Thread(target=watch, name="allocsim-parent-watch", daemon=True).start()


@contextmanager
def process_pool(jobs: int):
    """A local process pool that an error or a signal stops at once: queued work is cancelled and the
    workers are terminated, so that nothing keeps running (or holds our stdout) after we exit."""
    from ..outputs import signals_unwind
    ex = _Pool(max_workers=jobs, initializer=_pool_worker_init, initargs=(os.getpid(),))
    with signals_unwind():
        try:
            yield ex
        except BrokenProcessPool:
            _stop_pool(ex)
            raise WorkerDied(f"a worker process of the pool (-j {jobs}) died before its replay finished: killed "
                             "(the kernel's out-of-memory killer, a signal) or ended by a plug-in's own code; "
                             "-j 1 runs the replays in this process, one at a time") from None
        except BaseException:
            _stop_pool(ex)
            raise
        ex.shutdown()


def _stop_pool(ex: ProcessPoolExecutor) -> None:
    """Terminate the pool's workers, then wait for it to fail what was queued."""
    for w in list((getattr(ex, "_processes", None) or {}).values()):
        w.terminate()
    ex.shutdown()


class _Pool(ProcessPoolExecutor):
    """A process pool whose stop prints nothing: ``Executor.map`` cancels its queued futures as an
    exception leaves it, while the pool's manager thread, seeing its workers gone, sets an exception on
    every pending one; on a future already cancelled that raises ``InvalidStateError``, a traceback on
    stderr before allocsim's own line. Here a cancelled future keeps its cancellation."""

    def submit(self, fn, /, *args, **kwargs):
        future = super().submit(fn, *args, **kwargs)
        future.set_exception = partial(_fail_unless_cancelled, future)
        return future


def _fail_unless_cancelled(future: Future, exc: BaseException) -> None:
    try:
        Future.set_exception(future, exc)
    except InvalidStateError:       # cancelled (or done) meanwhile: its outcome is already settled
        pass


def run_cells(cells, settings: Settings | None = None, *, jobs: int = 1, executor=None, on_row=None) -> list[dict]:
    """Run ``cells``; return their rows sorted by `Cell.sort_key` (trace, policy, cap — none first —, runtime,
    options, capacity: the order `compare`'s table shows), whatever order the cells come in; a caller that
    needs its own order sorts or keys them (`tune_ranks`). ``on_row(cell, row)`` sees each as it finishes.

    ``executor`` may be any `concurrent.futures.Executor` (a Dask ``Client.get_executor()``
    included); otherwise ``jobs > 1`` uses a local process pool.
    """
    cells = list(cells)
    settings = settings or Settings()
    rows: dict[Cell, dict] = {}
    if executor is None and jobs <= 1:
        for c in cells:
            rows[c] = run_cell(c, settings)
            if on_row:
                on_row(c, rows[c])
    else:
        with (nullcontext(executor) if executor else process_pool(jobs)) as ex:
            futs = [ex.submit(_pool_run, (c, settings)) for c in longest_first(cells)]
            try:
                for f in as_completed(futs):
                    c, row = f.result()
                    rows[c] = row
                    if on_row:
                        on_row(c, row)
            except BaseException:
                if executor is not None:    # a Dask cluster's queued cells (our own pool stops itself)
                    for f in futs:
                        f.cancel()
                raise
    return [rows[c] for c in sorted(cells, key=Cell.sort_key)]


def longest_first(cells: list[Cell]) -> list[Cell]:
    """``cells`` in the order a pool should start them: the largest trace files (the longest replays) first, so
    that no long replay starts last while the other workers idle; the order among one trace's cells kept."""
    size = {t: os.path.getsize(t) for t in {c.trace for c in cells}}
    return sorted(cells, key=lambda c: -size[c.trace])


def compare(trace: str, policies=("split", "binned", "torch", "cupy", "bestfit"), caps=(None,),
            runtimes=("eager",), *, jobs: int = 1, settings: Settings | None = None) -> list[dict]:
    """The `allocsim compare` table as rows: one replay per policy × cap × runtime.

    ``policies`` entries are `PolicySpec` texts (options in brackets: ``"torch[expandable_segments:True]"``,
    plug-ins as ``"my.py:MyPool"``) or specs, one text a policy; ``caps`` in bytes or as text (``"8GB"``, ``None``:
    no cap); ``trace`` a `Trace` or a file's name (a `pathlib.Path` too: `trace_on_disk`); ``settings`` a sweep's
    `Settings` or a `ReplaySettings`.
    """
    if isinstance(policies, (str, PolicySpec)):
        policies = [policies]           # (a text iterated would be its letters, each an unknown policy)
    if caps is None or isinstance(caps, str) or kind_of(caps):
        caps = [caps]                   # (one cap: "8GB", 8 << 30, None; a float is refused as a replay's is)
    if isinstance(runtimes, str):
        runtimes = [runtimes]
    jobs = count_argument("jobs", jobs, 1)
    caps = [ReplaySettings(cap=cap).cap for cap in caps]   # (checked and read as a replay's: "none" is None)
    specs = [PolicySpec.of(p) for p in policies]
    with trace_on_disk(trace) as (path, shown):
        cells = [Cell(path, spec, cap, rt) for spec in specs for cap in caps for rt in runtimes]
        rows = run_cells(cells, Settings.of(settings), jobs=jobs)
    return [row if shown == path else {**row, "trace": shown} for row in rows]


def dask_executor(scheduler: str | None = None, local_workers: int | None = None):
    """A Dask executor: connect to ``scheduler`` (tcp://host:8786) or start a LocalCluster."""
    try:
        from dask.distributed import Client
    except ImportError:
        from ..errors import UsageError
        raise UsageError("Dask is not installed: pip install 'allocsim[dask]'") from None
    if scheduler:
        try:
            return Client(scheduler)
        except (ValueError, TypeError, ImportError) as e:
            # an address dask cannot read ('garbage': no port; ucx:// without UCX: an abstract connector)
            from ..errors import UsageError
            raise UsageError(f"--scheduler {scheduler}: {e} (expected e.g. tcp://host:8786)") from None
        except OSError as e:        # (TimeoutError too: no scheduler there; dask's line named no option)
            from ..errors import UsageError
            raise UsageError(f"--scheduler {scheduler}: cannot connect: {e}") from None
    # the client owns the cluster, so closing it (a signal included) stops the workers; a stop's own
    # warnings and the workers' tracebacks are not the user's to read (one line says what happened)
    with _sigint_ignored():         # Ctrl-C reaches the whole process group: the parent stops the workers
        return Client(n_workers=local_workers or os.cpu_count(), threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=logging.CRITICAL)


@contextmanager
def _sigint_ignored():
    """Processes started within the block ignore SIGINT (an ignored signal stays ignored across exec)."""
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:              # not the main thread: nothing to change
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
