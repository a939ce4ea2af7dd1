"""TimerOutputs-style sections: a tree of named steps with call counts and modeled time.

Policies name each escalation step as CuArrays did (``1. try alloc``,
``2. gc(false)``, ``1.2 scan`` ...). Slow paths `push`/`pop` a section around the
step; hot paths (a pool hit, a free) only bump counters and report their totals
once with `add` at the end of the replay, so the hot path pays nothing here.
Children print in name order, so the numbered steps print in escalation order.
"""
from __future__ import annotations

from .units import fmt_count, fmt_seconds

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
        """Depth-first rows ``{path, name, depth, ncalls, seconds}``; roots by time, children by name."""
        children: dict[tuple, list[tuple]] = {}
        for key in self.stats:
            for d in range(1, len(key) + 1):
                parent, node = key[: d - 1], key[:d]
                lst = children.setdefault(parent, [])
                if node not in lst:
                    lst.append(node)
        out = []

        def walk(parent, depth):
            nodes = children.get(parent, [])
            nodes = sorted(nodes, key=(lambda k: -self.stats.get(k, [0, 0])[1]) if depth == 0 else (lambda k: k[-1]))
            for node in nodes:
                calls, secs = self.stats.get(node, [0, 0.0])
                out.append({"path": "/".join(node), "name": node[-1], "depth": depth, "ncalls": calls,
                            "seconds": secs})
                walk(node, depth + 1)

        walk((), 0)
        return out

    def table(self, title: str | None = None) -> str:
        """The section table in the layout the CuArrays TimerOutputs tables use."""
        rows = self.rows()
        total = sum(r["seconds"] for r in rows if r["depth"] == 0) or 1.0
        width = max([len("Section")] + [2 * r["depth"] + len(r["name"]) for r in rows]) + 2
        lines = []
        if title:
            lines.append(f" {title}")
        head = f" {'Section':<{width}}{'ncalls':>8} {'time':>8} {'%tot':>6} {'avg':>8}"
        rule = " " + "─" * (len(head) - 1)
        lines += [rule, head, rule]
        for r in rows:
            name = "  " * r["depth"] + r["name"]
            avg = r["seconds"] / r["ncalls"] if r["ncalls"] else 0.0
            pct = 100 * r["seconds"] / total
            pct_s = f"{pct:.3g}%" if pct >= 0.01 or pct == 0 else "<0.01%"
            lines.append(f" {name:<{width}}{fmt_count(r['ncalls']):>8} {fmt_seconds(r['seconds']):>8} "
                         f"{pct_s:>6} {fmt_seconds(avg):>8}")
        lines.append(rule)
        return "\n".join(lines)
