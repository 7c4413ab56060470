# SPDX-License-Identifier: Apache-2.0
"""Without a usable GPU (no driver, too old a driver, no device) an allocation raises a
RuntimeError that says so, not rmm's MemoryError, which reads as out of memory. Runs where no
GPU is usable (this is what CI sees)."""

import re

import pytest
import rmm

import rmm_fences
import rmm_fences.unsafe
from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences._cuda import device_count, no_device_reason

pytestmark = pytest.mark.skipif(
    device_count() > 0, reason="shows what happens on a machine without a usable GPU"
)


def _over_cuda(name):
    cuda = rmm.mr.CudaMemoryResource()
    return {
        "pool": lambda: StreamOrderedPoolMemoryResource(cuda),
        "sync_on_free": lambda: SyncOnFreeResourceAdaptor(cuda),
        "tracking": lambda: HazardTrackingResourceAdaptor(cuda, nvtx=False),
        "naive_cache": lambda: rmm_fences.unsafe.NaiveCachingMemoryResource(cuda),
        "sync_on_free(pool)": lambda: SyncOnFreeResourceAdaptor(
            StreamOrderedPoolMemoryResource(cuda)
        ),
    }[name]()


NO_GPU = r"no usable GPU: .*\(cudaError\w+: .*\); the allocation failed with: "

CHAINS = ["pool", "sync_on_free", "tracking", "naive_cache", "sync_on_free(pool)"]


@pytest.mark.parametrize("chain", CHAINS)
def test_allocate_without_a_gpu_raises_a_runtime_error_naming_it(chain):
    mr = _over_cuda(chain)
    with pytest.raises(RuntimeError, match=NO_GPU) as raised:
        mr.allocate(256)
    assert not isinstance(raised.value, MemoryError)
    # the CUDA error that the test suite's own probe found, e.g. cudaErrorInsufficientDriver
    reason = re.search(r"cudaError\w+", no_device_reason())
    assert reason is not None and reason.group(0) in str(raised.value)


@pytest.mark.parametrize("chain", ["pool", "sync_on_free", "tracking"])
def test_device_buffer_without_a_gpu_raises_a_runtime_error_naming_it(chain):
    """rmm's DeviceBuffer reaches the resource from C++: the same error."""
    with pytest.raises(RuntimeError, match=NO_GPU):
        rmm.DeviceBuffer(size=256, mr=_over_cuda(chain))


def test_pool_initial_size_without_a_gpu_raises_a_runtime_error_naming_it():
    with pytest.raises(RuntimeError, match="StreamOrderedPoolMemoryResource: " + NO_GPU):
        StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size="4MiB")


def test_rmm_own_resource_still_reports_memory_error_without_a_gpu():
    """The control: rmm's CudaMemoryResource alone raises rmm's MemoryError (rmm's to
    change); rmm_fences' resources over it say what is missing."""
    with pytest.raises(MemoryError, match="cudaError"):
        rmm.mr.CudaMemoryResource().allocate(256)
