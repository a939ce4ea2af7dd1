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
from .machine.costs import CostModel
from .search.fit import fit_capacity
from .formats.importers import import_file as import_trace
from .machine.metrics import ReplayResult
from .engine.replay import Replay, ReplaySettings, replay
from .formats.recorders import mark, tries
from .formats.recorders.session import recording, start_recording, stop_recording
from .engine.spec import PolicySpec
from .search.sweep import compare
from .formats.synth import generate as synthesize
from .trace import Trace, TraceWriter
from .units import fmt_bytes, parse_size
from .search.validate import validate as validate_trace

from .version import __version__

__all__ = ["CostModel", "build", "PolicySpec", "Replay", "ReplayResult", "ReplaySettings", "Trace", "TraceWriter", "compare", "fit_capacity", "fmt_bytes",
           "import_trace", "mark", "parse_size", "recording", "replay", "start_recording", "stop_recording", "synthesize",
           "tries", "validate_trace", "__version__"]
