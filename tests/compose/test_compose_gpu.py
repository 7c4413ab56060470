# SPDX-License-Identifier: Apache-2.0
"""compose() builds every resource name on a GPU; use_resource() sets and restores."""

import pytest
import rmm

import rmm_fences
from rmm_fences.specs import RESOURCES, compose, use_resource

pytestmark = pytest.mark.gpu

SPECS = {
    "cuda": ("cuda", rmm.mr.CudaMemoryResource),
    "cuda_async": ("cuda_async(release_threshold=64MiB)", rmm.mr.CudaAsyncMemoryResource),
    "managed": ("managed", rmm.mr.ManagedMemoryResource),
    "rmm_pool": ("rmm_pool(cuda, initial_pool_size=64MiB)", rmm.mr.PoolMemoryResource),
    "arena": ("arena(cuda, arena_size=64MiB)", rmm.mr.ArenaMemoryResource),
    "limiting": ("limiting(cuda, allocation_limit=1GiB)", rmm.mr.LimitingResourceAdaptor),
    "statistics": ("statistics(cuda)", rmm.mr.StatisticsResourceAdaptor),
    "pool": (
        "pool(cuda_async, initial_pool_size=64MiB)",
        rmm_fences.StreamOrderedPoolMemoryResource,
    ),
    "stream_ordered_pool": (
        "stream_ordered_pool(cuda, maximum_growth_size=8MiB)",
        rmm_fences.StreamOrderedPoolMemoryResource,
    ),
    "sync_on_free": (
        "sync_on_free(naive_cache(cuda), mode=stream)",
        rmm_fences.SyncOnFreeResourceAdaptor,
    ),
    "tracking": ("tracking(pool(cuda), on_hazard=raise)", rmm_fences.HazardTrackingResourceAdaptor),
    "naive_cache": ("naive_cache(cuda)", None),
    "vmm_unmap": ("vmm_unmap(reserve_size=1GiB)", None),
    "vmm_pool": (
        "vmm_pool(initial_pool_size=64MiB, reserve_size=4GiB)",
        rmm_fences.VmmPoolMemoryResource,
    ),
}


def test_every_name_has_a_case():
    assert set(SPECS) == set(RESOURCES)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_compose_builds_every_name(name, cupy, scenarios, rng):
    """Each composed resource serves memory that kernels write and read back: random data
    summed by a kernel against its float64 reference, then, in the block the next allocation
    gets on the same stream (the freed one, where the resource reuses), a pattern written and
    checked by kernels."""
    import numpy as np

    import rmm_fences.unsafe as unsafe

    spec, cls = SPECS[name]
    cls = (
        cls
        or {
            "naive_cache": unsafe.NaiveCachingMemoryResource,
            "vmm_unmap": unsafe.UnmappingVmmMemoryResource,
        }[name]
    )
    mr = compose(spec)
    assert isinstance(mr, cls)
    nbytes, count = 1 << 20, (1 << 20) // 4
    s = cupy.cuda.Stream(non_blocking=True)
    rs = rmm.pylibrmm.stream.Stream(s)
    with s:  # zeroed on the stream the kernels run on (non-blocking: no implicit order)
        out = cupy.zeros(1, dtype=cupy.float64)
        errors = cupy.zeros(1, dtype=cupy.uint64)
    host = rng.standard_normal(count, dtype=np.float32) + np.float32(2.0)
    ptr = mr.allocate(nbytes, rs)
    assert ptr != 0
    scenarios.as_array(ptr, count, np.float32).set(host, stream=s)
    scenarios.slow_checksum(ptr, count, 0.0, out, s)
    if name in ("naive_cache", "vmm_unmap"):
        s.synchronize()  # unsafe: they free (or unmap) under a running kernel
    mr.deallocate(ptr, nbytes, rs)
    again = mr.allocate(nbytes, rs)
    scenarios.fill(again, count, pattern=77, stream=s)
    scenarios.check(again, count, pattern=77, errors=errors, stream=s)
    s.synchronize()
    mr.deallocate(again, nbytes, rs)
    s.synchronize()
    assert float(out.get()[0]) == pytest.approx(float(host.astype(np.float64).sum()), rel=1e-9)
    assert int(errors.get()[0]) == 0
    if name == "sync_on_free":
        assert mr.mode == "stream"
    if name == "tracking":
        assert mr.on_hazard == "raise" and mr.hazards == []
        assert mr.stats["allocations"] == 2 and mr.stats["deallocations"] == 2


def test_use_resource_sets_and_restores_the_current_resource():
    before = rmm.mr.get_current_device_resource()
    with use_resource("tracking(pool(cuda))") as mr:
        assert rmm.mr.get_current_device_resource() is mr
        buf = rmm.DeviceBuffer(size=4096)
        assert mr.allocated_bytes == 4096
        del buf
    assert rmm.mr.get_current_device_resource() is before
    mine = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    used = use_resource(mine)  # takes effect without a with-block
    try:
        assert rmm.mr.get_current_device_resource() is mine
    finally:
        used.__exit__(None, None, None)
    assert rmm.mr.get_current_device_resource() is before
    with pytest.raises(TypeError, match="spec_or_resource"):
        use_resource(42)
