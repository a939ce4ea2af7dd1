"""`allocsim tune` on a run of several processes: the worst rank searched, the answer checked on every rank.

Each rank fits its GPU only with what lay outside its caching allocator beside it (`allocsim.machine.ranks.fit_capacity`:
the GPU's memory less the CUDA context, NCCL's buffers and other processes the recording saw). The rank with the
least room (that capacity, or the memory fraction or limit the rank set itself where lower, less its recorded peak
reserved, or its LOAD where no segments were recorded) is tuned as one trace is (`allocsim.search.tune.tune`); its finalists, best first, are then replayed on every other rank at that
rank's capacity, and the first that fits every rank is the recommendation (docs/several-processes.md).

The traces may hold one process recorded more than once (``allocsim tune run.bin rerun.bin``): the same program's
allocations, in the same order and sizes, whose frees can still land elsewhere — DDP frees its first gradient bucket
at the bucket rebuild or one to two steps later, as the run's timing falls, under any setting (traces/README.md,
"Runs of two processes").
Each recording is checked as a rank is, and `RunTuning.variants` says which frees moved and the range of the
setting's peak over the recordings: the fit is judged on every one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..machine.capacity import device_capacity
from ..errors import UsageError
from ..filenames import shown_name
from ..machine.ranks import check_room, fit_capacity, process_words, rank_label
from ..engine.spec import PolicySpec
from .sweep import Cell, Settings, run_cells
from ..trace import Trace
from ..trace.analysis import Tally, free_points, moved_frees
from ..trace.events import OOM
from .tune import PASTE_KEYS, Tuning, conf_lines, tune
from ..units import fmt_bytes


@dataclass
class RunTuning:
    """What `tune_run` found; `to_dict` is ``allocsim tune RUN --json``."""

    paths: list[str]
    labels: list[str]
    capacities: list          # per rank: the capacity its replays ran at (bytes, None, or "trace")
    outside: list[int]        # per rank: bytes outside the allocator
    worst: int                # position of the rank tuned
    tuning: Tuning
    recorded_ooms: list[set] = field(default_factory=list)  # per rank: event indices of the OOMs it recorded
    checks: list[list[dict]] = field(default_factory=list)   # per finalist tried: one row per rank
    chosen: dict | None = None     # the worst rank's row of the setting that fits every rank
    recordings: list[dict] = field(default_factory=list)   # one process recorded more than once (`recorded_again`)

    @property
    def rank_rows(self) -> list[dict]:
        """The rows of the setting shown per rank: the chosen one (the last tried), else the first tried (the
        worst rank's best)."""
        if not self.checks:
            return []
        return self.checks[-1] if self.chosen is not None else self.checks[0]

    @property
    def variants(self) -> list[dict]:
        """Per process recorded more than once: its traces, the frees they make at different points
        (`moved_frees`), and the shown setting's peak reserved and device mallocs on each."""
        rows = self.rank_rows
        return [{"traces": [self.paths[k] for k in g["positions"]], "allocs": g["allocs"], "moved": g["moved"],
                 "peak_reserved_bytes": [rows[k]["peak_reserved_bytes"] for k in g["positions"]] if rows else None,
                 "device_mallocs": [rows[k]["device_mallocs"] for k in g["positions"]] if rows else None}
                for g in self.recordings]

    def to_dict(self) -> dict:
        return {"run": self.paths, "ranks": [{"trace": p, "rank": label, "outside_bytes": out, "row": row}
                                             for p, label, out, row in zip(self.paths, self.labels, self.outside,
                                                                           self.rank_rows or [None] * len(self.paths))],
                "worst": self.paths[self.worst], "recommended": self.chosen and conf_lines(self.chosen),
                "fits_every_rank": self.chosen is not None, "settings_tried": len(self.checks),
                "recorded_again": self.variants,
                "tuning": self.tuning.to_dict()}


def room(need: int, capacity) -> tuple[int, int]:
    """Sort key of a rank's room (smaller: worse): its capacity less what it needs; a rank with no capacity limit
    sorts after those with one, by need alone."""
    return (0, capacity - need) if isinstance(capacity, int) else (1, -need)


def tune_run(paths: list[str], *, capacity="trace", cap: int | None = None, jobs: int = 1,
             settings: Settings | None = None, given: str | None = None, **options) -> RunTuning:
    """Tune the worst rank of the run ``paths`` (``options``: `tune`'s) at its capacity, then find the best of
    its finalists that fits every rank (``given``: ``--capacity``'s text, which a refusal quotes)."""
    tallies = [Tally() for _ in paths]
    traces = [Trace.load(p, walkers=[t]) for p, t in zip(paths, tallies)]
    for path, t in zip(paths, traces):
        check_room(capacity, t, t.load_bytes, f"its LOAD {fmt_bytes(t.load_bytes)} (peak live bytes)", given,
                   who=f"{process_words(rank_label(t.meta), path)} ({shown_name(path)})")
    fitted = [fit_capacity(capacity, t) for t in traces]
    capacities = [c for c, _ in fitted]
    needs = [tally.upstream_segments()["peak_reserved_bytes"] or t.load_bytes for tally, t in zip(tallies, traces)]
    totals = [device_capacity(c, t)[0] for c, t in zip(capacities, traces)]
    for path, t, total in zip(paths, traces, totals):
        if total is not None and t.load_bytes > total:      # (a rank without outside bytes: check_room passed it)
            raise UsageError(f"{process_words(rank_label(t.meta), path)} ({shown_name(path)}): its LOAD "
                             f"{fmt_bytes(t.load_bytes)} (peak live bytes) is more than the {fmt_bytes(total)} it has"
                             ": no allocator setting fits the run")
    limits = [min([total] * (total is not None) + [lim["bytes"] for lim in tally.limits if lim["bytes"]] or [None])
              for total, tally in zip(totals, tallies)]       # a rank's own memory fraction or CuPy limit too
    worst = min(range(len(paths)), key=lambda k: room(needs[k], limits[k]))
    res = tune(paths[worst], capacity=capacities[worst], cap=cap, jobs=jobs, settings=settings, **options)
    out = RunTuning(list(paths), [rank_label(t.meta) for t in traces], capacities, [o for _, o in fitted], worst, res,
                    [set(np.flatnonzero(t.kind == OOM).tolist()) for t in traces], recordings=recorded_again(traces))
    for row in (r for r in res.finalists if not r["ooms"]):
        spec = PolicySpec.parse(row["spec"])
        others = [k for k in range(len(paths)) if k != worst]
        cells = [Cell(paths[k], spec, row["cap_bytes"], row["runtime"], capacity=capacities[k]) for k in others]
        named = {k: row[k] for k in ("setting", "spec", "recorded", *PASTE_KEYS) if k in row}
        by_key = sorted(range(len(cells)), key=lambda i: cells[i].sort_key())   # run_cells' order of its rows
        rows = {others[i]: {**r, **named} for i, r in zip(by_key, run_cells(cells, settings, jobs=jobs))}
        rows[worst] = row
        out.checks.append([rows[k] for k in range(len(paths))])
        if not any(r["ooms"] for r in rows.values()):
            out.chosen = row
            break
    return out


def recorded_again(traces: list[Trace]) -> list[dict]:
    """The groups (of two or more) of the traces of one process (the same rank, or none) that record one program's
    allocations, the same in number, size and order (one process recorded more than once; two ranks that allocate
    alike are two processes): ``{"positions", "allocs", "moved"}``, ``moved`` the frees that land at different
    points (`moved_frees`)."""
    groups: list[tuple[str, np.ndarray, list[int]]] = []
    for k, t in enumerate(traces):
        label, sizes = rank_label(t.meta), free_points(t)[0]
        for who, first, members in groups:
            if who == label and np.array_equal(first, sizes):
                members.append(k)
                break
        else:
            groups.append((label, sizes, [k]))
    return [{"positions": members, "allocs": len(sizes), "moved": moved_frees(*(traces[k] for k in members))}
            for _, sizes, members in groups if len(members) > 1]
