"""What every policy shares: the parameter declaration and the `Policy` interface.

A policy is one class in one module, registered by name with `@register`. Its
parameters are declared once, as `Param`s in ``params``; ``--policy-opt key=value``,
``allocsim policies`` and the docs all come from that declaration.

The contract with the engine (docs/architecture.md, "The policy contract"):

- ``malloc(size, stream) -> handle | None``: serve a request of ``size`` requested
  bytes on ``stream`` (a small integer index), running the allocator's own
  escalation (scan, split, reclaim, ``self.ctx.collect(...)``, retry). None
  means OOM, after the escalation is exhausted.
- ``free(handle)``: the block returns to the pool (for the ``gc`` runtime this
  happens inside a collection).
- ``allocated``: bytes of blocks handed out and not returned (rounded, with slack).
- ``block(handle) -> (addr, size)``: where a live block lies (tests check overlaps).
- ``largest_free() -> int``: largest free block inside reserved memory.
- ``free_breakdown(stream) -> {"hard", "soft", "stream"} | None`` (optional): the free bytes
  inside reserved memory, split by why a request on ``stream`` cannot use them whole; they
  sum to reserved - allocated. None (the default): the policy cannot say.
- ``release_cache()``: the program released the allocator's cache (a CACHE_RELEASE event).
- ``counters() -> dict``: policy-specific counters (cache flushes, retries, ...).
- ``finish()``: report hot-path section totals (``self.ctx.add_section``).
- ``tick(time_ns)`` (optional): called before each driving event when defined.
- ``close()`` (optional): release real resources (a GPU policy's memory).
- ``walk_chunk(events, handles, lat, peak, device, served)`` (optional): a fused loop of the
  policy's own ``malloc``/``free`` (docs/architecture.md, "The fast path").
- Streams arrive as small indices (the trace's stream table); requests of 0 bytes
  never reach a policy (every modeled allocator bypasses its pool for them).

Everything else goes through ``self.ctx``, a `allocsim.context.PolicyContext`: device
memory (``ctx.malloc(n)`` / ``ctx.free(addr, n)``, which charge their own modeled time),
pool time (``ctx.charge(self.costs.pool_hit_s)``), the limits, named sections, the
runtime's ``collect`` and the trace's metadata. The clock is read-only to a policy.
"""
from __future__ import annotations


from ..context import PolicyContext
from ..errors import UsageError
from ..params import Param, split_conf


class Policy:
    """Base class of allocator policies. Subclasses set ``name``, ``summary``, ``params``."""

    name: str = ""
    summary: str = ""
    models: str = ""                 # which real allocator, and the reference file
    params: tuple[Param, ...] = ()
    real_gpu: bool = False           # runs against a real GPU allocator
    offline: bool = False            # plans the whole trace up front (a bound, not an online allocator)
    #: the framework whose allocator this models; replaying that framework's traces, the
    #: simulated device hands out the recorded segment addresses (see `SimulatedDevice`)
    framework: str | None = None
    #: set on a reference model (``allocsim.policies.reference``): the name of the fast
    #: policy it restates; listings and defaults keep references apart
    reference_of: str | None = None

    #: Optional ``tick(time_ns)``: set it to a method to be called with the trace's
    #: timestamp before each driving event (time-driven behaviour such as the binned
    #: pool's background task). None keeps the hot path free of it.
    tick = None

    def __init__(self, ctx: PolicyContext, options: dict | None = None):
        self.ctx = ctx
        self.costs = ctx.costs
        self.allocated = 0
        opts = {p.name: p.default for p in self.params}
        opts.update(options or {})
        self.options = opts
        for k, v in opts.items():
            setattr(self, k, v)

    # ---- options ---------------------------------------------------------------------
    @classmethod
    def parse_options(cls, texts) -> dict:
        """``["k=v,k2:v2", "k3=v3"]`` -> typed dict; UsageError on unknown keys or bad values.

        `allocsim.spec.PolicySpec` calls it for every entry point (``-O``, brackets, sweep
        rows, the Python API); a policy with its own value syntax overrides `_parse_one`.
        """
        known = {p.name: p for p in cls.params}
        out = {}
        for text in texts or ():
            for key, value in split_conf(text):
                cls._merge_options(out, cls._parse_one(known, key, value))
        return out

    @classmethod
    def format_option(cls, key: str, value) -> str:
        """An option's typed value as text that `parse_options` reads back (tables, sweep rows)."""
        return next(p for p in cls.params if p.name == key).format(value)

    @classmethod
    def _merge_options(cls, out: dict, parsed: dict) -> None:
        """Add parsed options to ``out``; one option given twice is a contradiction, refused."""
        for key in parsed:
            if key in out:
                raise UsageError(f"option {key} is given twice")
        out.update(parsed)

    @classmethod
    def check_option(cls, key: str) -> None:
        """Refuse a key the policy does not declare, naming the ones it does."""
        if not any(p.name == key for p in cls.params):
            names = ", ".join(sorted(p.name for p in cls.params)) or "none"
            raise UsageError(f"unknown option {key!r} (known: {names})")

    @classmethod
    def _parse_one(cls, known, key, value):
        cls.check_option(key)
        p = known[key]
        try:
            return {key: p.parse(value)}
        except (ValueError, UsageError) as e:
            msg = e.args[0] if e.args else str(e)
            raise UsageError(f"option {key}: {msg}") from None

    # ---- the interface ------------------------------------------------------------------
    def malloc(self, size: int, stream: int):
        raise self._not_implemented("malloc")

    def free(self, handle) -> None:
        raise self._not_implemented("free")

    def block(self, handle) -> tuple[int, int]:
        raise self._not_implemented("block")

    def _not_implemented(self, method: str) -> NotImplementedError:
        """What a plug-in that left out a method of the contract is told (not a bare NotImplementedError)."""
        return NotImplementedError(f"{type(self).__name__} does not implement {method}(), which every policy must "
                                   f"(docs/architecture.md, the policy contract)")

    def largest_free(self) -> int:
        return 0

    def free_breakdown(self, stream: int) -> dict | None:
        """The free bytes inside reserved memory as ``{"hard", "soft", "stream"}``, summing to reserved -
        allocated, for a request on ``stream``: ``stream``, held by another stream's pool; ``hard``, in a
        segment that also holds a live block; ``soft``, in a segment with none (`free_parts`). Asked only at
        a new reserved peak and at an OOM, so it may be O(segments). None (the default): it cannot say."""
        return None

    @staticmethod
    def free_parts(pieces, stream: int) -> dict:
        """`free_breakdown` from free pieces ``(their pool's stream, bytes, their segment holds a live block)``:
        another stream's bytes are ``stream``; the rest ``hard`` beside live blocks, else ``soft``."""
        out = {"hard": 0, "soft": 0, "stream": 0}
        for st, n, shared in pieces:
            out["stream" if st != stream else "hard" if shared else "soft"] += n
        return out

    def release_cache(self) -> None:
        """The program released its allocator's cache (``torch.cuda.empty_cache()``, CuPy
        ``free_all_blocks()``). By default nothing: a pool that caches nothing has nothing to give back;
        a caching pool returns what its allocator's call would (at least every wholly free segment)."""

    def counters(self) -> dict:
        return {}

    def finish(self) -> None:
        pass

    def close(self) -> None:
        """Release real resources (GPU policies)."""

