"""allocsim: record GPU allocation traces once, replay them offline against allocator policies.

Python API (the same names as the command line)::

    import allocsim
    t = allocsim.Trace.load("traces/resnet50.bin")
    r = allocsim.replay(t, "split", cap=allocsim.parse_size("8GB"), runtime="gc")
    print(r.summary()); print(r.section_table)
"""
from .costs import CostModel
from .engine import replay
from .metrics import ReplayResult
from .recorders import mark
from .trace import Trace, TraceWriter
from .units import fmt_bytes, parse_size

__version__ = "0.1.0"

__all__ = ["CostModel", "ReplayResult", "Trace", "TraceWriter", "fmt_bytes", "parse_size", "replay", "__version__"]
