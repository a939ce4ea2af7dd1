"""Recording a program of several processes: one trace per rank (docs/several-processes.md).

``allocsim record -o run.bin -- torchrun --nproc-per-node 2 train.py`` runs the launcher as a child process with
its environment intact, plus two variables: `ENV_RUN` (where the traces go and how to record, as JSON) and
``PYTHONPATH`` with the folder ``bootstrap/`` in front of the user's own. Every Python process the launcher starts,
at any depth, runs ``bootstrap/sitecustomize.py`` at its start; it takes itself off ``sys.path``, hands on to the
``sitecustomize`` it hid, and, when `ENV_RUN` is set, waits (with the standard library only) for ``torch`` to be
imported and then for CUDA to be initialised (``torch.cuda._lazy_call``): a process that never uses CUDA
(torchrun's agent, a data loader worker, a shell) records nothing and never imports allocsim. One that does calls
`start_in_process`, which runs a `ProcessRecorder`: the torch recorder, opened on the device its first allocations use (the program picks it
after CUDA starts: ``torch.cuda.set_device(local_rank)``), finished at the process's exit (``atexit``, and SIGTERM,
which torchrun sends to the other workers when one fails, unwinds to it). Its trace is ``run.rank<R>.bin`` with
``R`` from ``RANK`` (torchrun) or from ``torch.distributed`` once the program has joined its group
(``torch.multiprocessing.spawn`` passes the rank as an argument), else ``run.pid<PID>.bin``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from ...errors import InputError, UsageError
from ...machine.ranks import process_name, run_files
from ._base import stderr
from .session import ENV_RUN
from .torch import TorchRecorder

#: The folder put in front of PYTHONPATH: its ``sitecustomize`` starts `in_child` in every Python process.
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
#: Launcher modules run as a program (``allocsim record -m torch.distributed.run ...``), never inside allocsim.
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                    "accelerate.commands.accelerate_cli")
#: Launchers' own commands: started as a program even when named by the path of their (Python) script.
LAUNCHER_PROGRAMS = ("torchrun", "accelerate")


def program_env(out: str, options: dict, environ=None) -> dict:
    """The program's environment: the caller's, with `ENV_RUN` and the bootstrap in front of PYTHONPATH."""
    env = dict(os.environ if environ is None else environ)
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env[ENV_RUN] = json.dumps({"out": os.path.abspath(out), "home": home, **options})
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def default_output(argv: list[str]) -> str:
    """``train.bin`` for ``torchrun ... train.py``: the first Python script named, else the last part of the first
    module run with ``-m`` that is not a launcher (``accelerate launch -m pkg.train``), else the program's name."""
    script = next((a for a in argv[1:] if a.endswith(".py")), None)
    if script is None:
        modules = [b for a, b in zip(argv, argv[1:]) if a == "-m" and b not in LAUNCHER_MODULES]
        if modules:
            return modules[0].rsplit(".", 1)[-1] + ".bin"
        script = argv[0]
    return os.path.splitext(os.path.basename(script))[0] + ".bin"


def record_program(argv: list[str], out: str, *, force: bool = False, **options) -> int:
    """Run ``argv`` (a launcher, a shell script, ``python train.py``) with every process that uses CUDA under
    torch recorded to its own trace beside ``out``; return the program's exit status.

    Traces of an earlier run of the same name would mix with this one's: they are refused, or removed with
    ``force``. The program's own exit status is returned (128 + N when a signal N ended it)."""
    from . import prepare
    prepare("torch", out)
    earlier = run_files(out)
    if earlier and not force:
        raise InputError(f"an earlier run's process traces are there ({', '.join(map(os.path.basename, earlier))}); "
                         "pass --force to replace them", path=out, position="-o")
    for path in earlier:
        for p in (path, path + ".stats.json"):
            if os.path.exists(p):
                os.unlink(p)
    env = program_env(out, {**options, "command": argv})
    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as e:
        raise UsageError(f"{argv[0]}: cannot run it ({e.strerror or e})") from None
    status = _wait_forwarding(proc)
    written = run_files(out)
    if written:
        stderr(f"{len(written)} process trace{'s' if len(written) > 1 else ''} of the run {out}: "
               + ", ".join(os.path.basename(p) for p in written))
    else:
        stderr(f"no process of {argv[0]} used CUDA under PyTorch: nothing recorded")
    return status


def _wait_forwarding(proc) -> int:
    """Wait for ``proc``; SIGTERM and SIGHUP sent to allocsim go on to it, and Ctrl-C (which the terminal sends
    to the program too) waits for it to end as it does."""
    forwarded = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s in forwarded:
        signal.signal(s, lambda signum, frame: proc.send_signal(signum))
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                continue
    finally:
        for s, old in forwarded.items():
            signal.signal(s, old)
    return code if code >= 0 else 128 - code


# ---- inside each process of the program ------------------------------------------------------------------------
def env_int(name: str, least: int = 0) -> int | None:
    """A count from the environment (torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``): ASCII digits, at least
    ``least``, at most 9 digits; None if unset or anything else (``-1``, ``1_0``, a number int() refuses), which the
    trace's reader would refuse as metadata."""
    text = os.environ.get(name, "").strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or int(text) < least:
        return None
    return int(text)


class ProcessRecorder(TorchRecorder):
    """The torch recorder in one process of a run: follows the device the process uses, labels the trace with
    the process's rank, and names it by rank when it closes."""

    follow_device = True

    def __init__(self, config: dict):
        self.run_out = config["out"]
        self.run_command = config.get("command")
        self.rank, self.local_rank, self.world_size = env_int("RANK"), env_int("LOCAL_RANK"), env_int("WORLD_SIZE", 1)
        if self.world_size is not None and self.rank is not None and self.rank >= self.world_size:
            self.world_size = None          # RANK=3 WORLD_SIZE=2: the rank names the trace; the size is not known
        super().__init__(process_name(self.run_out, self.label()), command=[sys.executable, *sys.argv],
                         stacks=config.get("stacks") or False, max_events=config.get("max_events"))

    def label(self) -> str:
        return f"rank{self.rank}" if self.rank is not None else f"pid{os.getpid()}"

    def process_meta(self) -> dict:
        """rank, local_rank, world_size (those known), the pid, and the run's command line."""
        known = {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size}
        return {**{k: v for k, v in known.items() if v is not None}, "pid": os.getpid(),
                "run": {"output": os.path.basename(self.run_out), "command": self.run_command}}

    def base_meta(self) -> dict:
        return {**super().base_meta(), **self.process_meta()}

    def late_meta(self) -> dict:
        self._ask_distributed()
        return self.process_meta()

    def _ask_distributed(self) -> None:
        """The rank, from torch.distributed once the program has joined a group (not from the environment)."""
        dist = sys.modules.get("torch.distributed")
        if self.rank is None and dist is not None and dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def drain(self):
        self._ask_distributed()
        return super().drain()

    def close_trace(self, late_meta=None):
        name = process_name(self.run_out, self.label())
        if name != self.out and os.path.exists(name):       # two processes claim one rank: keep both
            name = process_name(self.run_out, f"pid{os.getpid()}")
        self.out = name
        return super().close_trace(late_meta)


def start_in_process(config: dict) -> None:
    """CUDA is starting in this process (the bootstrap's call): record it until the process ends
    (`session.UntilExit`). Whatever fails here is one line, never the program's error."""
    from . import begin
    from .session import UntilExit
    try:
        rec = ProcessRecorder(config)
        begin(rec)                      # allocsim.mark() in the program writes into it
    except Exception as e:          # noqa: BLE001 - the program must run on unrecorded
        stderr(f"process {os.getpid()}: not recorded: {type(e).__name__}: {e}")
        return
    UntilExit(rec)
