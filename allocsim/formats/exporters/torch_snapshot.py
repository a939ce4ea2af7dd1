"""A replay written as a PyTorch memory snapshot, for PyTorch's memory visualizer.

`History` watches a replay (`replay_snapshot`) of a trace through a policy that knows
its segment layout (``layout(live)``, the ``torch`` model) and gives the run as the dictionary
``torch.cuda.memory._snapshot()`` returns: the final ``segments`` with their ``blocks``,
and ``device_traces[0]``, the whole history (``alloc``, ``free_requested`` and
``free_completed``, ``segment_alloc``/``free``/``map``/``unmap``, ``oom``). It is the
inverse of `allocsim.formats.importers.torch_snapshot`: importing the export gives back the
replayed events. `write_snapshot` pickles it with plain Python objects (no torch), in
pickle protocol 4: https://pytorch.org/memory_viz unpickles protocols 2 to 4 only.

Where the trace entries come from: the replay's observer sees each ALLOC and FREE
and its block (a FREE's block is where its ALLOC put it); the policy's segment log
gives each device call's kind, size, address and stream, and the event that made it
(`History.stamp`), so it goes just before that ALLOC's ``alloc`` entry; each OOM of
the result becomes an ``oom`` after its request's segment calls. A FREE is
``free_requested`` + ``free_completed``, unless the trace holds the program's own
FREE_REQUESTED before it (a recorded snapshot's ``record_stream``): ``free_requested``
goes there, and a block whose free was requested but never completed ends
``active_pending_free``, as PyTorch shows it. Times are the trace's, in µs.
A free block's ``requested_size`` is 0 (PyTorch keeps the size its last allocation
asked for). An ALLOC's call site (``file:line:function``) is its one stack frame, on
its block and its entries, as PyTorch puts the allocation's stack on them.
"""
from __future__ import annotations

import pickle
import time

import numpy as np

from ...errors import UsageError
from ...frameworks.torch import snapshot_settings
from ...outputs import atomic_open
from ...engine.replay import Replay, ReplaySettings, load_trace, settings_of, to_the_end
from ...engine.spec import PolicySpec
from ...trace.events import (ALLOC, FREE_REQUESTED, NO_SITE, POOL, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                            SEGMENT_UNMAP)

#: pickle protocol MemoryViz.js reads (it refuses 5, Python 3.14's default)
PROTOCOL = 4
SEGMENT_ACTIONS = {SEGMENT_ALLOC: "segment_alloc", SEGMENT_FREE: "segment_free",
                   SEGMENT_MAP: "segment_map", SEGMENT_UNMAP: "segment_unmap"}


def check_exportable(policy, runtime: str = "eager") -> PolicySpec:
    """The policy's spec, or a one-line `UsageError` if its replay cannot be a snapshot."""
    spec = PolicySpec.of(policy)
    if spec.policy_class().layout is None:
        raise UsageError(f"--snapshot: policy {spec.name!r} keeps no segment layout to export (the torch model does)")
    if runtime != "eager":
        raise UsageError("--snapshot: PyTorch frees a tensor when it dies; export an eager replay (--runtime eager)")
    return spec


class History:
    """Builds the snapshot of one replay: block entries from the observer, the rest after the run."""

    def __init__(self, trace):
        self.trace = trace
        self.streams = [int(s) for s in trace.streams] or [0]
        self.time_ns = trace.time_ns
        self.entries: list[tuple[int, dict]] = []     # (event index, entry): block entries in replay order
        self.live: dict[int, object] = {}               # id -> handle of each live block
        self.where: dict[int, tuple] = {}               # id -> (addr, requested size, stream, frames) at its ALLOC
        self.frames = [frames_of(site) for site in trace.sites]      # one list per call site, shared
        self.stamps: list[int] = []                     # the event that made each segment_log entry
        self.observed = -1                              # the last event the observer saw
        self.end = len(trace)                           # where the walk ended (an OOM can stop it)
        self.policy = None                              # the replay's policy, set once it is made
        at = np.flatnonzero(np.isin(np.asarray(trace.kind), POOL))      # a private pool's number -> its id
        self.pool_ids = {int(n): (int(a) >> 32, int(a) & 0xFFFFFFFF)
                         for n, a in zip(trace.aux[at].tolist(), trace.addr[at].tolist())}
        asked = np.flatnonzero(np.asarray(trace.kind) == FREE_REQUESTED)
        self.asked: dict[int, int] = dict(zip(trace.id[asked].tolist(), asked.tolist()))  # id -> its FREE_REQUESTED

    def stream(self, index: int) -> int:
        return self.streams[index] if index < len(self.streams) else index

    def entry(self, at: int, action: str, addr: int, size: int, stream: int, frames=()) -> tuple[int, dict]:
        return at, {"action": action, "addr": int(addr), "size": int(size), "stream": stream,
                    "time_us": int(self.time_ns[at]) // 1000, "frames": frames or []}

    def observe(self):
        """The replay's observer: an ``alloc`` per ALLOC, ``free_requested`` + ``free_completed`` per FREE.
        ``self.policy`` is set to the replay's policy once it is made (the observer is made before it)."""
        entries, live, where, trace = self.entries, self.live, self.where, self.trace

        def observer(at, kind, i, h):
            self.stamp(self.policy.segment_log, at)
            if kind == ALLOC:
                addr, _ = self.policy.block(h)
                site = int(trace.site[at])
                where[i] = (addr, int(trace.size[at]), self.stream(int(trace.stream[at])),
                            self.frames[site] if site != NO_SITE else [])
                live[i] = h
                entries.append(self.entry(at, "alloc", *where[i]))
            elif i in where:
                del live[i]
                self.free_requested(i, at)
                entries.append(self.entry(at, "free_completed", *where.pop(i)))
        return observer

    def free_requested(self, i: int, at: int | None = None) -> None:
        """Object ``i``'s ``free_requested``: at its FREE_REQUESTED if the trace has one before ``at``, else at ``at``."""
        asked = self.asked.get(i, at)
        self.entries.append(self.entry(asked if at is None or asked < at else at, "free_requested", *self.where[i]))

    def stamp(self, log, at: int) -> None:
        """Give the segment calls logged since the last event seen, event ``at``, their event.

        The log names the ALLOC being served (``log_events``): right for the calls of ``at``'s
        malloc and of a failed malloc the observer never saw, stale for the calls of an event
        that is not an ALLOC (an ``empty_cache``), which are ``at``'s own.
        """
        seen = self.observed
        self.stamps += [e if e > seen else at for _, _, e in log[len(self.stamps):]]
        self.observed = at

    def device_trace(self, pol, res) -> list[dict]:
        """Every entry in replay order: an event's segment calls, then its ``alloc`` or ``oom``."""
        self.stamp(pol.segment_log, self.observed)     # the calls of a failed ALLOC that ended the walk
        before = [self.entry(at, SEGMENT_ACTIONS[kind], addr, size, self.stream(stream))
                  for at, (kind, size, _), (addr, stream) in zip(self.stamps, pol.segment_log, pol.segment_where)]
        capacity = res.capacity_bytes
        for o in res.oom_events:
            at, e = self.entry(o.event, "oom", 0, o.size, self.stream(o.stream))
            del e["addr"]
            e["device_free"] = max(0, capacity - o.reserved_bytes) if capacity else 0
            before.append((at, e))
        for i in self.pending():
            self.free_requested(i)
        # stable sort: segment calls (in call order) and an OOM go before the block entries of the same event
        return [e for _, e in sorted(before + self.entries, key=lambda x: x[0])]

    def pending(self) -> list[int]:
        """The live objects whose free the program requested before the walk ended (it completes later)."""
        return [i for i in self.live if self.asked.get(i, self.end) < self.end]

    def segments(self, pol) -> list[dict]:
        """The final layout in ``snapshot()``'s form."""
        out = []
        pending = {self.where[i][0] for i in self.pending()}
        frames = {self.where[i][0]: self.where[i][3] for i in self.live}
        for seg in pol.layout(list(self.live.values())):
            blocks = [{"address": a, "size": s, "requested_size": r, "frames": frames.get(a, []) if on else [],
                       "state": "inactive" if not on else "active_pending_free" if a in pending else "active_allocated"}
                      for a, s, r, on in seg["blocks"]]
            out.append({"device": 0, "address": seg["address"], "total_size": seg["size"],
                        "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                        "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                        "requested_size": sum(b["requested_size"] for b in blocks),
                        "stream": self.stream(seg["stream"]), "segment_type": "small" if seg["small"] else "large",
                        "segment_pool_id": self.pool_ids.get(seg.get("pool", 0), (0, 0)), "is_expandable": seg["expandable"], "frames": [],
                        "blocks": blocks})
        return out

    def snapshot(self, pol, res) -> dict:
        if not res.completed:
            self.end = res.oom_events[-1].event
        return {"segments": self.segments(pol), "device_traces": [self.device_trace(pol, res)],
                "allocator_settings": snapshot_settings(pol.options), "external_annotations": []}


def frames_of(site: str) -> list[dict]:
    """A call site ``file:line:function`` as the one stack frame PyTorch would list (the importer reads it back)."""
    parts = site.rsplit(":", 2)
    filename, line, name = parts if len(parts) == 3 else (site, "0", "?")
    return [{"filename": filename, "line": int(line) if line.isdigit() else line, "name": name}]


def write_snapshot(snapshot: dict, path: str) -> None:
    """Pickle ``snapshot`` to ``path`` as ``torch.cuda.memory._dump_snapshot`` would, whole or not at all."""
    with atomic_open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=PROTOCOL)


def replay_snapshot(trace: "Trace | str", policy, settings: ReplaySettings | None = None, **changes):
    """Replay ``trace`` (a `Replay` with these arguments) and return ``(result, snapshot)``: the run as a
    PyTorch memory snapshot (this module), for a policy that keeps a segment layout.
    Timed, and a plug-in's exception one line, as `replay`."""
    s = settings_of(settings, {k: changes.pop(k) for k in list(changes) if k in ReplaySettings.__dataclass_fields__})
    spec = check_exportable(policy, s.runtime)
    trace, loaded = load_trace(trace)
    t_start = time.perf_counter()
    history = History(trace)
    r = Replay(trace, spec, s, observer=history.observe(), log_events=True, **changes)
    history.policy = r.policy
    res = to_the_end(r, spec, True, loaded, t_start)
    return res, history.snapshot(r.policy, res)
