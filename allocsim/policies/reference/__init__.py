"""Reference models: plain, readable versions of the policies that have a fast path.

As CPython keeps ``_pydecimal.py`` beside the C ``decimal``, each module here is the
modelled allocator written the way its own source is written -- the same functions,
the same names, plain sorted containers, no inlining -- and registered as
``<policy>-ref``. They are slow and exist to be read and to check the fast models:
``tests/test_reference_models.py`` replays generated and recorded traces through both
and asserts the same device calls, the same block placements and the same OOMs.
"""
from __future__ import annotations

from . import bestfit, cupy, split, torch  # noqa: F401  (register the models: `registry.reference_of`)
