"""allocsim record's bootstrap in each Python process of a recorded program (allocsim/formats/recorders/processes.py).

Python runs the first ``sitecustomize`` on its path at start-up; ``allocsim record`` puts this folder in front of
the program's PYTHONPATH. It takes this folder off ``sys.path`` (the program sees its own path) and runs the
``sitecustomize`` it hid (the user's or the distribution's, as without allocsim). With ALLOCSIM_RECORD_RUN set it
then waits, with the standard library only, for ``torch`` to be imported, and asks torch to call
`_start_recording` when CUDA initialises: only then is allocsim imported (from the folder the variable names).
"""
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys


def _step_aside():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    this = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")         # the one this file hid
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
    sys.modules.setdefault("sitecustomize", this)        # site.py reads it back


def _say(what):
    print(f"allocsim record: process {os.getpid()}: not recorded: {what}", file=sys.stderr, flush=True)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Steps aside at the import of ``torch``, and calls `_torch_imported` once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _torch_imported(module)
        spec.loader.exec_module = exec_module
        return spec


def _torch_imported(torch):
    lazy_call = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
    if lazy_call is None:
        _say(f"torch {getattr(torch, '__version__', '?')} has no torch.cuda._lazy_call to start with CUDA")
    else:
        lazy_call(_start_recording)


def _start_recording():
    """CUDA is starting: import allocsim from its own folder and record this process."""
    try:
        config = json.loads(os.environ["ALLOCSIM_RECORD_RUN"])
        home = config.get("home")
        added = bool(home) and home not in sys.path
        if added:
            sys.path.insert(0, home)
        try:
            from allocsim.formats.recorders.processes import start_in_process
        finally:
            if added:
                sys.path.remove(home)
        start_in_process(config)
    except Exception as e:      # never the program's error
        _say(f"{type(e).__name__}: {e}")


_step_aside()
if os.environ.get("ALLOCSIM_RECORD_RUN"):
    if "torch" in sys.modules:
        _torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterTorch())
