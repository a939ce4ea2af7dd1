"""One module per subcommand (memray's layout), each declaring one `Command`; `allocsim.cli` lists them.

What the rest of the package uses of the command layer's own modules, named here so that it imports nothing
private."""
from ._command import Command
from ._common import WARNINGS
from ._parser import Parser

__all__ = ["Command", "Parser", "WARNINGS"]
