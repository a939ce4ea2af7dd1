"""Synthetic but realistic training workloads: `allocsim synth`.

Two families of generators:

- **Model presets** (``mlp``, ``cnn``, ``transformer``) describe a network as a
  chain of `Op`s (output bytes, parameter tensors, extra buffers saved for
  backward, workspace temporaries) and drive it through a PyTorch-style training
  step with `_TrainingLoop`: parameters and buffers allocated first; per iteration
  ``zero_grad(set_to_none=True)`` frees the gradients, the forward pass keeps each
  activation, the backward pass allocates input and parameter gradients and frees
  the activations in exactly the reverse order of their allocation, and Adam
  allocates its two state buffers per parameter lazily at the first step (as
  ``torch.optim.Adam`` does) plus a foreach temporary per parameter every step.
  Shapes follow torchvision's ResNet and a GPT-2-style decoder with materialised
  attention scores, so sizes, counts and peaks resemble the reference traces in
  ``docs/metrics.md`` ("Reference measurements").
- **alloc-heavy** reproduces the seeds' artificial allocation-heavy workload
  (``docs/models/cuarrays.md``, "Measured numbers": ~1 M small and medium short-lived allocations)
  vectorised with numpy: 1 M allocations generate in well under a second.

``variable=True`` redraws the batch (mlp), image size (cnn) or sequence length
(transformer) every iteration, the drifting-shape pattern that fragments caching
allocators. Everything random comes from one ``numpy.random.default_rng(seed)``,
so the same arguments give byte-identical records.
"""
from __future__ import annotations

import copy
import errno
import os
import shutil
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import UsageError
from ..params import Param
from ..trace import ALLOC, FREE, MARK, RECORD_DTYPE, Trace, TraceWriter
from ..outputs import atomic_path, claim_outputs, own_temporary
from ..trace.events import MAX_SIZE, NO_ID, NO_SITE
from ..trace.format import TraceFileWriter
from ..units import fmt_bytes, fmt_count

#: The most training iterations a synthetic trace takes (one MARK and one label each): a million steps is a long run.
MAX_ITERATIONS = 1_000_000

GiB = 1024**3
DEVICE = {"name": "synthetic", "total_memory": 80 * GiB}


# ---- network description --------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One layer of a network, as the allocator sees it (all sizes in requested bytes).

    ``out`` is the output tensor, kept for backward when ``keep`` (else freed once the
    next op has produced its output: attention scores consumed by softmax). ``saved``
    are extra tensors kept for backward (BN mean/invstd, dropout masks, pooling
    indices); ``buffers`` are persistent non-trainable tensors (BN running stats);
    ``workspace``/``bwd_workspace`` are temporaries live only while the op runs
    (cuDNN workspaces). ``grad_in`` is the size of the gradient w.r.t. the input
    (None: the previous op's output; 0: the input needs no gradient). ``cost`` is a
    compute weight (default: output bytes) that apportions iteration time.
    """

    name: str
    out: int
    params: tuple = ()
    saved: tuple = ()
    buffers: tuple = ()
    workspace: int = 0
    bwd_workspace: int = 0
    grad_in: int | None = None
    keep: bool = True
    cost: float | None = None


@dataclass(frozen=True)
class Network:
    """The ops of one iteration plus the input batch tensors ``(bytes, site)``."""

    ops: list
    inputs: list = field(default_factory=list)


# ---- the emitter: one TraceWriter, a clock, a size scale -----------------------------------------

class _Emitter:
    """Writes ALLOC/FREE/MARK with plausible timestamps; O(1) per event.

    Each event advances the clock by ``event_ns`` (framework dispatch); `compute`
    advances it by modeled kernel time with a little seeded jitter.
    """

    def __init__(self, writer: TraceWriter, rng: np.random.Generator, scale: float, event_ns: int):
        self.w = writer
        self.rng = rng
        self.scale = scale
        self.event_ns = event_ns
        self.now = 0

    def size(self, n: int) -> int:
        """Scaled request size; multiples of 4 stay multiples of 4 (float32 tensors)."""
        if self.scale == 1.0 or n == 0:
            return n
        s = max(1, int(round(n * self.scale)))
        return max(4, s - s % 4) if n % 4 == 0 else s

    def alloc(self, n: int, site: str) -> int:
        i = self.w.alloc(self.size(n), t=self.now, site=site)
        self.now += self.event_ns
        return i

    def free(self, i: int) -> None:
        self.w.free(i, t=self.now)
        self.now += self.event_ns

    def mark(self, label: str) -> None:
        self.w.mark(label, t=self.now)

    def compute(self, ns: float) -> None:
        if ns > 0:
            self.now += int(ns * self.rng.uniform(0.9, 1.1))


# ---- the training step ---------------------------------------------------------------------

class _TrainingLoop:
    """Drives a `Network` through PyTorch-style training iterations.

    The activation stack is a Python list (push in forward, pop in backward: O(1)
    each); gradients and optimizer state are lists of ids. Iteration time is split
    30 % forward, 60 % backward, 10 % optimizer, apportioned by op cost with the
    ns-per-cost rate fixed from the nominal network, so smaller drifted shapes run
    proportionally faster.
    """

    FWD, BWD, OPT = 0.3, 0.6, 0.1

    def __init__(self, em: _Emitter, nominal: Network, iter_ns: float):
        self.em = em
        total = sum(self._cost(op) for op in nominal.ops) or 1.0
        self.ns_per_cost = iter_ns / total
        self.opt_ns = self.OPT * iter_ns
        self.param_sizes = [p for op in nominal.ops for p in op.params]
        self.grads: list[int] = []
        self.adam_state: list[int] = []

    @staticmethod
    def _cost(op: Op) -> float:
        return float(op.out if op.cost is None else op.cost)

    def setup(self, net: Network) -> None:
        """Model on the device: parameters, then persistent buffers (BN running stats)."""
        for op in net.ops:
            for p in op.params:
                self.em.alloc(p, f"{op.name}:param")
        for op in net.ops:
            for b in op.buffers:
                self.em.alloc(b, f"{op.name}:buffer")

    def iteration(self, k: int, net: Network) -> None:
        em = self.em
        em.mark(f"iter {k}")
        for g in self.grads:                       # optimizer.zero_grad(set_to_none=True)
            em.free(g)
        self.grads = []
        batch = [em.alloc(n, site) for n, site in net.inputs]
        stack = self._forward(net.ops)
        loss = em.alloc(4, "loss")
        em.compute(self.ns_per_cost * 0.01 * self._cost(net.ops[-1]))
        self._backward(net.ops, stack)
        em.free(loss)
        self._step()
        for i in reversed(batch):
            em.free(i)

    def _forward(self, ops) -> list:
        """Run every op; return the stack of (op, [activation ids]) kept for backward."""
        em, stack, pending = self.em, [], None
        for op in ops:
            if op.workspace:
                ws = em.alloc(op.workspace, f"{op.name}:workspace")
                em.compute(self.FWD * self.ns_per_cost * self._cost(op))
                em.free(ws)
            else:
                em.compute(self.FWD * self.ns_per_cost * self._cost(op))
            role = "activation" if op.keep else "temp"
            kept = [em.alloc(op.out, f"{op.name}:{role}")] + [em.alloc(s, f"{op.name}:activation") for s in op.saved]
            if pending is not None:                 # an unkept output dies once consumed
                em.free(pending)
                pending = None
            if op.keep:
                stack.append(kept)
            else:
                pending, extra = kept[0], kept[1:]
                stack.append(extra)
        if pending is not None:
            em.free(pending)
        return stack

    def _backward(self, ops, stack) -> None:
        """Reverse pass: gradient in, parameter grads, then free this op's activations last-in first-out."""
        em = self.em
        grad = em.alloc(ops[-1].out, "loss:grad_input")
        prev_out = [0] + [op.out for op in ops[:-1]]
        for op, below in zip(reversed(ops), reversed(prev_out)):
            ws = em.alloc(op.bwd_workspace, f"{op.name}:workspace") if op.bwd_workspace else None
            em.compute(self.BWD * self.ns_per_cost * self._cost(op))
            g_size = below if op.grad_in is None else op.grad_in
            g_in = em.alloc(g_size, f"{op.name}:grad_input") if g_size else None
            for p in op.params:
                self.grads.append(em.alloc(p, f"{op.name}:grad"))
            if ws is not None:
                em.free(ws)
            if grad is not None:
                em.free(grad)
            for i in reversed(stack.pop()):
                em.free(i)
            grad = g_in
        if grad is not None:
            em.free(grad)

    def _step(self) -> None:
        """Adam: state allocated lazily at the first step; a foreach temporary per parameter each step."""
        em = self.em
        if not self.adam_state:
            for p in self.param_sizes:
                self.adam_state.append(em.alloc(p, "adam:exp_avg"))
                self.adam_state.append(em.alloc(p, "adam:exp_avg_sq"))
        tmp = [em.alloc(p, "adam:foreach_tmp") for p in self.param_sizes]
        em.compute(self.opt_ns)
        for i in tmp:
            em.free(i)


# ---- the networks ----------------------------------------------------------------------------

def _mlp(p: dict) -> Network:
    """Linear -> ReLU (out of place) stack, then the classifier and log_softmax."""
    e, b = p["dtype_bytes"], p["batch"]
    widths = [p["d_in"]] + [p["hidden"]] * p["layers"]
    ops = []
    for li in range(p["layers"]):
        fan_in, fan_out = widths[li], widths[li + 1]
        ops.append(Op(f"fc{li}", b * fan_out * e, params=(fan_in * fan_out * e, fan_out * e),
                      grad_in=0 if li == 0 else None, cost=b * fan_in * fan_out))
        ops.append(Op(f"relu{li}", b * fan_out * e, cost=b * fan_out))
    ops.append(Op("head", b * p["classes"] * e, params=(widths[-1] * p["classes"] * e, p["classes"] * e),
                  cost=b * widths[-1] * p["classes"]))
    ops.append(Op("log_softmax", b * p["classes"] * e, cost=b * p["classes"]))
    return Network(ops, [(b * p["d_in"] * e, "input:x"), (b * 8, "input:labels")])


def _conv_bn(ops, name, b, cin, cout, k, stride, hw, e, grad_in=None):
    """conv (no bias) + batch norm + in-place ReLU; returns the output spatial size."""
    out_hw = (hw + stride - 1) // stride
    out = b * cout * out_hw * out_hw * e
    flops = b * cin * cout * k * k * out_hw * out_hw
    inp = b * cin * hw * hw * e
    ws = (inp + out) // 2 if k > 1 else 0       # implicit-GEMM 1x1 convs need no cuDNN workspace
    ops.append(Op(f"{name}.conv", out, params=(cout * cin * k * k * e,), workspace=ws, bwd_workspace=ws,
                  grad_in=grad_in, cost=flops))
    ops.append(Op(f"{name}.bn", out, params=(cout * e, cout * e), saved=(cout * 4, cout * 4),
                  buffers=(cout * 4, cout * 4, 8), cost=out))
    return out_hw


def _cnn(p: dict) -> Network:
    """torchvision ResNet (bottleneck blocks, expansion 4): stem, 4 stages, pool, classifier."""
    e, b, hw, w = p["dtype_bytes"], p["batch"], p["image"], p["width"]
    try:
        stages = [int(s) for s in str(p["blocks"]).split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"preset 'cnn' parameter blocks: expected comma-separated counts, got {p['blocks']!r}")
    if not stages or min(stages) < 1:
        raise UsageError(f"preset 'cnn' parameter blocks: expected positive counts, got {p['blocks']!r}")
    ops: list[Op] = []
    hw = _conv_bn(ops, "stem", b, 3, w, 7, 2, hw, e, grad_in=0)
    hw = (hw + 1) // 2
    pooled = b * w * hw * hw * e
    ops.append(Op("maxpool", pooled, saved=(pooled * 8 // e,), cost=pooled))   # int64 indices
    cin = w
    for si, n in enumerate(stages):
        width = w * 2**si
        for bi in range(n):
            name, stride = f"layer{si + 1}.{bi}", (2 if si > 0 and bi == 0 else 1)
            block_in = b * cin * hw * hw * e
            h1 = _conv_bn(ops, f"{name}.1", b, cin, width, 1, 1, hw, e)
            h2 = _conv_bn(ops, f"{name}.2", b, width, width, 3, stride, h1, e)
            _conv_bn(ops, f"{name}.3", b, width, width * 4, 1, 1, h2, e)
            if bi == 0:
                _conv_bn(ops, f"{name}.downsample", b, cin, width * 4, 1, stride, hw, e, grad_in=block_in)
            cin, hw = width * 4, h2
    ops.append(Op("avgpool", b * cin * e, cost=b * cin * hw * hw))
    ops.append(Op("fc", b * p["classes"] * e, params=(cin * p["classes"] * e, p["classes"] * e),
                  cost=b * cin * p["classes"]))
    ops.append(Op("log_softmax", b * p["classes"] * e, cost=b * p["classes"]))
    return Network(ops, [(b * 3 * p["image"] ** 2 * e, "input:images"), (b * 8, "input:labels")])


def _transformer(p: dict) -> Network:
    """GPT-2-style pre-LN decoder with materialised attention scores and dropout masks."""
    e, b, s, d, h, v = p["dtype_bytes"], p["batch"], p["seq"], p["d_model"], p["heads"], p["vocab"]
    if s > p["max_seq"]:
        raise UsageError(f"preset 'transformer': seq {s} exceeds max_seq {p['max_seq']}")
    tok, ff, att = b * s * d * e, b * s * 4 * d * e, b * h * s * s * e
    ln_stats = (b * s * 4, b * s * 4)             # mean, rstd (fp32)
    ln_params = (d * e, d * e)
    ops = [Op("wte", tok, params=(v * d * e,), grad_in=0, cost=tok),
           Op("wpe", tok, params=(p["max_seq"] * d * e,), grad_in=0, cost=tok),
           Op("drop", tok, saved=(b * s * d,), cost=tok)]
    for li in range(p["layers"]):
        n = f"h{li}"
        ops += [Op(f"{n}.ln_1", tok, params=ln_params, saved=ln_stats, cost=tok),
                Op(f"{n}.attn.c_attn", 3 * tok, params=(d * 3 * d * e, 3 * d * e), cost=b * s * d * 3 * d),
                Op(f"{n}.attn.scores", att, keep=False, grad_in=3 * tok, cost=b * s * s * d),
                Op(f"{n}.attn.softmax", att, grad_in=att, cost=att),
                Op(f"{n}.attn.attn_dropout", att, saved=(b * h * s * s,), cost=att),
                Op(f"{n}.attn.context", tok, cost=b * s * s * d),
                Op(f"{n}.attn.c_proj", tok, params=(d * d * e, d * e), cost=b * s * d * d),
                Op(f"{n}.attn.resid_dropout", tok, saved=(b * s * d,), cost=tok),
                Op(f"{n}.add_1", tok, cost=tok),
                Op(f"{n}.ln_2", tok, params=ln_params, saved=ln_stats, cost=tok),
                Op(f"{n}.mlp.c_fc", ff, params=(d * 4 * d * e, 4 * d * e), cost=b * s * d * 4 * d),
                Op(f"{n}.mlp.gelu", ff, cost=ff),
                Op(f"{n}.mlp.c_proj", tok, params=(4 * d * d * e, d * e), cost=b * s * d * 4 * d),
                Op(f"{n}.mlp.dropout", tok, saved=(b * s * d,), cost=tok),
                Op(f"{n}.add_2", tok, cost=tok)]
    logits = b * s * v * e
    ops += [Op("ln_f", tok, params=ln_params, saved=ln_stats, cost=tok),
            Op("lm_head", logits, cost=b * s * d * v),            # weight tied to wte: no parameter of its own
            Op("log_softmax", logits, cost=logits)]
    return Network(ops, [(b * s * 8, "input:input_ids"), (b * s * 8, "input:labels")])


# ---- presets ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    """A named workload: its parameters, a network builder and the shape that drifts."""

    name: str
    summary: str
    params: tuple
    build: Callable | None = None                  # params -> Network (model presets)
    vary: Callable | None = None                   # (params, rng) -> overrides for one iteration
    iterations: int = 10


_COMMON = (
    Param("dtype_bytes", "int", 4, "bytes per element (4 fp32, 2 fp16/bf16)"),
    Param("iter_ms", "float", 100.0, "modeled compute time of one iteration, ms"),
    Param("event_ns", "int", 2000, "framework time charged per allocation event, ns"),
)


def _vary_between(key: str, lo_frac: float, step: int):
    """Redraw ``key`` each iteration uniformly from [lo_frac * nominal, nominal] in multiples of ``step``."""
    def vary(p, rng):
        hi = max(1, p[key] // step)
        lo = max(1, int(hi * lo_frac))
        return {key: int(rng.integers(lo, hi + 1)) * step}
    return vary


PRESETS: dict[str, Preset] = {}


def _preset(p: Preset) -> Preset:
    PRESETS[p.name] = p
    return p


_preset(Preset(
    "mlp", "multilayer perceptron, Adam; variable: batch size drifts",
    (Param("batch", "int", 256, "batch size"), Param("d_in", "int", 1024, "input features"),
     Param("hidden", "int", 4096, "hidden width"), Param("layers", "int", 4, "hidden layers"),
     Param("classes", "int", 1000, "output classes")) + _COMMON,
    build=_mlp, vary=_vary_between("batch", 0.5, 8), iterations=20))

_preset(Preset(
    "cnn", "ResNet-50-like CNN (conv/BN/cuDNN workspaces), Adam; variable: image size drifts",
    (Param("batch", "int", 16, "batch size"), Param("image", "int", 224, "image side, pixels"),
     Param("width", "int", 64, "stem channels"), Param("blocks", "str", "3,4,6,3", "bottlenecks per stage"),
     Param("classes", "int", 1000, "output classes")) + _COMMON,
    build=_cnn, vary=_vary_between("image", 0.5, 32)))

_preset(Preset(
    "transformer", "GPT-like decoder (attention scores, MLP, logits), Adam; variable: sequence length drifts",
    (Param("batch", "int", 2, "batch size"), Param("seq", "int", 512, "sequence length (variable: the maximum)"),
     Param("max_seq", "int", 1024, "positional-embedding rows"), Param("d_model", "int", 512, "model width"),
     Param("heads", "int", 8, "attention heads"), Param("layers", "int", 8, "decoder blocks"),
     Param("vocab", "int", 32000, "vocabulary size")) + _COMMON,
    build=_transformer, vary=_vary_between("seq", 0.25, 16)))

_preset(Preset(
    "alloc-heavy", "~1M small/medium short-lived allocations (the seeds' alloc-heavy workload)",
    (Param("n_allocs", "int", 1_000_000, "number of allocations"),
     Param("min_size", "size", 16, "smallest request (log-uniform from here)"),
     Param("max_size", "size", 4 * 1024**2, "largest request"),
     Param("lifetime", "float", 64.0, "mean lifetime, in allocations (geometric)"),
     Param("event_ns", "int", 20_000, "mean time between events, ns (exponential)")),
    iterations=32))


# ---- entry point -----------------------------------------------------------------------------

def resolve_params(preset: Preset, given: dict) -> dict:
    """Defaults overridden by ``given`` (strings are parsed by the declared kind); UsageError if unknown/bad."""
    known = {p.name: p for p in preset.params}
    out = {p.name: p.default for p in preset.params}
    for key, value in given.items():
        decl = known.get(key)
        if decl is None:
            raise UsageError(f"unknown parameter {key!r} for preset {preset.name!r} "
                             f"(known: {', '.join(sorted(known))})")
        try:
            if value is None:                   # (a preset's parameters have values: none is unset)
                raise ValueError("expected a value, got None")
            if not isinstance(value, str) and decl.kind in ("int", "float", "size", "bool"):
                value = decl.text_of(value)     # (its type checked: batch=1.5 was 1, batch=None a comparison error)
            if isinstance(value, str) and decl.kind in ("int", "float"):
                try:
                    value = decl.parse(value)
                except ValueError:
                    raise ValueError(f"expected {'an integer' if decl.kind == 'int' else 'a number'}, "
                                     f"got {value!r}") from None
            elif isinstance(value, str):
                value = decl.parse(value)
            if decl.kind in ("int", "size", "float") and (isinstance(value, bool) or not 0 < value < float("inf")):
                raise ValueError(f"expected a positive number, got {value!r}")
        except (ValueError, TypeError, UsageError) as e:
            msg = e.args[0] if e.args else str(e)
            raise UsageError(f"preset {preset.name!r} parameter {key}: {msg}") from None
        out[key] = int(value) if decl.kind in ("int", "size") else value
    return out


def generate(preset: str, *, seed: int = 0, iterations: int | None = None, scale: float = 1.0,
             variable: bool = False, path: str | None = None, force: bool = False, **params) -> Trace:
    """Generate a synthetic trace of ``preset`` (see `PRESETS`).

    ``iterations``: training iterations (one MARK ``"iter k"`` each; alloc-heavy:
    chunks of its allocations). ``scale`` multiplies every requested size.
    ``variable`` redraws the drifting shape every iteration. ``path`` streams the
    trace to a ``.bin`` file (published whole, or not at all; a trace already there is replaced only with
    ``force``, as ``synth -o`` does) and returns it memory-mapped. ``params`` override the
    preset's declared parameters. Bad arguments raise `UsageError`.
    """
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):    # (an integer was taken as a file descriptor)
            raise UsageError(f"path: the name of the file to write the trace to, not {path!r}")
        path = os.fspath(path)
        if not own_temporary(path):     # (the command line's `atomic_path` hands its temporary here)
            claim_outputs([("path", path)], force=force)
            with atomic_path(path) as tmp:
                generate(preset, seed=seed, iterations=iterations, scale=scale, variable=variable, path=tmp,
                         **params)
            return Trace.load(path, validate=False)
    spec = PRESETS.get(preset)
    if spec is None:
        raise UsageError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    p = resolve_params(spec, params)
    if p.get("min_size", 0) > p.get("max_size", MAX_SIZE):
        raise UsageError(f"preset {preset!r}: min_size {p['min_size']} is larger than max_size {p['max_size']}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, got {seed!r}")
    iterations = spec.iterations if iterations is None else iterations
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 1:
        raise UsageError(f"iterations must be a positive integer, got {iterations!r}")
    if iterations > MAX_ITERATIONS:
        raise UsageError(f"iterations: at most {MAX_ITERATIONS:,} (one MARK and label each), got {iterations:,}")
    if not (isinstance(scale, (int, float)) and 0 < scale < 1e6):
        raise UsageError(f"scale must be a number above 0 and below 1e6 (a size multiplier), got {scale!r}")
    if variable and spec.vary is None:
        raise UsageError(f"preset {preset!r} has no variable shape")
    meta = {"producer": "allocsim synth", "preset": preset, "params": p, "seed": seed,
            "iterations": int(iterations), "scale": scale, "variable": bool(variable),
            "framework": "synthetic", "device": dict(DEVICE)}
    rng = np.random.default_rng(seed)
    try:
        if spec.build is None:
            return _alloc_heavy(p, int(iterations), scale, rng, meta, path)
        return _training(spec, p, int(iterations), scale, variable, rng, meta, path)
    except (ValueError, OverflowError) as e:     # sizes past 1 PiB, times past 2**64 ns
        why = "a time or size past 64 bits" if isinstance(e, OverflowError) else e
        raise UsageError(f"preset {preset!r}: these parameters make a trace out of range ({why})") from None


def _training(spec, p: dict, iterations: int, scale: float, variable: bool, rng, meta: dict, path) -> Trace:
    """A training loop of ``spec``'s model, event by event through a `TraceWriter`."""
    writer = TraceWriter(meta=meta, path=path)
    try:
        em = _Emitter(writer, rng, float(scale), p["event_ns"])
        nominal = spec.build(p)
        loop = _TrainingLoop(em, nominal, p["iter_ms"] * 1e6)
        loop.setup(nominal)
        for k in range(iterations):
            shape = {**p, **spec.vary(p, rng)} if variable else p
            before = writer.count
            loop.iteration(k, spec.build(shape))
            if k == 0 and path:         # no later iteration makes more events than the first (Adam's state too)
                check_room(path, writer.count + (iterations - 1) * (writer.count - before))
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


def check_room(path: str, events: int) -> None:
    """Refuse, before the disk fills, a trace of ``events`` records that the free space beside ``path`` cannot hold
    (ENOSPC on ``path``, which `atomic_path` reports as one line and cleans up after)."""
    need = events * RECORD_DTYPE.itemsize
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if need > free:
        raise OSError(errno.ENOSPC, f"the trace would take about {fmt_bytes(need)} ({fmt_count(events)} events), more "
                                    f"than the {fmt_bytes(free)} free on its disk (fewer iterations or allocations?)",
                      path)


def _alloc_heavy(p: dict, iterations: int, scale: float, rng, meta: dict, path: str | None,
                 block: int = 1 << 18) -> Trace:
    """The alloc-heavy trace, streamed to ``path`` (published whole) a block at a time, or kept in memory."""
    labels = [f"iter {k}" for k in range(iterations)]
    blocks = _alloc_heavy_records(p, iterations, scale, rng, block)
    if not path:
        return Trace(np.concatenate(list(blocks)), meta, labels=labels)
    check_room(path, 2 * p["n_allocs"] + iterations)
    with atomic_path(path) as tmp:
        writer = TraceFileWriter(tmp, meta)
        try:
            for rec in blocks:
                writer.write(rec)
        except BaseException:
            writer.abort()
            raise
        writer.close({"streams": [0], "sites": [], "labels": labels,
                      "summary": {"events": writer.count, "allocs": p["n_allocs"]}})
    return Trace.load(path, validate=False)


def _alloc_heavy_records(p: dict, iterations: int, scale: float, rng, block: int):
    """Yield the records, vectorised, ``block`` allocations at a time.

    Allocation ``i`` happens at key ``i``; it is freed after a geometric number of
    further allocations (mean ``lifetime``), at key ``i + L + 0.5``. MARK ``k`` sits
    just before allocation ``k * n / iterations``. Objects still live at the end are
    freed in death order. The events are the keys in order (ties by allocation, then
    mark, index); each block yields those with keys below its end, so memory is bounded
    by the block and the live objects, whatever ``n``. The sizes, lifetimes and gaps come
    from three copies of ``rng`` placed where one generator drawing them all in turn would
    be, so the records do not depend on ``block``.
    """
    n = p["n_allocs"]
    lo, hi = np.log(p["min_size"]), np.log(max(p["max_size"], p["min_size"]))
    p_free = 1.0 / max(1.0, p["lifetime"])
    size_rng, life_rng, gap_rng = copy.deepcopy(rng), copy.deepcopy(rng), rng
    life_rng.bit_generator.advance(n)                   # one 64-bit draw per uniform
    gap_rng.bit_generator.advance(n)
    for start in range(0, n, block):                    # a geometric takes a varying number: draw them
        gap_rng.geometric(p_free, min(block, n - start))
    marks = (np.arange(iterations, dtype=np.int64) * n) // iterations - 0.25
    pending_ids, pending_keys = np.zeros(0, np.int64), np.zeros(0)    # allocations not yet freed, by id
    clock = _Clock(gap_rng, p["event_ns"])
    n_marks = 0
    for start in range(0, n, block):
        end = min(n, start + block)
        ids = np.arange(start, end)
        sizes = np.exp(size_rng.uniform(lo, hi, end - start)) * scale
        if sizes.max() > MAX_SIZE:
            raise ValueError(f"an allocation of {sizes.max():.3g} bytes (> 1 PiB)")
        sizes = np.maximum(4, (sizes.astype(np.int64) + 3) // 4 * 4)        # float32 arrays: multiples of 4
        pending_ids = np.concatenate([pending_ids, ids])
        pending_keys = np.concatenate([pending_keys, ids + life_rng.geometric(p_free, end - start) + 0.5])
        until = end if end < n else np.inf
        due = pending_keys < until
        mark_end = int(np.searchsorted(marks, until))
        yield _alloc_heavy_block(ids, sizes, pending_ids[due], pending_keys[due], marks[n_marks:mark_end],
                                 n_marks, clock)
        pending_ids, pending_keys = pending_ids[~due], pending_keys[~due]
        n_marks = mark_end


def _alloc_heavy_block(ids, sizes, free_ids, free_keys, mark_keys, first_mark: int, clock) -> np.ndarray:
    """The records of one block: its ALLOCs, the FREEs and MARKs due before its end, in key order."""
    keys = np.concatenate([ids.astype(np.float64), free_keys, mark_keys])
    order = np.argsort(keys, kind="stable")
    n_a, n_f = len(ids), len(free_ids)
    is_alloc, is_mark = order < n_a, order >= n_a + n_f
    rec = np.zeros(len(keys), RECORD_DTYPE)
    rec["kind"] = np.where(is_alloc, ALLOC, np.where(is_mark, MARK, FREE))
    rec["id"] = np.where(is_mark, NO_ID, np.concatenate([ids, free_ids, np.zeros(len(mark_keys), np.int64)])[order])
    rec["site"] = NO_SITE
    rec["aux"] = np.where(is_mark, order - n_a - n_f + first_mark, 0)
    rec["size"] = np.where(is_alloc, sizes[np.minimum(order, n_a - 1)], 0)
    rec["time_ns"] = clock.times(len(rec))
    return rec


class _Clock:
    """Event times: exponential gaps of mean ``event_ns`` (the first event at 0), a block at a time."""

    def __init__(self, rng, event_ns: float):
        self.rng, self.event_ns = rng, event_ns
        self.now = 0
        self.total = 0.0        # the gaps drawn so far, unrounded
        self.first = True

    def times(self, n: int) -> np.ndarray:
        gaps = self.rng.exponential(self.event_ns, n)
        self.total += gaps.sum()
        if self.total >= 2**63:
            raise ValueError("event times past 2**63 ns")
        gaps = gaps.astype(np.int64)
        if self.first and n:
            gaps[0], self.first = 0, False
        t = np.cumsum(gaps) + self.now
        if n:
            self.now = int(t[-1])
        return t


def repeat_steps(trace: Trace, steps: int) -> Trace:
    """``trace`` with its last whole step (the records between its last two MARKs) repeated until it holds
    ``steps`` MARKs, the records after the last MARK following the copies: a long run of a recorded model
    (folding's tests and benchmark). Each copy's objects get fresh ids, and so do those of the records after,
    shifted past the copies; a FREE of an object the step before allocated frees the one the copy before
    allocated at the same place. Needs ids given densely in ALLOC order (every recorder and importer gives
    them so) and a step that allocates as many objects as the one before it; else `UsageError`."""
    marks = [at for at, _ in trace.marks()]
    extra = steps - len(marks)
    if len(marks) < 3 or extra < 0:
        raise UsageError(f"repeat_steps: the trace has {len(marks)} MARKs; it needs 3 or more and at most {steps}")
    rec = np.asarray(trace.records)
    a, b = marks[-2], marks[-1]
    kind, ids = rec["kind"], rec["id"].astype(np.int64)
    alloc_ids = ids[kind == ALLOC]
    if len(alloc_ids) and not (alloc_ids == np.arange(len(alloc_ids))).all():
        raise UsageError("repeat_steps: the trace's ids are not given densely in ALLOC order")
    lo = int(np.count_nonzero(kind[:a] == ALLOC))            # the first id the step allocates
    d = int(np.count_nonzero(kind[a:b] == ALLOC))           # how many it allocates
    if int(np.count_nonzero(kind[marks[-3]:a] == ALLOC)) != d:
        raise UsageError("repeat_steps: the last whole step allocates another number of objects than the one before")
    has_id = ids != NO_ID
    step, tail = rec[a:b], rec[b:]
    dt = int(rec["time_ns"][b]) - int(rec["time_ns"][a])
    parts = [rec[:b]]
    for c in range(1, extra + 1):
        copy_ = step.copy()
        shift = has_id[a:b] & (ids[a:b] >= lo - d)
        copy_["id"] = np.where(shift, ids[a:b] + c * d, ids[a:b])
        copy_["time_ns"] = step["time_ns"] + c * dt
        parts.append(copy_)
    tail = tail.copy()
    shift = has_id[b:] & (ids[b:] >= lo - d)
    tail["id"] = np.where(shift, ids[b:] + extra * d, ids[b:])
    tail["time_ns"] = rec["time_ns"][b:] + extra * dt
    parts.append(tail)
    return Trace(np.concatenate(parts), dict(trace.meta), streams=trace.streams, sites=trace.sites,
                 labels=trace.labels, path=trace.path)
