"""The cheap contract checks a plug-in's replay runs as it goes.

A built-in policy is held to the contract by the test suite (`allocsim.testing`); a plug-in is
not, and one that breaks it would replay to exit 0 with wrong figures (a negative address, a
device call of -5 bytes counted as thousands of mallocs, reserved lowered by freeing what was
never taken). So `Replay` guards a plug-in (`spec.is_plugin`: its allocation code, or a subclass of a built-in
overriding a helper the built-in's loop inlines, `policies.base.overrides_inlined`), and only a plug-in, so the
built-ins' hot path pays nothing:

- `guard_device_calls`: the context's ``malloc(n)`` refuses ``n`` that is not a positive
  number of bytes; ``free(addr, n)`` refuses a range the policy never took from the device
  (a segment from ``malloc``, with its size, or pages inside a range from
  ``reserve_address_range``, as expandable segments unmap them); ``map`` takes a positive number of bytes;
- `guard_policy`: after each ``malloc`` and before each ``free``, the block the handle names
  (``block(handle)``) is a non-negative address, at least the request, inside memory taken
  from the device and overlapping no live block; ``allocated`` stays within the bytes the live
  blocks were asked for and reserved;
- `guard_counters`: a plug-in's ``counters()`` (whatever else it defines) is a dict of names and finite
  numbers, its ``cache_flushes`` a count.

Each broken rule is one `PluginError` line naming the plug-in and the rule, the rules
`allocsim.testing.check_policy` states in full (docs/architecture.md, "The policy contract").
"""
from __future__ import annotations

import math
import numbers
from bisect import bisect_right, insort

import numpy as np

from ..errors import PluginError


class _Ranges:
    """Address ranges ``{start: size}`` with their starts kept sorted, so that a lookup is a bisection."""

    def __init__(self):
        self.size: dict[int, int] = {}
        self.starts: list[int] = []

    def add(self, addr: int, n: int) -> None:
        self.size[addr] = n
        insort(self.starts, addr)

    def remove(self, addr: int) -> None:
        del self.size[addr]
        del self.starts[bisect_right(self.starts, addr) - 1]

    def holds(self, addr: int, n: int) -> bool:
        """True if ``[addr, addr + n)`` lies inside one range."""
        i = bisect_right(self.starts, addr) - 1
        return i >= 0 and addr + n <= self.starts[i] + self.size[self.starts[i]]

    def overlaps(self, addr: int, n: int) -> bool:
        """True if ``[addr, addr + n)`` shares a byte with a range."""
        i = bisect_right(self.starts, addr)
        before = self.starts[i - 1] if i else None
        after = self.starts[i] if i < len(self.starts) else None
        return (before is not None and before + self.size[before] > addr) or (after is not None and addr + n > after)


class _Taken:
    """What the policy holds from the device: live segments and reserved address ranges."""

    def __init__(self):
        self.segments, self.ranges = _Ranges(), _Ranges()

    def holds(self, addr: int, n: int) -> bool:
        return self.segments.holds(addr, n) or self.ranges.holds(addr, n)


def _broke(name: str, what: str) -> PluginError:
    return PluginError(f"policy {name!r} broke the policy contract: {what} (allocsim.testing.check_policy "
                       f"checks a policy against it; docs/architecture.md, The policy contract)")


def _is_bytes(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0


def guard_device_calls(ctx, device, name: str) -> _Taken:
    """Replace ``ctx``'s device calls by checked ones; return what they record the policy took."""
    taken = _Taken()
    malloc, free, reserve, mapped = device.malloc, device.free, device.reserve_address_range, device.map

    def checked_malloc(n):
        if not _is_bytes(n):
            raise _broke(name, f"ctx.malloc({n!r}): expected a positive number of bytes")
        addr = malloc(n)
        if addr is not None and addr not in taken.segments.size:
            taken.segments.add(addr, n)
        return addr

    def checked_free(addr, n):
        if not _is_bytes(n):
            raise _broke(name, f"ctx.free({addr!r}, {n!r}): expected a positive number of bytes")
        if taken.segments.size.get(addr) == n:
            taken.segments.remove(addr)
        elif not (isinstance(addr, int) and taken.ranges.holds(addr, n)):
            raise _broke(name, f"ctx.free({addr!r}, {n}): not a segment ctx.malloc gave the policy (nor pages "
                               f"of a range from ctx.reserve_address_range)")
        free(addr, n)

    def checked_reserve(n):
        if not _is_bytes(n):
            raise _broke(name, f"ctx.reserve_address_range({n!r}): expected a positive number of bytes")
        addr = reserve(n)
        taken.ranges.add(addr, n)
        return addr

    def checked_map(n):
        if not _is_bytes(n):
            raise _broke(name, f"ctx.map({n!r}): expected a positive number of bytes")
        return mapped(n)

    ctx.malloc, ctx.free, ctx.reserve_address_range, ctx.map = checked_malloc, checked_free, checked_reserve, checked_map
    return taken


def guard_policy(policy, device, taken: _Taken, name: str) -> None:
    """Check each block the policy hands out and takes back, and its ``allocated`` (see the module)."""
    malloc, free, block = policy.malloc, policy.free, policy.block
    live = _Ranges()                # the live blocks
    requested = {}                  # each live block's request, by address
    held = [0]                      # ... their sum: ``allocated`` is at least it (a plug-in reported 0, and 100 %
                                    # fragmentation went out as its figure)

    def check_allocated(after: str):
        allocated, reserved = policy.allocated, device.reserved
        if not held[0] <= allocated <= reserved:
            raise _broke(name, f"after {after}, allocated is {allocated} B, outside the {held[0]} B the live blocks "
                               f"were asked for to reserved ({reserved} B)")

    def checked_malloc(size, stream):
        handle = malloc(size, stream)
        if handle is not None:
            addr, n = block(handle)
            doing = f"malloc({size}) returned a block"
            if not (isinstance(addr, int) and addr >= 0 and isinstance(n, int)):
                raise _broke(name, f"{doing} ({addr!r}, {n!r}): expected a non-negative address and a size")
            if n < size:
                raise _broke(name, f"{doing} of {n} B at {addr:#x}, smaller than the request")
            if not taken.holds(addr, n):
                raise _broke(name, f"{doing} [{addr:#x}+{n}] outside every segment taken from the device")
            if live.overlaps(addr, n):
                raise _broke(name, f"{doing} [{addr:#x}+{n}] that overlaps a live block")
            live.add(addr, n)
            requested[addr] = size
            held[0] += size
        check_allocated(f"malloc({size})")
        return handle

    def checked_free(handle):
        addr, _ = block(handle)
        if addr not in live.size:
            raise _broke(name, f"free of a block at {addr!r} that is not live")
        live.remove(addr)
        held[0] -= requested.pop(addr)
        free(handle)
        check_allocated("a free")

    policy.malloc, policy.free = checked_malloc, checked_free


def guard_counters(policy, name: str) -> None:
    """A plug-in's ``counters()`` (guarded or not: a subclass of a built-in may override it alone) is a dict of names
    and finite numbers, numpy's too (given back as Python's, for ``--json``), its ``cache_flushes`` a count: a
    negative one printed, then wedged a sweep's partial table."""
    counters = policy.counters

    def checked_counters():
        got = counters()
        if not isinstance(got, dict):
            raise _broke(name, f"counters() returned {type(got).__name__}, not a dict of names and numbers")
        out = {}
        for k, v in got.items():
            if not (isinstance(k, str) and isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))
                    and math.isfinite(v)):
                raise _broke(name, f"counters() holds {k!r}: {v!r}, not a name and a finite number")
            out[k] = int(v) if isinstance(v, numbers.Integral) else float(v)
        flushes = out.get("cache_flushes", 0)
        if not (isinstance(flushes, int) and flushes >= 0):
            raise _broke(name, f"counters()' cache_flushes is {flushes!r}, not a count (a whole number from 0)")
        return out

    policy.counters = checked_counters
