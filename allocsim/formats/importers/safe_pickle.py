"""A restricted unpickler for PyTorch memory snapshots.

`torch.cuda.memory._dump_snapshot` is a plain ``pickle.dump`` of a dict of
dicts, lists, tuples, strings, ints, floats, bools and None, so it loads without
torch. A pickle can also name any importable global and call it (``os.system``
through REDUCE), so loading an untrusted file with `pickle.load` runs code.

`SnapshotUnpickler.find_class` is the only way a pickle can reach a global
(GLOBAL, STACK_GLOBAL, INST, OBJ and the copyreg EXT opcodes all go through it);
it refuses every global except the few in `ALLOWED`, which only build plain
containers. Without a global there is nothing to call, so REDUCE, BUILD and
NEWOBJ cannot run code either. Persistent ids are refused by the base class
(no ``persistent_load``). The C unpickler is kept, so loading costs what
`pickle.load` costs.
"""
from __future__ import annotations

import io
import pickle
import pickletools

from ...errors import InputError

#: Globals that only build plain containers; protocols 0-2 pickle sets and
#: ordered dicts through them (under their Python 2 names, which the base
#: `find_class` maps). Nothing else is ever resolved.
ALLOWED = frozenset({
    ("builtins", "set"), ("__builtin__", "set"),
    ("builtins", "frozenset"), ("__builtin__", "frozenset"),
    ("collections", "OrderedDict"),
})


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle named a global outside `ALLOWED`."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name
        super().__init__(f"{module}.{name}")


class SnapshotUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves no global beyond `ALLOWED`."""

    def find_class(self, module, name):
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        raise RefusedGlobal(str(module), str(name))


#: What a snapshot pickle builds first: its top-level dict (or a bare segment list), after an optional MARK.
_CONTAINERS = {"DICT", "EMPTY_DICT", "LIST", "EMPTY_LIST"}


def looks_like_pickle(head: bytes, *, any_object: bool = False) -> bool:
    """Do the first bytes of a file read as a pickle of a dict or list (a memory snapshot), or of anything with
    ``any_object`` (an OrderedDict, a tuple: a pickle the importer then names as not a snapshot)?

    Protocol 2 and later open with the PROTO opcode (``\x80``). Protocols 0 and 1 (``pickle.dump(s, f, 0)``)
    have no such mark: their first opcodes are disassembled (`pickletools.genops` only reads them, nothing
    is built or run) and must go on for eight opcodes (or to the end), opening a container unless ``any_object``,
    which CSV or JSON text does not.
    """
    if head[:1] == b"\x80":
        return True
    ops = []
    try:
        for op, _, _ in pickletools.genops(io.BytesIO(head)):
            ops.append(op)
            if len(ops) == 8 or op.name == "STOP":
                break
    except Exception:       # not an opcode, or an argument the head cuts short: judge what came before
        pass
    if len(ops) < 8 and (not ops or ops[-1].name != "STOP") or not _stack_holds(ops):
        return False
    first = [o.name for o in ops[:2] if o.name != "MARK"][:1]
    return any_object or (bool(first) and first[0] in _CONTAINERS)


def _stack_holds(ops) -> bool:
    """Whether the opcodes ``ops`` run on the unpickler's stack without taking from an empty one (each opcode's
    declared ``stack_before``, a mark where a slice is taken): text of opcode-like characters (a test log's
    ``....s.s..``: STOP first; ``0000``: POP) does not, a pickle does."""
    stack: list = []        # True: a mark, False: an object
    for op in ops:
        before = list(op.stack_before)
        if pickletools.stackslice in before:            # (all above the topmost mark, and the mark)
            if True not in stack:
                return False
            del stack[len(stack) - 1 - stack[::-1].index(True):]
            before = [b for b in before if b not in (pickletools.stackslice, pickletools.markobject)]
        if len(stack) < len(before) or True in stack[len(stack) - len(before):]:
            return False
        del stack[len(stack) - len(before):]
        stack += [a is pickletools.markobject for a in op.stack_after]
    return True


def loads(data: bytes, source: str = "<pickle>"):
    """Unpickle ``data`` with `SnapshotUnpickler`; malformed or unsafe data -> `InputError`."""
    return _load(io.BytesIO(data), source)


def load(path: str):
    """Unpickle the file at ``path`` with `SnapshotUnpickler`."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(e.strerror or str(e), path=path)
    with f:
        return _load(f, path)


def _load(f, source: str):
    try:
        return SnapshotUnpickler(f).load()
    except RefusedGlobal as e:
        raise InputError(f"refusing to load global {e.module}.{e.name}: a memory snapshot holds only plain "
                         f"dicts, lists, strings and numbers (this pickle is not one, or it is malicious; "
                         f"nothing was run)", path=source)
    except RecursionError:
        raise InputError("pickle nests too deeply", path=source)
    except MemoryError:
        raise InputError("pickle too large to load", path=source)
    except Exception as e:  # EOFError, UnpicklingError, ValueError, KeyError, ... from corrupt opcodes
        if isinstance(e, EOFError) or "truncated" in str(e):
            raise InputError(f"truncated pickle (the data ends early, at byte {f.tell()})", path=source)
        raise InputError(f"not a valid pickle ({type(e).__name__}: {e})", path=source)
