# SPDX-License-Identifier: Apache-2.0
"""``initial_pool_size`` of StreamOrderedPoolMemoryResource means what it means in rmm, on a GPU:
None is half the free device memory, as rmm's PoolMemoryResource takes it; the default, 0, an
empty pool."""

import gc

import pytest
import rmm

import rmm_fences
from rmm_fences import StreamOrderedPoolMemoryResource

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def test_pool_initial_pool_size_none_is_half_the_free_memory_as_in_rmm_pool():
    ref = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=None)
    rmm_half = ref.pool_size()
    del ref  # its chunk goes back to the device
    gc.collect()
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=None)
    ours = pool.pool_size()
    del pool
    _, total = rmm.mr.available_device_memory()
    assert rmm_half > total // 8, "the device was busy: half its free memory is a sliver"
    # rounded up to whole 2 MiB chunks; the free memory may move a little in between
    assert abs(ours - rmm_half) <= 64 * MiB, (ours, rmm_half)


def test_pool_default_starts_empty_and_the_spec_takes_the_class_default():
    assert StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource()).pool_size() == 0
    assert StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), 0).pool_size() == 0
    assert rmm_fences.compose("pool(cuda)").pool_size() == 0
    sized = rmm_fences.compose("pool(cuda, initial_pool_size=64MiB)")
    assert sized.pool_size() == 64 * MiB
