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
    allocsim.mark("epoch 2")          # inside a script run by `allocsim record`
    with allocsim.recording("run.bin"): train()       # record from inside Python (docs/recording.md)
    allocsim.start_recording("run.bin"); ...; allocsim.stop_recording()
    with allocsim.tries("back-off"): ...  # code there catches an OOM and goes on: a replay under a cap survives it
    allocsim.build()                  # which build runs: "interpreted", or the compiled modules
"""
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
    """``allocsim.replay`` and the other API names: imported from their module the first time one is read."""
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'allocsim' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{where[0]}", __name__), where[1])
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["CostModel", "build", "PolicySpec", "Replay", "ReplayResult", "ReplaySettings", "Trace", "TraceWriter", "compare", "fit_capacity", "fmt_bytes",
           "import_trace", "mark", "parse_size", "recording", "replay", "start_recording", "stop_recording", "synthesize",
           "tries", "validate_trace", "__version__"]
