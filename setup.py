"""Builds allocsim. With ``ALLOCSIM_COMPILE=1`` at install time, the modules `allocsim/compiled.py` names are
compiled with Cython (their Python source as it is, in pure Python mode) where Cython and a C compiler are at
hand; else, and by default, the interpreted modules are installed, with one line saying why
(docs/architecture.md, "The compiled build"). Everything else is in pyproject.toml.

The compiled build is asked for, not the default: a replay of a compiled policy is walked in full, never folded
(`allocsim.engine.fold`), and on long runs folding saves more than compiling."""
from __future__ import annotations

import os
import re
import runpy
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
COMPILED = runpy.run_path(os.path.join(HERE, "allocsim", "compiled.py"))
FALLBACK = "allocsim: {}; installing the interpreted modules (same results, slower replays)"


def say(why: str, error: Exception | None = None) -> None:
    """The one line a build that falls back prints: why, and the error's first line."""
    if error is not None:
        first = (str(error).splitlines() or ["no message"])[0]
        why += f" ({type(error).__name__}: {first if len(first) <= 120 else first[:117] + '...'})"
    print(FALLBACK.format(why), file=sys.stderr)


class OptionalBuildExt(build_ext):
    """`build_ext` whose failure (no C compiler, a failed compile) leaves the interpreted modules in place: the
    modules that did not compile are named in one line, with the first error (without a compiler every one
    fails alike), and only those that did are copied beside their source."""

    def run(self):
        self.failed = []
        try:
            super().run()
        except Exception as e:          # noqa: BLE001  (setuptools raises several kinds: any of them falls back)
            if not self.failed:
                say("no compiled build", e)
        if self.failed:
            names = ", ".join(name for name, _ in self.failed)
            say(f"{names} not compiled" if len(self.failed) < len(self.extensions) else "no compiled build",
                self.failed[0][1])

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:          # noqa: BLE001
            self.failed.append((ext.name, e))

    def copy_extensions_to_source(self):
        failed = {name for name, _ in self.failed}
        built = self.extensions
        self.extensions = [ext for ext in built if ext.name not in failed]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = built


def switch_on(name: str) -> bool:
    """The on/off variable ``name`` (`allocsim.compiled.switch_on`'s spellings); another value stops the build
    with one line, exit status 2."""
    try:
        return COMPILED["switch_on"](name)
    except ValueError as e:
        print(f"allocsim: {e}", file=sys.stderr)
        sys.exit(2)


#: The oldest Cython the compiled build is tested with: Cython 3.3.0 compiled ``for ptr in pool.unmapped`` in
#: torch.py's ``_find_expandable_block`` with no iterable, a segmentation fault (Python 3.12, 2026-11-26),
#: where 3.3.1 compiles the same source correctly (docs/architecture.md, "The compiled build").
LEAST_CYTHON = (3, 3, 1)


def cython_version(text: str) -> tuple:
    """``"3.3.1"`` -> ``(3, 3, 1)``, the release numbers a version string starts with (``"3.1b2"`` -> ``(3, 1, 0)``)."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else (0, 0, 0)


def extensions() -> list:
    if switch_on(COMPILED["INTERPRETED_ENV"]):
        say(f"{COMPILED['INTERPRETED_ENV']} is set")
        return []
    if not switch_on(COMPILED["COMPILE_ENV"]):
        say(f"{COMPILED['COMPILE_ENV']}=1 asks for the compiled build")
        return []
    try:
        import Cython
        from Cython.Build import cythonize
    except ImportError:
        say("Cython is not installed")
        return []
    if cython_version(Cython.__version__) < LEAST_CYTHON:
        say(f"Cython {Cython.__version__} is older than {'.'.join(map(str, LEAST_CYTHON))}, which the compiled build "
            "needs (3.3.0 miscompiles a loop of torch.py: a crash)")
        return []
    from setuptools import Extension
    mods = [Extension(m, [os.path.join(*m.split(".")) + ".py"]) for m in COMPILED["COMPILED_MODULES"]]
    try:
        return cythonize(mods, compiler_directives={"language_level": 3, "annotation_typing": False,
                                                       "overflowcheck": True}, quiet=True)
    except Exception as e:              # noqa: BLE001  (a Cython too old for pure Python mode, say)
        say("Cython could not translate the modules", e)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
