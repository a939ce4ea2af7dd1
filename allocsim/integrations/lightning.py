"""A PyTorch Lightning callback that records the run and marks its phases (docs/recording.md)::

    from allocsim.integrations.lightning import AllocsimCallback
    trainer = L.Trainer(callbacks=[AllocsimCallback("run.bin")])

Recording starts at the callback's ``setup`` — before Lightning moves the model to the GPU — and stops at the
``teardown`` of the same stage (or when the run raises). Rank R of a run of several processes writes
``run.rankR.bin``. Phases: ``train`` around each training batch (its forward, backward and optimizer step),
``eval`` around a validation loop (the sanity check's included), ``test`` around a test loop, ``checkpoint`` around
each ``trainer.save_checkpoint`` (ModelCheckpoint's saves). With ``path=None`` (or when ``allocsim record`` records
the program already) the callback only marks the phases.

`LightningPhases` holds the hooks and imports nothing; `AllocsimCallback` is it on Lightning's ``Callback`` base
(``lightning.pytorch``, or ``pytorch_lightning``, whichever the program imported: a Trainer takes only callbacks of
its own package), made when first asked for.
"""
from __future__ import annotations

import sys

from . import CHECKPOINT, EVAL, TEST, TRAIN, Phases, RunRecording


class LightningPhases:
    """The hooks of `AllocsimCallback` (Lightning calls them by name)."""

    def __init__(self, path: str | None = None, framework: str | None = "torch", **options):
        super().__init__()
        self.recording = RunRecording(path, framework, **options)
        self.phases = Phases()
        self.stage = None
        self._saving = None            # (trainer, the save_checkpoint it had) while wrapped

    # ---- the run -----------------------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage=None):
        if self.stage is None:
            self.stage = stage
            self.recording.start(getattr(trainer, "global_rank", None), getattr(trainer, "world_size", None))
        self._wrap_save(trainer)

    def teardown(self, trainer, pl_module, stage=None):
        self._unwrap_save()
        if stage == self.stage:
            self.phases.close_all()
            self.recording.stop(0)
            self.stage = None

    def on_exception(self, trainer, pl_module, exception):
        self._unwrap_save()
        self.phases.close_all()
        self.recording.stop(1, f"the run raised {type(exception).__name__}: {exception}")
        self.stage = None

    # ---- phases ------------------------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        self.phases.begin(TRAIN)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self.phases.end(TRAIN)

    def on_validation_start(self, trainer, pl_module):
        self.phases.begin(EVAL)

    def on_validation_end(self, trainer, pl_module):
        self.phases.end(EVAL)

    def on_test_start(self, trainer, pl_module):
        self.phases.begin(TEST)

    def on_test_end(self, trainer, pl_module):
        self.phases.end(TEST)

    def _wrap_save(self, trainer) -> None:
        """Put a ``checkpoint`` phase around ``trainer.save_checkpoint`` (Lightning has no hook after a save)."""
        if self._saving is not None or not hasattr(trainer, "save_checkpoint"):
            return
        original = trainer.save_checkpoint
        phases = self.phases

        def save_checkpoint(*args, **kwargs):
            phases.begin(CHECKPOINT)
            try:
                return original(*args, **kwargs)
            finally:
                phases.end(CHECKPOINT)
        save_checkpoint.__wrapped__ = original
        trainer.save_checkpoint = save_checkpoint
        self._saving = (trainer, save_checkpoint)

    def _unwrap_save(self) -> None:
        if self._saving is None:
            return
        trainer, wrapper = self._saving
        self._saving = None
        if trainer.__dict__.get("save_checkpoint") is wrapper:
            del trainer.save_checkpoint         # the class's method again


def _callback_base():
    """Lightning's ``Callback``: of the package the program imported, else of the one installed."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if name in sys.modules:
            return sys.modules[name].Callback
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            from ..errors import UsageError
            raise UsageError("AllocsimCallback needs PyTorch Lightning (pip install 'allocsim[lightning]')") from None
    return Callback


def __getattr__(name):
    if name == "AllocsimCallback":
        cls = type("AllocsimCallback", (LightningPhases, _callback_base()), {"__module__": __name__,
                                                                           "__doc__": __doc__})
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
