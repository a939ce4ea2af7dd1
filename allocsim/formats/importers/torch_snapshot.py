"""PyTorch memory snapshots (`torch.cuda.memory._snapshot()` / `_dump_snapshot`) -> trace events.

A snapshot holds the allocator's final state (``segments``, each with its
``blocks``) and a per-device ring buffer of what it did (``device_traces``).
The mapping (``docs/importers.md``, "PyTorch memory snapshots"):

    alloc            -> ALLOC (requested size, addr, stream, call site when frames are present; flagged
                        CATCHES_OOM when its C++ frames name a path that catches its OOM: `catches_oom`)
    free_requested   -> FREE_REQUESTED of the block live at that address
    free_completed   -> FREE of that block (the block leaves the live set here)
    segment_alloc/free/map/unmap -> SEGMENT_* (informational)
    oom              -> OOM (size, device_free)
    snapshot         -> ignored; unknown actions are ignored and counted

A snapshot has no entry for ``torch.cuda.empty_cache()``: `inferred_releases`
finds the segment frees the allocator's own paths do not explain and puts a
CACHE_RELEASE before them (``docs/importers.md``, "Cache releases"). Nor has it
one for a private pool's begin and end (CUDA graphs, MemPool): `inferred_pool_runs`
routes the requests that landed in a segment the final state names a pool of
(``segment_pool_id``) to that pool (``docs/importers.md``, "Private pools").

Times are ``time_us`` * 1000 relative to the earliest entry, or the entry index
when the snapshot has no ``time_us`` (before PyTorch 2.2).

A trace that wrapped its ring buffer, or that started after the model was
built, frees blocks it never saw allocated. `StartState` rebuilds the allocator
state at the first retained entry by undoing the entries one by one from the
final ``segments`` backwards, as MemoryViz does; its live blocks become ALLOCs
at t=0 flagged PRE_EXISTING, in address order, and its segments go to
``meta["initial_segments"]``.

Costs: one validating pass, one backward pass and one forward pass over the
entries, each O(1) per entry (dicts keyed by address); expandable-segment map
and unmap entries also scan the segments, O(#segments) each.
"""
from __future__ import annotations

import bisect
import re
import reprlib
from collections import Counter

from ...errors import InputError
from ...trace import events as ev

SMALL_SEGMENT = 2 * 1024**2     # kSmallBuffer: every small-pool segment is exactly this size
LARGE_PAGE = 20 * 1024**2       # kLargeBuffer: large expandable segments map pages of this size

#: Block states that hold a live allocation, and whether the free was already requested.
LIVE_STATES = {"active_allocated": False, "active_pending_free": True}

SEGMENT_KINDS = {"segment_alloc": ev.SEGMENT_ALLOC, "segment_free": ev.SEGMENT_FREE,
                 "segment_map": ev.SEGMENT_MAP, "segment_unmap": ev.SEGMENT_UNMAP}
BLOCK_ACTIONS = ("alloc", "free_requested", "free_completed")
#: Actions whose entries must carry an address and a size.
SIZED_ACTIONS = frozenset(BLOCK_ACTIONS) | frozenset(SEGMENT_KINDS)


def convert(snapshot: dict, writer, *, device: int | None = None, source: str = "<snapshot>",
            device_name: str | None = None, total_memory: int | None = None) -> dict:
    """Append ``snapshot``'s device ``device`` history (None: the device that has one, `snapshot_device`) to
    ``writer``; return stats.

    The conversion's metadata (framework, allocator settings, initial segments)
    is merged into ``writer.meta``. A writer streaming to a file wrote its header
    when it was made: build it with ``SnapshotConversion(...).meta`` instead
    (as `allocsim.formats.importers.import_file` does). Malformed input -> `InputError`.
    """
    conv = SnapshotConversion(snapshot, device=device, source=source, device_name=device_name,
                              total_memory=total_memory)
    writer.meta.update(conv.meta)
    return conv.emit(writer)


class _Shown(reprlib.Repr):
    """How a value from the snapshot is shown in an error: bounded in depth and length, since a pickle may share one
    list many times over (``a = [b, b]; b = [c, c]; ...``): a few bytes whose plain repr or str never ends; an int
    of 4,300 digits or more (which repr() refuses with a ValueError) by its size."""

    def repr_int(self, x, level):
        return f"an integer of {x.bit_length():,} bits" if x.bit_length() > 256 else super().repr_int(x, level)


_REPR = _Shown()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 80, 80, 60
_shown = _REPR.repr

#: The most values (containers and scalars, a shared one counted each time it appears) ``allocator_settings`` may
#: hold: PyTorch's are a few dozen; the metadata it goes into is written out as JSON, every sharing expanded.
SETTINGS_VALUES = 10_000


def _text(value, default: str) -> str:
    """A frame's or segment's text field: the string itself, an int of 64 bits at most as digits (str() refuses 4,300
    digits), anything else ``default``."""
    if isinstance(value, str):
        return value
    return str(value) if type(value) is int and value.bit_length() <= 64 else default


def _settings(settings, where: "_Where") -> dict:
    """``allocator_settings`` as they go into the metadata: a dict of at most `SETTINGS_VALUES` values, its integers
    of 64 bits at most."""
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise where.error(f"allocator_settings is {_shown(settings)}, expected a dict", "metadata")
    todo, seen = [settings], 0
    while todo:
        value = todo.pop()
        seen += 1
        if seen > SETTINGS_VALUES:
            raise where.error(f"allocator_settings: more than {SETTINGS_VALUES:,} values (with the lists the pickle "
                              f"shares expanded, as the trace's JSON metadata would hold them): not a PyTorch "
                              f"allocator's settings", "metadata")
        if isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            todo.extend(value)
        elif isinstance(value, int) and value.bit_length() > 64:       # json.dumps refuses 4,300 digits
            raise where.error(f"allocator_settings: an integer of {value.bit_length():,} bits (JSON metadata holds "
                              f"none past 64): not a PyTorch allocator's settings", "metadata")
    return settings


def site_of(frames) -> str | None:
    """Call-site string ``file:line:function`` of the first Python frame outside torch, else the first frame."""
    if not frames or not isinstance(frames, list):
        return None
    first_py = None
    for f in frames:
        if not isinstance(f, dict):
            continue
        name = _text(f.get("filename"), "?")
        if name.endswith(".py"):
            if "/torch/" not in name:
                return f"{name}:{_text(f.get('line'), '?')}:{_text(f.get('name'), '?')}"
            first_py = first_py or f
    f = first_py or (frames[0] if isinstance(frames[0], dict) else {})
    return f"{_text(f.get('filename'), '?')}:{_text(f.get('line'), '?')}:{_text(f.get('name'), '?')}"


#: The PyTorch functions whose allocation is caught when it fails (``docs/allocator-dependent.md``): cuDNN v8's
#: workspace request of a convolution plan (``run_conv_plan``, ``run_conv_plan_fused``: their callers
#: ``run_single_conv``/``run_fused_conv`` on a cached plan, ``try_configs``/``try_plans`` on each candidate, catch
#: ``c10::OutOfMemoryError`` and go on to the next) and ``generate_and_filter_plans`` (benchmark mode: the
#: workspace is asked again at half the size). Matched as a C++ function name in the alloc's frames.
CAUGHT_OOM_FUNCTIONS = re.compile(r"\b(run_conv_plan(_fused)?|generate_and_filter_plans)\(")


def catches_oom(frames) -> bool:
    """Was the allocation with these frames made where PyTorch catches its OOM (`CAUGHT_OOM_FUNCTIONS`)?"""
    search = CAUGHT_OOM_FUNCTIONS.search
    return any(isinstance(f, dict) and search(_text(f.get("name"), "")) for f in frames)


def stacks_of(entries) -> str | None:
    """What stacks a history holds, read from its first alloc with frames: ``"all"`` (C++ frames too: a name
    with ``::``, as every allocation's allocator frames have), ``"python"``, or None (no frames)."""
    for e in entries:
        frames = e.get("frames") if isinstance(e, dict) and e.get("action") == "alloc" else None
        if frames and isinstance(frames, list):
            return "all" if any(isinstance(f, dict) and "::" in _text(f.get("name"), "") for f in frames) \
                else "python"
    return None


def _is_uint(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64


class _Where:
    """Builds `InputError`s that name the snapshot and a path inside it."""

    def __init__(self, source: str):
        self.source = source

    def error(self, what: str, position: str) -> InputError:
        return InputError(what, path=self.source, position=position)

    def uint(self, d: dict, key: str, position: str, default=None) -> int:
        x = d.get(key, default)
        if x is None:
            raise self.error(f"missing key {key!r}", position)
        if not _is_uint(x):
            raise self.error(f"{key} is {_shown(x)}, expected a non-negative integer", position)
        return x


class StartState:
    """The allocator state just before the first retained trace entry (``docs/importers.md``, "A wrapped ring buffer").

    ``blocks``: address -> [requested size, stream, free requested?, freed in the trace?, frames];
    ``segments``: base address -> {total_size, stream, is_expandable, segment_type}.
    Built from the final state by undoing entries newest first; each undo is O(1)
    except expandable map/unmap (O(#segments)). ``inconsistent`` counts undo steps
    that did not find what the final state should have held.
    """

    def __init__(self, snapshot: dict, entries: list, device: int, where: _Where):
        self.blocks: dict[int, list] = {}
        self.segments: dict[int, dict] = {}
        self.inconsistent = 0
        self._load_final(snapshot, device, where)
        self.final_live: set[int] = set(self.blocks)     # addresses of the snapshot's active blocks
        self._walk_back(entries)

    def _load_final(self, snapshot, device, where):
        segments = snapshot.get("segments", [])
        if not isinstance(segments, list):
            raise where.error("'segments' is not a list", "segments")
        for k, seg in enumerate(segments):
            pos = f"segments[{k}]"
            if not isinstance(seg, dict):
                raise where.error("segment is not a dict", pos)
            if where.uint(seg, "device", pos, device) != device:
                continue
            base = where.uint(seg, "address", pos)
            stream = where.uint(seg, "stream", pos, 0)
            expandable = seg.get("is_expandable", False)
            if not isinstance(expandable, bool):        # bool("False") is True
                raise where.error(f"is_expandable is {_shown(expandable)}, expected True or False", pos)
            self.segments[base] = {"total_size": where.uint(seg, "total_size", pos), "stream": stream,
                                   "is_expandable": expandable,
                                   "segment_type": _text(seg.get("segment_type"), "unknown")}
            blocks = seg.get("blocks", [])
            if not isinstance(blocks, list):
                raise where.error("'blocks' is not a list", pos)
            for j, b in enumerate(blocks):
                bpos = f"{pos}.blocks[{j}]"
                if not isinstance(b, dict):
                    raise where.error("block is not a dict", bpos)
                state = b.get("state")
                pending = LIVE_STATES.get(state) if isinstance(state, str) else None
                if pending is None:
                    continue
                size = where.uint(b, "requested_size", bpos, b.get("size"))
                if size > ev.MAX_SIZE:
                    raise where.error(f"absurd block size {size} (> 1 PiB)", bpos)
                self.blocks[where.uint(b, "address", bpos)] = [size, stream, pending, False, b.get("frames")]

    def _walk_back(self, entries):
        blocks, segments = self.blocks, self.segments
        bad = 0
        for e in reversed(entries):
            a = e["action"]
            if a == "free_completed":
                addr = e["addr"]
                bad += addr in blocks
                blocks[addr] = [e["size"], e.get("stream", 0), True, True, e.get("frames")]
            elif a == "free_requested":
                b = blocks.get(e["addr"])
                if b is None:
                    bad += 1
                    blocks[e["addr"]] = [e["size"], e.get("stream", 0), False, True, e.get("frames")]
                else:
                    b[2] = False
                    b[3] = True
            elif a == "alloc":
                bad += blocks.pop(e["addr"], None) is None
            elif a == "segment_alloc":
                bad += segments.pop(e["addr"], None) is None
            elif a == "segment_free":
                size = e["size"]
                bad += e["addr"] in segments
                segments[e["addr"]] = {"total_size": size, "stream": e.get("stream", 0), "is_expandable": False,
                                       "segment_type": "small" if size == SMALL_SEGMENT else "large",
                                       "freed_in_trace": True}
            elif a == "segment_map":
                bad += not self._unmap_range(e["addr"], e["size"])
            elif a == "segment_unmap":
                self._map_range(e["addr"], e["size"], e.get("stream", 0))
        self.inconsistent = bad

    def _unmap_range(self, addr: int, size: int) -> bool:
        """Undo a map: take [addr, addr+size) out of the expandable segment holding it."""
        end = addr + size
        for base, seg in self.segments.items():
            top = base + seg["total_size"]
            if base <= addr and end <= top:
                del self.segments[base]
                if base < addr:
                    self.segments[base] = {**seg, "total_size": addr - base}
                if end < top:
                    self.segments[end] = {**seg, "total_size": top - end}
                return True
        return False

    def _map_range(self, addr: int, size: int, stream: int) -> None:
        """Undo an unmap: [addr, addr+size) was mapped; merge it with touching expandable ranges."""
        seg = {"total_size": size, "stream": stream, "is_expandable": True,
               "segment_type": "large" if size % LARGE_PAGE == 0 else "small", "freed_in_trace": True}
        for base, other in list(self.segments.items()):
            if not other["is_expandable"] or other["stream"] != stream:
                continue
            if base + other["total_size"] == addr:
                del self.segments[base]
                addr, size = base, size + other["total_size"]
                seg["segment_type"] = other["segment_type"]
            elif base == addr + size:
                del self.segments[base]
                size += other["total_size"]
                seg["segment_type"] = other["segment_type"]
        seg["total_size"] = size
        self.segments[addr] = seg

    @property
    def wrapped(self) -> bool:
        """Did the trace free a block or segment that existed before its first entry?"""
        return any(b[3] for b in self.blocks.values()) or any(s.get("freed_in_trace") for s in self.segments.values())

    def seed(self, conv: "EntryConverter") -> int:
        """Write the live blocks as ALLOCs at t=0 flagged PRE_EXISTING, in address order, into ``conv``'s writer
        and its live set (so that their frees in the history pair with them); return how many had their free
        requested already."""
        pending_frees = 0
        for addr in sorted(self.blocks):
            size, stream, pending, _, frames = self.blocks[addr]
            conv.live[addr] = conv.w.alloc(size, stream, t=0, addr=addr, site=site_of(frames), flags=ev.PRE_EXISTING)
            pending_frees += pending
        if conv.use is not None:        # the segments a release must free, and what they hold (`SegmentUse`)
            conv.use = SegmentUse(self.segments, self.blocks)
            conv.reserved = sum(s["total_size"] for s in self.segments.values())
        return pending_frees

    def initial_segments(self) -> list[dict]:
        return [{"address": base, "total_size": s["total_size"], "stream": s["stream"],
                 "is_expandable": s["is_expandable"], "segment_type": s["segment_type"]}
                for base, s in sorted(self.segments.items())]


#: Entries that give memory back upstream; a run of them is one release.
RELEASING = frozenset({"segment_free", "segment_unmap"})
#: Entries that take memory from upstream.
GROWING = frozenset({"segment_alloc", "segment_map"})


def private_incarnations(entries: list, start: StartState, pool_ids: dict) -> tuple[dict, dict]:
    """The segments the final state names a private pool of, in their last incarnation: ``({base: pool} of the
    starting segments, {entry index of a segment_alloc: pool})``. A base freed later was another segment then."""
    if not pool_ids:
        return {}, {}
    last_free = {}
    for i, e in enumerate(entries):
        if e["action"] == "segment_free":
            last_free[e["addr"]] = i
    first = {b: pool_ids[b] for b in start.segments if b in pool_ids and b not in last_free}
    later = {i: pool_ids[e["addr"]] for i, e in enumerate(entries)
             if e["action"] == "segment_alloc" and e["addr"] in pool_ids and last_free.get(e["addr"], -1) < i}
    return first, later


class SegmentUse:
    """The non-expandable segments and how many live blocks each holds, entry by entry (`see`), and whether a run
    of segment frees is the program's cache release (`is_release`: ``docs/importers.md``, "Cache releases"). One
    rule for the importer (`inferred_releases`, a whole history) and the recorder (`EntryConverter`, chunk by
    chunk: its state is kept between chunks). ``in_pool``: live segments of a private pool. O(log #segments) per
    block entry, O(#segments) per segment alloc and per run of segment frees."""

    def __init__(self, segments: dict | None = None, blocks=(), in_pool=()):
        segments = segments or {}
        self.bases = sorted(b for b, seg in segments.items() if not seg["is_expandable"])
        self.size = {b: segments[b]["total_size"] for b in self.bases}
        self.live = dict.fromkeys(self.bases, 0)        # segment -> blocks live in it
        self.block_in: dict[int, int] = {}              # live block address -> its segment
        self.in_pool = set(in_pool)
        for addr in blocks:
            self._track(addr)

    def _track(self, addr: int) -> None:
        bases = self.bases
        k = bisect.bisect_right(bases, addr) - 1
        if k >= 0 and addr < bases[k] + self.size[bases[k]]:
            self.block_in[addr] = bases[k]
            self.live[bases[k]] += 1

    def see(self, e: dict, pool: bool = False) -> None:
        """Follow a block or segment-alloc entry (``pool``: a segment of a private pool)."""
        a = e["action"]
        if a == "alloc":
            self._track(e["addr"])
        elif a == "free_completed":
            b = self.block_in.pop(e["addr"], None)
            if b is not None:
                self.live[b] -= 1
        elif a == "segment_alloc":
            bisect.insort(self.bases, e["addr"])
            self.size[e["addr"]], self.live[e["addr"]] = e["size"], 0
            if pool:
                self.in_pool.add(e["addr"])

    def is_release(self, run: list, own_path: bool) -> bool:
        """Whether ``run`` (a run of `RELEASING` entries) is the program's cache release, and forget what it
        freed. ``own_path``: the entry after the run is one the allocator's own paths end in (an ``oom``; with a
        GC threshold a segment alloc or map)."""
        freed = {x["addr"] for x in run if x["action"] == "segment_free"}
        empty = {b for b in self.bases if not self.live[b] and b not in self.in_pool}   # what empty_cache() frees
        release = (len(freed) < len(run) or freed - self.in_pool == empty) and not own_path
        for b in freed & set(self.size):
            self.bases.remove(b)
            del self.size[b], self.live[b]
        self.in_pool -= freed
        return release


def inferred_releases(entries: list, start: StartState, gc_threshold: bool = False,
                      private: tuple[dict, dict] = ({}, {})) -> list[int]:
    """Indexes of the entries before which the program released the cache (``docs/importers.md``, "Cache releases").

    A run of segment frees is the program's ``empty_cache()`` unless the allocator's own
    paths explain it: the run ends in an ``oom`` entry (the OOM path frees the cache, then
    gives up), or it frees only some of the segments that held no live block then (the
    garbage-collection path and ``max_split_size_mb``'s partial release). ``empty_cache``
    frees every segment with no live block. With ``gc_threshold`` (a
    ``garbage_collection_threshold`` in the settings) a run followed by a segment alloc or
    map is the collection made for that request. Runs of expandable-segment unmaps, whose
    pages are not tracked, are judged by the other rules alone. A private pool's segment
    (``private``, `private_incarnations`) is freed by a release only once its pool is freeable,
    so one of them with no live block may stay or go (`SegmentUse`).
    """
    own_path = {"oom", "segment_alloc", "segment_map"} if gc_threshold else {"oom"}
    use = SegmentUse(start.segments, start.blocks, private[0])
    out, n, i = [], len(entries), 0
    while i < n:
        if entries[i]["action"] in RELEASING:
            j = _run_end(entries, i)
            if use.is_release(entries[i:j], j < n and entries[j]["action"] in own_path):
                out.append(i)
            i = j
            continue
        use.see(entries[i], i in private[1])
        i += 1
    return out


def _run_end(entries: list, i: int) -> int:
    """The end of the run of `RELEASING` entries that starts at ``entries[i]``."""
    n = len(entries)
    while i < n and entries[i]["action"] in RELEASING:
        i += 1
    return i


def private_pool_ids(snapshot, device: int = 0, where: _Where | None = None) -> dict[int, tuple[int, int]]:
    """``{base address: MempoolId_t}`` of the snapshot's final segments in a private pool (`private_pool_segments`).
    A pool event holds the id in 64 bits (docs/trace-format.md): a half of 2**32 or more is an error (``where``)."""
    out = {}
    for k, seg in enumerate(snapshot.get("segments") or () if isinstance(snapshot, dict) else ()):
        pool = seg.get("segment_pool_id") if isinstance(seg, dict) else None
        if seg.get("device", device) == device and isinstance(pool, (list, tuple)) and len(pool) == 2 \
                and all(_is_uint(x) for x in pool) and any(pool) and _is_uint(seg.get("address")):
            if where is not None and max(pool) >> 32:
                raise where.error(f"segment_pool_id {tuple(pool)}: a pool id's halves must be below 2**32 (the "
                                  f"trace holds the id in 64 bits)", f"segments[{k}]")
            out[seg["address"]] = (int(pool[0]), int(pool[1]))
    return out


def inferred_pool_runs(entries: list, start: StartState, private: tuple[dict, dict],
                       releases=()) -> dict[int, list]:
    """Where to put POOL_BEGIN / POOL_END: ``{entry index: [(kind, MempoolId_t, stream, flags), ...]}``, each to go
    before that entry.

    A request belongs to a private pool when its block lies in a segment of that pool: a segment the final state
    names a pool of, in its last incarnation (its base never freed after that segment_alloc, or a starting segment
    never freed). Each run of consecutive requests of one pool becomes a begin before the first (before the segment
    allocations just ahead of it, which that request made) and an end after the last. A graph's pool (``(n, 0)``)
    with one stream is routed on that stream (POOL_CAPTURE), a MemPool's (``(0, n)``) on every stream (its filter is
    the thread). A cache release (``releases``, `inferred_releases`) ends a run: the default pools are released
    only while no pool is begun. Segments freed before the snapshot name no pool: their requests stay in the
    default pools. O(entries · log segments)."""
    first, later = private
    if not first and not later:
        return {}
    released = set(releases)
    live = {base: (s["total_size"], first.get(base)) for base, s in start.segments.items()}
    bases = sorted(live)
    runs, run = [], None                       # run: [pool, streams, first alloc index, last alloc index]
    for i, e in enumerate(entries):
        a = e["action"]
        if i in released and run is not None:
            runs.append(run)
            run = None
        if a == "segment_alloc":
            base = e["addr"]
            live[base] = (e["size"], later.get(i))
            bisect.insort(bases, base)
        elif a == "segment_free":
            if live.pop(e["addr"], None) is not None:
                del bases[bisect.bisect_left(bases, e["addr"])]
        elif a == "alloc":
            k = bisect.bisect_right(bases, e["addr"]) - 1
            pool = None
            if k >= 0:
                size, pool = live[bases[k]]
                if e["addr"] >= bases[k] + size:
                    pool = None
            if run is not None and run[0] != pool:
                runs.append(run)
                run = None
            if pool is not None:
                if run is None:
                    run = [pool, set(), i, i]
                run[1].add(e.get("stream", 0) or 0)
                run[3] = i
    if run is not None:
        runs.append(run)
    out: dict[int, list] = {}
    for pool, streams, first, last in runs:
        while first > 0 and entries[first - 1]["action"] in ("segment_alloc", "segment_map"):
            first -= 1                          # the segment the request made comes inside the begin
        capture = pool[0] != 0 and len(streams) == 1
        flags = ev.POOL_CAPTURE if capture else ev.POOL_ANY_STREAM
        out.setdefault(first, []).append((ev.POOL_BEGIN, pool, next(iter(streams)) if capture else 0, flags))
        out.setdefault(last + 1, []).insert(0, (ev.POOL_END, pool, 0, 0))
    return out


class SnapshotConversion:
    """One device's history in a snapshot, checked and ready to emit.

    ``meta`` is known before any event is written (so a streaming writer can be
    made with it); `emit` writes the events and returns the stats.
    """

    def __init__(self, snapshot, *, device: int | None = None, source: str = "<snapshot>",
                 device_name: str | None = None, total_memory: int | None = None):
        self.where = where = _Where(source)
        self.device = device = snapshot_device(snapshot, where) if device is None else device
        self.entries = _device_entries(snapshot, device, where)
        self.other_devices = {d: len(t) for d, t in enumerate(snapshot["device_traces"])
                              if d != device and isinstance(t, list) and t}
        if not self.entries:
            others = list(self.other_devices)
            if others:
                raise where.error(f"holds no allocation events for device {device}; device "
                                  f"{', '.join(map(str, others))} does: pass --device {others[0]}", "device_traces")
        self.t0 = _check_entries(self.entries, device, where)
        self.start = StartState(snapshot, self.entries, device, where)
        dev = {"index": device}
        if device_name:
            dev["name"] = device_name
        if total_memory:
            dev["total_memory"] = int(total_memory)
        settings = _settings(snapshot.get("allocator_settings"), where)
        self.private = private_pool_segments(snapshot, device)
        self.pool_ids = private_pool_ids(snapshot, device, where)
        self.meta = {
            "producer": "allocsim import", "framework": "torch", "format": "torch-snapshot",
            "source_file": source, "device": dev,
            "allocator_settings": settings,
            "time_source": "time_us" if self.t0 is not None else "entry index",
            "wrapped": self.start.wrapped, "pre_existing": len(self.start.blocks),
            "initial_segments": self.start.initial_segments(), "stacks": stacks_of(self.entries),
        }
        if self.private:
            self.meta["private_pools"] = {"segments": len(self.private), "bytes": sum(self.private.values())}
        from ...frameworks.torch import settings_from_trace
        settings_from_trace(self.meta, source)     # the torch policy reads them at replay: refuse bad ones now

    def emit(self, writer) -> dict:
        """Write the seeded live blocks, then every entry, with the inferred cache releases; return counts."""
        start = self.start
        conv = EntryConverter(writer, where=self.where, device=self.device, t0_us=self.t0,
                              untimed=self.t0 is None)
        conv.private = set(self.private)
        seeded_pending = start.seed(conv)
        gc_threshold = self.meta["allocator_settings"].get("garbage_collection_threshold")
        private = private_incarnations(self.entries, start, self.pool_ids)
        releases = inferred_releases(self.entries, start, isinstance(gc_threshold, (int, float)) and gc_threshold > 0,
                                     private)
        pool_runs = inferred_pool_runs(self.entries, start, private, releases)
        numbers: dict[tuple, int] = {}
        released, at = set(releases), 0
        for cut in sorted(released | set(pool_runs)):
            conv.feed(self.entries[at:cut])
            at = cut
            here = pool_runs.get(cut, ())
            for kind, pool, stream, flags in sorted(here, key=lambda x: x[0] != ev.POOL_END):
                if kind == ev.POOL_BEGIN and cut in released:
                    writer.record(ev.CACHE_RELEASE, aux=ev.TORCH_AUX)      # after the ends, before the begins
                    released.discard(cut)
                writer.record(kind, aux=numbers.setdefault(pool, len(numbers) + 1), addr=ev.pool_id_bits(pool),
                              stream=stream, flags=flags)
            if cut in released:
                writer.record(ev.CACHE_RELEASE, aux=ev.TORCH_AUX)
        conv.feed(self.entries[at:])
        counts, unknown, live = conv.counts, conv.unknown, conv.live
        final_mismatch = len(set(live) ^ start.final_live)
        warnings = []
        if start.inconsistent or final_mismatch:
            warnings.append(f"history and final segments disagree: {start.inconsistent} entries undone without "
                            f"a matching block or segment, {final_mismatch} blocks live at the end differ from "
                            f"the snapshot's active blocks")
        if self.private:
            warnings.append(f"{len(self.private)} segments ({sum(self.private.values()):,} bytes) belong to "
                            f"{len(numbers)} private pools (CUDA graphs, MemPool): the requests that landed in them "
                            f"are routed to their pools ({sum(len(v) for v in pool_runs.values()) // 2} runs); a "
                            f"pool whose segments were all freed before the snapshot names no pool, so its requests "
                            f"stay in the default pools (record with allocsim record to see every pool)")
        if unknown:
            warnings.append("ignored unknown actions: " + ", ".join(f"{k} x{n}" for k, n in sorted(unknown.items())))
        warnings += [f"device {d} also holds {n:,} trace entries: --device {d} imports them"
                     for d, n in self.other_devices.items()]
        return {
            "format": "torch", "entries": len(self.entries),
            "allocs": counts["alloc"], "frees": counts["free_completed"], "free_requested": counts["free_requested"],
            "segment_allocs": counts["segment_alloc"], "segment_frees": counts["segment_free"],
            "segment_maps": counts["segment_map"], "segment_unmaps": counts["segment_unmap"],
            "ooms": counts["oom"], "catches_oom": counts["catches_oom"], "cache_releases_inferred": len(releases),
            "pool_runs_inferred": sum(len(v) for v in pool_runs.values()) // 2,
            "snapshots_ignored": counts["snapshot"], "unknown_actions": dict(unknown),
            "seeded": len(start.blocks), "seeded_pending_free": seeded_pending, "wrapped": start.wrapped,
            "initial_segments": len(start.segments), "inconsistent": start.inconsistent,
            "final_mismatch": final_mismatch, "live_at_end": len(live), "warnings": warnings,
        }


class EntryConverter:
    """Writes PyTorch ``device_traces`` entries as allocsim events, chunk after chunk.

    The one forward conversion, used by the importer (a whole history at once,
    ``where`` given: an inconsistent entry is an `InputError` at its position) and by
    the recorder (each drained chunk, ``where=None``: a free of a block allocated
    before recording began is counted in ``counts["unmatched_free"]`` and skipped).
    ``live`` maps a block address to the dense id of the block live there.
    Times are µs from ``t0_us`` (default: the first timed entry), in ns; untimed
    entries take their index. O(1) per entry.

    ``infer_releases`` (the recorder): a CACHE_RELEASE before each run of segment frees that the allocator's
    own paths do not explain, by the importer's rule (`SegmentUse`; ``docs/importers.md``, "Cache releases"):
    ``emptyCache()`` called from C++ (cuDNN's benchmark mode) never passes the Python wrapper. Chunk-safe: the
    state is kept between chunks, and a run and the entry that explains it (the ``oom``, or the segment the
    release was made for) come from one ``malloc`` call, which a drain never splits. Besides the importer's rule,
    a run followed by a segment that would not have fitted under ``limit`` (the bytes the allocator may hold:
    the memory fraction's, else the device's) with what was reserved before the run is the release-and-retry
    of that ``malloc``; a run of private-pool segments alone (``private``) is a deleted MemPool's own release
    (its POOL_RELEASE follows); a run right after `cache_release` (the program's ``empty_cache()``, written
    where it was called) is that call's.
    """

    def __init__(self, writer, *, stacks: bool = True, where: _Where | None = None, device: int = 0,
                 t0_us=None, untimed: bool = False, infer_releases: bool = False, limit: int | None = None,
                 gc_threshold: bool = False):
        self.w = writer
        self.stacks = stacks
        self.where = where
        self.device = device
        self.t0_us = t0_us
        self.untimed = untimed
        self.live: dict[int, int] = {}
        self.private: set[int] = set()      # base addresses of segments known to be in CUDA graph private pools
        self.n = 0
        self.counts: Counter = Counter()
        self.unknown: Counter = Counter()
        self.use = SegmentUse() if infer_releases else None
        self.limit, self.gc_threshold = limit, gc_threshold
        self.reserved = 0               # bytes of the segments and pages held (the release-and-retry's check)
        self.explained = False          # a CACHE_RELEASE was just written for the next run (`cache_release`)
        self._run_end = 0               # with ``use``: where the run of segment frees being written ends

    def cache_release(self) -> None:
        """Write the program's ``empty_cache()`` here; the segment frees that follow at once are its own."""
        self.w.record(ev.CACHE_RELEASE, aux=ev.TORCH_AUX)
        self.explained = self.use is not None

    def _infer_release(self, entries: list, k: int, t: int) -> None:
        """At ``entries[k]``, the first of a run of segment frees: a CACHE_RELEASE before it if the program (or a
        C++ ``emptyCache()``) released the cache there (the class docstring)."""
        j = _run_end(entries, k)
        nxt = entries[j] if j < len(entries) else None
        freed = {x["addr"] for x in entries[k:j]}
        own = (nxt is not None and (
            nxt["action"] == "oom"
            or (nxt["action"] in GROWING and (self.gc_threshold or (
                self.limit is not None and self.reserved + nxt["size"] > self.limit))))
            or freed <= self.use.in_pool)       # a MemPool's own emptyCache(pool) as it is deleted
        if self.use.is_release(entries[k:j], own) and not self.explained:
            self.w.record(ev.CACHE_RELEASE, aux=ev.TORCH_AUX, t=t)
            self.counts["cache_releases_inferred"] += 1
        self._run_end = j

    def _problem(self, key: str, what: str, idx: int) -> None:
        if self.where is not None:
            raise self.where.error(what, f"device_traces[{self.device}][{idx}]")
        self.counts[key] += 1

    def feed(self, entries) -> None:
        w, live, counts, use = self.w, self.live, self.counts, self.use
        alloc, free, free_requested, segment, oom = w.alloc, w.free, w.free_requested, w.segment, w.oom
        if use is not None:
            entries = list(entries)
            self._run_end = 0
        for k, e in enumerate(entries):
            idx = self.n
            self.n += 1
            a = e.get("action")
            tu = None if self.untimed else e.get("time_us")
            if tu is None:
                t = idx
            else:
                if self.t0_us is None:
                    self.t0_us = tu
                t = max(0, int((tu - self.t0_us) * 1000))
            stream = e.get("stream", 0) or 0
            if use is not None:
                if a in RELEASING:
                    if k >= self._run_end:
                        self._infer_release(entries, k, t)
                    self.reserved -= e["size"]
                elif a in BLOCK_ACTIONS or a in GROWING:
                    use.see(e, a == "segment_alloc" and e["addr"] in self.private)
                    if a in GROWING:
                        self.reserved += e["size"]
                self.explained = self.explained and a in RELEASING
            if a == "alloc":
                addr = e["addr"]
                if addr in live:
                    self._problem("alloc_at_live_address",
                                  f"alloc at address {addr:#x}, which is still live (id {live[addr]})", idx)
                frames = e.get("frames") if self.stacks else None
                flags = e.get("_flags", 0)              # `converted_again`: as recorded
                if frames and isinstance(frames, list) and catches_oom(frames):
                    flags = ev.CATCHES_OOM
                    counts["catches_oom"] += 1
                live[addr] = alloc(e["size"], stream, t=t, addr=addr,
                                   site=site_of(frames) if frames else e.get("_site"), flags=flags)
            elif a == "free_requested" or a == "free_completed":
                addr = e["addr"]
                i = live.get(addr) if a == "free_requested" else live.pop(addr, None)
                if i is None:
                    self._problem("unmatched_free", f"{a} of address {addr:#x}, which holds no live block", idx)
                    continue
                (free_requested if a == "free_requested" else free)(i, t=t, stream=stream, addr=addr,
                                                                     size=e["size"])
            elif a in SEGMENT_KINDS:
                segment(SEGMENT_KINDS[a], e["addr"], e["size"], stream, t=t,
                        flags=ev.PRIVATE_POOL if e["addr"] in self.private else 0)
            elif a == "oom":
                oom(e["size"], device_free=e.get("device_free", 0) or 0, stream=stream, t=t)
            else:
                (counts if a == "snapshot" else self.unknown)[a] += 1
                continue
            counts[a] += 1


def private_pool_segments(snapshot, device: int = 0) -> dict[int, int]:
    """``{base address: size}`` of the snapshot's segments in a CUDA graph private pool: a
    ``segment_pool_id`` other than ``(0, 0)`` (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``).
    The allocator's default pools are what the `torch` model follows; these it does not model."""
    out = {}
    segments = snapshot.get("segments") if isinstance(snapshot, dict) else None
    for seg in segments if isinstance(segments, list) else ():
        pool = seg.get("segment_pool_id") if isinstance(seg, dict) else None
        if seg.get("device", device) == device and isinstance(pool, (list, tuple)) and any(pool) \
                and _is_uint(seg.get("address")) and _is_uint(seg.get("total_size")):
            out[seg["address"]] = seg["total_size"]
    return out


def snapshot_device(snapshot, where: _Where) -> int:
    """The device whose history a snapshot holds, when none is named: device 0 when it has trace entries (as
    always), else the one device that has (a rank's snapshot taken on ``cuda:1`` holds ``device_traces[1]`` only),
    else the one its segments lie on, else 0; an `InputError` naming them when several other devices have entries."""
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        return 0                    # _device_entries says what is wrong
    used = [d for d, t in enumerate(traces) if isinstance(t, list) and t]
    if len(used) > 1 and used[0] != 0:
        raise where.error(f"holds no allocation events for device 0, and some for devices "
                          f"{', '.join(map(str, used))}; pass --device N to import one", "device_traces")
    if used:
        return used[0]
    segments = snapshot.get("segments")
    on = {seg.get("device") for seg in segments if isinstance(seg, dict) and _is_uint(seg.get("device"))} \
        if isinstance(segments, list) else set()
    return on.pop() if len(on) == 1 else 0


def _device_entries(snapshot, device: int, where: _Where) -> list:
    if isinstance(snapshot, list):
        raise where.error("a bare segment list (torch.cuda.memory_snapshot()) has no history; dump one with "
                          "torch.cuda.memory._record_memory_history() then _dump_snapshot()", "top level")
    if not isinstance(snapshot, dict):
        raise where.error(f"not a memory snapshot (top level is {type(snapshot).__name__}, expected dict)",
                          "top level")
    traces = snapshot.get("device_traces")
    if traces is None:
        segs = snapshot.get("segments")
        legacy = isinstance(segs, list) and any(isinstance(s, dict) and any(
            isinstance(b, dict) and "history" in b for b in s.get("blocks", []) or []) for s in segs)
        if legacy:
            raise where.error("legacy snapshot format (blocks with 'history', PyTorch < 2.1) is not supported; "
                              "record again with PyTorch >= 2.1 and torch.cuda.memory._record_memory_history()",
                              "segments")
        raise where.error("not a memory snapshot: no 'device_traces' key", "top level")
    if not isinstance(traces, list):
        raise where.error("'device_traces' is not a list", "device_traces")
    if not 0 <= device < len(traces):
        have = f"devices 0..{len(traces) - 1}" if traces else "no devices"
        raise where.error(f"no trace for device {device} (the snapshot has {have})", "device_traces")
    entries = traces[device]
    if not isinstance(entries, list):
        raise where.error("trace is not a list", f"device_traces[{device}]")
    return entries


def _check_entries(entries: list, device: int, where: _Where) -> int | None:
    """Validate every entry the conversion reads; return the time origin (µs) or None if untimed. A snapshot times
    every entry (PyTorch 2.2 on) or none: one entry without ``time_us`` among timed ones is refused at it (read as
    untimed, every time became an entry index)."""
    timed = True            # (entry 0 decides: timed or not, the others as it is)
    t0 = None
    uint = _is_uint
    for i, e in enumerate(entries):
        if type(e) is not dict:
            raise where.error("entry is not a dict", f"device_traces[{device}][{i}]")
        a = e.get("action")
        if not isinstance(a, str):
            raise where.error(f"action is {_shown(a)}, expected a string", f"device_traces[{device}][{i}]")
        if a in SIZED_ACTIONS:
            if not (uint(e.get("addr")) and uint(e.get("size"))):
                pos = f"device_traces[{device}][{i}]"
                where.uint(e, "addr", pos)
                where.uint(e, "size", pos)
            if e["size"] > ev.MAX_SIZE:
                raise where.error(f"absurd size {e['size']} (> 1 PiB)", f"device_traces[{device}][{i}]")
        elif a == "oom":
            pos = f"device_traces[{device}][{i}]"
            where.uint(e, "size", pos)
            where.uint(e, "device_free", pos, 0)
        s = e.get("stream", 0)
        if not uint(s):
            raise where.error(f"stream is {_shown(s)}, expected a non-negative integer",
                              f"device_traces[{device}][{i}]")
        if timed:
            tu = e.get("time_us")
            if tu is None and i:
                raise where.error(f"no time_us, where device_traces[{device}][0] has one (a snapshot times every "
                                  f"entry, or none)", f"device_traces[{device}][{i}]")
            if tu is None:
                timed = False
            elif type(tu) not in (int, float) or not 0 <= tu < 2**53:
                raise where.error(f"time_us is {_shown(tu)}, expected microseconds (a number, 0 to 2**53)",
                                  f"device_traces[{device}][{i}]")
            elif t0 is None or tu < t0:
                t0 = tu
        elif e.get("time_us") is not None:
            raise where.error(f"time_us is {_shown(e.get('time_us'))}, where device_traces[{device}][0] has none "
                              f"(a snapshot times every entry, or none)", f"device_traces[{device}][{i}]")
    if not timed:
        return None
    return t0 if t0 is not None else 0


#: The trace kinds that come from the allocator's history, as the entry actions they were converted from.
ENTRY_ACTIONS = {ev.ALLOC: "alloc", ev.FREE: "free_completed", ev.FREE_REQUESTED: "free_requested",
                 ev.OOM: "oom", **{k: a for a, k in SEGMENT_KINDS.items()}}


def converted_again(path: str, out: str) -> int:
    """Convert a torch recording's history again with today's `EntryConverter` (a recording made before it inferred
    the releases made in C++: docs/importers.md, "In a recording") into ``out``; return the releases inferred. The
    entries are the trace's own ALLOC, FREE, SEGMENT_* and OOM records (addresses, sizes, streams; times and call
    sites as recorded), drained at each event the recorder wrote itself (a mark, empty_cache(), a fraction, a pool
    or scope event), which stay in place; the private segments are those the trace flags."""
    from ...trace import Trace, TraceWriter
    t = Trace.load(path)
    w = TraceWriter(meta=dict(t.meta))
    gc = (t.meta.get("allocator_settings") or {}).get("garbage_collection_threshold")
    conv = EntryConverter(w, infer_releases=True, limit=t.meta["device"]["total_memory"],
                          gc_threshold=isinstance(gc, (int, float)) and gc > 0, t0_us=0)
    segs = t.records[t.kind == ev.SEGMENT_ALLOC]
    conv.private = {int(r["addr"]) for r in segs if int(r["flags"]) & ev.PRIVATE_POOL}
    streams, labels, sites = list(t.streams), t.labels, t.sites
    chunk: list = []
    for r in t.records:
        k, stream, at = int(r["kind"]), streams[int(r["stream"])], int(r["time_ns"]) / 1000
        action = ENTRY_ACTIONS.get(k)
        if action == "oom":
            chunk.append({"action": action, "size": int(r["size"]), "device_free": int(r["addr"]), "stream": stream,
                          "time_us": at})
        elif action == "alloc":                 # its call site and flags (CATCHES_OOM, ...) as recorded
            site = int(r["site"])
            chunk.append({"action": action, "addr": int(r["addr"]), "size": int(r["size"]), "stream": stream,
                          "time_us": at, "_flags": int(r["flags"]), "_site": sites[site] if site < len(sites) else None})
        elif action is not None:
            chunk.append({"action": action, "addr": int(r["addr"]), "size": int(r["size"]), "stream": stream,
                          "time_us": at})
        else:
            conv.feed(chunk)
            chunk = []
            if k == ev.MARK:
                w.mark(labels[int(r["aux"])], t=int(r["time_ns"]))
            elif k == ev.CACHE_RELEASE:
                conv.cache_release()
            else:
                aux = w.label_index(labels[int(r["aux"])]) if k in ev.SCOPE_KINDS else int(r["aux"])
                w.record(k, aux=aux, addr=int(r["addr"]), size=int(r["size"]), flags=int(r["flags"]),
                         stream=stream, t=int(r["time_ns"]))
                if k == ev.SET_LIMIT:
                    conv.limit = int(r["size"])
    conv.feed(chunk)
    w.finish().save(out)
    return conv.counts["cache_releases_inferred"]
