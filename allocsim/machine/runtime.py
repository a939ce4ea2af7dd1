"""Runtimes: when a program's FREE reaches the pool, and what a collection does.

`eager` hands each FREE to the policy at once (Python refcounting, PyTorch, CuPy);
a collection there frees nothing and only costs a pause (CuPy's ``gc.collect()``
on its OOM path).

`gc` models a tracing, generational collector (Julia, the CuArrays setting): a
FREE only marks the object dead. `collect(full=False)` — ``gc(false)`` — reclaims
objects that died before being promoted, i.e. allocated since the last
collection; survivors are then promoted. `collect(full=True)` — ``gc(true)`` —
reclaims every dead object. Reclaimed objects go back to the policy through its
``free``, inside the collection, as Julia finalizers do. Collections run when a
policy's escalation asks, and every ``gc_every`` allocated bytes if set.

Frees the recorded run made *inside* a request (FREE flagged ``IN_REQUEST``: CuPy's
``gc.collect()`` on its limit or OOM path collected them after the request's best-fit
lookup) are `hold`-ed by the eager runtime: the k-th full collection the policy runs in
that request hands it those of the recorded run's k-th collection, and `end_request`
(after the request's malloc) the rest, so the lookup never sees them.

Costs: marking a FREE is O(1); a collection is O(objects reclaimed).
"""
from __future__ import annotations

from .sections import FREE_ROOT


class Runtime:
    name = ""

    def __init__(self, device, sections, *, gc_every: int | None = None):
        self.device = device
        self.sections = sections
        self.costs = device.costs
        self.gc_every = gc_every
        self.gc_incremental = 0
        self.gc_full = 0
        self.gc_time = 0.0
        self.reclaimed_bytes = 0
        self.reclaimed_objects = 0
        self.policy = None
        self.handles = None
        #: ``(handle, k)`` of the frees held for the request in progress (`hold`); empty between requests
        self.held: list = []
        self._request_collections = 0

    def attach(self, policy, handles: dict) -> None:
        """Bind to the policy and the engine's id -> handle table (live ids only)."""
        self.policy = policy
        self.handles = handles

    def _charge(self, full: bool) -> float:
        raise NotImplementedError

    def collect(self, full: bool = False) -> int:
        """Run a collection; return the number of objects it reclaimed."""
        pause = self._charge(full)
        self.device.clock += pause
        self.gc_time += pause
        if full:
            self.gc_full += 1
        else:
            self.gc_incremental += 1
        return self._reclaim(full)

    def _reclaim(self, full: bool) -> int:
        return self._release_held(full)

    def hold(self, handle, k: int) -> None:
        """A free the recorded run made inside the next request, in its k-th collection (0: outside any):
        given to the policy at the k-th full collection of that request, or at `end_request`."""
        self.held.append((handle, k))

    def _release_held(self, full: bool) -> int:
        """In a full collection inside a request: free the held handles of this collection or an earlier one."""
        if not full or not self.held:
            return 0
        self._request_collections += 1
        n = self._request_collections
        due = [h for h, k in self.held if 0 < k <= n]
        if due:
            self.held[:] = [(h, k) for h, k in self.held if not 0 < k <= n]
            free = self.policy.free
            for h in due:
                free(h)
        return len(due)

    def end_request(self) -> None:
        """The request the held frees were made in has been served (or failed): free the rest."""
        held = self.held[:]
        self.held.clear()
        self._request_collections = 0
        free = self.policy.free
        for h, _ in held:
            free(h)


class EagerRuntime(Runtime):
    """Frees reach the policy at once; collections only cost a pause."""

    name = "eager"
    eager = True

    def _charge(self, full):
        return self.costs.eager_collect_s


class GCRuntime(Runtime):
    """Deferred frees, reclaimed by incremental (young) or full (all) collections."""

    name = "gc"
    eager = False

    def attach(self, policy, handles):
        super().attach(policy, handles)
        self.epoch = 0
        self.born = {}          # id -> (epoch of its allocation, requested bytes), for live objects
        self.dead_young = []    # (id, bytes) dead and allocated in the current epoch
        self.dead_old = []      # (id, bytes) dead and promoted by an earlier collection

    def _charge(self, full):
        return self.costs.gc_full_s if full else self.costs.gc_incremental_s

    def on_alloc(self, id_: int, size: int) -> None:
        self.born[id_] = (self.epoch, size)

    def on_free(self, id_: int) -> None:
        epoch, size = self.born.pop(id_)
        (self.dead_young if epoch == self.epoch else self.dead_old).append((id_, size))

    def _reclaim(self, full):
        ids = self.dead_young
        if full:
            ids = ids + self.dead_old
            self.dead_old = []
        self.dead_young = []
        self.epoch += 1
        if not ids:
            return 0
        handles, free = self.handles, self.policy.free
        t0 = self.device.clock
        nbytes = 0
        for i, size in ids:
            free(handles.pop(i))
            nbytes += size
        self.sections.add(FREE_ROOT, self.device.clock - t0, len(ids))
        self.reclaimed_bytes += nbytes
        self.reclaimed_objects += len(ids)
        return len(ids)


RUNTIMES = {"eager": EagerRuntime, "gc": GCRuntime}
