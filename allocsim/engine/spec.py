"""`PolicySpec`: which policy, with which options — parsed in one place for every entry point.

The command line (``--policy``, ``--policies``, ``-O``), the bracket syntax
(``torch[expandable_segments:True]``), sweep rows and the Python API all make a
`PolicySpec`, so a typo fails the same way everywhere. The policy is named by

- a registered name (``split``) or an installed entry point of the group
  ``allocsim.policies``;
- ``path/to/file.py:Class`` (the path is made absolute here, so that worker
  processes and Dask workers load the same file);
- ``package.module:Class`` (imported by name).

Options are a sorted tuple of ``(key, typed value)``, parsed by the policy's own
declaration (`Policy.parse_options`). A spec is a small immutable value: it travels
to workers as it is and resolves its class there (`policy_class`).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field

from .. import policies
from ..errors import AllocsimError, PluginError, UsageError, closest
from ..outputs import Terminated
from ..params import PARSERS, Param, kind_of, split_top
from ..policies.base import Policy, _definer
from ..policies.registry import NameTaken

ENTRY_POINT_GROUP = "allocsim.policies"

#: Resolved classes of this process, by reference (a plug-in file is executed once).
_CLASSES: dict[str, type] = {}


def _is_default(param: Param, value) -> bool:
    """Whether ``value`` is ``param``'s declared default, which a caller may give as it is (a default such as
    ``garbage_collection_threshold``'s 0.0, "off", is no value the option's text takes; 0 and numpy's 0.0 are it
    too, as a snapshot records "none set")."""
    d = param.default
    if d is None or value is None:
        return False
    kd, kv = kind_of(d), kind_of(value)
    if "b" in (kd, kv):
        return kd == kv and bool(value) == d
    return kd in ("i", "u", "f") and kv in ("i", "u", "f") and float(value) == float(d)


@dataclass(frozen=True)
class PolicySpec:
    """A policy reference and its options; ``str(spec)`` parses back to an equal spec."""

    ref: str                          # registered name, entry point, pkg.mod:Class or /abs/file.py:Class
    options: tuple = ()               # sorted ((key, typed value), ...)
    shown: str = field(default="", compare=False)   # the reference as written, for tables

    # ---- making one --------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """``name``, ``name[k:v,k2=v2]``, ``file.py:Class[k=v]``, ``pkg.mod:Class``."""
        text = str(text).strip()
        ref, bracket, rest = text.partition("[")
        ref = ref.strip()
        if not ref or (bracket and not rest.endswith("]")):
            raise UsageError(f"policy {text!r}: expected name, name[key:value,...], file.py:Class or module:Class")
        spec = cls(_absolute(ref), (), ref)
        spec.policy_class()                   # unknown names and broken plug-ins fail here, at parse time
        return spec.with_options([rest[:-1]]) if bracket else spec

    @classmethod
    def of(cls, policy, options=None) -> PolicySpec:
        """A spec from what the Python API accepts: text, a spec or a Policy subclass, plus options
        as ``key=value`` texts or a dict of typed values."""
        if isinstance(policy, type):
            spec = cls._of_class(policy)
        else:
            spec = policy if isinstance(policy, PolicySpec) else cls.parse(policy)
        if isinstance(options, dict):
            return spec.with_values(options)
        return spec.with_options(options) if options else spec

    @classmethod
    def _of_class(cls, policy_cls: type) -> PolicySpec:
        """A spec for a class at hand (`allocsim.testing.check_policy`): resolved in this process only."""
        _check_policy_class(policy_cls, policy_cls.__qualname__)
        ref = f"{policy_cls.__module__}:{policy_cls.__qualname__}"
        _CLASSES[ref] = policy_cls
        return cls(ref, (), policy_cls.name or policy_cls.__qualname__)

    def with_options(self, texts) -> PolicySpec:
        """These options plus ``["k=v,k2:v2", ...]`` (``-O``), parsed by the policy's declaration."""
        return self._adding(lambda pcls: pcls.parse_options(list(texts)))

    def with_values(self, values: dict) -> PolicySpec:
        """These options plus ``values`` (the Python API's dict), each checked as ``-O`` checks it: text parsed as
        ``-O`` parses it (``{"limit": "8GB"}``; a text option with its own parser too), a number, a bool or a choice
        as its text would be (`Param.text_of`: ``{"max_split_size_mb": -5}`` is refused as on the command line).
        Taken as they are: None where the default is None (unset), the declared default (numerically: ``0`` for
        0.0), and a value a text option's parser makes (`tune`'s grids hold divisions tables)."""
        def typed(pcls):
            known = {p.name: p for p in pcls.params}
            out = {}
            for k, v in values.items():
                pcls.check_option(k)
                p = known[k]
                if v is None and p.default is None:
                    out[k] = None                   # unset, as "none" reads
                elif _is_default(p, v):
                    out[k] = p.default              # (0 for garbage_collection_threshold's 0.0, "off": no text's)
                elif isinstance(v, str) and (p.kind != "str" or p.parser is not None):
                    out.update(pcls.parse_option(known, k, v))
                elif p.kind != "str":               # a number, a bool or a choice: as its text would be
                    try:
                        text = p.text_of(v)
                    except ValueError as e:
                        raise UsageError(f"option {k}: {e}") from None
                    out.update(pcls.parse_option(known, k, text))
                elif isinstance(v, dict) and p.parser is not None:     # a table as PyTorch's settings spell it
                    text = "[" + ",".join(f"{key}:{d}" for key, d in v.items()) + "]"   # ({"256": 1, ">": 8})
                    out.update(pcls.parse_option(known, k, text))
                elif kind_of(v) in ("i", "u") and p.parser is not None:   # (roundup_power2_divisions=4)
                    out.update(pcls.parse_option(known, k, str(int(v))))
                elif isinstance(v, str):            # a text option's own text
                    out[k] = v
                elif isinstance(v, (tuple, list)):  # a value a text option's parser made (tune's tables)
                    out[k] = tuple(v)
                else:       # (a dict or a number reached the model, which said "expected an integer")
                    raise UsageError(f"option {k}: expected text{' or a table' if p.parser else ''}, got {v!r}")
            return out
        return self._adding(typed)

    def _adding(self, new) -> PolicySpec:
        """A spec with the options ``new(policy class)`` parses added; an unknown key, a bad value or a
        key given twice is one line naming the policy."""
        pcls = self.policy_class()
        have = dict(self.options)
        try:
            pcls.merge_options(have, new(pcls))
        except UsageError as e:
            raise UsageError(f"policy {self.name!r}: {e}") from None
        return PolicySpec(self.ref, tuple(sorted(have.items())), self.shown)

    # ---- reading one ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The policy as the user wrote it (a plug-in file as given, not made absolute)."""
        return self.shown or self.ref

    @property
    def option_text(self) -> str:
        """``k:v,k2:v2`` in key order, each value as the policy writes it."""
        pcls = self.policy_class()
        return ",".join(f"{k}:{pcls.format_option(k, v)}" for k, v in self.options)

    @property
    def label(self) -> str:
        """How tables and plots name this policy: ``torch[expandable_segments:True]``."""
        return f"{self.name}[{self.option_text}]" if self.options else self.name

    def __str__(self) -> str:
        return f"{self.ref}[{self.option_text}]" if self.options else self.ref

    def values(self) -> dict:
        return dict(self.options)

    def policy_class(self) -> type:
        """The `Policy` subclass named by ``ref``, loaded once per process."""
        pcls = _CLASSES.get(self.ref)
        if pcls is None:
            pcls = _CLASSES[self.ref] = _resolve(self.ref, self.name)
        return pcls


# ---- resolving references ----------------------------------------------------------------
def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def _absolute(ref: str) -> str:
    """A plug-in file's reference with its path made absolute; anything else unchanged."""
    where, colon, name = ref.rpartition(":")
    return f"{os.path.abspath(where)}:{name}" if colon and _is_file(where) else ref


def plugin_files(texts) -> list[str]:
    """The plug-in files the policy lists ``texts`` name (``a.py:Class``, ``split,b.py:B[k:1]``), loading none: the
    inputs a command's outputs must never replace (``compare --csv ff.py`` wrote its table over the plug-in)."""
    out = []
    for text in texts:
        for item in split_top(text or ""):
            where, colon, _ = item.partition("[")[0].strip().rpartition(":")
            if colon and _is_file(where):
                out.append(where)
    return out


def _resolve(ref: str, shown: str) -> type:
    where, colon, name = ref.rpartition(":")
    if not colon:
        if _is_file(ref):
            raise UsageError(f"policy {shown!r}: name the class in the file too: {shown}:ClassName")
        return _named(ref)
    if not where or not name.isidentifier() or (":" in where and not _is_file(where)):
        raise UsageError(f"policy {shown!r}: expected file.py:Class or module:Class")
    policies.names()            # the built-ins filed before a plug-in's code runs: its `register` meets their names
    module = _load_file(where, shown) if _is_file(where) else _import(where, shown)
    pcls = getattr(module, name, None)
    if pcls is None:
        raise UsageError(f"policy {shown!r}: {where} has no class {name!r}")
    return _check_policy_class(pcls, shown)


def _check_policy_class(pcls, shown: str) -> type:
    if not (isinstance(pcls, type) and issubclass(pcls, Policy)):
        raise UsageError(f"policy {shown!r}: {getattr(pcls, '__name__', pcls)!r} is not a subclass of "
                         f"allocsim.policies.Policy")
    if pcls is Policy:      # (named by a plug-in file that imports it: NotImplementedError's traceback, deep inside)
        raise UsageError(f"policy {shown!r}: names allocsim.policies.Policy itself, the contract every policy "
                         f"subclasses, not a policy (name the subclass)")
    with plugin_errors(pcls, shown, "its declaration (name, summary, params) was read"):
        _check_declaration(pcls, shown)
    return pcls


def _check_declaration(pcls: type, shown: str) -> None:
    """A plug-in's ``name``, ``summary`` and ``params`` are what `-O`, tables and `allocsim policies` read:
    a wrong one is one line at load, not a traceback wherever it is first read."""
    for attr in ("name", "summary"):
        if not isinstance(getattr(pcls, attr), str):
            raise UsageError(f"policy {shown!r}: {pcls.__name__}.{attr} must be a string, "
                             f"got {getattr(pcls, attr)!r}")
    _check_own_name(pcls, shown)
    params = pcls.params
    if not isinstance(params, (tuple, list)) or not all(isinstance(p, Param) for p in params):
        raise UsageError(f"policy {shown!r}: {pcls.__name__}.params must be a tuple of allocsim.params.Param, "
                         f"got {params!r}")
    for p in params:
        if not (isinstance(p.kind, tuple) or p.kind in PARSERS):
            raise UsageError(f"policy {shown!r}: {pcls.__name__}.params: {p.name}: kind {p.kind!r} is not one of "
                             f"{', '.join(PARSERS)} or a tuple of choices")


def _check_own_name(pcls: type, shown: str) -> None:
    """A plug-in that calls itself by a built-in policy's name (``name = "torch"``) is refused: its reports and
    ``--json`` would read as the built-in's. A subclass of a built-in that keeps the built-in's name is left as it
    is (its class at hand is how tests and `check_policy` vary a built-in)."""
    definer = _definer(pcls, "name")
    builtin = policies.find(pcls.name)
    if builtin is None or builtin is definer or not is_plugin(definer):
        return
    source = getattr(sys.modules.get(definer.__module__), "__file__", None) or definer.__module__
    raise UsageError(f"policy {shown!r}: {definer.__qualname__} ({source}) is named {pcls.name!r}, a built-in "
                     f"policy's name: its reports would read as the built-in's; give it a name of its own")


def _named(name: str) -> type:
    """The built-in policy ``name``, else the installed one (an entry point) of that name."""
    cls = policies.find(name)
    if cls is not None:
        return cls
    installed = entry_points()
    if name in installed:
        return load_entry_point(installed[name])
    known = policies.names() + sorted(installed)
    meant = closest(name, known)
    raise UsageError(f"unknown policy {name!r}{f': did you mean {meant!r}?' if meant else ''} (known: "
                     f"{', '.join(known)}; or file.py:Class, module:Class)")


def _load_file(path: str, shown: str):
    """Execute a plug-in file as a module of its own (once per process)."""
    if not os.path.isfile(path):
        problem = (f"{path} is a folder, not a file" if os.path.isdir(path) else
                   f"{path} is not a regular file" if os.path.exists(path) else f"no such file {path}")
        raise UsageError(f"policy {shown!r}: {problem}")
    if not path.endswith(".py"):
        raise UsageError(f"policy {shown!r}: {path} is not a Python file (a plug-in file's name ends in .py)")
    modname = "allocsim_plugin_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if modname in sys.modules:
        return sys.modules[modname]
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.append(folder)             # it imports the modules beside it, as a script would
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module           # dataclasses and pickle inside the plug-in look it up
    try:
        with _plugin_output(), _own_siblings(folder):
            spec.loader.exec_module(module)
    except _STOPS:
        del sys.modules[modname]
        raise
    except BaseException as e:              # SystemExit included: a plug-in cannot end allocsim
        del sys.modules[modname]
        raise _import_failed(e, shown, path) from None
    return module


#: The folders of the plug-in files loaded in this process, each with the modules beside it that its files
#: imported as they were loaded (bare name -> module): what `_own_siblings` keeps apart.
_FOLDERS: dict[str, dict] = {}


def _siblings(folder: str) -> set[str]:
    """The module names ``folder`` holds itself (``name.py``, a ``name/`` folder): what a file there imports
    from beside it."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return set()
    return {e[:-3] if e.endswith(".py") else e for e in entries
            if (e.endswith(".py") and e[:-3].isidentifier()) or (e.isidentifier() and
                                                                  os.path.isdir(os.path.join(folder, e)))}


def _beside(module, folder: str) -> bool:
    """Whether ``module`` was found in ``folder`` (``folder/name.py``, ``folder/name/...``)."""
    spec, top = module.__spec__, module.__name__.partition(".")[0]
    places = [] if spec is None else [spec.origin, *(spec.submodule_search_locations or ())]
    for place in places:
        if isinstance(place, str) and os.path.isabs(place):
            rel = os.path.relpath(place, folder)
            if not rel.startswith(os.pardir) and rel.split(os.sep)[0].split(".")[0] == top:
                return True
    return False


@contextmanager
def _own_siblings(folder: str):
    """While a plug-in file in ``folder`` is loaded, its imports of the modules beside it (``from common import
    X``) find its own folder's: a name ``folder`` holds itself whose module in ``sys.modules`` came from elsewhere
    (another plug-in folder's ``common.py``) is set aside, with its submodules, and ``folder`` is searched first,
    as a script's own folder is; then they are put back. (Two plug-in folders each with a ``common.py`` shared the
    first one loaded, so results depended on the order of ``-p``.) A module ``folder`` does not hold -- a package
    installed or beside another plug-in -- stays the one module it is."""
    folder = os.path.abspath(folder)
    own = _FOLDERS.setdefault(folder, {})
    names = _siblings(folder)
    aside = {}                              # name -> what sys.modules held there before
    for name in [n for n in sys.modules if n.partition(".")[0] in names]:
        mod = sys.modules[name]
        if own.get(name) is not mod and not _beside(mod, folder):
            aside[name] = sys.modules.pop(name)
    for name, mod in own.items():
        if sys.modules.get(name) is not mod:
            aside.setdefault(name, sys.modules.get(name))
            sys.modules[name] = mod
    sys.path.insert(0, folder)
    before = set(sys.modules)
    try:
        yield
    finally:
        if folder in sys.path:
            sys.path.remove(folder)         # (the first one: the one put ahead)
        for name in set(sys.modules) - before:
            if name.partition(".")[0] in names and _beside(sys.modules[name], folder):
                own[name] = sys.modules[name]
        for name, mod in aside.items():     # the names back as they were (a clash: the one loaded first)
            if mod is not None:
                sys.modules[name] = mod


def _import(modname: str, shown: str):
    try:
        with _plugin_output():
            return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name and (modname == e.name or modname.startswith(e.name + ".")):
            raise UsageError(f"policy {shown!r}: no module named {e.name!r}") from None
        raise _import_failed(e, shown) from None
    except _STOPS:
        raise
    except BaseException as e:              # SystemExit included, as for a plug-in file
        raise _import_failed(e, shown) from None


def _raised_at(e: BaseException, path: str | None = None) -> str:
    """``file:line`` of the innermost frame that raised ``e`` (a syntax error's own position); a syntax
    error raised by the compiler itself (NUL bytes: no line) is the plug-in ``path``'s."""
    where = (e.filename or path) if isinstance(e, SyntaxError) else None
    if where:
        return f"{where}:{e.lineno}" if e.lineno else where
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<frozen")]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _import_failed(e: BaseException, shown: str, path: str | None = None) -> UsageError:
    """One line naming where the plug-in failed: its file and line, and the error."""
    if isinstance(e, NameTaken):            # (raised in allocsim's register: the line names the plug-in's own)
        return UsageError(f"policy {shown!r}: {e}")
    msg = e.msg if isinstance(e, SyntaxError) else _what(e)
    return UsageError(f"policy {shown!r}: loading it failed at {_raised_at(e, path)}: {type(e).__name__}: {msg}")


def _what(e: BaseException) -> str:
    """The exception's message; a `SystemExit` says that the plug-in tried to end the program."""
    if isinstance(e, SystemExit):
        return f"the plug-in called sys.exit({e.code!r}), which cannot end allocsim"
    try:
        return str(e)
    except Exception as inner:      # (its own ``__str__`` raised: the plug-in's failure is still the one line)
        return f"<its message could not be made: {type(inner).__name__} in its __str__>"


def is_plugin(obj) -> bool:
    """A policy class (or a method) written outside allocsim (a file, a module, an entry point, a class at hand)."""
    return not (obj.__module__ == "allocsim" or obj.__module__.startswith("allocsim."))


#: What still means "stop" inside a plug-in: the user's Ctrl-C, and a signal unwinding (`Terminated`).
_STOPS = (KeyboardInterrupt, Terminated)


@contextmanager
def _plugin_output():
    """While a plug-in's code runs, what it prints goes to stderr: stdout holds allocsim's report
    (``--json`` must stay valid JSON, and ``| head`` must not fail inside the plug-in)."""
    if sys.stderr is None:
        yield
        return
    with redirect_stdout(sys.stderr):
        yield


@contextmanager
def plugin_errors(pcls: type, shown: str, doing: str):
    """Turn an exception a plug-in raises while ``doing`` (being made, replaying) into one `PluginError`
    naming the plug-in, the exception and where it was raised; the original stays chained for --debug.
    Whatever a plug-in raises — `SystemExit` and bare `BaseException` too — becomes that line: a plug-in
    cannot end allocsim silently; only Ctrl-C and a signal still stop it. Its prints go to stderr.
    A built-in's exception is allocsim's own bug and passes through with its traceback."""
    if not is_plugin(pcls):
        yield
        return
    try:
        with _plugin_output():
            yield
    except AllocsimError:
        raise
    except _STOPS:
        raise
    except BaseException as e:
        raise PluginError(f"policy {shown!r} failed while {doing}: {type(e).__name__}: {_what(e)} (raised at "
                          f"{_raised_at(e)}); --debug shows the traceback, allocsim.testing.check_policy "
                          f"checks a policy against the contract") from e


def load_entry_point(ep) -> type:
    """The class an installed entry point names; its import errors are one line, like a plug-in file's."""
    policies.names()            # (as for a plug-in file: the built-ins filed first)
    try:
        with _plugin_output():
            pcls = ep.load()
    except _STOPS:
        raise
    except BaseException as e:              # SystemExit included, as for a plug-in file
        if _raised_at(e).startswith(_IMPORT_MACHINERY):     # the entry point names what is not there
            raise UsageError(f"policy {ep.name!r}: its installed entry point {ep.value} cannot be loaded: "
                             f"{type(e).__name__}: {_what(e)}") from None
        raise _import_failed(e, ep.name) from None
    return _check_policy_class(pcls, ep.name)


#: Where Python's import machinery lies: an error raised there is about the name imported, not its code.
_IMPORT_MACHINERY = os.path.dirname(importlib.__file__) + os.sep


def entry_points() -> dict:
    """Installed policies: the entry points of the group ``allocsim.policies``, by name."""
    from importlib.metadata import entry_points as eps
    return {ep.name: ep for ep in eps(group=ENTRY_POINT_GROUP)}

