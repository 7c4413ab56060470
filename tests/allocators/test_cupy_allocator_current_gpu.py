# SPDX-License-Identifier: Apache-2.0
"""``CupyAllocator()`` follows rmm's current device resource on every call, with real CuPy
arrays: each allocation from the resource current at the call, each free through the resource
that allocated the block."""

import gc

import numpy as np
import pytest
import rmm

import rmm_fences
from rmm_fences import StreamOrderedPoolMemoryResource

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def _stats_over_pool(inner=None):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    return rmm.mr.StatisticsResourceAdaptor(pool if inner is None else inner(pool))


def test_cupy_allocator_follows_the_current_device_resource(cupy, current_resource):
    """As rmm_cupy_allocator: each allocation from the resource current at the call; each
    free to the resource that allocated the block, whatever is current then."""
    from rmm_fences.allocators.cupy import CupyAllocator

    a = _stats_over_pool()
    b = _stats_over_pool(lambda pool: rmm_fences.SyncOnFreeResourceAdaptor(pool, mode="deferred"))
    host = np.random.default_rng(11).random(1 << 20) + 0.5  # 8 MiB of float64
    with cupy.cuda.using_allocator(CupyAllocator()):
        rmm.mr.set_current_device_resource(a)
        x = cupy.asarray(host)
        rmm.mr.set_current_device_resource(b)
        y = x * 2.0  # one allocation (x * 2.0 + 1.0 would make a temporary)
        assert a.allocation_counts.current_bytes == 8 * MiB
        assert b.allocation_counts.current_bytes == 8 * MiB
        rmm.mr.set_current_device_resource(current_resource)
        got = (float(x.sum()), float(y.sum()))  # outputs from the resource current now
        assert a.allocation_counts.total_count == 1 and b.allocation_counts.total_count == 1
        del x  # a's block, freed by a while another resource is current
        assert a.allocation_counts.current_bytes == 0
        assert b.allocation_counts.current_bytes == 8 * MiB
        del y
        assert b.allocation_counts.current_bytes == 0

        # a resource whose only reference is an array's block lives until that free
        rmm.mr.set_current_device_resource(_stats_over_pool())
        z = cupy.ones(1 << 20, dtype=cupy.float32)
        rmm.mr.set_current_device_resource(current_resource)
        gc.collect()
        z_sum = float(z.sum())
        del z
    cupy.cuda.Device().synchronize()
    assert got == pytest.approx((host.sum(), 2.0 * host.sum()), rel=1e-9)
    assert z_sum == float(1 << 20)
