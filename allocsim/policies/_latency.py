"""A fused loop's latency column: `add_latency` appends one ALLOC's modeled latency to the list the engine hands
the loop (an ``array('d')``, or the fold recorder's tape).

Interpreted, a fused loop calls the column's own ``append`` (bound once per chunk), and this function is not on
its path. In the compiled build (docs/architecture.md, "The compiled build") a compiled policy's ``.pxd``
cimports the C function of ``_latency.pxd`` under this name instead: it writes the C double into the array's
buffer, without a Python float or a call through the array's argument parsing (about a tenth of the compiled
`cupy` loop's time); tests/test_compiled.py holds both builds to the same latencies.
"""


def add_latency(lat, seconds: float) -> None:
    """Append ``seconds`` to ``lat``."""
    lat.append(seconds)
