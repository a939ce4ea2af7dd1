"""Recording a run started by a trainer: PyTorch Lightning (`allocsim.integrations.lightning`) and Hugging Face
``transformers`` (`allocsim.integrations.hf`), docs/recording.md.

Each offers a callback that records the run (`RunRecording`: `allocsim.start_recording`, or the recording already
running — ``allocsim record``'s, or the program's own — when there is one) and marks its phases as PHASE scopes
(`Phases`): ``train`` around each optimizer step's batch, ``eval`` around an evaluation, ``checkpoint`` around a
save. Only these modules import their trainer, and only when their callback class is asked for.
"""
from __future__ import annotations

import os

from ..formats import recorders
from ..formats.recorders import session
from ..trace import events as ev

TRAIN, EVAL, TEST, CHECKPOINT = "train", "eval", "test", "checkpoint"


class Phases:
    """The PHASE scopes a trainer's hooks open and close, innermost last. `end` closes the innermost open scope of
    its label, and any opened inside it and left open (a hook the trainer skipped), so that the trace's scopes
    always nest; `close_all` closes what is open (the run ended, or raised). Nothing is written when no recording
    runs."""

    def __init__(self):
        self.open: list[tuple] = []         # (label, serial, recorder)

    def begin(self, label: str) -> None:
        rec = recorders.active()
        if rec is None:
            return
        serial = rec.scope_begin(ev.PHASE_BEGIN, label)
        if serial is not None:
            self.open.append((label, serial, rec))

    def is_open(self, label: str) -> bool:
        return any(lab == label for lab, _, _ in self.open)

    def end(self, label: str) -> None:
        at = next((i for i in range(len(self.open) - 1, -1, -1) if self.open[i][0] == label), None)
        if at is not None:
            self._close_to(at)

    def close_all(self) -> None:
        self._close_to(0)

    def _close_to(self, depth: int) -> None:
        while len(self.open) > depth:
            label, serial, rec = self.open.pop()
            if rec is recorders.active():            # a recording stopped meanwhile has been finished
                rec.scope_end(ev.PHASE_END, label, serial)


def rank_path(path: str, rank: int | None, world_size: int | None) -> str:
    """``run.rank1.bin`` for rank 1 of a run of several processes (as ``allocsim record`` names them), ``path``
    itself for a run of one."""
    if rank is None or not world_size or world_size <= 1:
        return path
    from ..machine.ranks import process_name
    return process_name(path, f"rank{rank}")


def env_rank() -> tuple[int | None, int | None]:
    """``(RANK, WORLD_SIZE)`` as the launchers (torchrun, accelerate) set them; None where unset."""
    from ..formats.recorders.processes import env_int
    return env_int("RANK"), env_int("WORLD_SIZE", 1)


class RunRecording:
    """The recording a callback asked for: started with `allocsim.start_recording` into ``path`` unless one runs
    already or the process runs under ``allocsim record -- launcher ...`` (whose recording starts with CUDA): then the
    callback only marks phases in it, as it does with ``path`` None. `stop` stops only a recording it started."""

    def __init__(self, path: str | None, framework: str | None = "torch", **options):
        self.path, self.framework, self.options = path, framework, options
        self.recorder = None

    def start(self, rank: int | None = None, world_size: int | None = None) -> None:
        if self.path is None or recorders.active() is not None or self.recorder is not None or os.environ.get(session.ENV_RUN):
            return          # a recording runs already, or allocsim record's starts with CUDA: phases only
        if rank is None:
            rank, world_size = env_rank()
        self.recorder = session.start_recording(rank_path(os.fspath(self.path), rank, world_size), self.framework,
                                                  **self.options)

    @property
    def running(self) -> bool:
        return self.recorder is not None and self.recorder is recorders.active()

    def stop(self, status: int = 0, note: str | None = None) -> dict | None:
        """Finish the recording this callback started (its stats), None if it started none."""
        rec, self.recorder = self.recorder, None
        if rec is None or rec is not recorders.active():
            return None
        if note:
            rec.note(note)
        return session.stop_recording(status)
