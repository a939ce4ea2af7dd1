"""The registry of built-in policies: `register` files a class under its ``name``; `reference_of` files a
reference model (``allocsim.policies.reference``) as ``<fast>-ref``. `allocsim.policies` looks names up here."""
from __future__ import annotations

from .base import Policy

REGISTRY: dict[str, type[Policy]] = {}


class NameTaken(TypeError):
    """A plug-in's `register` under a built-in policy's name: the plug-in's loader says it in the plug-in's words."""


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: a built-in policy, found by its ``name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    if not cls.__module__.startswith("allocsim."):      # a plug-in's: its loader files the built-ins first
        import sys
        taken = REGISTRY.get(cls.name, cls)
        if taken is not cls and taken.__module__.startswith("allocsim."):     # (another plug-in's name: its own)
            caller = sys._getframe(1)
            raise NameTaken(f"{cls.__qualname__} ({caller.f_code.co_filename}:{caller.f_lineno}) registers itself as "
                            f"{cls.name!r}, a built-in policy's name; give it a name of its own")
    REGISTRY[cls.name] = cls
    return cls


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
