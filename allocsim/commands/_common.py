"""Arguments and helpers shared by the replay-style subcommands."""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from contextlib import contextmanager

from ..machine.costs import CostModel
from ..errors import UsageError
from ..filenames import shown_name
from ..engine.replay import ReplaySettings
from ..engine.spec import plugin_files
from ..trace import Trace
from ..trace.events import MAX_SIZE
from ..units import fmt_bytes, parse_cap, parse_size


def add_replay_arguments(p, *, multi: bool = False) -> None:
    """--cap, --capacity, --runtime, --policy-opt, --cost-model, --gc-every, --keep-going, --no-fold."""
    if not multi:
        p.add_argument("--cap", default="none", help="pool cap, e.g. 8GB (CUARRAYS_MEMORY_LIMIT), 1.2x (of the "
                       "trace's LOAD) or 90%% (of the device's memory); default none")
        p.add_argument("--runtime", default="eager", choices=["eager", "gc"],
                       help="eager: frees reach the pool at once; gc: frees wait for a collection")
    p.add_argument("--capacity", default="trace",
                   help="device memory, e.g. 80GB; default: the recorded device's, else unlimited")
    p.add_argument("--policy-opt", "-O", action="append", default=[], metavar="KEY=VALUE", type=option_text,
                   help="policy option (repeatable; comma-separated lists allowed)")
    add_cost_model_argument(p)
    p.add_argument("--gc-every", metavar="SIZE", help="an incremental collection every SIZE allocated (under eager it "
                   "frees nothing and only costs a pause, as a periodic gc.collect())")
    p.add_argument("--keep-going", action="store_true", help="count OOMs and continue instead of stopping")
    add_fold_argument(p)


def add_fold_argument(p) -> None:
    """--no-fold: every command that replays through `ReplaySettings`."""
    p.add_argument("--no-fold", action="store_true",
                   help="walk every step, even where the replay repeats itself (by default a periodic run's repeats "
                        "are added without walking them; the result is the same bit for bit)")


def add_warm_cache_argument(p, what: str = "replay") -> None:
    """--warm-cache: every command that predicts a run from a recording (docs/compile.md)."""
    p.add_argument("--warm-cache", action="store_true",
                   help=f"{what} a later run of the program with warm compile caches, from a recording of a first "
                        "(cold) one: without the allocations its compile and autotune phases make and the step frees "
                        "(docs/compile.md)")


@contextmanager
def warm_cache_trace(path: str | None, warm: bool, command: str, shown: str | None = None):
    """``path`` itself; with ``warm`` (``--warm-cache``) its warm view (`trace.phases.warm_view`) in a temporary
    trace file for the length of the command, named as the trace is, after one stderr line saying what was
    left out (naming ``shown``, the trace as the user gave it: default ``path``). A trace without compile or
    autotune phases is refused: nothing in it tells what a warm run skips."""
    if not warm:
        yield path
        return
    import tempfile
    from ..trace.phases import checked_warm_view
    name = shown_name(shown or path or DEFAULT_TRACE)
    view = checked_warm_view(load_trace(path), name)
    cut = view.meta["warm_cache"]
    print(f"allocsim {command}: {name}: --warm-cache: left out {cut['allocs']:,} allocations "
          f"({fmt_bytes(cut['alloc_bytes'])}) made inside {cut['phases']:,} compile/autotune phases (a scope inside "
          f"another counted with it) and freed in their step"
          + (f", {cut['ooms']:,} OOMs" if cut["ooms"] else "") + (f", {cut['tries']:,} tries" if cut["tries"] else "")
          + f" and the recorded segment calls; kept {cut['kept_allocs']:,} ({fmt_bytes(cut['kept_alloc_bytes'])}) "
          f"that outlive it", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="allocsim-warm-") as d:
        out = os.path.join(d, os.path.basename(path or DEFAULT_TRACE))
        view.save(out)
        yield out


def add_policies_argument(p, default: str) -> None:
    """-p/--policies, the same help (and its default shown) for every command that replays several."""
    p.add_argument("--policies", "-p", default=default,
                   help="comma-separated; options in brackets: torch[expandable_segments:True]; plug-ins as "
                        f"file.py:Class or module:Class (default {default})")


def add_cost_model_argument(p) -> None:
    p.add_argument("--cost-model", metavar="FILE", help="cost model JSON (from `allocsim calibrate`)")


def count(least: int = 0, note: str = ""):
    """argparse type of a count or index on the command line (``-n``, ``--seed``, ``--top``, ``--device``, ...): ASCII
    digits, at least ``least`` (0 or 1). Python's int() would also read ``1_0`` as 10, ``+3`` and other scripts'
    digits; ``note`` says what 0 means where it means something. Below 10**18 (int() refuses 4,300 digits)."""
    expected = ("a positive integer" if least == 1 else "a non-negative integer") + note

    def parse(text: str) -> int:
        s = text.strip()
        digits = s.removeprefix("-")
        plain = s.isascii() and digits.isdigit()        # -3 or 0: shown as the number it is
        if plain and len(digits) > 18:
            raise argparse.ArgumentTypeError(f"expected {expected} below 10**18, got a number of {len(digits)} "
                                             f"digits")
        if plain and s == digits and int(s) >= least:
            return int(s)
        raise argparse.ArgumentTypeError(f"expected {expected}, got {s if plain else repr(text)}")
    return parse


#: argparse type: an integer >= 1 (worker counts, repetitions).
positive_int = count(1)


def real_number(text: str) -> float:
    """argparse type of a number (``--scale``), written as `count` takes a count: blanks around it dropped, ASCII, no
    ``1_0`` (Python's float() reads it as 10, and other scripts' digits); its range is checked where it is used."""
    from ..params import number
    try:
        return number(text.strip(), "float")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def at_most_cores(flag: str):
    """argparse type of a count of local processes (``-j``, ``--dask-local``): a positive integer, capped at this
    machine's cores with a note (more only adds processes: ``--dask-local 99999`` would start them all)."""
    def parse(text: str) -> int:
        n = positive_int(text)
        cores = os.cpu_count() or 1
        if n > cores:
            print(f"allocsim: note: {flag} {n} is more than the {cores} cores here; using {cores}", file=sys.stderr)
            return cores
        return n
    return parse


jobs_arg = at_most_cores("-j")


def add_jobs_argument(p) -> None:
    """-j/--jobs, the same for every command that runs replays in parallel."""
    default = min(4, os.cpu_count() or 1)
    p.add_argument("-j", "--jobs", type=jobs_arg, default=default,
                   help=f"parallel processes, at most the number of cores (default {default})")


def add_dask_arguments(p) -> None:
    """--scheduler / --dask-local, for the commands whose replays may run on a Dask cluster (`dask_cluster`)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler, e.g. tcp://host:8786")
    g.add_argument("--dask-local", type=at_most_cores("--dask-local"), metavar="N",
                   help="run on a local Dask cluster of N workers, at most the number of cores")


def inputs_of(args, traces=None) -> list:
    """The inputs a command's outputs must never replace: its trace(s) (``traces``, else ``args.trace``), its
    cost model and its plug-in policies' files (``compare --csv ff.py`` wrote its table over the plug-in)."""
    policies = getattr(args, "policies", None) or getattr(args, "policy", None)
    return [*(traces if traces is not None else [args.trace]), getattr(args, "cost_model", None),
            *plugin_files([policies])]


def check_scheduler(args) -> None:
    """An empty ``--scheduler``, or one whose port no address has, is one line, before anything is written."""
    if args.scheduler is not None and not args.scheduler.strip():
        raise UsageError("--scheduler: empty address (expected e.g. tcp://host:8786)")
    _, colon, port = (args.scheduler or "").rpartition("://")[2].rpartition(":")
    if colon and port.isdigit() and not 0 < int(port) < 65536:
        raise UsageError(f"--scheduler {args.scheduler}: port {port} is no port (1 to 65535)")


@contextmanager
def dask_cluster(args):
    """``(executor, workers)`` of the Dask cluster ``--scheduler`` / ``--dask-local`` name (`add_dask_arguments`),
    closed at the end; ``(None, None)`` when neither is given."""
    check_scheduler(args)
    if not (args.scheduler or args.dask_local):
        yield None, None
        return
    from ..search.sweep import dask_executor
    client = dask_executor(args.scheduler, args.dask_local)
    try:
        yield client.get_executor(), args.dask_local or sum(client.nthreads().values()) or None
    finally:
        client.close()


def positive_size(text: str, what: str, *, allow_none: bool = False) -> int | None:
    """A byte size of 1 B to 1 PiB (``none`` for no limit where allowed): 0 bytes of anything is nonsense."""
    n = parse_size(text, what=what, allow_none=allow_none)
    if n is not None and not 0 < n <= MAX_SIZE:
        raise UsageError(f"{what}: expected at least 1 byte and at most 1 PiB"
                         + (" (or none for no limit)" if allow_none else "") + f", got {text!r}")
    return n


def capacity_arg(text: str):
    if text == "trace":
        return "trace"
    return positive_size(text, "--capacity", allow_none=True)


def cap_arg(text: str, what: str, trace=None, capacity="trace") -> int | None:
    """A pool cap of 1 B to 1 PiB, or None: a size, ``none``, ``1.2x`` (of ``trace``'s LOAD) or ``90%`` (of the
    device's memory: ``capacity``, ``"trace"`` for the recorded device's), `parse_cap`."""
    from ..machine.capacity import device_capacity
    if not str(text).strip().endswith(("x", "X", "%")):
        return positive_size(text, what, allow_none=True)
    device, name = device_capacity(capacity, trace)
    n = parse_cap(text, what=what, load=trace.load_bytes if trace is not None else None, device=device,
                  device_name=name)
    return n if n is None else positive_size(n, f"{what} {text}")


def caps_arg(text: str, trace=None, capacity="trace") -> list[int | None]:
    """``--caps``: distinct pool caps, ``none`` for no cap; relative to ``trace`` as `cap_arg` reads them."""
    def size(c):
        return cap_arg(c, "--caps", trace, capacity)
    return [size(c) for c in distinct(split_list(text, "--caps"), "--caps", key=size)]


def parse_caps(text: str, trace=None, capacity="trace") -> dict:
    """``none,3.5GB`` -> ``{None: "none", 3758096384: "3.5GB"}``: ``--caps``' bytes to the user's spelling, in
    order (``1.2x``, ``90%``: of ``trace``), which plot's pictures and compare's table label a cap with
    (`allocsim.report.text.cap_spelling`)."""
    return dict(zip(caps_arg(text, trace, capacity), split_list(text, "--caps")))


def gc_every_arg(text: str | None) -> int | None:
    """``--gc-every``: bytes between periodic collections, None without it; 0 is refused, not read as "never"."""
    return positive_size(text, "--gc-every") if text is not None else None


def cost_model_arg(path):
    return CostModel.load(path) if path is not None else None


def replay_settings(args, trace=None, **fixed) -> ReplaySettings:
    """The `ReplaySettings` of a command's arguments — those it has of --cap (``1.2x``, ``90%``: of ``trace``),
    --capacity, --cost-model, --gc-every, --keep-going, --backend and --no-fold — with ``fixed`` over them: built
    once, handed on as it is (a sweep's cells set their own cap, runtime and capacity over it)."""
    a = vars(args)
    found = {}
    if "capacity" in a:
        found["capacity"] = capacity_arg(a["capacity"])
    if a.get("cap") is not None:        # 1.2x, 90%: of ``trace``
        found["cap"] = cap_arg(a["cap"], "--cap", trace, found.get("capacity", "trace"))
    if a.get("cost_model") is not None:
        found["costs"] = cost_model_arg(a["cost_model"])
    if a.get("gc_every") is not None:
        found["gc_every"] = gc_every_arg(a["gc_every"])
    found.update({k: a[k] for k in ("keep_going", "backend") if k in a})
    if a.get("no_fold"):
        found["fold"] = False
    return ReplaySettings(**{**found, **fixed})


DEFAULT_TRACE = "resnet50.bin"     # traces/resnet50.bin: ResNet-50 training on an H100, recorded


def recorded_settings(specs, trace) -> str | None:
    """The line under the heading for the policies that start from the allocator settings ``trace`` recorded
    (``trace_settings``, on unless a row turns it off), where those are not the defaults: a row's plain label
    (``torch``) does not show them, where replay's header lists the options in force. None where none applies.
    compare and fit print it under their heading."""
    from ..frameworks.torch import conf_text, options_in_force
    readers = [s for s in specs if any(p.name == "trace_settings" for p in s.policy_class().params)
               and s.values().get("trace_settings", True)]
    recorded = readers[0].policy_class().changed_options(options_in_force(None, trace)) if readers else {}
    if not recorded:
        return None
    return (f"{', '.join(sorted({s.name for s in readers}))}: the recording's allocator settings "
            f"({conf_text(recorded)}) unless trace_settings:False")


def default_trace_path() -> str:
    """The trace embedded in the package, replayed when no trace is named."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", DEFAULT_TRACE)


def load_trace(path: str | None, quiet: bool = True, walkers=(), *, say_unfinished: bool = True) -> Trace:
    """Load (and validate) a trace; a ticking bar on a terminal unless ``quiet`` (large traces take seconds).

    ``walkers`` are fed the validating pass's chunks (`Trace.load`). An unfinished trace (its writer died, or is
    still writing: docs/trace-format.md, section 6) is a warning once the command is done (`WARNINGS`), once per
    file, unless the command says so itself (``say_unfinished`` False: `info`): its figures are those of the
    prefix read."""
    path = default_trace_path() if path is None else path       # "" is refused where it is opened
    _, close = progress_bar(None, f"load {os.path.basename(path)}", quiet, unit=None)
    try:
        trace = Trace.load(path, walkers=walkers)
    finally:
        close()
    if not trace.finished and say_unfinished:
        WARNINGS.setdefault(os.path.abspath(path), f"{shown_name(path)}: unfinished (its writer died, or is still "
                                                   f"writing): the figures are of the {len(trace):,} events read")
    return trace


#: Warnings said when the command is done (`allocsim.cli.main`), once each, by key: none if it fails, so that
#: its error stays the one line.
WARNINGS: dict[str, str] = {}


def progress_bar(total, desc: str, quiet: bool = False, unit: str | None = "ev"):
    """A tqdm progress callable for long jobs, silent when not a terminal or with --quiet.

    Returns ``(update(n_done), close)``; ``total`` None counts without an end, and
    ``unit`` None makes a bare timer for one long step. The bar redraws itself twice a second from a
    thread, so its elapsed time keeps moving through a long step between updates (a
    trace's validation, an oracle's plan) while the caller's updates stay cheap.
    """
    if quiet or not sys.stderr.isatty():
        return (lambda n: None), (lambda: None)
    from tqdm import tqdm
    bar = tqdm(total=total, desc=desc, unit=unit or "it", unit_scale=unit == "ev", leave=False, mininterval=0.5,
               bar_format=None if unit else "{desc} {elapsed}")
    stop = threading.Event()

    def redraw():
        while not stop.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=redraw, daemon=True)
    ticker.start()
    state = {"n": 0}

    def update(n):
        bar.update(n - state["n"])
        state["n"] = n

    def close():
        stop.set()
        ticker.join()
        bar.close()

    return update, close


def plural(n: int, noun: str) -> str:
    """``1 policy``, ``7 policies``, ``2 replays``: counts in progress lines and bars read as English."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") and noun[-2:-1] not in "aeiou" else f"{n} {noun}s"


class PhaseReport:
    """A long command's progress, phase by phase (fit's policies, plot's replays, tune's search steps).

    On a terminal, a ticking bar names the running phase (`progress_bar`); elsewhere (a CI log, ``nohup``),
    where a bar's redraws would be noise and silence looks like a hang, one stderr line as each phase ends:
    what it did, how long it took and, when the number of phases is known, about how long the rest will take
    (the mean phase so far times the phases left). ``quiet`` silences both.
    """

    def __init__(self, command: str, total: int | None = None, unit: str = "phase", quiet: bool = False):
        self.command, self.total, self.unit, self.quiet = command, total, unit, quiet
        self.tty = sys.stderr.isatty()
        self.done = 0
        self.started = self.phase_started = time.perf_counter()
        self._close_bar = lambda: None

    def start(self, desc: str) -> None:
        """A phase begins: on a terminal, its bar."""
        self._close_bar()
        if self.tty and not self.quiet:
            self._close_bar = progress_bar(None, f"{self.command}: {desc}", unit=None)[1]
        self.phase_started = time.perf_counter()

    def end(self, what: str, left: int | None = None) -> None:
        """A phase ended having done ``what`` (``torch: 39 replays``): off a terminal, its line. ``left``: the
        phases still to come, where the total is learnt on the way."""
        if left is not None:
            self.total = self.done + 1 + left
        self._close_bar()
        self._close_bar = lambda: None
        self.done += 1
        now = time.perf_counter()
        took, self.phase_started = now - self.phase_started, now
        if self.quiet or self.tty:
            return
        line = f"allocsim {self.command}: {what} in {took:.1f}s"
        if self.total:
            left = self.total - self.done
            line += f" ({self.done} of {plural(self.total, self.unit)}"
            line += f"; about {(now - self.started) / self.done * left:.0f}s left)" if left > 0 else ")"
        print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._close_bar()


def lazy_progress_bar(desc: str, quiet: bool = False, unit: str = "ev"):
    """``(update(done, total), close)``: a `progress_bar` made on the first report, once the total is known."""
    made = []

    def update(done, total):
        if not made:
            made.extend(progress_bar(total, desc, quiet, unit))
        made[0](done)
        if done >= total:
            made[1]()

    def close():
        if made:
            made[1]()

    return update, close


#: Name endings of files that are no pickle: a picture, a table, a trace, JSON (a trace's ``.stats.json`` sidecar).
_NOT_A_SNAPSHOT = (".png", ".svg", ".pdf", ".json", ".jsonl", ".csv", ".bin", ".stats.json")


def check_snapshot_name(path: str | None) -> None:
    """``--snapshot`` writes a pickle whatever the name: one ending as another format's (``x.png``, a trace's
    ``run.bin.stats.json``) is refused before any work, not filled with a pickle where that file is expected."""
    if path is None:
        return
    low = os.path.basename(path).lower()
    ext = ".stats.json" if low.endswith(".stats.json") else os.path.splitext(low)[1]
    if ext in _NOT_A_SNAPSHOT:
        what = "a trace's recorded counters (its .stats.json)" if ext == ".stats.json" else f"a {ext} file"
        raise UsageError(f"--snapshot {shown_name(path)}: names {what}, but --snapshot writes a PyTorch memory "
                         f"snapshot, a pickle: end the name in .pickle or .pkl")


def say_snapshot_written(snapshot: dict, path: str, what: str) -> None:
    """One stderr line naming the snapshot just written and what it holds: the file is a side output, easy
    to miss beside the report on stdout."""
    entries = sum(len(t) for t in snapshot.get("device_traces", []))
    print(f"allocsim: wrote {path}: {what} as a PyTorch memory snapshot ({plural(len(snapshot['segments']), 'segment')}"
          f", {plural(entries, 'trace entry')}; open it in https://pytorch.org/memory_viz)", file=sys.stderr)


def split_list(text: str, what: str) -> list[str]:
    """A comma-separated option: neither empty, nor with an empty item, nor naming one item twice."""
    from ..params import split_top
    return distinct(split_top(text, what), what)


def policy_specs(text: str, what: str = "--policies", options=()) -> list:
    """``--policies``: a `PolicySpec` per comma-separated policy (options in brackets), each once;
    ``options`` (``-O`` texts) are added to every one."""
    from ..params import split_top
    from ..engine.spec import PolicySpec
    specs = [PolicySpec.parse(s) for s in split_top(text, what)]
    try:
        specs = [s.with_options(options) for s in specs]
    except UsageError as e:
        if len(specs) < 2:
            raise
        raise UsageError(f"{e} (-O applies to every policy of {what}; give one policy its options in brackets: "
                         f"torch[max_split_size_mb:128])") from None
    return distinct(specs, what)


def distinct(items: list, what: str, key=lambda x: x) -> list:
    """``items`` unless empty or naming one item twice (``key`` says when two are the same)."""
    if not items:
        raise UsageError(f"{what}: empty list")
    seen = set()
    for x in items:
        if key(x) in seen:
            raise UsageError(f"{what}: {x} is named twice")
        seen.add(key(x))
    return items


def option_text(text: str) -> str:
    """An ``-O`` value: ``key=value`` items; an empty one (``-O ""``, an unset variable) is refused, not ignored."""
    if not text.strip(" ,"):
        raise argparse.ArgumentTypeError("expected key=value, got an empty option")
    from ..params import split_top
    try:
        split_top(text, "")
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).lstrip()) from None
    return text
