"""The trainers' callbacks (allocsim.integrations, docs/recording.md): on the CPU their hooks are driven with
stand-in trainers and a stand-in recorder, so the phase logic is tested here; where Lightning or transformers
is installed, the real callback classes are checked too (skipped elsewhere, with the reason)."""
from __future__ import annotations

import importlib.util
import types

import pytest

from allocsim.formats import recorders
from allocsim.formats.recorders import session
from allocsim.integrations import Phases, RunRecording
from allocsim.integrations.hf import HFPhases
from allocsim.integrations.lightning import LightningPhases
from allocsim.trace import events as ev


class ScopeLog:
    """A recorder that keeps the scopes written into it: ``(kind, label, serial)``."""

    def __init__(self, out="run.bin"):
        self.out, self.log, self.notes, self.serial = out, [], [], 0

    def scope_begin(self, kind, label):
        self.serial += 1
        self.log.append((kind, label, self.serial))
        return self.serial

    def scope_end(self, kind, label, serial):
        self.log.append((kind, label, serial))

    def note(self, text):
        self.notes.append(text)

    def phases(self) -> list[str]:
        """``+train``, ``-train``, ...; and asserts that every END closes the innermost open BEGIN."""
        open_, out = [], []
        for kind, label, serial in self.log:
            if kind == ev.PHASE_BEGIN:
                open_.append((label, serial))
                out.append("+" + label)
            else:
                assert kind == ev.PHASE_END and open_ and open_.pop() == (label, serial), self.log
                out.append("-" + label)
        assert not open_, f"left open: {open_}"
        return out


@pytest.fixture
def started(monkeypatch):
    """`start_recording` / `stop_recording` as stand-ins: the recorder is a `ScopeLog`; the calls are listed."""
    calls = []

    def start(path, framework=None, **options):
        calls.append(("start", path, framework, options))
        rec = ScopeLog(path)
        monkeypatch.setattr(recorders, "_active", rec)
        return rec

    def stop(status=0):
        calls.append(("stop", status))
        monkeypatch.setattr(recorders, "_active", None)
        return {}
    monkeypatch.setattr(session, "start_recording", start)
    monkeypatch.setattr(session, "stop_recording", stop)
    monkeypatch.setattr(recorders, "_active", None)
    return calls


class FakeTrainer:
    global_rank, world_size = 0, 1

    def __init__(self):
        self.saved = []

    def save_checkpoint(self, path, weights_only=False):
        self.saved.append(path)
        assert recorders._active.log[-1][:2] == (ev.PHASE_BEGIN, "checkpoint")     # saved inside its phase


def test_lightning_fit_phases_and_recording(started):
    cb, trainer = LightningPhases("run.bin", max_events=10), FakeTrainer()
    cb.setup(trainer, None, "fit")
    rec = recorders._active
    cb.on_validation_start(trainer, None)            # the sanity check
    cb.on_validation_end(trainer, None)
    for i in range(2):
        cb.on_train_batch_start(trainer, None, "batch", i)
        cb.on_train_batch_end(trainer, None, {}, "batch", i)
    cb.on_validation_start(trainer, None)
    cb.on_validation_end(trainer, None)
    trainer.save_checkpoint("epoch0.ckpt")             # as ModelCheckpoint does
    cb.teardown(trainer, None, "fit")
    assert started == [("start", "run.bin", "torch", {"max_events": 10}), ("stop", 0)]
    assert rec.phases() == ["+eval", "-eval", "+train", "-train", "+train", "-train", "+eval", "-eval",
                            "+checkpoint", "-checkpoint"]
    assert trainer.saved == ["epoch0.ckpt"] and "save_checkpoint" not in trainer.__dict__     # unwrapped


def test_lightning_rank_names_the_trace(started):
    trainer = FakeTrainer()
    trainer.global_rank, trainer.world_size = 1, 2
    LightningPhases("out/run.bin").setup(trainer, None, "fit")
    assert started[0][1] == "out/run.rank1.bin"


def test_lightning_exception_closes_the_open_phases(started):
    cb, trainer = LightningPhases("run.bin"), FakeTrainer()
    cb.setup(trainer, None, "fit")
    rec = recorders._active
    cb.on_train_batch_start(trainer, None, "batch", 0)
    cb.on_exception(trainer, None, RuntimeError("CUDA out of memory"))
    assert rec.phases() == ["+train", "-train"] and started[-1] == ("stop", 1)
    assert "save_checkpoint" not in trainer.__dict__


def test_only_phases_inside_a_recording_already_running(started, monkeypatch):
    """Under `allocsim record` (or the program's own recording) the callback starts and stops nothing."""
    running = ScopeLog()
    monkeypatch.setattr(recorders, "_active", running)
    cb, trainer = LightningPhases("run.bin"), FakeTrainer()
    cb.setup(trainer, None, "fit")
    cb.on_test_start(trainer, None)
    cb.on_test_end(trainer, None)
    cb.teardown(trainer, None, "fit")
    assert started == [] and running.phases() == ["+test", "-test"] and recorders._active is running


def test_no_recording_writes_nothing():
    p = Phases()
    p.begin("train")
    p.end("train")
    p.close_all()
    assert p.open == []


def test_a_skipped_end_keeps_the_scopes_nested(monkeypatch):
    rec = ScopeLog()
    monkeypatch.setattr(recorders, "_active", rec)
    p = Phases()
    p.begin("train")
    p.begin("eval")             # its end never comes
    p.end("train")
    p.end("eval")               # nothing open of that label: nothing written
    assert rec.phases() == ["+train", "+eval", "-eval", "-train"]


def _control(evaluate=False, save=False):
    return types.SimpleNamespace(should_evaluate=evaluate, should_save=save)


def test_hf_phases_follow_the_trainers_flow(started):
    cb = HFPhases("run.bin")           # recording starts with the callback, before Trainer(...) moves the model
    rec = recorders._active
    args = state = None
    cb.on_step_begin(args, state, _control())
    cb.on_step_begin(args, state, _control())       # a second micro-batch of one accumulation: one phase
    cb.on_step_end(args, state, _control(evaluate=True, save=True))
    cb.on_evaluate(args, state, _control(evaluate=True, save=True), metrics={})
    cb.on_save(args, state, _control(save=True))
    cb.on_step_begin(args, state, _control())
    cb.on_step_end(args, state, _control(save=True))
    cb.on_save(args, state, _control(save=True))
    cb.on_step_begin(args, state, _control())
    cb.on_step_end(args, state, _control())
    cb.on_epoch_end(args, state, _control(evaluate=True))
    cb.on_evaluate(args, state, _control(evaluate=True))
    cb.on_evaluate(args, state, _control())          # a trainer.evaluate() of its own: no begin, not marked
    cb.on_train_end(args, state, _control())
    assert rec.phases() == ["+train", "-train", "+eval", "-eval", "+checkpoint", "-checkpoint",
                            "+train", "-train", "+checkpoint", "-checkpoint", "+train", "-train", "+eval", "-eval"]
    assert started[-1] == ("stop", 0)


def test_hf_rank_from_the_launchers_environment(started, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    HFPhases("run.bin")
    assert started[0][1] == "run.rank3.bin"


def test_run_recording_started_elsewhere_is_not_stopped(started, monkeypatch):
    r = RunRecording(None)
    r.start()
    assert started == [] and r.stop() is None


@pytest.mark.skipif(not (importlib.util.find_spec("lightning") or importlib.util.find_spec("pytorch_lightning")),
                    reason="PyTorch Lightning is not installed here (benchmarks/gpu_trainers.sh runs it)")
def test_real_lightning_callback_class():
    from allocsim.integrations.lightning import AllocsimCallback, _callback_base
    cb = AllocsimCallback(None)
    assert isinstance(cb, _callback_base()) and isinstance(cb, LightningPhases)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed here (benchmarks/gpu_trainers.sh runs it)")
def test_real_hf_callback_class():
    from transformers import TrainerCallback
    from allocsim.integrations.hf import AllocsimCallback
    cb = AllocsimCallback(None)
    assert isinstance(cb, TrainerCallback) and isinstance(cb, HFPhases)
