"""Output files: never over an input, never over a trace without --force, whole or not at all.

`claim_outputs` is the one place that decides whether a command may write its
outputs; every command calls it before any work starts. Files appear through a
temporary beside them, named ``.NAME.allocsim-PID.tmp`` (hidden, with the pid
of the writer), that `signals_unwind` removes on any signal that can be caught;
a later run writing into the same folder names the ones a killed run left.
`check_input_file` refuses, at once, inputs that cannot be read as files (pipes).
`guard_stdout` makes a report that cannot reach stdout (a full disk, ``>&-``) an error, not a silent exit 0.
"""
from __future__ import annotations

import errno
import io
import os
import re
import shlex
import signal
import stat
import sys
from contextlib import contextmanager

from .errors import InputError

#: ``.NAME.allocsim-PID.tmp``: what `temp_path` makes, what `stale_temporaries` looks for.
TEMP_NAME = re.compile(r"^\..+\.allocsim-(\d+)\.tmp$")

#: Signals that stop a program and can be caught (SIGINT's Python default already unwinds).
CATCHABLE = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


class Terminated(SystemExit):
    """A signal arrived: unwind like ``exit(128 + signum)`` so that ``finally`` blocks clean up."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    if os.getpid() != _unwinding_pid:
        # a child forked from the process that installed this handler (a pool's worker, before its initializer
        # resets the signals) holds a copy of it: it dies of the signal, never unwinds its parent's stack
        os._exit(128 + signum)
    raise Terminated(signum)


_unwinding_pid = os.getpid()     # the process whose signals unwind: set where `signals_unwind` installs them


@contextmanager
def _handlers(handler, *, only_default: bool):
    """Install ``handler`` for the catchable signals (only those at their default action, if asked);
    restore the previous handlers afterwards. Outside the main thread nothing changes (Python allows
    handlers only there)."""
    saved = {}
    try:
        for s in CATCHABLE:
            if not only_default or signal.getsignal(s) is signal.SIG_DFL:
                saved[s] = signal.signal(s, handler)
    except ValueError:          # not the main thread
        pass
    try:
        yield
    finally:
        for s, old in saved.items():
            signal.signal(s, old)


def signals_unwind():
    """Within the block, a catchable signal left at its default action raises `Terminated`.

    Signals the program ignores or handles itself keep their handler; SIGINT
    already unwinds as KeyboardInterrupt.
    """
    global _unwinding_pid
    _unwinding_pid = os.getpid()
    return _handlers(_raise_terminated, only_default=True)


def signals_ignored():
    """Within the block, the catchable signals are ignored (finishing a file must not be cut short)."""
    return _handlers(signal.SIG_IGN, only_default=False)


def temp_path(path: str) -> str:
    """The temporary that becomes ``path``: hidden, beside it, named with this process's pid; the name is
    cut short where ``path``'s own name leaves no room for the additions (a 250-character name)."""
    d, base = os.path.split(os.path.abspath(path))
    tail = f".allocsim-{os.getpid()}.tmp"
    room = _name_max(d)
    encoded = base.encode("utf-8", "surrogateescape")
    if len(encoded) + len(tail) + 1 > room:
        base = encoded[:room - len(tail) - 1].decode("utf-8", "ignore")
    return os.path.join(d, f".{base}{tail}")


def _name_max(directory: str) -> int:
    """The longest file name, in bytes, that ``directory``'s file system takes."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def own_temporary(path: str) -> bool:
    """True if ``path`` is a temporary this process is writing (an `atomic_path` inside another)."""
    m = TEMP_NAME.match(os.path.basename(path))
    return bool(m) and int(m.group(1)) == os.getpid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # someone else's live process
        return True
    except OSError:
        return False
    return True


def stale_temporaries(directory: str) -> list[str]:
    """Temporaries in ``directory`` whose writer is no longer running (killed before it could clean up)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names
            if (m := TEMP_NAME.match(n)) and not _alive(int(m.group(1)))]


_noticed: set[str] = set()


def notice_stale(directory: str) -> None:
    """Say once, on stderr, which temporaries a killed run left in ``directory`` and how to remove them."""
    directory = os.path.abspath(directory)
    if directory in _noticed:
        return
    _noticed.add(directory)
    stale = stale_temporaries(directory)
    if stale:
        from .units import fmt_bytes
        size = sum(os.path.getsize(p) for p in stale if os.path.isfile(p))
        traces = [p for p in stale if is_trace(p)]     # a killed recording's prefix: still readable
        keep = f" ({len(traces)} unfinished trace{'s' if len(traces) > 1 else ''}, readable: allocsim info " \
               f"{shlex.quote(traces[0])})" if traces else ""
        print(f"allocsim: note: {len(stale)} temporary file{'s' if len(stale) > 1 else ''} ({fmt_bytes(size)}) "
              f"left in {directory} by a killed run{keep}; remove with: rm {'-r ' * any(map(os.path.isdir, stale))}-- "
              f"{' '.join(map(shlex.quote, stale))}",
              file=sys.stderr)


def check_writable(path: str) -> str:
    """Raise `InputError` now if ``path`` cannot be written; return its directory."""
    check_named(path, "write")
    d = os.path.dirname(os.path.abspath(path))
    if os.path.exists(d) and not os.path.isdir(d):
        raise InputError(f"cannot write: {d} is a file, not a directory", path=path)
    if not os.path.isdir(d):
        raise InputError("cannot write: its directory does not exist", path=path)
    if not os.access(d, os.W_OK):
        raise InputError("cannot write: its directory is not writable", path=path)
    room = _name_max(d)
    if len(os.path.basename(path).encode("utf-8", "surrogateescape")) > room:
        raise InputError(f"cannot write: the file name is longer than the {room} bytes a name may have here",
                         path=path)
    if os.path.isdir(path):
        raise InputError("cannot write: it is a directory", path=path)
    if os.path.exists(path) and not os.path.isfile(path):
        raise InputError(NOT_A_FILE, path=path)
    return d


#: Why an output that is a pipe or a device is refused: its temporary's rename would replace the device itself
#: (``Trace.save("/dev/null")`` run as root replaced /dev/null with the trace).
NOT_A_FILE = "is a pipe or a device, not a file; name a file"


def check_can_create(path: str) -> None:
    """Make and remove the temporary that will become ``path`` (`temp_path`), or raise `InputError`: root passes
    `os.access` everywhere, and a read-only file system or ``/proc`` refuses only the write itself, which would
    come after the work.

    The probe is a temporary like any (`TEMP_NAME`), made before any `atomic_path` installs handlers: a signal
    while it exists (Ctrl-C, a kill) unwinds here too and removes it, rather than leaving it behind or killing
    the process at its default action with the file still there."""
    tmp = temp_path(path)
    ours = True
    with signals_unwind():
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(tmp)          # here, not in the finally: a signal during that check would skip the unlink
        except FileExistsError:     # this process's own, being written
            ours = False
        except OSError as e:
            raise InputError(f"cannot write: {e.strerror or e}", path=path) from None
        finally:
            if ours and os.path.lexists(tmp):       # a signal (or an error) between the open and the unlink
                os.unlink(tmp)


def check_named(path: str, doing: str = "read") -> None:
    """Raise `InputError` for an empty file name (``"$UNSET"`` in a script): refused, never read as "none";
    and for ``-``, which would be a file called ``-``, not the standard stream a user means by it."""
    if not path:
        raise InputError(f"cannot {doing}: the file name is empty (an unset variable?)", path=repr(path))
    if path == "-":
        stream = "standard input; save it to a file first" if doing == "read" else "standard output; name a file"
        raise InputError(f"cannot {doing}: allocsim does not take - for {stream} (./- is a file called -)",
                         path=path)


def check_input_file(path: str) -> None:
    """Raise `InputError` unless ``path`` is a regular file: inputs are read more than once and
    seeked in, which a pipe (``<(zcat log.gz)``) cannot do, and opening a FIFO nobody writes waits forever."""
    check_named(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise InputError(e.strerror or str(e), path=path) from None
    if stat.S_ISDIR(mode):
        raise InputError("is a directory, not a file", path=path)
    if not stat.S_ISREG(mode):
        raise InputError("is a pipe or a device, not a file (allocsim seeks in its inputs); save it to a file first",
                         path=path)


def same_file(a: str, b: str) -> bool:
    """True if ``a`` and ``b`` name one file: links and spellings (``./a``, ``a``) included."""
    try:
        return os.path.samefile(a, b)
    except OSError:             # one does not exist (yet): compare where the names lead
        return os.path.realpath(a) == os.path.realpath(b)


#: The files a user keeps as inputs, by their first bytes: ``{head: (kind, what it is)}``. A format adds its
#: own (`keep_files_starting_with`; `allocsim.trace.format` adds the trace magic), so this module, below
#: every format, knows none. A pickle (the PROTO opcode) is what `allocsim import` reads as a snapshot.
KEPT: dict[bytes, tuple[str, str]] = {b"\x80": ("pickle", "a pickle (a PyTorch memory snapshot, an input allocsim imports)")}


def keep_files_starting_with(head: bytes, kind: str, what: str) -> None:
    """Files that start with ``head`` are inputs a user keeps: ``kind`` names them, ``what`` says it to the user."""
    KEPT[head] = (kind, what)


def _kept(path: str) -> tuple[str, str] | None:
    """``(kind, what)`` of the kept input ``path`` is (`KEPT`), or None."""
    if not os.path.isfile(path):                # a FIFO would block the read
        return None
    if path.lower().endswith(".py"):            # (no first bytes tell it: `compare --csv train.py` replaced it)
        return ("source", "a Python source file")
    try:
        with open(path, "rb") as f:
            head = f.read(max(map(len, KEPT)))
    except OSError:
        return None
    return next((k for h, k in KEPT.items() if head.startswith(h)), None)


def is_trace(path: str) -> bool:
    """True if ``path`` is an existing file that starts with the trace magic."""
    kept = _kept(path)
    return kept is not None and kept[0] == "trace"


def kept_input(path: str) -> str | None:
    """What ``path`` is, if it is a file a user keeps as an input (an allocsim trace, a PyTorch memory
    snapshot, a Python source file), else None."""
    kept = _kept(path)
    return kept and kept[1]


#: Outputs claimed by this process: absolute path -> (the flag naming it, whether --force was given).
_CLAIMED: dict[str, tuple] = {}


def claim_outputs(outputs, inputs=(), *, force: bool = False) -> None:
    """Refuse before any work starts if an output would overwrite an input, or a trace without ``force``.

    ``outputs`` are ``(flag, path)`` pairs (the flag names the position in the
    error line; a None path is an output not asked for); ``inputs`` are paths. An input is never
    overwritten, ``--force`` or not. Also notes stale temporaries in the folders
    written to.
    """
    outputs = [(flag, p) for flag, p in outputs if p is not None and not own_temporary(p)]   # (an enclosing
    inputs = [p for p in inputs if p]                                                        # claim's temporary)
    named: dict[str, str] = {}
    for flag, out in outputs:           # (tune --plot P --snapshot P: the snapshot replaced the picture)
        check_named(out, "write")       # (an empty name or -: that line, not "is --plot's output too")
        first = named.setdefault(os.path.realpath(out), flag)
        if first != flag:
            raise InputError(f"is {first}'s output too: name another file for each", path=out, position=flag)
    for flag, out in outputs:
        if os.path.exists(out) and not os.path.isfile(out) and not os.path.isdir(out):     # (`check_writable`)
            raise InputError(NOT_A_FILE, path=out, position=flag)
        check_writable(out)
        check_can_create(out)
        for src in inputs:
            if same_file(out, src):
                raise InputError(f"would overwrite the input {src}; choose another output", path=out, position=flag)
        kept = None if force else kept_input(out)
        if kept:
            raise InputError(f"exists and is {kept}; pass --force to replace it", path=out, position=flag)
        _CLAIMED[os.path.abspath(out)] = (flag, force)
    for d in dict.fromkeys(os.path.dirname(os.path.abspath(p)) for _, p in outputs):
        notice_stale(d)


def add_force_argument(p) -> None:
    """``--force``, for every command that writes a file."""
    p.add_argument("--force", action="store_true",
                   help="replace an existing trace, snapshot or Python file named as an output (an input, a "
                        "plug-in's file among them, is never replaced)")


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds.

    The temporary is removed however the block ends, a signal included.
    """
    if own_temporary(path):        # written in place: the atomic_path that made it publishes it
        yield path
        return
    check_writable(path)
    tmp = temp_path(path)
    with signals_unwind():
        try:
            try:
                yield tmp
                _publish(tmp, path)
            except OSError as e:
                if e.filename not in (None, tmp):
                    raise
                raise InputError(f"cannot write: {e.strerror or e}", path=path) from None
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)


def _publish(tmp: str, path: str) -> None:
    """Rename ``tmp`` to ``path``. A claimed output without --force is not put over a trace or snapshot
    that another run wrote meanwhile (two ``synth -o same.bin`` at once): the later finisher refuses."""
    flag, force = _CLAIMED.get(os.path.abspath(path), (None, True))
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)              # only if nothing is there: atomic, unlike a check and a rename
        os.unlink(tmp)
        return
    except FileExistsError:
        pass
    except OSError:                     # no hard links here (some file systems): check, then rename
        pass
    kept = kept_input(path)
    if kept:
        raise InputError(f"{kept} appeared there while this run worked (another run writing it?); it is kept: "
                         f"pass --force to replace it", path=path, position=flag)
    os.replace(tmp, path)


@contextmanager
def atomic_folder(path: str, last: str = "index.html"):
    """Yield a temporary folder beside the folder ``path`` to write a set of files into (a report); they land in
    ``path`` only if the block succeeds, so a disk that fills leaves ``path`` as it was, never half a report.

    A new ``path`` is the temporary renamed; into an existing one each file is renamed, ``last`` (the page that
    links the others) last: renames take no room. An error naming a file in the temporary names it in ``path``.
    The temporary is removed however the block ends, a signal included."""
    import shutil
    given, path = path, os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = temp_path(path)
    with signals_unwind():
        try:
            try:
                os.mkdir(tmp)
                yield tmp
                if not os.path.exists(path):
                    os.rename(tmp, path)
                    return
                for name in sorted(os.listdir(tmp), key=lambda n: (n == last, n)):
                    os.replace(os.path.join(tmp, name), os.path.join(path, name))
            except OSError as e:
                if e.filename and not _inside(e.filename, tmp):
                    raise
                raise InputError(f"cannot write: {e.strerror or e}", path=_named_in(e.filename or tmp, tmp, given)) \
                    from None
            except InputError as e:
                if e.path and _inside(e.path, tmp):
                    raise InputError(e.what, path=_named_in(e.path, tmp, given), position=e.position) from None
                raise
        finally:
            if os.path.lexists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)


def _inside(name, folder: str) -> bool:
    return isinstance(name, str) and (os.path.abspath(name) + os.sep).startswith(folder + os.sep)


def _named_in(name: str, tmp: str, path: str) -> str:
    """``name``, a file in the temporary folder ``tmp``, as the user knows it: in ``path``, as they spelled it."""
    rel = os.path.relpath(os.path.abspath(name), tmp)
    return path if rel == "." else os.path.join(path, rel)


@contextmanager
def atomic_open(path: str, mode: str = "w"):
    """Open a temporary file beside ``path``; it becomes ``path`` only if the block succeeds. A link where the
    temporary goes (a name another run of this pid left) is not written through."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with open(fd, mode) as f:
            yield f


class _ClosedStdout(io.TextIOBase):
    """Standing in for the stdout a program was started without (``>&-``): the first write fails, so a report
    that cannot be delivered is an error (exit 2), never a silent success that printed nothing."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            raise OSError(errno.EBADF, "standard output is closed (started with >&-): the report could not be "
                                       "written")
        return 0


#: Where stdout's file started when `guard_stdout` ran, if stdout is a file of its own: `undo_stdout` cuts the
#: half-written report off there.
_stdout_start: int | None = None


def guard_stdout() -> None:
    """Make every failed write to stdout raise, once, at the start of a command.

    Started with stdout closed, Python has None there: a stand-in that refuses the first write takes its place
    (descriptor 1 is held by ``/dev/null``, so no file opened later becomes the stdout of a child process).
    Under ``PYTHONUNBUFFERED`` (``python -u``, common in containers) stdout's text layer writes straight to the
    file and drops what a short write left (a disk that fills mid-report): half a JSON document and exit 0. A
    buffer, flushed at each line, goes between; it writes the rest or raises."""
    global _stdout_start
    out = sys.stdout
    if out is None:
        try:
            os.fstat(1)
        except OSError:
            fd = os.open(os.devnull, os.O_WRONLY)
            if fd != 1:
                os.close(fd)
        sys.stdout = _ClosedStdout()
        return
    if out is sys.__stdout__ and isinstance(out, io.TextIOWrapper) and isinstance(out.buffer, io.RawIOBase):
        # the process's own stdout only: a stream a caller put there (a test's capture, a notebook's) is theirs,
        # and a wrapper of it would close it when collected
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(out.buffer), encoding=out.encoding, errors=out.errors,
                                      line_buffering=True)
    _stdout_start = _own_file_offset(sys.stdout)


def _own_file_offset(stream) -> int | None:
    """Where ``stream`` writes in a regular file that stderr does not share (``> out.json``, not ``> log 2>&1``,
    whose warnings a cut would lose), or None."""
    try:
        fd = stream.fileno()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            err = os.fstat(sys.stderr.fileno())
            if (err.st_dev, err.st_ino) == (st.st_dev, st.st_ino):
                return None
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            pass
        return os.lseek(fd, 0, os.SEEK_CUR)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None


def undo_stdout() -> None:
    """A write to stdout failed: cut the file it goes to back to where this run started writing it, so that what
    reads ``out.json`` later finds no report rather than half of one. What is still buffered goes to
    ``/dev/null`` (the interpreter's final flush would fail again, and say so on stderr)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return                  # not a file (tests capture it)
    try:
        if _stdout_start is not None:
            os.ftruncate(fd, _stdout_start)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass
