"""Reference models: plain, readable versions of the policies that have a fast path.

As CPython keeps ``_pydecimal.py`` beside the C ``decimal``, each module here is the
modelled allocator written the way its own source is written -- the same functions,
the same names, plain sorted containers, no inlining -- and registered as
``<policy>-ref``. They are slow and exist to be read and to check the fast models:
``tests/test_reference_models.py`` replays generated and recorded traces through both
and asserts the same device calls, the same block placements and the same OOMs.
"""
from __future__ import annotations

from .. import register


def reference_of(fast):
    """Class decorator: register ``cls`` as ``<fast.name>-ref``, the reference model of ``fast``.

    The reference takes the fast model's option declarations, option parsing and
    framework as they are (one declaration, two implementations).
    """
    def wrap(cls):
        cls.name = f"{fast.name}-ref"
        cls.reference_of = fast.name
        cls.params = fast.params
        cls.framework = fast.framework
        cls.parse_options = classmethod(lambda _cls, texts: fast.parse_options(texts))
        return register(cls)
    return wrap


from . import bestfit, cupy, split, torch  # noqa: E402,F401  (register the models)
