"""What every policy shares: the parameter declaration and the `Policy` interface.

A policy is one class in one module, registered by name with `@register`. Its
parameters are declared once, as `Param`s in ``params``; ``--policy-opt key=value``,
``allocsim policies`` and the docs all come from that declaration.

The contract with the engine is declared here, on `Policy`, and only here: every
member another module reads has a declaration below with its default and its cost
budget (how often the engine or a command calls it), and nothing probes a policy
with ``getattr``. docs/architecture.md ("The policy contract") points to this page.

Required (the engine calls them):

- ``malloc(size, stream) -> handle | None`` (per ALLOC): serve ``size`` requested
  bytes (never 0: every modeled allocator bypasses its pool for them) on ``stream``
  (a small index into the trace's stream table), running the allocator's own
  escalation (scan, split, reclaim, ``self.ctx.collect(...)``, retry). None is an
  OOM, after the escalation is exhausted.
- ``free(handle)`` (per FREE): the block returns to the pool (under the ``gc``
  runtime, inside a collection).
- ``allocated`` (read per ALLOC): bytes handed out and not returned (rounded, slack included).
- ``block(handle) -> (addr, size)`` (tests and `Replay.live_blocks`): where a live block lies.

Optional, with a default here (see each member's docstring or comment for its budget):
``largest_free``, ``free_breakdown``, ``release_cache``, ``pool_event``, ``counters``, ``finish``,
``close``, ``tick``, ``walk_chunk`` (the fused loop; `fused_loop` says when the engine
may use it), ``renumber`` (handles renamed between chunks), ``wants_event_index`` /
``event_index`` and ``segment_log`` (`validate`), ``follows_recording``, ``seeded``, ``peak_allocated_override``
(real-GPU policies), ``layout`` (the snapshot export), ``gc_on`` (`tune`), the copy of the state
(``checkpoint``/``restore``, `can_checkpoint`: none by default, so never resumed) and the folding of periodic
runs: ``fold_state`` (None by default: never folded), ``fold_counts`` and ``fold_advance``.

A built-in whose hot path differs by option declares each variant as a subclass and
names it in `variant` (torch without expandable segments or GC; cupy with
``track_total``); nothing is bound onto an instance, so a plug-in subclass's
``malloc``/``free`` is what the engine calls.

Everything else goes through ``self.ctx``, a `allocsim.machine.context.PolicyContext`: device
memory (``ctx.malloc(n)`` / ``ctx.free(addr, n)``, which charge their own modeled time),
pool time (``ctx.charge(self.costs.pool_hit_s)``), the limits, named sections, the
runtime's ``collect`` and the trace's metadata. The clock is read-only to a policy.
"""
from __future__ import annotations


from ..machine.context import PolicyContext
from ..machine.state import add_growth, snapshot
from ..errors import UsageError
from ..params import Param, split_conf


#: The members of the contract that the engine and the commands call themselves, never from inside a walk of the
#: common events, and that no built-in's fused loop inlines (each `walk_chunk` read for them): a subclass that
#: overrides only these keeps its built-in's fused loop (`Policy.fused_loop`). ``gc_on`` is not one (`torch`'s
#: loop reads it once per run of events, its ``malloc`` per request).
NOT_INLINED = frozenset({
    "__new__", "__init__", "variant", "parse_options", "format_option", "merge_options", "check_option",
    "parse_option", "block", "_not_implemented", "fused_loop", "fused_tape", "_meets_inlined", "largest_free",
    "free_breakdown", "free_parts", "release_cache", "pool_event", "declares", "can_checkpoint", "checkpoint",
    "restore", "fold_state", "addresses", "fold_counts", "fold_advance", "counters", "finish", "close"})

#: How every attribute is read or written: a subclass's own makes the fused loop's reads not the plain walk's.
_ACCESS_HOOKS = frozenset({"__getattribute__", "__setattr__", "__delattr__"})


def _definer(cls: type, name: str) -> type | None:
    """The class of ``cls.__mro__`` whose body defines ``name`` (None: none does)."""
    return next((c for c in cls.__mro__ if name in c.__dict__), None)


def _is_method(value) -> bool:
    """Whether a class attribute is code (a function, a static or class method, a property): what a fused loop
    may inline; data (an option's default, ``tick = None``) it reads from the instance as the plain walk does."""
    return callable(value) or isinstance(value, (staticmethod, classmethod, property))


#: `_inlined`'s answers, by (class, fused loop's class).
_INLINED: dict = {}


def _inlined(cls: type, owner: type) -> tuple[frozenset, bool]:
    """``(names, overridden)``: the methods of ``owner`` its fused loop may inline (all but `NOT_INLINED`), and
    whether ``cls`` defines any of them otherwise than ``owner`` does. Kept per class pair: read afresh, it took
    0.1 ms of every replay's start (a 10-step replay of a small GPT takes 2-3 ms)."""
    got = _INLINED.get((cls, owner))
    if got is None:
        names = frozenset(n for c in owner.__mro__[:-1] for n, v in vars(c).items()
                          if _is_method(v) and n not in NOT_INLINED) | (_ACCESS_HOOKS - NOT_INLINED)
        got = _INLINED[(cls, owner)] = (names, any(_definer(cls, n) is not _definer(owner, n) for n in names))
    return got


def overrides_inlined(cls: type) -> bool:
    """Whether ``cls`` overrides a method its fused loop's class may inline (`NOT_INLINED` aside): a subclass of a
    built-in that changes how blocks are found, whose replay walks plainly and is guarded as a plug-in's."""
    if cls.walk_chunk is None:
        return False
    owner = _definer(cls, "walk_chunk")
    return owner is not cls and _inlined(cls, owner)[1]


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

    # ---- optional members other modules read: each declared here, with its default and its budget -------
    #: Optional ``tick(time_ns)``: a method called with the trace's timestamp before each driving event
    #: (time-driven behaviour such as the binned pool's background task). Per event; None keeps the hot path
    #: free of it (and the fused loop allowed).
    tick = None

    #: Optional fused loop ``walk_chunk(events, handles, lat, peak, device, served) -> (index | None, peak)``:
    #: the class's own ``malloc`` and ``free`` inlined over a run of a chunk's events (docs/architecture.md,
    #: "The fast path"). Once per run of common events; the engine takes it only through `fused_loop`.
    walk_chunk = None

    #: True where `walk_chunk` also takes ``tape`` (a `allocsim.engine.fold.Tape`): while the folder records a
    #: window, the loop appends each increment it adds to the clock to ``tape.incs`` (an ``array('d')``), and for
    #: each latency it appends (a float, as always) the number of increments then on the tape to
    #: ``tape.latency_ends`` (an ``array('d')``: the latency is the last increment), hands an event it would serve
    #: other than by its pools back undone, for the plain walk, and writes the clock back as ``tape.at(clock)``.
    #: Read with `walk_chunk` from the class that defines it (`fused_tape`); else a recorded window walks plainly.
    records_fused = False

    #: Optional ``renumber(held) -> {old handle: new handle} | None``, for a policy whose handles index its own
    #: tables (split): called by the engine between chunks, never inside a request, with the handles the
    #: engine's id -> handle table holds (the gc runtime's dead, uncollected objects included). The policy may
    #: give its live blocks new handles and return the renaming; the engine applies it to its own table.
    #: Once per chunk (every 64 Ki records), so it may be O(blocks) when it acts.
    renumber = None

    #: True: when `validate` or the snapshot export asks (``Replay(log_events=True)``), the engine stores the
    #: trace index of each ALLOC and pressure event in ``event_index`` before it reaches the policy (one store
    #: per event then; nothing otherwise), for the policy to stamp its ``segment_log`` with.
    wants_event_index = False
    event_index = -1

    #: True (with `wants_event_index`): the engine stores ``event_index`` in every replay, not only when `validate`
    #: asks, for a model that follows the recorded run's own choices at the record it serves (cupy's
    #: ``follow_ties``). Read once per replay; the replay then takes the plain walk.
    follows_recording = False

    #: The policy's own log of device calls, ``(kind, size, event_index)`` with kinds from
    #: `allocsim.trace.events`, one entry appended per segment call; `validate` compares it with the recorded
    #: calls (`Replay.segment_log`). None: the policy keeps none.
    segment_log: list | None = None

    #: True: the policy starts from the recorded layout (the segments that existed before the trace began), so
    #: `validate` counts the recorded initial reserved bytes on the model's side too. Read once per validation.
    seeded = False

    #: Real-GPU policies: the allocator's own peak allocated bytes, set in ``finish``; read once, by the result
    #: (None or 0: the engine's own peak of ``allocated``, which a real allocator's rounding can pass).
    peak_allocated_override: int | None = None

    #: Optional ``layout(live handles) -> list[dict]``: the segments as PyTorch's ``snapshot()`` reports them
    #: (`allocsim.formats.exporters.torch_snapshot`). Once, after the replay; None: the policy has no layout to export.
    layout = None

    def __new__(cls, ctx: PolicyContext | None = None, options: dict | None = None, **extra):
        """Make the class `variant` names for this context and these options (``cls`` itself by default)."""
        return super().__new__(cls if ctx is None else cls.variant(ctx, options or {}))

    @classmethod
    def variant(cls, ctx: PolicyContext, options: dict) -> type:
        """The class an instance is made of, for these options: ``cls`` by default. A built-in whose hot path
        depends on its options returns the subclass that declares that path as methods (so malloc, free and
        walk_chunk always come from one class); it returns a subclass made elsewhere (a plug-in) as itself.
        Once per replay."""
        return cls

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
    def changed_options(cls, options: dict) -> dict:
        """Those of ``options`` that differ from their declared defaults: a result's options (what ``replay``'s
        header lists), and what ``compare`` says a trace's recorded settings change."""
        defaults = {p.name: p.default for p in cls.params}
        return {k: v for k, v in options.items() if k in defaults and defaults[k] != v}

    @classmethod
    def parse_options(cls, texts) -> dict:
        """``["k=v,k2:v2", "k3=v3"]`` -> typed dict; UsageError on unknown keys or bad values.

        `allocsim.engine.spec.PolicySpec` calls it for every entry point (``-O``, brackets, sweep
        rows, the Python API); a policy with its own value syntax overrides `parse_option`.
        """
        known = {p.name: p for p in cls.params}
        out = {}
        for text in texts or ():
            for key, value in split_conf(text, "options"):
                cls.merge_options(out, cls.parse_option(known, key, value))
        return out

    @classmethod
    def format_option(cls, key: str, value) -> str:
        """An option's typed value as text that `parse_options` reads back (tables, sweep rows)."""
        return next(p for p in cls.params if p.name == key).format(value)

    @classmethod
    def merge_options(cls, out: dict, parsed: dict) -> None:
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
    def parse_option(cls, known: dict, key: str, value: str) -> dict:
        """One ``key=value`` as ``{key: typed value}`` (``known``: the declared `Param` by name); a policy
        with its own value syntax overrides it."""
        cls.check_option(key)
        p = known[key]
        try:
            return {key: p.parse(value)}
        except (ValueError, UsageError) as e:
            msg = e.args[0] if e.args else str(e)
            raise UsageError(f"option {key}: {msg}") from None

    # ---- the interface ------------------------------------------------------------------
    def malloc(self, size: int, stream: int):
        """Serve ``size`` requested bytes on ``stream``; a handle, or None (OOM). Per ALLOC (see the module docstring)."""
        raise self._not_implemented("malloc")

    def free(self, handle) -> None:
        """Return the block of ``handle`` to the pool. Per FREE (under gc, inside a collection)."""
        raise self._not_implemented("free")

    def block(self, handle) -> tuple[int, int]:
        """``(address, size)`` of a live block (tests, `Replay.live_blocks`)."""
        raise self._not_implemented("block")

    def _not_implemented(self, method: str) -> NotImplementedError:
        """What a plug-in that left out a method of the contract is told (not a bare NotImplementedError)."""
        return NotImplementedError(f"{type(self).__name__} does not implement {method}(), which every policy must "
                                   f"(the contract: allocsim/policies/base.py)")

    def fused_loop(self):
        """The fused loop the engine may walk the common events with: `walk_chunk` when the class that defines
        it also defines ``malloc`` and ``free`` (so it is those two, inlined) and this instance meets every other
        method as that class does (`_meets_inlined`), else None. A subclass that overrides malloc, free or a
        helper the loop inlines (a plug-in on a built-in) thus gets the plain loop, and its override runs.
        Once per replay."""
        if self.walk_chunk is None:
            return None
        owners = {_definer(type(self), name) for name in ("malloc", "free", "walk_chunk")}
        return self.walk_chunk if len(owners) == 1 and self._meets_inlined(owners.pop()) else None

    def _meets_inlined(self, owner: type) -> bool:
        """Whether each method of ``owner`` (the class whose `walk_chunk` is the fused loop) that the loop may
        inline -- all but `NOT_INLINED` -- is here the one ``owner`` has: not overridden by a subclass or a mixin,
        nor set on the instance (a subclass of `bestfit` overriding ``_pop_fit`` was replayed as `bestfit`, its
        override never called). Once per replay."""
        names, overridden = _inlined(type(self), owner)
        return not overridden and names.isdisjoint(vars(self))


    def fused_tape(self) -> bool:
        """Whether the fused loop records a window onto a tape (`records_fused`, declared by the class that
        defines `walk_chunk`: a subclass's own loop is not taken to)."""
        loop = self.fused_loop()
        if loop is None:
            return False
        owner = next(c for c in type(self).__mro__ if "walk_chunk" in c.__dict__)
        return bool(owner.__dict__.get("records_fused", False))

    def largest_free(self) -> int | None:
        """The largest free block inside reserved memory, bytes. Asked at each new reserved peak and each OOM
        (per segment call at most), so O(free blocks) is fine. None (the default): the policy cannot see it."""
        return None

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
        ``free_all_blocks()``), per CACHE_RELEASE event. By default nothing: a pool that caches nothing has nothing to give back;
        a caching pool returns what its allocator's call would (at least every wholly free segment)."""

    def pool_event(self, kind: int, pool: int, stream: int, flags: int) -> None:
        """A private-pool event of the trace (`allocsim.trace.events.POOL`: POOL_BEGIN, POOL_END, POOL_RETAIN,
        POOL_RELEASE), per such event: ``pool`` is the pool's number, ``stream`` the stream index a POOL_BEGIN
        routes, ``flags`` the record's. By default nothing: an allocator without private pools serves every
        request from its one pool. `torch` routes requests to the pool while it is begun (docs/models/torch.md,
        "Private pools")."""

    def gc_on(self) -> bool:
        """Whether the allocator's own collection of cached blocks (torch's ``garbage_collection_threshold``)
        acts now. Per segment call at most; `tune` asks once per search whether a threshold would act under
        its target. False (the default): the allocator has none."""
        return False

    # ---- the state as a copy: checkpoints (`Replay.checkpoint`; docs/architecture.md, "Folding") ----------------
    @classmethod
    def declares(cls, member: str) -> bool:
        """Whether this class declares ``member`` of the state contract (`checkpoint`, `restore`, `fold_state`)
        rather than taking the base's "cannot": a subclass made outside allocsim only if it declares it itself
        (what it adds is its to say; a built-in's declaration covers the built-in's state alone). Once per
        replay."""
        owner = next(c for c in cls.__mro__ if member in c.__dict__)
        return owner is not Policy and (owner is cls or all(c.__module__.startswith("allocsim.")
                                                            for c in cls.__mro__[:-1]))

    def can_checkpoint(self) -> bool:
        """Whether `checkpoint` copies this policy's state: its class declares `checkpoint` and `restore`
        (`declares`). False, the default: a replay of it is never checkpointed (tune's and fit's probes walk it
        in full). Once per checkpoint."""
        cls = type(self)
        return cls.declares("checkpoint") and cls.declares("restore")

    def checkpoint(self, handles: dict) -> object:
        """The policy's whole state so far, copied, with ``handles`` (the replay's id -> live handle) pointing
        into the copy: what `restore` takes, in this class or another instance of it with other options (a
        named record is best: its fields say what it holds). None, the default: the policy cannot copy itself
        (`can_checkpoint`). O(blocks), once per checkpoint."""
        return None

    def restore(self, state) -> dict:
        """Take a `checkpoint`'s state, copied again (one state may be restored more than once), this instance's
        options kept; return the replay's id -> handle table pointing into this policy. Once per resume."""
        raise self._not_implemented("restore")

    # ---- folding periodic runs (allocsim/engine/fold.py; docs/architecture.md, "Folding") ----------------------
    def fold_state(self, held) -> object:
        """The whole state that steers this policy's decisions from here on, canonical and picklable, or None
        (the default) when it cannot say: the engine then never folds its replay. ``held`` are the handles
        the engine holds (live objects, and under gc the dead ones not yet collected).

        Two states must be equal exactly when the policy, given the same requests from here on (each FREE
        naming the block that lies at the same address), makes the same decisions, device calls and modeled
        charges: blocks by address, size, stream and state, the free structures in the order their ties are
        broken, and every counter a decision reads (by its difference from another where only that matters),
        never a handle or an id itself. What only counts (statistics) is `fold_counts`. Once per iteration
        boundary, so O(blocks) is fine."""
        return None

    def addresses(self, held: dict) -> dict:
        """``id -> address`` of each block in ``held`` (the engine's id -> handle table): how the folder names the
        live objects at a boundary. The default asks `block` for each; a policy may say it faster. Once per
        fingerprinted boundary, O(held)."""
        block = self.block
        return {i: block(h)[0] for i, h in held.items()}

    #: Names of the integer attributes that only count (never steer a decision) and go into the result:
    #: what `fold_counts` and `fold_advance` read and add by default.
    fold_counters: tuple[str, ...] = ()

    def fold_counts(self) -> tuple:
        """The totals that only count and go into the result or a log: a snapshot that `fold_advance`
        repeats (by default the `fold_counters`). Twice per fold."""
        return snapshot(self, self.fold_counters)

    def fold_advance(self, before: tuple, after: tuple, k: int) -> None:
        """The engine skipped ``k`` more windows like the one walked between the `fold_counts` snapshots
        ``before`` and ``after``: add ``k`` times that window's growth to the totals, in the order the walk added it
        (a log's entries). Once per fold, or, for a window begun at a step boundary inside the one walked, once per
        part of it, each part's snapshots as the walk took them (`allocsim.engine.fold.Rotated`)."""
        add_growth(self, self.fold_counters, before, after, k)

    def counters(self) -> dict:
        """Policy-specific counters (``cache_flushes`` goes into the result). Once, at the result."""
        return {}

    def finish(self) -> None:
        """Report the hot path's section totals (``self.ctx.add_section``). Once, at the end."""

    def close(self) -> None:
        """Release real resources (GPU policies). Once, when the replay ends."""

