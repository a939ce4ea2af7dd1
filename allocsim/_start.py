"""The ``allocsim`` console script (pyproject.toml's ``[project.scripts]``, and ``python -m allocsim``): `allocsim.cli.main`,
with an interrupt while the command line's modules load (numpy and every command: about 0.2 s) said in one line,
exit status 130, as one later is -- it printed a traceback of 10 to 30 lines. ``import allocsim`` itself loads
nothing heavy (its API names are imported on first use), so this holds from the script's first milliseconds."""
from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("allocsim: interrupted\n")
        return 130
    return run()
