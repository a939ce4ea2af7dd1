"""`allocsim validate`: self-consistency, a perturbed trace, a hand-written one, bad input."""
from __future__ import annotations

import json
import random

import pytest

from allocsim.engine.replay import Replay
from allocsim.cli import main
from allocsim.errors import InputError
from allocsim.trace import TraceWriter
from allocsim.trace import events as ev
from allocsim.search.validate import validate
from allocsim.report.text import validation_summary

MiB = 1 << 20


def workload(seed=0, n_iter=6, streams=(0, 1)):
    rnd = random.Random(seed)
    w = TraceWriter(meta={"framework": "torch", "device": {"total_memory": 16 << 30}})
    sizes = [rnd.choice([rnd.randint(1, 2000) * 512, rnd.randint(1, 40) * MiB + rnd.randint(0, 9999)])
             for _ in range(30)]
    for it in range(n_iter):
        live = []
        for s in sizes:
            live.append(w.alloc(s, rnd.choice(streams)))
            if rnd.random() < 0.3:
                w.free(live.pop(rnd.randrange(len(live))))
        for i in live:
            w.free(i)
        w.mark(f"iter {it}")
    return w.finish()


def with_model_segments(trace, conf="", perturb=None):
    """``trace`` with the torch model's own segment calls written in, each before its ALLOC."""
    r = Replay(trace, "torch", options=[conf] if conf else [], keep_going=True, log_events=True)
    r.run()
    log = list(r.segment_log)
    if perturb is not None:
        k, s, e = log[perturb]
        log[perturb] = (k, s + 2 * MiB, e)
    before = {}
    for k, s, e in log:
        before.setdefault(e, []).append((k, s))
    w = TraceWriter(meta=dict(trace.meta, allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": conf}))
    for i, (kind, _, stream, id_, _, aux, size, _, _) in enumerate(trace.records.tolist()):
        for k, s in before.get(i, ()):
            w.segment(k, 0, s, trace.streams[stream])
        if kind == ev.ALLOC:
            w.alloc(size, trace.streams[stream])
        elif kind == ev.FREE:
            w.free(id_)
        elif kind == ev.MARK:
            w.mark(trace.labels[aux])
    return w.finish(), log


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:24"])
def test_self_consistent_trace_matches(conf):
    t, log = with_model_segments(workload(), conf)
    v = validate(t)
    assert v.match, validation_summary(v)
    assert v.recorded_events == len(log) > 3 and v.first_divergence is None
    assert (conf == "expandable_segments:True") == all(k == ev.SEGMENT_MAP for k, _, _ in log)


def test_perturbed_trace_reports_first_divergence():
    t, log = with_model_segments(workload(), perturb=3)
    v = validate(t)
    assert not v.match
    d = v.first_divergence
    assert d["index"] == 3
    assert d["recorded"]["size"] == log[3][1] and d["model"]["size"] == log[3][1] - 2 * MiB
    grown = sum(s for _, s, _ in log[:3])      # no frees in this workload before the 4th segment
    assert d["recorded"]["reserved_before"] == d["model"]["reserved_before"] == grown
    # the recorded segment event sits right before the ALLOC that caused it, which is the model's event
    assert t.kind[d["recorded"]["event"]] == ev.SEGMENT_ALLOC
    assert d["model"]["event"] == d["recorded"]["event"] + 1 and t.kind[d["model"]["event"]] == ev.ALLOC
    names = {c["name"]: c["ok"] for c in v.checks}
    assert names["segment allocs"] and not names["same calls, same requests"] and not names["peak reserved"]


def test_a_trace_of_segments_and_no_request_is_told_not_a_traceback():
    """Segment events with no ALLOC after them: each is for no request (``request_of`` indexed an empty array), and
    the summary says so rather than print the placeholder -1."""
    w = TraceWriter(meta={"framework": "torch"})
    w.segment(ev.SEGMENT_ALLOC, 0x1000, 2 * MiB)
    v = validate(w.finish())
    assert not v.match and v.first_divergence["recorded"]["request"] == -1
    text = validation_summary(v)
    assert "(no later ALLOC)" in text and "ALLOC at -1" not in text


def test_hand_written_recording():
    """What PyTorch writes for 1 MiB, 3 MiB and 3 MiB requests: a 2 MiB and a 20 MiB segment."""
    w = TraceWriter(meta={"framework": "torch"})
    w.segment(ev.SEGMENT_ALLOC, 0x1000, 2 * MiB)
    w.alloc(MiB)
    w.segment(ev.SEGMENT_ALLOC, 0x300000, 20 * MiB)
    w.alloc(3 * MiB)
    w.alloc(3 * MiB)
    t = w.finish()
    assert validate(t).match
    w2 = TraceWriter(meta={"framework": "torch"})
    w2.segment(ev.SEGMENT_ALLOC, 0x1000, 2 * MiB)
    w2.alloc(MiB)
    w2.segment(ev.SEGMENT_ALLOC, 0x300000, 4 * MiB)     # wrong: PyTorch takes 20 MiB for 1-10 MiB
    w2.alloc(3 * MiB)
    v = validate(w2.finish())
    assert not v.match and v.first_divergence["index"] == 1
    assert v.first_divergence["model"]["event"] == 3


def test_every_row_of_the_check_table_stands_in_its_columns():
    """The figures of every check, the longest name's (``same calls, same requests``) included, end where their
    heading does: that row stood three characters right of the others."""
    w = TraceWriter(meta={"framework": "torch"})
    w.segment(ev.SEGMENT_ALLOC, 0x1000, 2 * MiB)
    w.alloc(MiB)
    v = validate(w.finish())
    lines = validation_summary(v).splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:3] == ["check", "recorded", "model"])
    head, rows = lines[at], lines[at + 1:at + 1 + len(v.checks)]
    assert [r.split("  ")[1] for r in rows] == [c["name"] for c in v.checks]
    for end in (head.index("recorded") + len("recorded"), head.index("model") + len("model")):
        assert all(r[end - 1] != " " and r[end] == " " for r in rows), "\n".join([head, *rows])


def cupy_recording(producer: str):
    """What CuPy's pool does for a 1,000-byte request and a 3 MiB one, both held to the end: two segments, none
    released; ``producer`` says who wrote the trace."""
    w = TraceWriter(meta={"framework": "cupy", "producer": producer})
    w.segment(ev.SEGMENT_ALLOC, 0x1000, 1024)
    w.alloc(1000)
    w.segment(ev.SEGMENT_ALLOC, 0x200000, 3 * MiB)
    w.alloc(3 * MiB)
    return w.finish()


def test_a_cupy_recording_that_released_nothing_still_has_its_reserved_bytes_checked():
    """`allocsim record` sees every segment CuPy's pool releases (formats/recorders/cupy.py), so a recording that
    holds none released none, and its reserved bytes are known and checked; an imported DebugPrintHook log cannot
    see a release, so its reserved bytes are not."""
    v = validate(cupy_recording("allocsim 0.1.0 record"))
    checks = {c["name"]: c for c in v.checks}
    assert v.match and ev.SEGMENT_FREE in v.kinds_compared
    assert checks["peak reserved"]["recorded"] == checks["final reserved"]["model"] == 1024 + 3 * MiB
    imported = validate(cupy_recording("allocsim import"))
    assert imported.match and ev.SEGMENT_FREE not in imported.kinds_compared
    assert not {"peak reserved", "final reserved"} & {c["name"] for c in imported.checks}


def test_cli_exit_status_and_json(tmp_path, capsys):
    good, _ = with_model_segments(workload(n_iter=2))
    bad, _ = with_model_segments(workload(n_iter=2), perturb=0)
    good.save(str(tmp_path / "good.bin"))
    bad.save(str(tmp_path / "bad.bin"))
    assert main(["validate", str(tmp_path / "good.bin")]) == 0
    assert "verdict: MATCH" in capsys.readouterr().out
    assert main(["validate", str(tmp_path / "bad.bin"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["match"] is False and out["first_divergence"]["index"] == 0


def test_bad_inputs(tmp_path, capsys):
    plain = workload(n_iter=1)
    with pytest.raises(InputError, match="no upstream segment events"):
        validate(plain)
    w = TraceWriter(meta={"framework": "julia"})
    w.alloc(10)
    p = tmp_path / "julia.bin"
    w.finish().save(str(p))
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert "julia" in err and str(p) in err and "Traceback" not in err
