"""Builds allocsim. By default the modules `allocsim/compiled.py` names are compiled with Cython (their Python
source as it is, in pure Python mode; Cython is a build requirement in pyproject.toml, so pip fetches it) where a
C compiler is at hand; where one is not, or a module does not compile, those modules install interpreted, with
one line saying why, which `allocsim --version` repeats. ``ALLOCSIM_COMPILE=0`` (or ``ALLOCSIM_INTERPRETED=1``)
at install time asks for the interpreted build (docs/architecture.md, "The compiled build"). Everything else is
in pyproject.toml.

The modules are translated and compiled by `build_ext` (so ``setup.py --name`` or an sdist translate nothing),
the C beside the build's temporary files, not the source; the largest first, as many at once as there are
cores, without debug information (docs/performance.md, "Install time")."""
from __future__ import annotations

import importlib.machinery
import itertools
import os
import re
import runpy
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
COMPILED = runpy.run_path(os.path.join(HERE, "allocsim", "compiled.py"))
FALLBACK = "allocsim: {}; installing the interpreted modules (same results, slower replays)"


def because(why: str, error: Exception | None = None) -> str:
    """Why a build falls back, with the error's first line."""
    if error is None:
        return why
    first = (str(error).splitlines() or ["no message"])[0]
    return why + f" ({type(error).__name__}: {first if len(first) <= 120 else first[:117] + '...'})"


def switch_on(name: str, default: bool = False) -> bool:
    """The on/off variable ``name`` (`allocsim.compiled.switch_on`'s spellings; unset is ``default``); another
    value stops the build with one line, exit status 2."""
    try:
        return COMPILED["switch_on"](name, default=default)
    except ValueError as e:
        print(f"allocsim: {e}", file=sys.stderr)
        sys.exit(2)


def switched_off() -> str | None:
    """Why the environment asks for the interpreted build (None: it does not), read when setup.py starts, so
    that a bad value stops even ``setup.py --name``."""
    if switch_on(COMPILED["INTERPRETED_ENV"]):
        return f"{COMPILED['INTERPRETED_ENV']} is set"
    if not switch_on(COMPILED["COMPILE_ENV"], default=True):
        return f"{COMPILED['COMPILE_ENV']} is off"
    return None


SWITCHED_OFF = switched_off()

#: The oldest Cython the compiled build is tested with: Cython 3.3.0 compiled ``for ptr in pool.unmapped`` in
#: torch.py's ``_find_expandable_block`` with no iterable, a segmentation fault (Python 3.12, 2026-11-26),
#: where 3.3.1 compiles the same source correctly (docs/architecture.md, "The compiled build").
LEAST_CYTHON = (3, 3, 1)


#: gcc's level for the compiled modules: ``-O1`` compiles in about 55 % of the CPU time of Python's own ``-O3`` (or
#: 60 % of ``-O2``), and the replays it builds run as fast within this machine's noise (docs/performance.md,
#: 2026-12-03's "the compile at -O1"). ``CFLAGS=-O3 pip install .`` asks for another.
OPTIMIZE = "-O1"


def cython_version(text: str) -> tuple:
    """``"3.3.1"`` -> ``(3, 3, 1)``, the release numbers a version string starts with (``"3.1b2"`` -> ``(3, 1, 0)``)."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    return tuple(int(g or 0) for g in m.groups()) if m else (0, 0, 0)


class OptionalBuildExt(build_ext):
    """`build_ext` that translates the modules with Cython first and whose failure (no Cython, no C compiler, a
    failed compile) leaves the interpreted modules in place: one line names the modules that did not compile,
    with the first error (without a compiler every one fails alike), only those that did are installed (an
    earlier build of the others is removed), and the line is kept for `allocsim --version`
    (`allocsim.compiled.NOTE`)."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:       # -j: the modules take 10-30 s each to compile
            self.parallel = max(1, min(os.cpu_count() or 1, len(self.extensions)))

    def run(self):
        self.failed = []
        why = SWITCHED_OFF or self.translate()
        if why is None:
            inplace = self.inplace      # setuptools' run sets it to 0 around the build, and a raise leaves it so
            try:
                super().run()
            except Exception as e:      # noqa: BLE001  (setuptools raises several kinds: any of them falls back)
                self.inplace = inplace
                if not self.failed:
                    why = because("no compiled build", e)
                    self.failed = [(ext.name, e) for ext in self.extensions]
            if why is None and self.failed:
                names = ", ".join(sorted(name for name, _ in self.failed))
                why = because("the C compile failed" if len(self.failed) == len(self.extensions)
                              else f"{names} did not compile", self.failed[0][1])
        else:
            self.failed = [(ext.name, None) for ext in self.extensions]
        if why is not None:
            print(FALLBACK.format(why), file=sys.stderr)
        self.drop_stale()
        self.keep_note(why)

    def translate(self) -> str | None:
        """Cython's C for each module, written under the build's temporary folder; why not, where it cannot."""
        try:
            import Cython
            from Cython.Build import cythonize
        except ImportError:
            return "Cython is not installed"
        if cython_version(Cython.__version__) < LEAST_CYTHON:
            return (f"Cython {Cython.__version__} is older than {'.'.join(map(str, LEAST_CYTHON))}, which the "
                    "compiled build needs (3.3.0 miscompiles a loop of torch.py: a crash)")
        try:
            done = cythonize(self.extensions, build_dir=os.path.join(self.build_temp, "cython"), quiet=True,
                             compiler_directives={"language_level": 3, "annotation_typing": False,
                                                  "overflowcheck": True})
        except Exception as e:          # noqa: BLE001  (a Cython too old for pure Python mode, say)
            return because("Cython could not translate the modules", e)
        for ext, translated in zip(self.extensions, done):
            ext.sources = translated.sources
        return None

    def build_extensions(self):
        """The largest module first, so that it does not start last on a machine of few cores; no debug
        information (a third of gcc's time, and nothing a replay uses); optimized at ``-O1`` unless ``CFLAGS``
        names a level (`OPTIMIZE`)."""
        self.extensions.sort(key=lambda ext: -sum(os.path.getsize(s) for s in ext.sources))
        if self.compiler.compiler_type == "unix":
            level = [] if re.search(r"(^|\s)-O", os.environ.get("CFLAGS", "")) else [OPTIMIZE]
            for ext in self.extensions:
                ext.extra_compile_args = [*ext.extra_compile_args, "-g0", *level]
        super().build_extensions()

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:          # noqa: BLE001
            self.failed.append((ext.name, e))

    def copy_extensions_to_source(self):
        built = self.extensions
        self.extensions = [ext for ext in built if ext.name not in dict(self.failed)]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = built

    def drop_stale(self) -> None:
        """A module not built now goes from the build folder (whence an earlier build's would be packed) and, in
        place, from beside its source (where it would load)."""
        roots = [self.build_lib] + [HERE] * bool(self.inplace)
        for name, _ in self.failed:
            for root, suffix in itertools.product(roots, importlib.machinery.EXTENSION_SUFFIXES):
                path = os.path.join(root, *name.split(".")) + suffix
                if os.path.exists(path):
                    os.remove(path)

    def keep_note(self, why: str | None) -> None:
        """Writes ``why`` (or removes the note, None) where the installed package will have it."""
        where = {os.path.join(self.build_lib, "allocsim")}
        if self.inplace:
            where.add(os.path.join(HERE, "allocsim"))
        for folder in where:
            path = os.path.join(folder, COMPILED["NOTE"])
            if why is not None and os.path.isdir(folder):
                with open(path, "w") as f:
                    f.write(why + "\n")
            elif os.path.exists(path):
                os.remove(path)


setup(ext_modules=[Extension(m, [os.path.join(*m.split(".")) + ".py"], optional=True)
                   for m in COMPILED["COMPILED_MODULES"]],
      cmdclass={"build_ext": OptionalBuildExt})
