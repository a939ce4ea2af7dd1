"""Trace model and `.bin` file format."""
from .events import (ALLOC, FREE, FREE_REQUESTED, GC, KIND_NAMES, MARK, OOM, PRE_EXISTING, RECORD_DTYPE,
                     SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)
from .trace import Event, Trace, TraceWriter, trace_path

__all__ = ["ALLOC", "FREE", "FREE_REQUESTED", "GC", "KIND_NAMES", "MARK", "OOM", "PRE_EXISTING", "RECORD_DTYPE",
           "SEGMENT_ALLOC", "SEGMENT_FREE", "SEGMENT_MAP", "SEGMENT_UNMAP", "Event", "Trace", "TraceWriter",
           "trace_path"]
