"""Which build runs: the modules the compiled build compiles, whether they are compiled here, and the stand-in
for Cython's ``cython`` module that lets the same source run interpreted (docs/architecture.md, "The compiled
build").

A compiled module keeps its Python source as the definition: Cython compiles the ``.py`` file as it is (pure
Python mode), reading the types its ``@cython.locals``/``@cython.cfunc`` decorators and its ``.pxd`` declare.
Interpreted, the module imports `cython` from here when Cython is not installed: every decorator returns what
it decorates, so the source runs as plain Python, with the same results bit for bit.

``ALLOCSIM_INTERPRETED=1`` in the environment (read once, when this module is first imported) makes Python
load the interpreted source of these modules even where a compiled build lies beside them: the tests walk
both that way (tests/test_compiled.py). It and ``ALLOCSIM_COMPILE`` are switches (`switch_on`): 1, true, yes or
on; 0, false, no, off or empty. Another value leaves the default and is kept in `ENV_PROBLEM`, which the
command line refuses in one line (a library import goes on).

This file imports nothing of allocsim, so ``setup.py`` reads `COMPILED_MODULES` from it without importing
the package.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

#: The modules the compiled build compiles (``setup.py``), dotted.
COMPILED_MODULES = ("allocsim.policies.cupy", "allocsim.policies.split", "allocsim.policies.bestfit",
                    "allocsim.policies.torch", "allocsim.engine.repeats")

#: The environment variable that, off (``ALLOCSIM_COMPILE=0``), asks `pip install` for the interpreted build
#: (``setup.py``; on by default).
COMPILE_ENV = "ALLOCSIM_COMPILE"

#: The environment variable that makes the compiled modules load from their Python source.
INTERPRETED_ENV = "ALLOCSIM_INTERPRETED"

#: The file beside this one where an install that fell back to the interpreted modules keeps the line saying
#: why (``setup.py``), which `build` repeats.
NOTE = "BUILD-NOTE.txt"

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: The spellings of an on/off environment variable (compared without case and surrounding blanks).
ON, OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def switch_on(name: str, environ=None, default: bool = False) -> bool:
    """Whether the on/off environment variable ``name`` is on (unset is ``default``); ValueError, one line naming
    the variable and its value, for a value that is neither."""
    value = (os.environ if environ is None else environ).get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in ON or word in OFF:
        return word in ON
    raise ValueError(f"{name}={value!r}: expected {', '.join(ON[:-1])} or {ON[-1]} (on), or {', '.join(OFF[1:])} or "
                     f"empty (off)")


def _interpreted_switch() -> tuple[bool, str | None]:
    """``ALLOCSIM_INTERPRETED`` read now: (whether it is on, None); for neither spelling (False, the line saying
    so): the default, which the command line refuses (`ENV_PROBLEM`)."""
    try:
        return switch_on(INTERPRETED_ENV), None
    except ValueError as e:
        return False, str(e)


#: The line saying ``ALLOCSIM_INTERPRETED`` holds neither spelling (None: it is fine), read at import.
ENV_PROBLEM = _interpreted_switch()[1]


def _forced_interpreted() -> bool:
    return _interpreted_switch()[0]


def _module_path(name: str, suffix: str) -> str:
    return os.path.join(_ROOT, *name.split(".")) + suffix


def compiled_modules() -> list[str]:
    """The modules of `COMPILED_MODULES` that Python loads compiled here (an extension module lies beside the
    source, which Python's import takes first), none where ``ALLOCSIM_INTERPRETED`` is set."""
    if _forced_interpreted():
        return []
    return [m for m in COMPILED_MODULES
            if any(os.path.exists(_module_path(m, s)) for s in importlib.machinery.EXTENSION_SUFFIXES)]


def build() -> str:
    """Which build runs, in words (`allocsim --version`), and why a module runs interpreted where the install
    fell back (`NOTE`)."""
    if _forced_interpreted():
        return "interpreted"
    done = compiled_modules()
    left = [m for m in COMPILED_MODULES if m not in done]
    which = ("compiled: " + ", ".join(done) + (f"; interpreted: {', '.join(left)}" if left else "")) if done else \
        "interpreted"
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), NOTE)) as f:
            why = f.readline().strip()
    except OSError:
        why = ""
    return f"{which}, because {why}" if left and why else which


class _SourceFirst:
    """A meta path finder that loads the modules of `COMPILED_MODULES` from their ``.py`` source."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in COMPILED_MODULES:
            return None
        source = _module_path(name, ".py")
        return importlib.util.spec_from_file_location(name, source) if os.path.exists(source) else None


if _forced_interpreted() and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFirst())


class _Type:
    """A C type's name, interpreted: what a declaration names and nothing else."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"cython.{self.name}"

    def __getitem__(self, dims):
        """``cython.longlong[:]``: a typed memoryview of such numbers, interpreted a name too."""
        return _Type(f"{self.name}[:]")


def _as_is(f=None, **_):
    """A decorator that changes nothing, usable bare (``@cython.cfunc``) or called (``@cython.locals(x=...)``)."""
    return (lambda g: g) if f is None else f


class cython:    # noqa: N801  (it stands for the module of that name)
    """Cython's ``cython`` module as far as allocsim's compiled modules use it, interpreted: ``compiled`` is
    False, the decorators change nothing, the types are names."""

    compiled = False
    cfunc = ccall = inline = staticmethod(_as_is)
    locals = staticmethod(lambda **types: _as_is)
    returns = staticmethod(lambda type_: _as_is)
    boundscheck = wraparound = overflowcheck = staticmethod(lambda on: _as_is)     # directives: nothing to do
    longlong, ulonglong, uchar, double, Py_ssize_t, bint = (_Type(n) for n in ("longlong", "ulonglong", "uchar",
                                                                                "double", "Py_ssize_t", "bint"))
