"""`torch-real` reads its device calls from PyTorch's own counters (issue 29: on an H200 it printed "device mallocs
/ frees 109 / 0 (0 B / 0 B)": the counts were read, the bytes never). Without a GPU, a stand-in for
``torch.cuda``'s caching allocator keeps the counters `memory_stats()` keeps, and the replay must report them."""
from __future__ import annotations

import types

import pytest

from allocsim.engine.replay import replay
from conftest import random_trace

SEGMENT = 2 << 20


class _FakeCuda:
    """The calls `TorchReal` makes, over an allocator that takes a segment of its own (2 MiB rounded) for each
    block and gives the free ones back at `empty_cache`, counting as `torch.cuda.memory_stats()` does."""

    OutOfMemoryError = MemoryError

    def __init__(self, before: dict):
        self.stats = dict(before)       # what earlier work in the process left in the counters
        self.blocks, self.free_segments, self.next = {}, [], 1 << 30

    def _count(self, key: str, n: int):
        self.stats[key] = self.stats.get(key, 0) + n

    def caching_allocator_alloc(self, size, device, stream):
        seg = -(-max(size, 1) // SEGMENT) * SEGMENT
        self._count("num_device_alloc", 1)
        self._count("reserved_bytes.all.allocated", seg)
        self._count("reserved_bytes.all.current", seg)
        self.stats["reserved_bytes.all.peak"] = max(self.stats.get("reserved_bytes.all.peak", 0),
                                                    self.stats["reserved_bytes.all.current"])
        self.next += seg
        self.blocks[self.next] = seg
        return self.next

    def caching_allocator_delete(self, ptr):
        self.free_segments.append(self.blocks.pop(ptr))

    def empty_cache(self):
        for seg in self.free_segments:
            self._count("num_device_free", 1)
            self._count("reserved_bytes.all.freed", seg)
            self._count("reserved_bytes.all.current", -seg)
        self.free_segments.clear()

    def memory_stats(self):
        self.read = dict(self.stats)    # the last read: the replay's end (its close() empties the cache after)
        return dict(self.stats)

    def synchronize(self):
        pass

    def get_device_properties(self, i):
        return types.SimpleNamespace(total_memory=80 << 30)

    def set_per_process_memory_fraction(self, f):
        pass

    def reset_peak_memory_stats(self):
        pass

    def current_stream(self):
        return 0

    def Stream(self):
        return 0


def test_torch_real_reports_the_bytes_of_its_device_calls(monkeypatch, tmp_path):
    from allocsim.policies import torch_real
    before = {"num_device_alloc": 7, "num_device_free": 3, "reserved_bytes.all.allocated": 5 << 30,
              "reserved_bytes.all.freed": 1 << 30}
    cuda = _FakeCuda(before)
    monkeypatch.setattr(torch_real, "require_torch", lambda: types.SimpleNamespace(cuda=cuda, _C=None))
    monkeypatch.setattr(torch_real, "_APPLIED", [])
    path = str(tmp_path / "t.bin")
    random_trace(300, seed=5).save(path)
    res = replay(path, "torch-real", capacity=None).to_dict()
    s = cuda.read
    assert res["device_mallocs"] == s["num_device_alloc"] - 7 > 0
    assert res["device_malloc_bytes"] == s["reserved_bytes.all.allocated"] - (5 << 30) > 0
    assert res["device_frees"] == s["num_device_free"] - 3
    assert res["device_free_bytes"] == s["reserved_bytes.all.freed"] - (1 << 30)
