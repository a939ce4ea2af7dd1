"""The policy registry. A built-in policy is one module in this package with a class
decorated by `@register`; `get(name)` imports the package's modules on first use and
falls back on the installed entry points of the group ``allocsim.policies``. Plug-ins
named by file or module (``my.py:MyPool``) are resolved by `allocsim.spec.PolicySpec`."""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import UsageError
from .base import Param, Policy

REGISTRY: dict[str, type[Policy]] = {}
_loaded = False


def register(cls: type[Policy]) -> type[Policy]:
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for m in pkgutil.iter_modules(__path__):
        if m.name != "base" and not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")


def names() -> list[str]:
    _load_all()
    return sorted(REGISTRY)


def get(name: str) -> type[Policy]:
    """The built-in policy ``name``, else the installed entry point of that name."""
    _load_all()
    cls = REGISTRY.get(name)
    if cls is not None:
        return cls
    from ..spec import entry_points, load_entry_point
    installed = entry_points()
    if name in installed:
        return load_entry_point(installed[name])
    known = sorted(REGISTRY) + sorted(installed)
    raise UsageError(f"unknown policy {name!r} (known: {', '.join(known)}; or file.py:Class, module:Class)")


__all__ = ["Param", "Policy", "REGISTRY", "get", "names", "register"]
