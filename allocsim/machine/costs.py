"""Cost model: modeled latency of device calls, pool operations and GC pauses.

Defaults are the H100 medians of `docs/metrics.md` ("The cost model")
(cudaMalloc flat at 33 µs up to 20 MiB, then ~110-120 µs per GiB; cudaFree 29 µs up
to 2 MiB, ~320-390 µs per GiB beyond 256 MiB), a 1 µs pool hit (CuPy, H100), a
~0.4 µs pooled free (CuArrays tables) and GC pauses from the CuArrays tables
(gc(false) 3-300 ms, gc(true) 100-291 ms), and the device synchronisation every
cudaFree implies (`free_sync_s`: it waits for the device's outstanding work and
leaves the pipeline empty; 2 ms per call, from the H100 re-run of issue 17 in
``docs/metrics.md``). Sizes between measured points are
interpolated piecewise-linearly; beyond the last point the last slope continues.
`allocsim calibrate` writes a file of the same shape for another GPU.
"""
from __future__ import annotations

import bisect
import json
from dataclasses import asdict, astuple, dataclass, field

from ..errors import InputError, json_why

MiB, GiB = 1 << 20, 1 << 30


#: The most seconds a cost model may give one call or pause: an hour. Larger finite times (``1e308``) overflowed the
#: sums into inf and nan, printed as "nanns", and failed tune's ranking with a traceback.
MOST_SECONDS = 3600.0


def _non_negative(x) -> bool:
    """A number of seconds from 0 to `MOST_SECONDS` (JSON's true/false are not numbers here)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= MOST_SECONDS


def _point(p) -> bool:
    """A ``[bytes, seconds]`` pair: a whole number of bytes (``1e-300`` bytes made a slope past any float) and
    `_non_negative` seconds."""
    return (isinstance(p, list) and len(p) == 2 and isinstance(p[0], (int, float)) and not isinstance(p[0], bool)
            and 0 <= p[0] < 2**63 and float(p[0]).is_integer() and _non_negative(p[1]))


@dataclass
class CostModel:
    malloc_points: list = field(default_factory=lambda: [
        [512, 33e-6], [20 * MiB, 33e-6], [256 * MiB, 46e-6], [GiB, 129e-6], [4 * GiB, 491e-6]])
    free_points: list = field(default_factory=lambda: [
        [512, 29e-6], [2 * MiB, 29e-6], [20 * MiB, 40e-6], [256 * MiB, 118e-6], [GiB, 359e-6],
        [4 * GiB, 1.53e-3]])
    free_sync_s: float = 2e-3         # per cudaFree: the wait for outstanding device work it implies
    pool_hit_s: float = 1.0e-6        # a cached block served (scan + split + bookkeeping)
    pool_free_s: float = 0.4e-6       # a block returned to the pool
    gc_incremental_s: float = 50e-3   # gc(false) pause in the gc runtime
    gc_full_s: float = 150e-3         # gc(true) pause in the gc runtime
    eager_collect_s: float = 5e-3     # a Python gc.collect() in the eager runtime (CuPy's OOM path)
    source: str = "H100 defaults (docs/metrics.md, The cost model)"

    def __post_init__(self):
        self._malloc_cache: dict[int, float] = {}
        self._free_cache: dict[int, float] = {}
        self._least_cache: dict[int, tuple[float, float]] = {}
        # Below the first change of slope the cost is flat: callers test `n <= flat_end` first.
        self.malloc_flat_end, self.malloc_flat = self._flat(self.malloc_points)
        self.free_flat_end, self.free_flat = self._flat(self.free_points)
        self.free_flat += self.free_sync_s
        self._malloc_xs = [p[0] for p in self.malloc_points]     # (`_interp`'s search: made once, not per call)
        self._free_xs = [p[0] for p in self.free_points]

    @staticmethod
    def _flat(points):
        end = points[0][0]
        for x, y in points[1:]:
            if y != points[0][1]:
                break
            end = x
        return end, points[0][1]

    @staticmethod
    def _interp(points, xs, n):
        """The cost at ``n`` bytes, linear between ``points`` (``xs``: their sizes) and past the last, at least 0."""
        i = bisect.bisect_left(xs, n)
        if i == 0:
            return points[0][1]
        if i == len(points):
            (x0, y0), (x1, y1) = points[-2], points[-1]
        else:
            (x0, y0), (x1, y1) = points[i - 1], points[i]
        return max(0.0, y0 + (y1 - y0) * (n - x0) / (x1 - x0))

    def malloc_cost(self, n: int) -> float:
        if n <= self.malloc_flat_end:
            return self.malloc_flat
        c = self._malloc_cache.get(n)
        if c is None:
            c = self._malloc_cache[n] = self._interp(self.malloc_points, self._malloc_xs, n)
        return c

    def free_cost(self, n: int) -> float:
        """A cudaFree of ``n`` bytes: the call on an idle device (``free_points``) and the sync it implies."""
        if n <= self.free_flat_end:
            return self.free_flat
        c = self._free_cache.get(n)
        if c is None:
            c = self._free_cache[n] = self._interp(self.free_points, self._free_xs, n) + self.free_sync_s
        return c

    def least_malloc_seconds(self, n: int, largest: int) -> float:
        """The least modeled seconds device mallocs (or maps, charged alike) take to reserve ``n`` bytes in all,
        none of them more than ``largest`` bytes: at least ``n / largest`` calls, each costing no less than the
        cheapest call, and every call of ``m`` bytes at least ``m`` times the least cost per byte of any call up to
        ``largest``. ``malloc_cost`` is linear between its points (and past the last), so cost per byte and cost
        are least at a point, at ``largest`` or (clamped at 0) where the line reaches 0: those are all tried (but a
        point at 0 bytes, whose cost per byte the next point's bounds: a cost there divided by zero)."""
        if n <= 0 or largest <= 0:
            return 0.0
        kept = self._least_cache.get(largest)
        if kept is None:
            sizes = sorted({x for x, _ in self.malloc_points if x <= largest} | {largest})
            costs = [self.malloc_cost(x) for x in sizes]
            kept = self._least_cache[largest] = (min(costs), min(c / x for c, x in zip(costs, sizes) if x > 0))
        cheapest, per_byte = kept
        return max(-(-n // largest) * cheapest, n * per_byte)

    def to_dict(self) -> dict:
        return asdict(self)

    def __hash__(self) -> int:
        """By value, as ``==`` compares (a model is not changed once made): the settings a replay runs under are a
        key of `allocsim.search.fit`'s trails, and a ``--cost-model`` made them unhashable (fit, tune and plot's
        frontier failed with a TypeError)."""
        return hash(tuple(tuple(map(tuple, v)) if isinstance(v, list) else v for v in astuple(self)))

    def save(self, path: str) -> None:
        """Write the model as JSON, whole or not at all (a disk that fills leaves no half a model)."""
        from ..outputs import atomic_open
        with atomic_open(path) as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "CostModel":
        """Read a JSON cost model; any key left out keeps its default."""
        from ..outputs import check_input_file, kept_input
        check_input_file(path)
        kept = kept_input(path)         # --cost-model run.bin: a trace where the JSON belongs
        if kept:
            raise InputError(f"is {kept}, not a cost model (a JSON object, as allocsim calibrate writes)", path=path,
                             position="byte 0")
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as e:
            raise InputError(e.strerror or str(e), path=path)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON: {e.msg}", path=path, position=f"line {e.lineno} column {e.colno}")
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 text ({e.reason})", path=path, position=f"byte {e.start}")
        except (ValueError, RecursionError) as e:   # (a 5,000-digit number; nesting past the stack)
            raise InputError(f"not valid JSON: {json_why(e)}", path=path, position="line 1") from None
        if not isinstance(data, dict):
            raise InputError("a cost model is a JSON object", path=path, position="line 1")
        known = set(cls.__dataclass_fields__)
        for k, v in data.items():
            if k not in known:
                raise InputError(f"unknown key {k!r} (known: {', '.join(sorted(known))})", path=path, position=f"key {k!r}")
            if k.endswith("_points"):
                ok = (isinstance(v, list) and len(v) >= 2 and all(_point(p) for p in v)
                      and all(v[i][0] < v[i + 1][0] for i in range(len(v) - 1)))
                if not ok:
                    raise InputError(f"expected at least two [bytes, seconds] pairs in increasing size (a whole "
                                     f"number of bytes; seconds from 0 to {MOST_SECONDS:g})",
                                     path=path, position=f"key {k!r}")
            elif k == "source" and not isinstance(v, str):
                raise InputError(f"expected a string, got {v!r}", path=path, position=f"key {k!r}")
            elif k != "source" and not _non_negative(v):
                raise InputError(f"expected a number of seconds from 0 to {MOST_SECONDS:g}, got {v!r}", path=path,
                                 position=f"key {k!r}")
        return cls(**data)
