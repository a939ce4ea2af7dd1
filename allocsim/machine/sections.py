"""TimerOutputs-style sections: a tree of named steps with call counts and modeled time.

Policies name each escalation step as CuArrays did (``1. try alloc``,
``2. gc(false)``, ``1.2 scan`` ...). Slow paths `push`/`pop` a section around the
step; hot paths (a pool hit, a free) only bump counters and report their totals
once with `add` at the end of the replay, so the hot path pays nothing here.
Children print in name order, so the numbered steps print in escalation order.
"""
from __future__ import annotations

from contextlib import contextmanager

ALLOC_ROOT = "pooled alloc"
FREE_ROOT = "pooled free"


class Sections:
    def __init__(self):
        self.stats: dict[tuple, list] = {}   # path -> [ncalls, seconds]
        self.stack: list[str] = [ALLOC_ROOT]
        self._open: list[float] = []

    def add(self, name: str, seconds: float, calls: int = 1, *, path: tuple | None = None) -> None:
        """Count ``calls`` calls of ``name`` (under the open section) taking ``seconds`` in all."""
        key = path if path is not None else (*self.stack, name)
        s = self.stats.get(key)
        if s is None:
            self.stats[key] = [calls, seconds]
        else:
            s[0] += calls
            s[1] += seconds

    def push(self, name: str, clock: float) -> None:
        self.stack.append(name)
        self._open.append(clock)

    def pop(self, clock: float) -> None:
        t0 = self._open.pop()
        key = tuple(self.stack)
        self.stack.pop()
        self.add(key[-1], clock - t0, path=key)

    def rows(self) -> list[dict]:
        """`section_rows` of the sections so far."""
        return section_rows(self.stats)

    @contextmanager
    def kept(self):
        """Whatever is added inside is taken back at the end (a result read mid-replay)."""
        saved = {k: list(v) for k, v in self.stats.items()}
        try:
            yield
        finally:
            self.stats = saved


def section_rows(stats: dict) -> list[dict]:
    """Depth-first rows ``{path, name, depth, ncalls, seconds}`` of ``stats`` (path -> [ncalls, seconds]);
    roots by time, children by name."""
    children: dict[tuple, list[tuple]] = {}
    for key in stats:
        for d in range(1, len(key) + 1):
            parent, node = key[: d - 1], key[:d]
            lst = children.setdefault(parent, [])
            if node not in lst:
                lst.append(node)
    out = []

    def walk(parent, depth):
        nodes = children.get(parent, [])
        nodes = sorted(nodes, key=(lambda k: -stats.get(k, [0, 0])[1]) if depth == 0 else (lambda k: k[-1]))
        for node in nodes:
            calls, secs = stats.get(node, [0, 0.0])
            out.append({"path": "/".join(node), "name": node[-1], "depth": depth, "ncalls": calls,
                        "seconds": secs})
            walk(node, depth + 1)

    walk((), 0)
    return out
