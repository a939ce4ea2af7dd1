"""The recorder's converter infers the cache releases nobody wrote (`EntryConverter`'s ``infer_releases``;
docs/importers.md, "Cache releases"): an ``emptyCache()`` made in C++ (cuDNN's benchmark mode, once per plan
search) never passes the Python wrapper, so a recording showed segment frees the torch model does not make and did
not validate. On hand-written entry lists (each expectation from CUDACachingAllocator.cpp's paths: a release frees
every segment holding no live block; the OOM path's release ends in an ``oom``; a retry's release is followed by
the segment it was made for, which did not fit before it; a GC or ``max_split_size_mb`` release frees only some), a
property (the same history fed in any chunks gives the same trace), the recorder end to end (the stand-in torch),
and the shipped recordings, whose entries converted again (`converted_again`) give back the same trace."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.formats.importers.torch_snapshot import EntryConverter, converted_again
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev
from allocsim.search.validate import validate

from conftest import ROOT
from test_recording import _run

MiB = 1 << 20
SEG = 20 * MiB
A, B, C = 0x10000000, 0x20000000, 0x30000000       # segment bases


def e(action, addr, size=SEG, **kw):
    return {"action": action, "addr": addr, "size": size, "stream": 0, **kw}


def converted(*chunks, limit=None, gc=False, private=(), between=None) -> list[str]:
    """The kinds of the trace the recorder's converter writes from ``chunks`` (``between(conv, k)``: the
    recorder's own calls before chunk k)."""
    w = TraceWriter({"framework": "torch", "device": {"total_memory": 80 << 30}})
    conv = EntryConverter(w, infer_releases=True, limit=limit, gc_threshold=gc)
    conv.private = set(private)
    for k, chunk in enumerate(chunks):
        if between is not None:
            between(conv, k)
        conv.feed(chunk)
    t = w.finish()
    return [ev.KIND_NAMES[int(k)] for k in t.kind]


#: Two segments, a block in each, both freed: then both segments hold nothing.
TWO_EMPTY = [e("segment_alloc", A), e("alloc", A, MiB), e("segment_alloc", B), e("alloc", B, MiB),
             e("free_completed", A, MiB), e("free_completed", B, MiB)]


def test_a_run_freeing_every_empty_segment_unexplained_is_a_release():
    """cuDNN's emptyCache(): both empty segments freed, then the workspace request's new segment."""
    kinds = converted(TWO_EMPTY + [e("segment_free", A), e("segment_free", B), e("segment_alloc", C),
                                   e("alloc", C, 5 * MiB)])
    assert kinds[6:] == ["CACHE_RELEASE", "SEGMENT_FREE", "SEGMENT_FREE", "SEGMENT_ALLOC", "ALLOC"]


def test_the_oom_paths_release_is_not_the_programs():
    kinds = converted(TWO_EMPTY + [e("segment_free", A), e("segment_free", B), e("oom", 0, 90 * SEG)])
    assert "CACHE_RELEASE" not in kinds


def test_a_partial_release_is_the_allocators_own():
    """The GC threshold's or max_split_size_mb's release frees some of the empty segments, never all."""
    kinds = converted(TWO_EMPTY + [e("segment_free", A), e("alloc", B, MiB)])
    assert "CACHE_RELEASE" not in kinds


def test_a_retry_under_the_limit_is_the_allocators_own_and_one_that_fit_is_not():
    """A run followed by a segment that did not fit beside what was reserved before it: the release-and-retry of
    that malloc. One that fitted was no retry (the allocator frees nothing before a cudaMalloc that succeeds)."""
    run = TWO_EMPTY + [e("segment_free", A), e("segment_free", B), e("segment_alloc", C, 3 * SEG)]
    assert "CACHE_RELEASE" not in converted(run, limit=4 * SEG)
    assert "CACHE_RELEASE" in converted(run, limit=5 * SEG)


def test_with_a_gc_threshold_a_run_before_a_segment_is_the_collection():
    run = TWO_EMPTY + [e("segment_free", A), e("segment_free", B), e("segment_alloc", C)]
    assert "CACHE_RELEASE" not in converted(run, gc=True)


def test_the_programs_own_empty_cache_is_written_once():
    """torch.cuda.empty_cache() is written by the recorder where it is called (`cache_release`); the frees it
    causes are not inferred again. A later unexplained run still is."""
    def between(conv, k):
        if k == 1:
            conv.cache_release()
    kinds = converted(TWO_EMPTY, [e("segment_free", A), e("segment_free", B)],
                      [e("segment_alloc", A), e("alloc", A, MiB), e("free_completed", A, MiB), e("segment_free", A)],
                      between=between)
    assert kinds.count("CACHE_RELEASE") == 2
    assert kinds[6:9] == ["CACHE_RELEASE", "SEGMENT_FREE", "SEGMENT_FREE"]
    assert kinds[-2:] == ["CACHE_RELEASE", "SEGMENT_FREE"]


def test_a_mempools_own_release_is_not_the_programs():
    """A deleted MemPool empties its own pool (its POOL_RELEASE is written after): segments of private pools only."""
    kinds = converted([e("segment_alloc", A), e("alloc", A, MiB), e("segment_alloc", B), e("alloc", B, MiB),
                       e("free_completed", B, MiB), e("segment_free", B)], private={B})
    assert "CACHE_RELEASE" not in kinds


def test_a_live_block_keeps_its_segment_out_of_what_a_release_must_free():
    kinds = converted([e("segment_alloc", A), e("alloc", A, MiB), *TWO_EMPTY[2:4], e("free_completed", B, MiB),
                       e("segment_free", B)])
    assert kinds[-2:] == ["CACHE_RELEASE", "SEGMENT_FREE"]


HISTORY = TWO_EMPTY + [e("segment_free", A), e("segment_free", B), e("segment_alloc", C), e("alloc", C, MiB),
                       e("segment_alloc", A), e("alloc", A, MiB), e("free_completed", C, MiB), e("segment_free", C),
                       e("alloc", A + MiB, MiB), e("free_completed", A, MiB), e("free_completed", A + MiB, MiB),
                       e("segment_free", A), e("oom", 0, 90 * SEG)]


#: Where a drain may fall: between two malloc/free calls, never inside a run of segment frees or between one and
#: the entry of the same malloc after it.
DRAINS = [p for p in range(1, len(HISTORY)) if HISTORY[p - 1]["action"] not in ("segment_free", "segment_unmap")]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(DRAINS), max_size=6))
def test_chunks_do_not_change_what_is_inferred(cuts):
    """A history cut at any drain gives the trace it gives in one piece."""
    cuts = sorted(set(cuts))
    chunks = [HISTORY[a:b] for a, b in zip([0, *cuts], [*cuts, len(HISTORY)])]
    assert converted(*chunks) == converted(HISTORY)


def test_a_recording_carries_the_releases_made_in_cxx(tmp_path):
    """End to end through the recorder (the stand-in torch): a segment cached before recording began (the trace's
    initial segment, seeded as the converter's state) and one freed inside it, both freed by a C++ emptyCache()."""
    r = _run(tmp_path, """
        cached = torch.cuda.fake_alloc(2 << 20)
        torch.cuda.fake_free(cached, 2 << 20)
        weights = torch.cuda.fake_alloc(6 << 20)
        with allocsim.recording(OUT):
            act = torch.cuda.fake_alloc(4 << 20)
            torch.cuda.fake_free(act, 4 << 20)
            torch.cuda.fake_cxx_empty_cache()
            torch.cuda.fake_alloc(4 << 20)
    """)
    assert r.returncode == 0, r.stderr
    t = Trace.load(str(tmp_path / "run.bin"))
    kinds = [ev.KIND_NAMES[int(k)] for k in t.kind]
    assert kinds[-5:] == ["CACHE_RELEASE", "SEGMENT_FREE", "SEGMENT_FREE", "SEGMENT_ALLOC", "ALLOC"]
    assert json.load(open(tmp_path / "run.bin.stats.json"))["cache_releases_inferred"] == 1


# ---- the shipped recordings, their entries converted again -------------------------------------------------------
@pytest.mark.parametrize("name", ["pressure-fraction-retry.bin", "pressure-empty-cache.bin",
                                  "pressure-gc-threshold.bin", "pools-mempool.bin", "pools-compile.bin"])
def test_a_shipped_recording_converted_again_is_the_same_trace(tmp_path, name):
    """A release-and-retry under a fraction, the program's own empty_cache(), a GC threshold's collections, a
    deleted MemPool, graph trees: every segment free is explained already, and `converted_again` gives back the
    recording record for record."""
    path, out = os.path.join(ROOT, "traces", name), str(tmp_path / name)
    assert converted_again(path, out) == 0
    before, after = Trace.load(path).records, Trace.load(out).records
    assert len(before) == len(after) and all(np.array_equal(before[f], after[f]) for f in before.dtype.names)


def test_the_cudnn_benchmark_recording_validates_and_its_releases_are_the_rule(tmp_path):
    """traces/cudnn-benchmark-resnet50.bin (ResNet-50, cudnn.benchmark = True, an H200), recorded with the
    inference: its 68 releases, one before each plan search's segment frees, validate MATCH (an earlier recording
    without them: 282 segment allocs recorded, 47 modelled). Taken out, converting its records again puts each back
    where the recorder put it."""
    path = os.path.join(ROOT, "traces", "cudnn-benchmark-resnet50.bin")
    t = Trace.load(path)
    assert validate(t).match
    stripped = Trace(t.records[t.kind != ev.CACHE_RELEASE], dict(t.meta), streams=t.streams, sites=t.sites,
                     labels=t.labels)
    stripped.save(str(tmp_path / "stripped.bin"))
    out = str(tmp_path / "again.bin")
    assert converted_again(str(tmp_path / "stripped.bin"), out) == int((t.kind == ev.CACHE_RELEASE).sum()) == 68
    assert all(np.array_equal(t.records[f], Trace.load(out).records[f]) for f in t.records.dtype.names)
