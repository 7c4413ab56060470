# SPDX-License-Identifier: Apache-2.0
"""Null-pointer frees on a real GPU.

``deallocate(0, 0)`` and ``deallocate(0, 4096)`` are no-ops for every resource of rmm_fences,
from Python and from C++ (through an rmm adaptor), as for rmm's resources: the resource's
counters and its upstream's stay as they were, and a later allocation is a real block that holds
real data. The CuPy allocator asks no resource for 0 bytes, the PyTorch allocator's free entry
point ignores a null pointer, and ``HazardTrackingResourceAdaptor.record_stream(0, s)`` raises
ValueError.
"""

import gc
import warnings

import numpy as np
import pytest
import rmm

from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences.unsafe import NaiveCachingMemoryResource, UnmappingVmmMemoryResource

pytestmark = pytest.mark.gpu

NBYTES = 4096
WORDS = NBYTES // 4


def rmm_stream(s):
    return rmm.pylibrmm.stream.Stream(s)


def counted_cuda():
    """cudaMalloc under rmm's statistics adaptor: a null free that reached it would change its
    counts."""
    return rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())


# Each builder returns (resource, its counted upstream or None, a function of its state).
def _pool():
    up = counted_cuda()
    mr = StreamOrderedPoolMemoryResource(up)
    return mr, up, lambda: (mr.stats, mr.pool_size())


def _sync_on_free(mode):
    def build():
        up = counted_cuda()
        mr = SyncOnFreeResourceAdaptor(up, mode=mode)
        return mr, up, lambda: (mr.stats, mr.pending_count, mr.pending_bytes)

    return build


def _tracker(over_pool):
    def build():
        up = counted_cuda()
        pool = StreamOrderedPoolMemoryResource(up) if over_pool else None
        mr = HazardTrackingResourceAdaptor(pool or up, on_hazard="raise")

        def state():
            records = [a.pointer for a in mr.outstanding()]
            return mr.stats, [h.kind for h in mr.hazards], records, pool and pool.stats

        return mr, up, state

    return build


def _naive_cache():
    up = counted_cuda()
    mr = NaiveCachingMemoryResource(up)
    return mr, up, lambda: (mr.cached_bytes, mr.hits, mr.misses)


def _vmm():
    mr = UnmappingVmmMemoryResource("1GiB")
    return mr, None, lambda: (mr.mapped_bytes,)


RESOURCES = {
    "pool": _pool,
    "sync_on_free_deferred": _sync_on_free("deferred"),
    "sync_on_free_stream": _sync_on_free("stream"),
    "sync_on_free_device": _sync_on_free("device"),
    "tracker": _tracker(over_pool=False),
    "tracker_over_pool": _tracker(over_pool=True),
    "naive_cache": _naive_cache,
    "vmm": _vmm,
}


def snapshot(up, state):
    return state(), None if up is None else up.allocation_counts


def assert_holds_data(cupy, scenarios, rng, mr, s):
    """A new block of NBYTES: real (not 0), and what is written there is read back (its float64
    sum on the device against the host's)."""
    rs = rmm_stream(s)
    ptr = mr.allocate(NBYTES, rs)
    assert ptr != 0
    host = rng.standard_normal(WORDS, dtype=np.float32)
    scenarios.as_array(ptr, WORDS, np.float32).set(host, stream=s)
    with s:
        out = cupy.zeros(1, dtype=cupy.float64)
    scenarios.slow_checksum(ptr, WORDS, 0, out, s)
    s.synchronize()
    assert np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
    mr.deallocate(ptr, NBYTES, rs)


@pytest.mark.parametrize("nbytes", [0, NBYTES])
@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_null_free_is_a_no_op(cupy, scenarios, rng, name, nbytes):
    mr, up, state = RESOURCES[name]()
    s = cupy.cuda.Stream(non_blocking=True)
    rs = rmm_stream(s)
    keep = mr.allocate(NBYTES, rs)  # a live block: the resource has state to lose
    before = snapshot(up, state)
    outer = rmm.mr.StatisticsResourceAdaptor(mr)  # its C++ free reaches mr's noexcept path
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a HazardWarning fails the test
        mr.deallocate(0, nbytes)  # the default stream
        mr.deallocate(0, nbytes, rs)
        outer.deallocate(0, nbytes, rs)
    assert snapshot(up, state) == before
    assert_holds_data(cupy, scenarios, rng, mr, s)
    mr.deallocate(keep, NBYTES, rs)
    s.synchronize()


@pytest.mark.parametrize("over_pool", [False, True], ids=["cuda", "pool"])
def test_record_stream_of_a_null_pointer_raises(cupy, over_pool):
    mr, _, state = _tracker(over_pool)()
    s = cupy.cuda.Stream(non_blocking=True)
    keep = mr.allocate(NBYTES)
    before = state()
    for stream in (s, rmm_stream(s)):
        with pytest.raises(ValueError, match=r"buffer_or_ptr is a null pointer.*live allocation"):
            mr.record_stream(0, stream)
    assert state() == before
    mr.deallocate(keep, NBYTES)
    assert mr.stats["stream_waits"] == 0  # nothing was declared
    assert mr.hazards == []


def test_cupy_allocator_asks_no_resource_for_0_bytes(cupy, rng):
    from rmm_fences.allocators.cupy import CupyAllocator

    up = counted_cuda()
    pool = StreamOrderedPoolMemoryResource(up)
    alloc = CupyAllocator(pool)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        keep = alloc(NBYTES)
        before = (pool.stats, up.allocation_counts)
        empties = [alloc(0) for _ in range(8)]
        assert [m.ptr for m in empties] == [0] * 8
        del empties
        gc.collect()
        assert (pool.stats, up.allocation_counts) == before
        with cupy.cuda.using_allocator(alloc):
            host = rng.standard_normal(WORDS, dtype=np.float32)
            a = cupy.asarray(host)
            empty = cupy.empty(0, dtype=cupy.float32)
            assert empty.size == 0
            total = float(a.astype(cupy.float64).sum().get())
        assert np.isclose(total, host.astype(np.float64).sum(), rtol=1e-9)
        del a, empty, keep
        gc.collect()
    s.synchronize()
    assert pool.stats["rejected_frees"] == 0


# The native entry points of the PyTorch allocator (no PyTorch needed), in a child: the core is
# installed once per process. A null free before anything is installed writes nothing to stderr;
# after, it changes neither the core's counters nor the pool's nor the upstream's.
TORCH_ENTRY_POINTS = r"""
import ctypes, json
import cupy, numpy as np, rmm
from rmm_fences import StreamOrderedPoolMemoryResource, _scenarios
from rmm_fences._lib import _torch

lib = ctypes.CDLL(_torch.__file__)
free = lib.rmm_fences_torch_free
free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
free.restype = None
alloc = lib.rmm_fences_torch_alloc
alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
alloc.restype = ctypes.c_void_p

free(None, 0, 0, None)
up = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
pool = StreamOrderedPoolMemoryResource(up)
_torch.install_core(pool, 0)
state = lambda: (_torch.stats(), pool.stats, up.allocation_counts)
s = cupy.cuda.Stream(non_blocking=True)
keep = alloc(4096, 0, s.ptr)
before = state()
for nbytes in (0, 4096):
    free(None, nbytes, 0, s.ptr)
    free(None, nbytes, 0, None)
after = state()
ptr = alloc(4096, 0, s.ptr)
host = np.random.default_rng(7).standard_normal(1024, dtype=np.float32)
_scenarios.as_array(ptr, 1024, np.float32).set(host, stream=s)
with s:
    out = cupy.zeros(1, dtype=cupy.float64)
_scenarios.slow_checksum(ptr, 1024, 0, out, s)
s.synchronize()
sum_ok = bool(np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9))
free(ptr, 4096, 0, s.ptr)
free(keep, 4096, 0, s.ptr)
s.synchronize()
print(json.dumps({"same": before == after, "before": repr(before), "after": repr(after),
                  "ptr": ptr, "sum_ok": sum_ok, "stats": _torch.stats()}))
"""


def test_torch_free_entry_point_ignores_a_null_pointer(json_child):
    rc, out, stdout, stderr = json_child(TORCH_ENTRY_POINTS, timeout=300)
    assert rc == 0 and out is not None, stdout + stderr
    assert "asked to free" not in stderr, stderr
    assert out["same"], out
    assert out["ptr"] and out["sum_ok"], out
    stats = out["stats"]
    assert stats["rejected_frees"] == 0 and stats["current_allocations"] == 0, stats


# PyTorch itself over rmm's cudaMalloc resource, which gives a null pointer for 0 bytes: empty
# tensors change none of the allocator's counters, and a real tensor holds its data.
TORCH_EMPTY_TENSORS = r"""
import json
import numpy as np, rmm, torch
import rmm_fences.allocators.torch as rt

rt.install(rmm.mr.CudaMemoryResource())
before = rt.memory_stats()
for _ in range(8):
    e = torch.empty(0, device="cuda")
    del e
torch.cuda.synchronize()
after = rt.memory_stats()
host = np.random.default_rng(7).standard_normal(1024, dtype=np.float32)
x = torch.from_numpy(host).cuda()
total = x.double().sum().item()
sum_ok = bool(np.isclose(total, host.astype(np.float64).sum(), rtol=1e-9))
del x
torch.cuda.synchronize()
print(json.dumps({"before": before, "after": after, "sum_ok": sum_ok, "stats": rt.memory_stats()}))
"""


def test_torch_empty_tensors_change_nothing(json_child):
    pytest.importorskip("torch", reason="the PyTorch allocator test needs torch")
    rc, out, stdout, stderr = json_child(TORCH_EMPTY_TENSORS, timeout=300)
    assert rc == 0 and out is not None, stdout + stderr
    assert out["after"] == out["before"], out
    assert out["sum_ok"], out
    stats = out["stats"]
    assert stats["rejected_frees"] == 0 and stats["leaked_blocks"] == 0, stats
