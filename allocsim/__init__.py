"""allocsim: record GPU allocation traces once, replay them offline against allocator policies.

Python API (the same names as the command line)::

    import allocsim
    t = allocsim.Trace.load("traces/resnet50.bin")
    r = allocsim.replay(t, "split", cap=allocsim.parse_size("8GB"), runtime="gc")
    from allocsim.report.text import replay_summary, section_table
    print(replay_summary(r)); print(section_table(r.sections))      # what `allocsim replay` prints
    s = allocsim.ReplaySettings(runtime="gc", cap=8 << 30)              # how a replay runs, as one value
    allocsim.replay(t, "binned", s); allocsim.replay(t, "split", s, keep_going=True)
    rows = allocsim.compare("traces/resnet50.bin", ["split", "torch"], caps=[None, 4 << 30])
    allocsim.replay(t, "torch[expandable_segments:True]"); allocsim.replay(t, "my_pool.py:MyPool", options=["k=1"])
    allocsim.PolicySpec.parse("cupy[limit=8GB]").label     # how every entry point names a policy
    allocsim.fit_capacity("traces/resnet50.bin", "torch")["capacity_bytes"]
    allocsim.validate_trace("traces/resnet50.bin").match
    r = allocsim.Replay(t, "split"); r.run(until=1000); r.live_blocks(); r.run()   # stepped, then to the end
    allocsim.synthesize("transformer", seed=1); allocsim.import_trace("snapshot.pickle", "t.bin")
    w = allocsim.TraceWriter(path="t.bin"); i = w.alloc(1 << 20); w.free(i); w.mark("step 1"); w.finish()
    allocsim.mark("epoch 2")          # inside a script run by `allocsim record`
    with allocsim.recording("run.bin"): train()       # record from inside Python (docs/recording.md)
    allocsim.start_recording("run.bin"); ...; allocsim.stop_recording()
    with allocsim.tries("back-off"): ...  # code there catches an OOM and goes on: a replay under a cap survives it
    allocsim.build()                  # which build runs: "interpreted", or the compiled modules
"""
from typing import TYPE_CHECKING

from .compiled import build         # first: with ALLOCSIM_INTERPRETED set, the compiled modules load from source
from .version import __version__

#: The API's names and the modules they come from, imported on first use (PEP 562): ``import allocsim`` costs no
#: numpy, so the console script (`allocsim._start`) can say "interrupted" in one line from its first milliseconds.
_LAZY = {"CostModel": ("machine.costs", "CostModel"), "fit_capacity": ("search.fit", "fit_capacity"),
         "import_trace": ("formats.importers", "import_file"), "ReplayResult": ("machine.metrics", "ReplayResult"),
         "Replay": ("engine.replay", "Replay"), "ReplaySettings": ("engine.replay", "ReplaySettings"),
         "replay": ("engine.replay", "replay"), "mark": ("formats.recorders", "mark"),
         "tries": ("formats.recorders", "tries"), "recording": ("formats.recorders.session", "recording"),
         "start_recording": ("formats.recorders.session", "start_recording"),
         "stop_recording": ("formats.recorders.session", "stop_recording"), "PolicySpec": ("engine.spec", "PolicySpec"),
         "compare": ("search.sweep", "compare"), "synthesize": ("formats.synth", "generate"),
         "Trace": ("trace", "Trace"), "TraceWriter": ("trace", "TraceWriter"), "fmt_bytes": ("units", "fmt_bytes"),
         "parse_size": ("units", "parse_size"), "validate_trace": ("search.validate", "validate")}


def __getattr__(name: str):
    """An API name read for the first time (``allocsim.replay``) imports the whole API, in the order an eager
    ``import allocsim`` did (`_LAZY`'s); a subpackage or module (``allocsim.policies``, as ``from .. import
    policies`` reads it) is imported alone."""
    import importlib
    import importlib.util
    if name in _LAZY:
        for api_name, (module, attr) in _LAZY.items():
            globals().setdefault(api_name, getattr(importlib.import_module(f".{module}", __name__), attr))
        return globals()[name]
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is None:
        raise AttributeError(f"module 'allocsim' has no attribute {name!r}")
    return importlib.import_module(f".{name}", __name__)


if TYPE_CHECKING:                   # what `__getattr__` imports, for type checkers and editors
    from .engine.replay import Replay, ReplaySettings, replay
    from .engine.spec import PolicySpec
    from .formats.importers import import_file as import_trace
    from .formats.recorders import mark, tries
    from .formats.recorders.session import recording, start_recording, stop_recording
    from .formats.synth import generate as synthesize
    from .machine.costs import CostModel
    from .machine.metrics import ReplayResult
    from .search.fit import fit_capacity
    from .search.sweep import compare
    from .search.validate import validate as validate_trace
    from .trace import Trace, TraceWriter
    from .units import fmt_bytes, parse_size


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["CostModel", "build", "PolicySpec", "Replay", "ReplayResult", "ReplaySettings", "Trace", "TraceWriter", "compare", "fit_capacity", "fmt_bytes",
           "import_trace", "mark", "parse_size", "recording", "replay", "start_recording", "stop_recording", "synthesize",
           "tries", "validate_trace", "__version__"]
