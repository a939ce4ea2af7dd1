"""A Hugging Face ``transformers`` ``TrainerCallback`` that records the run and marks its phases
(docs/recording.md)::

    from allocsim.integrations.hf import AllocsimCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[AllocsimCallback("run.bin")])

``Trainer(...)`` moves the model to the GPU when it is made, so recording starts when the callback is made (build
it first, as above) and stops at the end of ``trainer.train()``. Rank R of a run of several processes (``RANK``
and ``WORLD_SIZE`` set by ``accelerate launch`` or ``torchrun``) writes ``run.rankR.bin``. Phases: ``train``
around each optimizer step (``on_step_begin`` .. ``on_step_end``); ``eval`` from the end of the step or epoch
after which the Trainer's flow asks for an evaluation (``control.should_evaluate``) to ``on_evaluate``;
``checkpoint`` from there (or from that step's end) when it asks for a save (``control.should_save``) to
``on_save``. A ``trainer.evaluate()`` called outside ``train()`` has no begin hook and is not marked. With
``path=None`` (or when ``allocsim record`` records the program already) the callback only marks the phases.

`HFPhases` holds the hooks and imports nothing; `AllocsimCallback` is it on ``transformers.TrainerCallback``,
made when first asked for.
"""
from __future__ import annotations

from . import CHECKPOINT, EVAL, TRAIN, Phases, RunRecording


class HFPhases:
    """The hooks of `AllocsimCallback` (the Trainer's ``CallbackHandler`` calls them by name, with ``args``,
    ``state``, ``control`` and keywords)."""

    def __init__(self, path: str | None = None, framework: str | None = "torch", **options):
        super().__init__()
        self.recording = RunRecording(path, framework, **options)
        self.phases = Phases()
        self.recording.start()

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.phases.is_open(TRAIN):      # some versions call it for each micro-batch of an accumulation
            self.phases.begin(TRAIN)

    def on_step_end(self, args, state, control, **kwargs):
        self.phases.end(TRAIN)
        self._flow_asks(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._flow_asks(control)

    def _flow_asks(self, control) -> None:
        """What the Trainer does next (`_maybe_log_save_evaluate`): evaluate, then save."""
        if getattr(control, "should_evaluate", False):
            self.phases.begin(EVAL)
        elif getattr(control, "should_save", False):
            self.phases.begin(CHECKPOINT)

    def on_evaluate(self, args, state, control, **kwargs):
        if not self.phases.is_open(EVAL):
            return
        self.phases.end(EVAL)
        if getattr(control, "should_save", False):
            self.phases.begin(CHECKPOINT)

    def on_save(self, args, state, control, **kwargs):
        self.phases.end(CHECKPOINT)

    def on_train_end(self, args, state, control, **kwargs):
        self.phases.close_all()
        self.recording.stop(0)


def __getattr__(name):
    if name == "AllocsimCallback":
        try:
            from transformers import TrainerCallback
        except ImportError:
            from ..errors import UsageError
            raise UsageError("AllocsimCallback needs transformers (pip install 'allocsim[hf]')") from None
        cls = type("AllocsimCallback", (HFPhases, TrainerCallback), {"__module__": __name__, "__doc__": __doc__})
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
