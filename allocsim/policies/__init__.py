"""The policy registry. A built-in policy is one module in this package with a class
decorated by `@register`; `get(name)` imports the package's modules on first use and
the registry itself is `allocsim.policies.registry`. Installed policies (the entry points of the group
``allocsim.policies``) and plug-ins named by file or module (``my.py:MyPool``) are resolved by
`allocsim.engine.spec.PolicySpec`."""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import UsageError
from .base import Param, Policy
from .registry import REGISTRY, register

_loaded = False


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for m in pkgutil.iter_modules(__path__):
        if m.name not in ("base", "registry") and not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")


def names() -> list[str]:
    _load_all()
    return sorted(REGISTRY)


def find(name: str) -> type[Policy] | None:
    """The built-in policy ``name``, or None (`allocsim.engine.spec.PolicySpec` then looks at installed policies)."""
    _load_all()
    return REGISTRY.get(name)


def get(name: str) -> type[Policy]:
    """The built-in policy ``name``; a one-line `UsageError` naming the built-ins if there is none."""
    cls = find(name)
    if cls is None:
        raise UsageError(f"unknown built-in policy {name!r} (known: {', '.join(names())})")
    return cls


__all__ = ["Param", "Policy", "REGISTRY", "find", "get", "names", "register"]
