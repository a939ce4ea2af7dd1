"""compare / fit / sweep: tables equal single replays; fit is exact and monotone; executors agree."""
import json
import os
import re
import shutil

import pytest

from allocsim import policies
from allocsim.engine.replay import replay
from allocsim.search.fit import fit_capacity
from allocsim.search.sweep import COLUMNS, Cell, Settings, run_cells
from allocsim.trace import TraceWriter

from conftest import ROOT, random_trace, run_cli

SIM = [n for n in policies.names() if not policies.get(n).real_gpu]
ONLINE = [n for n in SIM if n != "oracle"]


def test_compare_rows_equal_single_replays(small_trace_path):
    pols = [p for p in ("none", "split", "bestfit", "binned") if p in SIM]
    cells = [Cell(small_trace_path, p, cap, rt) for p in pols for cap in (None, 40 << 20) for rt in ("eager", "gc")]
    rows = run_cells(cells, Settings(), jobs=2)
    assert len(rows) == len(cells)
    for row in rows:
        single = replay(small_trace_path, row["policy"], cap=row["cap_bytes"], runtime=row["runtime"]).to_dict()
        for k in COLUMNS:
            if k in single and k not in ("replay_seconds", "options", "trace"):
                assert row[k] == single[k], (row["policy"], k)


def test_compare_cli_json_matches_replay_cli(small_trace_path):
    out = run_cli("compare", small_trace_path, "--policies", "none", "--caps", "none,30MB", "-j", "1", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["cap_bytes"] for r in rows] == [None, 30_000_000]
    for r in rows:
        args = ["replay", small_trace_path, "--policy", "none", "--json"]
        if r["cap_bytes"]:
            args += ["--cap", str(r["cap_bytes"])]
        single = json.loads(run_cli(*args).stdout)
        for k in ("peak_reserved_bytes", "device_mallocs", "gc_incremental", "gc_full", "ooms", "utilization"):
            assert r[k] == single[k], k


def _known_trace():
    """LOAD = 350 bytes; the `none` policy needs exactly LOAD."""
    w = TraceWriter()
    a = w.alloc(100)
    b = w.alloc(200)
    w.free(a)
    c = w.alloc(150)
    w.free(b)
    w.free(c)
    return w.finish()


def test_fit_exact_on_known_answer(tmp_path):
    p = str(tmp_path / "k.bin")
    _known_trace().save(p)
    f = fit_capacity(p, "none", resolution=1)
    assert f["load_bytes"] == 350
    assert f["capacity_bytes"] == 350


@pytest.mark.parametrize("policy", ONLINE)
def test_fit_frontier_is_tight(tmp_path, policy):
    """At the answer the replay succeeds; one resolution step below it fails."""
    p = str(tmp_path / "r.bin")
    random_trace(600, seed=5, max_size=1 << 21).save(p)
    res = 1 << 16
    f = fit_capacity(p, policy, resolution=res)
    assert f["capacity_bytes"] >= f["load_bytes"]
    ok = replay(p, policy, capacity=f["capacity_bytes"])
    assert ok.ooms == 0
    if f["capacity_bytes"] - res >= f["load_bytes"]:
        bad = replay(p, policy, capacity=f["capacity_bytes"] - res)
        assert bad.ooms >= 1 or f["capacity_bytes"] - res < f["load_bytes"]


def test_fit_cli(small_trace_path):
    out = run_cli("fit", small_trace_path, "--policies", "none", "--json", "-j", "1", "--no-oracle")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["fits"][0]["capacity_bytes"] - res["load_bytes"] <= 1 << 20


def test_sweep_dask_equals_local(tmp_path, small_trace_path):
    pytest.importorskip("distributed")
    local, dask = str(tmp_path / "local.jsonl"), str(tmp_path / "dask.jsonl")
    args = ["--policies", "none", "--caps", "none,30MB", "--runtime", "eager,gc", "-q"]
    assert run_cli("sweep", small_trace_path, *args, "-o", local, "-j", "2").returncode == 0
    out = run_cli("sweep", small_trace_path, *args, "-o", dask, "--dask-local", "2")
    assert out.returncode == 0, out.stderr
    a = [json.loads(l) for l in open(local)]
    b = [json.loads(l) for l in open(dask)]
    assert len(a) == 4 and a == b


def test_sweep_resumes_and_drops_torn_line(tmp_path, small_trace_path):
    out = str(tmp_path / "s.csv")
    args = ["sweep", small_trace_path, "--policies", "none", "--caps", "none,30MB,60MB", "-o", out, "-j", "1", "-q"]
    assert run_cli(*args).returncode == 0
    full = open(out).read()
    os.unlink(out)
    # an interrupted sweep: one finished row and a torn second line
    from allocsim.commands.sweep import PARTIAL_MARK, _inputs_stamp, shared_key
    cell = Cell(small_trace_path, "none", None, "eager", (), "trace")
    row = run_cells([cell], Settings())[0]
    row.pop("replay_seconds")
    with open(out + ".partial", "w") as f:
        f.write(PARTIAL_MARK.decode() + json.dumps(dict(row, cell=cell.key(), shared=shared_key(Settings()),
                                trace_bytes=os.path.getsize(small_trace_path), inputs_stamp=_inputs_stamp(cell)))
                + "\n" + '{"trace": "tor')
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    assert "1 of 3 cells already done" in res.stderr
    assert open(out).read() == full
    assert not os.path.exists(out + ".partial")


def test_a_sweep_resumes_no_row_of_a_trace_made_again_at_the_same_size(tmp_path, small_trace_path):
    """A partial table's row stands for its cell while the trace is the file it was replayed from: the same bytes
    written again later (a trace recorded again, whatever its size) are replayed again, not resumed."""
    from allocsim.commands.sweep import PARTIAL_MARK, _inputs_stamp, _still_done, shared_key
    trace = str(tmp_path / "t.bin")
    shutil.copy(small_trace_path, trace)
    cell = Cell(trace, "none", None, "eager", (), "trace")
    row = dict(run_cells([cell], Settings())[0], trace_bytes=os.path.getsize(trace), inputs_stamp=_inputs_stamp(cell))
    assert _still_done(row, cell)
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))     # written again: same size, later
    assert not _still_done(row, cell)
    assert not _still_done(dict(row, inputs_stamp=None), Cell(small_trace_path, "none", None, "eager", (), "trace"))
    out = str(tmp_path / "s.csv")
    with open(out + ".partial", "w") as f:
        f.write(PARTIAL_MARK.decode() + json.dumps(dict(row, cell=cell.key(), shared=shared_key(Settings()))) + "\n")
    res = run_cli("sweep", trace, "--policies", "none", "-o", out, "-j", "1", "-q")
    assert res.returncode == 0, res.stderr
    assert "already done" not in res.stderr


def test_fit_rejects_a_zero_resolution(small_trace_path):
    out = run_cli("fit", small_trace_path, "--policies", "none", "--resolution", "0")
    assert out.returncode == 2 and "at least 1 byte" in out.stderr and out.stderr.count("\n") == 1


def test_cached_trace_keeps_the_last_few_and_reloads_a_changed_file(tmp_path):
    """A worker keeps `TRACES_KEPT` traces for its next cells, no more, and never a stale one."""
    from allocsim.search import sweep
    from conftest import random_trace
    paths = []
    for k in range(sweep.TRACES_KEPT + 1):
        paths.append(str(tmp_path / f"t{k}.bin"))
        random_trace(50 + k, seed=k).save(paths[-1])
    first = sweep.cached_trace(paths[0])
    assert sweep.cached_trace(paths[0]) is first
    for p in paths[1:]:
        sweep.cached_trace(p)
    assert len(sweep._loaded) == sweep.TRACES_KEPT
    assert sweep.cached_trace(paths[0]) is not first            # evicted as the least recently used
    random_trace(400, seed=9).save(paths[1])                    # replaced on disk: read again
    assert len(sweep.cached_trace(paths[1])) == len(random_trace(400, seed=9))


def test_a_pool_starts_the_longest_replays_first():
    """`longest_first`: the larger trace's cells first (its replays are the longest), each trace's cells in
    their order."""
    from allocsim.search.sweep import longest_first
    small, large = (os.path.join(ROOT, "traces", n) for n in ("cupy_mlp.bin", "gpt2.bin"))
    cells = [Cell(t, p) for t in (small, large) for p in ("split", "torch")]
    assert longest_first(cells) == cells[2:] + cells[:2]


def test_run_cells_rows_come_sorted_by_cell_whatever_the_order_given(small_trace_path, tmp_path):
    """`run_cells` returns its rows in `Cell.sort_key` order (trace, policy, cap with none first, runtime), the
    order compare's table shows, from cells given in another order, in one process or a pool."""
    import shutil
    a, b = str(tmp_path / "a.bin"), str(tmp_path / "b.bin")
    shutil.copy(small_trace_path, a)
    shutil.copy(small_trace_path, b)
    cells = [Cell(t, p, cap, rt) for t in (b, a) for p in ("split", "none") for cap in (40 << 20, None)
             for rt in ("gc", "eager")]
    want = [(os.path.basename(c.trace), c.policy.name, c.cap, c.runtime) for c in sorted(cells, key=Cell.sort_key)]
    assert want != [(os.path.basename(c.trace), c.policy.name, c.cap, c.runtime) for c in cells]
    for jobs in (1, 2):
        rows = run_cells(cells, Settings(), jobs=jobs)
        assert [(os.path.basename(r["trace"]), r["policy"], r["cap_bytes"], r["runtime"]) for r in rows] == want


def test_sweep_replays_again_a_trace_recorded_again(tmp_path):
    """A stopped sweep resumed after its trace was written again under the same name (another recording) replays
    that trace's cells again: its old rows, of another file, are not the table's."""
    trace, out = str(tmp_path / "t.bin"), str(tmp_path / "s.csv")
    random_trace(200, seed=1).save(trace)
    args = ["sweep", trace, "--policies", "none,split", "-o", out, "-j", "1", "-q"]
    assert run_cli(*args).returncode == 0
    first = open(out).read()
    os.unlink(out)
    from allocsim.commands.sweep import PARTIAL_MARK, shared_key
    cell = Cell(trace, "none", None, "eager", (), "trace")
    row = {k: v for k, v in run_cells([cell], Settings())[0].items() if k != "replay_seconds"}
    with open(out + ".partial", "w") as f:          # stopped after one cell of the first recording
        f.write(PARTIAL_MARK.decode() + json.dumps(dict(row, cell=cell.key(), shared=shared_key(Settings()),
                                trace_bytes=os.path.getsize(trace))) + "\n")
    random_trace(300, seed=2).save(trace)           # recorded again
    res = run_cli(*args)
    assert res.returncode == 0 and "already done" not in res.stderr, res.stderr
    again = open(out).read()
    assert again != first
    os.unlink(out)
    assert run_cli(*args).returncode == 0 and open(out).read() == again      # what a fresh sweep writes


def test_every_column_of_a_sweeps_row_has_a_kind_its_resume_checks():
    """A resumed partial table's rows are checked column by column (`commands.sweep._wrong_value`): a column added
    to the rows must be given its kind there, else a hand-edited value in it would go into the result unchecked."""
    from allocsim.commands import sweep as sweep_command
    kinds = [sweep_command._TEXT, sweep_command._WHOLE, sweep_command._FRACTIONAL, {"completed", "breakdown_at_peak"}]
    for column in sweep_command._ROW_KEYS:
        assert sum(column in kind for kind in kinds) == 1, column


def test_a_scheduler_that_cannot_be_reached_is_one_line_naming_the_option(monkeypatch):
    """dask's own line ("Timed out trying to connect to ...") named no option: the command's says which."""
    pytest.importorskip("dask.distributed", reason="Dask is an optional extra")
    import dask.distributed

    from allocsim.errors import UsageError
    from allocsim.search.sweep import dask_executor

    def unreachable(address, **kw):
        raise OSError(f"Timed out trying to connect to {address} after 30 s")
    monkeypatch.setattr(dask.distributed, "Client", unreachable)
    with pytest.raises(UsageError, match=r"--scheduler tcp://127.0.0.1:1: cannot connect: Timed out"):
        dask_executor("tcp://127.0.0.1:1")


def test_compare_says_once_that_torch_starts_from_the_recorded_settings(capsys):
    """A trace recorded under other allocator settings replays ``torch`` under them (9.46 GiB here, 8.73 GiB with
    trace_settings:False): compare's plain ``torch`` label hid it, where replay's header lists them. Said once, and
    only where a row reads them and they are not the defaults."""
    from allocsim.cli import main
    from allocsim.commands._common import recorded_settings
    from allocsim.engine.spec import PolicySpec
    from allocsim.trace import Trace
    path = os.path.join(ROOT, "traces", "gpt2-maxsplit128-rp2div4.bin")
    assert main(["compare", path, "-p", "torch,torch[trace_settings:False]", "-q"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("torch: the recording's allocator settings (max_split_size_mb:128,roundup_power2_divisions:4) "
                      "unless trace_settings:False")
    assert sum("allocator settings" in line for line in out) == 1
    specs = {PolicySpec.parse(p) for p in ("torch[trace_settings:False]", "split")}
    assert recorded_settings(specs, Trace.load(path)) is None
    assert recorded_settings({PolicySpec.parse("torch")}, Trace.load(os.path.join(ROOT, "traces", "gpt2.bin"))) is None


def test_compare_labels_a_cap_as_the_user_wrote_it(small_trace_path, capsys):
    """``--caps 40MB`` was labelled ``38.15 MiB``, where plot's pictures and index.html say ``40MB (38.15 MiB)``: one
    spelling for one cap, in the table and in --breakdown's (`cap_spelling`)."""
    from allocsim.cli import main
    assert main(["compare", small_trace_path, "-p", "none", "--caps", "none,40MB,32MiB", "-q", "--breakdown"]) == 0
    tables = capsys.readouterr().out.split("reserved - live requested bytes")
    for table in tables:
        caps = [re.split(r"\s{2,}", line)[1] for line in table.splitlines() if line.startswith("none ")]
        assert caps == ["none", "32MiB", "40MB (38.15 MiB)"], table


def test_fit_says_once_that_torch_starts_from_the_recorded_settings(capsys):
    """fit's plain ``torch`` label hid the trace's recorded allocator settings (its safe capacity 8.79 GiB under
    them, 8.72 GiB with trace_settings:False): it says them once under its heading, as compare does."""
    from allocsim.cli import main
    path = os.path.join(ROOT, "traces", "gpt2-maxsplit128-rp2div4.bin")
    assert main(["fit", path, "-p", "torch,torch[trace_settings:False]", "-q", "--no-oracle"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("torch: the recording's allocator settings (max_split_size_mb:128,roundup_power2_divisions:4) "
                      "unless trace_settings:False")
    assert sum("allocator settings" in line for line in out) == 1
    assert main(["fit", path, "-p", "torch[trace_settings:False]", "-q", "--no-oracle"]) == 0
    assert "allocator settings" not in capsys.readouterr().out
