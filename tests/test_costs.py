"""The cost model's device sync: every cudaFree is charged the wait it implies (`free_sync_s`), and nothing
but the modeled times moves with it."""
import json

import pytest

from allocsim.machine.costs import CostModel
from allocsim.errors import InputError
from allocsim.engine.replay import replay
from allocsim.trace import TraceWriter

MiB = 1 << 20


def growing_trace():
    """Requests of 100, 101, ... 127 MiB, each freed before the next: on a 130 MiB device the defaults release
    their cache (one cudaFree a segment) at almost every request."""
    w = TraceWriter(meta={"framework": "torch", "device": {"name": "test", "total_memory": 130 * MiB}})
    for t, n in enumerate(range(100, 128)):
        w.free(w.alloc(n * MiB, t=2 * t), t=2 * t + 1)
    return w.finish()


def test_each_cudafree_is_charged_its_sync():
    trace = growing_trace()
    without = replay(trace, "torch", costs=CostModel(free_sync_s=0.0)).to_dict()
    charged = replay(trace, "torch", costs=CostModel(free_sync_s=1e-3)).to_dict()
    assert charged["device_frees"] > 10
    added = charged["device_time_seconds"] - without["device_time_seconds"]
    assert added == pytest.approx(charged["device_frees"] * 1e-3)
    assert charged["total_time_seconds"] - without["total_time_seconds"] == pytest.approx(added)
    for k in ("peak_reserved_bytes", "device_mallocs", "device_frees", "ooms", "allocs", "frees"):
        assert charged[k] == without[k], k


def test_device_time_is_the_device_calls_share():
    res = replay(growing_trace(), "torch").to_dict()
    assert 0 < res["device_time_seconds"] <= res["total_time_seconds"]
    m = CostModel()
    assert m.free_cost(512) == m.free_points[0][1] + m.free_sync_s
    assert m.free_cost(4 << 30) == pytest.approx(m.free_points[-1][1] + m.free_sync_s)


def test_a_negative_sync_is_one_clear_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"free_sync_s": -1}))
    with pytest.raises(InputError, match="free_sync_s"):
        CostModel.load(str(path))
    path.write_text(json.dumps({"free_sync_s": 5e-4}))
    assert CostModel.load(str(path)).free_sync_s == 5e-4


def test_a_cost_model_is_hashable_by_value_so_fit_and_tune_take_one(tmp_path, capsys, monkeypatch):
    """Replay settings key `fit`'s trails (a dict): with ``--cost-model`` they held an unhashable model and `fit`,
    `tune`'s capacity walk and `plot --kind frontier` failed with a TypeError. Equal models hash alike; a model
    that differs in a point is another key."""
    from allocsim.cli import main
    from allocsim.engine.replay import ReplaySettings
    a, b = CostModel(), CostModel()
    assert a == b and hash(a) == hash(b)
    c = CostModel(malloc_points=[[512, 34e-6], [4 << 30, 491e-6]])
    assert c != a and {ReplaySettings(costs=a): 1}.get(ReplaySettings(costs=b)) == 1
    assert ReplaySettings(costs=c) not in {ReplaySettings(costs=a)}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"pool_hit_s": 2e-6}))
    trace = tmp_path / "t.bin"
    w = TraceWriter()
    for k in range(40):
        i = w.alloc((k % 5 + 1) << 20)
        w.free(i)
    w.finish().save(str(trace))
    from allocsim.search import fit
    monkeypatch.setattr(fit, "TRAIL_LEAST", 10)     # (a trail, keyed by the settings, for this short trace too)
    assert main(["fit", str(trace), "-p", "torch", "-j", "1", "-q", "--cost-model", str(path)]) == 0
    assert "safe capacity" in capsys.readouterr().out
