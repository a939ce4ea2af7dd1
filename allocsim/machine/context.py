"""The policy context: the only thing a policy touches.

A policy sees the replay through one `PolicyContext` (``self.ctx``):

- the device: ``malloc(n) -> addr | None``, ``free(addr, n)``, ``fits(n)``, ``note(need,
  granted)``, ``pin()``, ``reserve_address_range(n)`` and ``map(n) -> bool`` (pages into such a
  range) (each charges its own modeled time);
- the limits, read live: ``cap`` (the pool cap: ``--cap`` or the program's recorded
  limit), ``limit`` (the smaller of cap and capacity), ``capacity``, and ``reserved``;
- time: ``clock`` (read-only) and ``charge(seconds)`` for modeled pool work; ``costs``;
- named sections: ``push_section(name)`` / ``pop_section()`` around a slow step,
  ``add_section(name, seconds, calls)`` for hot-path totals (``section_path()``: where it counts),
  ``section(name)`` as a ``with`` block;
- the runtime: ``collect(full)`` (returns the objects reclaimed) and ``eager`` (the engine
  owns the id -> handle table; a pool that renumbers its handles declares ``Policy.renumber``);
- repeating an idle interval: ``totals(root)`` and ``repeat(k, before, after)`` (binned's background task);
- the trace: ``meta`` (the recording's metadata) and ``trace`` (offline policies plan on it);
- real-GPU policies only: ``measured_device``, the accounting they fill in from the real allocator.

Device calls are the device's own bound methods, so the hot path pays no extra layer.
"""
from __future__ import annotations

from contextlib import contextmanager


class PolicyContext:
    """What one replay lends its policy (see the module docstring)."""

    def __init__(self, device, runtime, sections, trace=None):
        self._device, self._runtime, self._sections = device, runtime, sections
        self.malloc, self.free = device.malloc, device.free
        self.fits, self.note, self.pin = device.fits, device.note, device.pin
        self.reserve_address_range = device.reserve_address_range
        self.map = device.map
        self.collect = runtime.collect
        self.charge = device.charge     # `charge(seconds)`: modeled pool work onto the clock (the device's own)
        self.costs = device.costs
        self.trace = trace
        self.meta = trace.meta if trace is not None else {}

    # ---- limits and device state, read live (a recorded SET_LIMIT changes the cap) ------------
    @property
    def cap(self) -> int | None:
        return self._device.cap

    @property
    def limit(self) -> int:
        return self._device.limit

    @property
    def capacity(self) -> int | None:
        return self._device.capacity

    @property
    def reserved(self) -> int:
        return self._device.reserved

    # ---- time ------------------------------------------------------------------------------
    @property
    def clock(self) -> float:
        """The replay's modeled clock, seconds (device calls, pool work and GC pauses add to it)."""
        return self._device.clock

    # ---- named sections ---------------------------------------------------------------------
    def push_section(self, name: str) -> None:
        self._sections.push(name, self._device.clock)

    def pop_section(self) -> None:
        self._sections.pop(self._device.clock)

    def add_section(self, name: str, seconds: float, calls: int = 1, under: tuple | None = None) -> None:
        """Count ``calls`` calls of ``name`` under the open section (or the path ``under``, a `section_path`),
        ``seconds`` in all (hot-path totals)."""
        self._sections.add(name, seconds, calls, path=None if under is None else (*under, name))

    def section_path(self) -> tuple:
        """The open sections' names, outermost first: where `add_section` would count now."""
        return tuple(self._sections.stack)

    @contextmanager
    def section(self, name: str):
        """Time the enclosed step as section ``name``, nested under the open one."""
        self.push_section(name)
        try:
            yield
        finally:
            self.pop_section()

    @contextmanager
    def top_level(self):
        """Sections opened inside are roots (work outside any malloc: a background task, a periodic GC)."""
        stack = self._sections.stack
        saved = stack[:]
        stack[:] = []
        try:
            yield
        finally:
            stack[:] = saved

    # ---- the runtime --------------------------------------------------------------------------
    @property
    def eager(self) -> bool:
        """True when a FREE reaches the policy at once (no tracing collector)."""
        return self._runtime.eager

    @property
    def measured_device(self):
        """Real-GPU policies only: the device's own accounting (reserved, peak, call counts and times), which
        they fill in from the real allocator they run, since that allocator stands in for device and pool."""
        return self._device

    # ---- repeating an idle interval (binned's background task fast-forwards) -----------------------
    def totals(self, root: str) -> tuple:
        """The shared running totals an interval adds to: clock, GC count, time and epoch, and the
        sections under ``root``."""
        rt = self._runtime
        return (self._device.clock, rt.gc_time, rt.gc_incremental, getattr(rt, "epoch", 0),
                {k: tuple(v) for k, v in self._sections.stats.items() if k[0] == root})

    def repeat(self, k: int, before: tuple, after: tuple) -> None:
        """Add ``k`` more copies of the interval that took `totals` from ``before`` to ``after``."""
        rt = self._runtime
        self._device.clock += k * (after[0] - before[0])
        rt.gc_time += k * (after[1] - before[1])
        rt.gc_incremental += k * (after[2] - before[2])
        if hasattr(rt, "epoch"):
            rt.epoch += k * (after[3] - before[3])
        for key, (calls, secs) in after[4].items():
            c0, s0 = before[4].get(key, (0, 0.0))
            stat = self._sections.stats[key]
            stat[0] += k * (calls - c0)
            stat[1] += k * (secs - s0)
