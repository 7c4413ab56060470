# SPDX-License-Identifier: Apache-2.0
"""compose() builds every resource name on a GPU; install() sets and restores."""

import pytest
import rmm

import rmm_fences
from rmm_fences.compose import RESOURCES, compose, install

pytestmark = pytest.mark.gpu

SPECS = {
    "cuda": ("cuda", rmm.mr.CudaMemoryResource),
    "cuda_async": ("cuda_async(release_threshold=64MiB)", rmm.mr.CudaAsyncMemoryResource),
    "managed": ("managed", rmm.mr.ManagedMemoryResource),
    "rmm_pool": ("rmm_pool(cuda, initial_pool_size=64MiB)", rmm.mr.PoolMemoryResource),
    "arena": ("arena(cuda, arena_size=64MiB)", rmm.mr.ArenaMemoryResource),
    "limiting": ("limiting(cuda, allocation_limit=1GiB)", rmm.mr.LimitingResourceAdaptor),
    "statistics": ("statistics(cuda)", rmm.mr.StatisticsResourceAdaptor),
    "pool": ("pool(cuda_async, initial_pool_size=64MiB)",
             rmm_fences.StreamOrderedPoolMemoryResource),
    "sync_on_free": ("sync_on_free(naive_cache(cuda), mode=stream)",
                     rmm_fences.SyncOnFreeResourceAdaptor),
    "tracking": ("tracking(pool(cuda), on_hazard=raise)",
                 rmm_fences.HazardTrackingResourceAdaptor),
    "naive_cache": ("naive_cache(cuda)", None),
    "vmm_unmap": ("vmm_unmap(reserve_size=1GiB)", None),
}


def test_every_name_has_a_case():
    assert set(SPECS) == set(RESOURCES)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_compose_builds_every_name(name):
    import rmm_fences.unsafe as unsafe

    spec, cls = SPECS[name]
    cls = cls or {"naive_cache": unsafe.NaiveCachingMemoryResource,
                  "vmm_unmap": unsafe.UnmappingVmmMemoryResource}[name]
    mr = compose(spec)
    assert isinstance(mr, cls)
    ptr = mr.allocate(1 << 20)
    assert ptr != 0
    mr.deallocate(ptr, 1 << 20)
    if name == "sync_on_free":
        assert mr.mode == "stream"
    if name == "tracking":
        assert mr.on_hazard == "raise" and mr.hazards == []


def test_install_sets_and_restores_the_current_resource():
    before = rmm.mr.get_current_device_resource()
    with install("tracking(pool(cuda))") as mr:
        assert rmm.mr.get_current_device_resource() is mr
        buf = rmm.DeviceBuffer(size=4096)
        assert mr.allocated_bytes == 4096
        del buf
    assert rmm.mr.get_current_device_resource() is before
    mine = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    installed = install(mine)  # takes effect without a with-block
    try:
        assert rmm.mr.get_current_device_resource() is mine
    finally:
        installed.__exit__(None, None, None)
    assert rmm.mr.get_current_device_resource() is before
    with pytest.raises(TypeError, match="spec_or_resource"):
        install(42)
