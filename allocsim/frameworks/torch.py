"""PyTorch's caching-allocator settings: read, written and recorded, in one place.

Source: `docs/models/torch.md` (Options; option parsing as in c10/core/AllocatorConfig.cpp, rev B).

- the options the `torch` model (and `torch-ref`) takes, declared once (`PARAMS`), with
  PyTorch's refusals: ``max_split_size_mb`` and ``max_non_split_rounding_mb`` from 20 MiB
  up to what a ``size_t`` of bytes holds; divisions and their MiB keys powers of two
  (a division may be 0), a list naming at least one interval;
- the ``roundup_power2_divisions`` table both ways (`parse_divisions`, `divisions_text`);
- a ``PYTORCH_ALLOC_CONF`` line both ways (`parse_conf`, `conf_text`, `conf_lines`);
- the settings a trace recorded (`settings_from_trace`, `options_in_force`) and the
  ``allocator_settings`` a snapshot records (`snapshot_settings`, its inverse);
- the memory fraction whose allowed memory is a given cap (`fraction_for`);
- the same setting applied from inside a running process (`python_lines`: docs/recording.md).
"""
from __future__ import annotations

import math

from ..errors import InputError, UsageError
from ..params import Param, number, split_conf

MiB = 1 << 20
SIZE_MAX = 2**64 - 1                # size_t: PyTorch's "no limit" for max_split_size
N_DIVISION_INTERVALS = 16           # one divisions entry per power-of-two interval, 1 MiB .. 64 GiB
NO_DIVISIONS = (0,) * N_DIVISION_INTERVALS
MIN_MB = 20                         # kLargeBuffer in MiB: the least max_split / max_non_split_rounding
MAX_MB = SIZE_MAX // MiB            # the most MiB whose bytes a size_t holds


# ---- roundup_power2_divisions ---------------------------------------------------------------
def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _size_t(text: str, what: str) -> int:
    """An integer PyTorch reads into a ``size_t``: 0 .. 2**64 - 1."""
    v = number(text)
    if not 0 <= v <= SIZE_MAX:
        raise ValueError(f"{what} {v} is outside 0 .. 2**64 - 1 (a size_t)")
    return v


def interval_of_mb(mb: int) -> int:
    """The divisions entry of an interval key in MiB (a power of two): log2, the last entry for 64 GiB and up."""
    return min(mb.bit_length() - 1, N_DIVISION_INTERVALS - 1)


def parse_divisions(text: str) -> tuple:
    """``roundup_power2_divisions``: ``4`` or ``[256:1,512:2,>:8]`` (keys in MiB) -> 16 entries.

    As AllocatorConfig::parseRoundUpPower2Divisions: the first key also fills every
    interval below it; ``>`` fills every interval after the last key; a key given again
    (``[256:2,256:4]``) sets its interval again, the last one counting. An empty list
    is refused: it names no interval (write ``[1:0]`` for none); so is an empty item
    but a trailing one (``[256:2,,512:4]``), which PyTorch's parser refuses too.
    """
    text = str(text).replace(" ", "")
    if not (text.startswith("[") and text.endswith("]")):
        v = _size_t(text, "divisions")
        if not _pow2(v):
            raise ValueError("the divisions have to be a power of 2")
        return (v,) * N_DIVISION_INTERVALS
    split = text[1:-1].split(",")
    items = [item for item in split if item]
    if not items:
        raise ValueError(f"the list {text} names no interval: give interval:divisions items, e.g. [256:1,>:4]")
    if "" in split[:-1]:
        raise ValueError(f"item {split.index('') + 1} of the list {text} is empty (a comma too many)")
    table = [0] * N_DIVISION_INTERVALS
    first, last = True, 0
    for item in items:
        key, sep, val = item.partition(":")
        if not sep:
            raise ValueError(f"expected interval:divisions, got {item!r}")
        d = _size_t(val, "divisions")
        if d != 0 and not _pow2(d):
            raise ValueError("the divisions have to be a power of 2 or 0 to disable roundup")
        if key == ">":
            table[last + 1:] = [d] * (N_DIVISION_INTERVALS - last - 1)
            continue
        mb = _size_t(key, "interval")
        if not _pow2(mb):
            raise ValueError(f"the intervals have to be powers of 2, got {mb}")
        idx = interval_of_mb(mb)
        if first:
            table[:idx] = [d] * idx
            first = False
        table[idx] = d
        last = idx
    return tuple(table)


def divisions_table(v) -> tuple:
    """The 16-entry table of a divisions option as given: a table already, or its text."""
    return v if isinstance(v, tuple) else parse_divisions(v)


def divisions_text(table: tuple) -> str:
    """The shortest usual spelling of a 16-interval divisions table that PyTorch parses back to it: one number
    when uniform, else ``[key:d,...]`` (MiB keys; the first key also fills the intervals below it, ``>`` the ones
    after the last key)."""
    if len(set(table)) == 1:
        return str(table[0]) if table[0] else "[1:0]"        # a single 0 is refused (not a power of 2)
    last = len(table) - 1
    first_end = next(i for i, d in enumerate(table) if d != table[0]) - 1
    tail_start = next(i for i in range(last, -1, -1) if table[i] != table[last]) + 1
    keys = [first_end] + [i for i in range(first_end + 1, tail_start) if table[i]]
    if table[last] and keys[-1] != tail_start - 1:
        keys.append(tail_start)         # ">" fills only the intervals after the last key
    items = [f"{1 << i}:{table[i]}" for i in keys]
    if table[last] and keys[-1] < last:
        items.append(f">:{table[last]}")
    return "[" + ",".join(items) + "]"


# ---- the options --------------------------------------------------------------------------
def _mb(v: str) -> int:
    """``max_split_size_mb`` / ``max_non_split_rounding_mb``: MiB from 20 to what a size_t of bytes holds."""
    mb = number(v)
    if mb < MIN_MB:
        raise ValueError(f"too small, must be >= {MIN_MB}")
    if mb > MAX_MB:
        raise ValueError(f"too large, must be <= {MAX_MB} (2**64 bytes; leave it unset for no limit)")
    return mb


def _gc_threshold(v: str) -> float:
    x = number(v, "float")
    if not 0.0 < x < 1.0:
        raise ValueError("must lie in (0.0, 1.0)")
    return x


def _fraction(v: str) -> float:
    x = number(v, "float")
    if not 0.0 < x <= 1.0:
        raise ValueError("must lie in (0.0, 1.0]")
    return x


#: The options of the `torch` model (and of `torch-ref`, which shares them).
PARAMS = (
    Param("expandable_segments", "bool", False, "map 2 MiB / 20 MiB pages into per-stream virtual segments"),
    Param("max_split_size_mb", "int", None, "blocks this large (MiB, >= 20) are never split; default unlimited", _mb),
    Param("max_non_split_rounding_mb", "int", MIN_MB, "slack (MiB, >= 20) an oversize request accepts", _mb),
    Param("roundup_power2_divisions", "str", None, "4 or [256:1,512:2,>:8] (MiB keys); default 512 B rounding",
          divisions_table),
    Param("garbage_collection_threshold", "float", 0.0, "in (0,1): reclaim old cached blocks above this "
          "fraction of the allowed memory (--cap or per_process_memory_fraction)", _gc_threshold),
    Param("per_process_memory_fraction", "float", None, "torch.cuda.set_per_process_memory_fraction: "
          "fraction of device memory the allocator may reserve (1.0: no limit); default: --cap", _fraction),
    Param("fix_189504", "bool", False, "search the pool again after release_cached_blocks (PR #191302)"),
    Param("trace_settings", "bool", True, "start from the allocator settings recorded in the trace"),
)
_KNOWN = {p.name: p for p in PARAMS}

#: Keys PyTorch accepts that change nothing in the model.
IGNORED_CONF_KEYS = ("backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                     "pinned_num_register_threads", "pinned_use_background_threads", "large_segment_size_mb")


def format_value(key: str, value) -> str:
    """An option's value as ``PYTORCH_ALLOC_CONF`` writes it (the divisions table short, `divisions_text`)."""
    if key == "roundup_power2_divisions" and value is not None:
        return divisions_text(divisions_table(value))
    return _KNOWN[key].format(value)


def parse_conf(text: str) -> dict:
    """A ``PYTORCH_ALLOC_CONF`` line (``k:v,...``) as the model's option values; a ValueError names the key.

    Keys that change nothing in the model (`IGNORED_CONF_KEYS`) are skipped; a ``backend`` other
    than ``native`` is refused (its allocator is not this one)."""
    out: dict = {}
    for key, value in split_conf(text or ""):
        if key == "backend" and value != "native":
            raise ValueError(f"backend {value} is not modeled by the torch policy")
        if key in IGNORED_CONF_KEYS:
            continue
        if key not in _KNOWN:
            raise ValueError(f"unknown option {key!r} (known: {', '.join(sorted([*_KNOWN, *IGNORED_CONF_KEYS]))})")
        try:
            out[key] = _KNOWN[key].parse(value)
        except ValueError as e:
            raise ValueError(f"option {key}: {e.args[0] if e.args else e}") from None
    return out


def conf_text(values: dict) -> str:
    """``k:v,...`` as PyTorch's option parser takes it, ``trace_settings`` left out (not a PyTorch key)."""
    return ",".join(f"{k}:{format_value(k, v)}" for k, v in values.items() if k != "trace_settings")


def conf_lines(values: dict) -> dict:
    """The environment lines that select these option values, ready to paste: ``{"conf", "legacy_conf", "note"}``
    (``PYTORCH_ALLOC_CONF``, and the older name that PyTorch still reads)."""
    text = conf_text(values)
    if not text:
        return {"conf": "unset PYTORCH_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF", "legacy_conf": "", "note": "the defaults"}
    note = ("needs torch.cuda.set_per_process_memory_fraction(cap / total memory) in the script"
            if "garbage_collection_threshold" in values else "")
    return {"conf": f"PYTORCH_ALLOC_CONF={text}", "legacy_conf": f"PYTORCH_CUDA_ALLOC_CONF={text}", "note": note}


# ---- what a trace recorded ------------------------------------------------------------------
def settings_from_trace(meta: dict, path=None) -> dict:
    """Option values in force when the trace was recorded (``meta["allocator_settings"]``).

    The settings string (``PYTORCH_CUDA_ALLOC_CONF``) is applied first, then the
    structured fields of the snapshot, which are the values actually in force.
    """
    s = meta.get("allocator_settings") or {}
    if not isinstance(s, dict):
        raise InputError("allocator_settings is not a dict", path=path, position="metadata")
    try:
        out = parse_conf(s.get("PYTORCH_CUDA_ALLOC_CONF") or "")
        if s.get("max_split_size") is not None:
            v = s["max_split_size"]
            if type(v) is not int:      # int() would round 1073741824.5 and read "1GB" as an error of its own
                raise ValueError(f"max_split_size {v!r}: expected a whole number of bytes")
            out["max_split_size_mb"] = None if v >= SIZE_MAX or v <= 0 else v // MiB
            if out["max_split_size_mb"] is not None and out["max_split_size_mb"] < MIN_MB:
                raise ValueError(f"max_split_size {v} bytes is below the {MIN_MB} MiB PyTorch allows")
        if s.get("garbage_collection_threshold") is not None:
            v = s["garbage_collection_threshold"]
            if type(v) not in (int, float):
                raise ValueError(f"garbage_collection_threshold {v!r}: expected a number")
            if not (v == 0 or 0 < v < 1):     # (0: none set, as a snapshot records it; else as the option allows)
                raise ValueError(f"garbage_collection_threshold {v!r} must lie in (0.0, 1.0), or be 0 (none set)")
            out["garbage_collection_threshold"] = float(v)
        if s.get("expandable_segments") is not None:
            if not isinstance(s["expandable_segments"], bool):       # bool("False") is True
                raise ValueError(f"expandable_segments {s['expandable_segments']!r}: expected true or false")
            out["expandable_segments"] = s["expandable_segments"]
        div = s.get("roundup_power2_divisions")
        if isinstance(div, dict) and div:
            table, keys = [0] * N_DIVISION_INTERVALS, {}
            for k, d in div.items():
                try:
                    mb = int(k)
                except (TypeError, ValueError):
                    raise ValueError(f"roundup_power2_divisions key {k!r} is not a whole number of MiB") from None
                if not _pow2(mb):
                    raise ValueError(f"roundup_power2_divisions key {k!r} is not a power of two")
                if (other := keys.setdefault(interval_of_mb(mb), k)) != k:     # a snapshot keys each once
                    raise ValueError(f"roundup_power2_divisions keys {other!r} and {k!r} name one interval")
                table[interval_of_mb(mb)] = _recorded_divisions(d)
            out["roundup_power2_divisions"] = tuple(table)
        elif isinstance(div, (list, tuple)) and div:
            if len(div) != N_DIVISION_INTERVALS:
                raise ValueError(f"roundup_power2_divisions: a list of {len(div)} entries, expected one per interval "
                                 f"({N_DIVISION_INTERVALS})")
            out["roundup_power2_divisions"] = tuple(_recorded_divisions(d) for d in div)
        if not any(d > 1 for d in out.get("roundup_power2_divisions") or ()):
            out.pop("roundup_power2_divisions", None)      # a table that rounds nothing: the default, not an option
    except (ValueError, TypeError, OverflowError, UsageError) as e:
        raise InputError(f"allocator_settings: {e.args[0] if e.args else e}", path=path, position="metadata")
    return out


def _recorded_divisions(d) -> int:
    """One recorded divisions entry: 0 (no rounding) or a power of two, as PyTorch's parser allows."""
    if isinstance(d, bool) or not isinstance(d, int) or not (d == 0 or _pow2(d)) or d > SIZE_MAX:
        raise ValueError(f"roundup_power2_divisions entry {d!r} is neither 0 nor a power of 2")
    return d


def options_in_force(options: dict | None, trace) -> dict:
    """The trace's recorded settings (unless ``trace_settings`` is false), overridden by ``options``."""
    explicit = dict(options or {})
    opts = {}
    if explicit.get("trace_settings", True) and trace is not None:
        opts.update(settings_from_trace(trace.meta, trace.path))
    opts.update(explicit)
    return opts


def snapshot_settings(values: dict) -> dict:
    """``allocator_settings`` as a PyTorch snapshot records them for these option values (all of them, defaults
    included): the settings string of the options changed from PyTorch's defaults, then the structured fields.
    `settings_from_trace` reads it back to the same values."""
    div = divisions_table(values["roundup_power2_divisions"] or NO_DIVISIONS)
    ms = values["max_split_size_mb"]
    changed = {"expandable_segments": bool(values["expandable_segments"]), "max_split_size_mb": ms is not None,
               "max_non_split_rounding_mb": values["max_non_split_rounding_mb"] not in (None, MIN_MB),
               "roundup_power2_divisions": any(div),
               "garbage_collection_threshold": (values["garbage_collection_threshold"] or 0.0) > 0.0}
    return {"PYTORCH_CUDA_ALLOC_CONF": conf_text({k: values[k] for k in changed if changed[k]}),
            "max_split_size": -1 if ms is None else ms << 20,
            "garbage_collection_threshold": float(values["garbage_collection_threshold"] or 0.0),
            "expandable_segments": bool(values["expandable_segments"]),
            "roundup_power2_divisions": {str(1 << i): int(d) for i, d in enumerate(div)}}


def fraction_for(allowed: int | None, total: int) -> float:
    """The memory fraction whose ``int(fraction * total)`` — PyTorch's allowed memory
    (``setMemoryFraction``) — is exactly ``allowed``; 1.0 (no limit) for none or the whole device."""
    if not allowed or allowed >= total:
        return 1.0
    f = allowed / total
    while int(f * total) < allowed:
        f = math.nextafter(f, 1.0)
    while int(f * total) > allowed:
        f = math.nextafter(f, 0.0)
    return f


# ---- the setting applied from inside a running process (docs/recording.md) -------------------------------------
#: Options that are the model's, not PyTorch's: never in a settings string.
MODEL_ONLY = ("trace_settings", "fix_189504", "per_process_memory_fraction")
#: Options PyTorch's parser keeps at their last value when a settings string leaves them out (it resets
#: max_split_size_mb, roundup_power2_divisions and garbage_collection_threshold to their defaults), with the
#: defaults a run-time string names them with, so that it selects the setting whatever was in force before.
KEPT_WHEN_UNNAMED = {"expandable_segments": False, "max_non_split_rounding_mb": MIN_MB}
#: What the run-time form changes, and when it must run: PyTorch 2.11's parser accepts every option but ``backend``
#: (fixed when torch loads) at run time; each applies to what comes after the call.
RUNTIME_NOTE = ("before the model or any tensor is on the GPU: the options apply from the call on, expandable_segments "
                "to the segments made after it, and tune modeled them from the start; backend cannot change at run "
                "time")


def runtime_text(values: dict) -> str:
    """The ``k:v,...`` string that ``torch.cuda.memory._set_allocator_settings`` takes for these option values in a
    running process: the options it would otherwise keep from before named with their defaults (`KEPT_WHEN_UNNAMED`),
    the model's own options left out."""
    chosen = {k: v for k, v in values.items() if k not in MODEL_ONLY and v is not None}
    return conf_text({k: chosen.get(k, v) for k, v in KEPT_WHEN_UNNAMED.items()} |
                     {k: v for k, v in chosen.items() if k not in KEPT_WHEN_UNNAMED})


def python_lines(values: dict, cap: int | None, total: int | None) -> dict:
    """The setting as Python that works in a running process (a notebook, where ``PYTORCH_ALLOC_CONF`` was read
    when CUDA started): ``{"python": the _set_allocator_settings call, "python_fraction": the
    set_per_process_memory_fraction call for ``cap`` ("" without one), "fraction": its value (None without a device
    size), "python_note"}``. The fraction is `fraction_for`'s: PyTorch allows ``int(fraction * total)`` bytes, and
    that is ``cap`` to the byte; it is written as Python's shortest repr, which reads back to the same float. Without
    the device's size (a trace that does not say it, no --capacity) the call computes it on the device."""
    fraction = values.get("per_process_memory_fraction")
    if fraction is None and cap:
        fraction = fraction_for(cap, total) if total else None
        call = (f"set_per_process_memory_fraction({fraction!r})" if fraction is not None else
                f"set_per_process_memory_fraction(fraction_for({cap}, "
                f"torch.cuda.get_device_properties(0).total_memory))  # from allocsim.frameworks.torch import "
                f"fraction_for")
    else:
        call = f"set_per_process_memory_fraction({fraction!r})" if fraction is not None else ""
    note = RUNTIME_NOTE + (f"; the fraction allows int(fraction x {total:,}) = {cap:,} bytes, the cap"
                           if fraction is not None and cap and total and "per_process_memory_fraction" not in values
                           else "")
    return {"python": f'torch.cuda.memory._set_allocator_settings("{runtime_text(values)}")',
            "python_fraction": f"torch.cuda.{call}" if call and fraction != 1.0 else "",
            "fraction": fraction, "python_note": note}

