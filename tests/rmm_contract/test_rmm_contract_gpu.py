# SPDX-License-Identifier: Apache-2.0
"""rmm's Python contract for memory resources, kept by every rmm_fences resource: what rmm's
own test suite (python/rmm/rmm/tests) expects of whatever is the current device resource."""

import pytest
import rmm

from rmm_fences import (
    HazardError,
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences.unsafe import NaiveCachingMemoryResource

pytestmark = pytest.mark.gpu

RESOURCES = {
    "pool": lambda: StreamOrderedPoolMemoryResource(rmm.mr.CudaAsyncMemoryResource()),
    "sync_on_free_deferred": lambda: SyncOnFreeResourceAdaptor(
        rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), 1 << 24), mode="deferred"
    ),
    "sync_on_free_stream": lambda: SyncOnFreeResourceAdaptor(
        rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), 1 << 24), mode="stream"
    ),
    "tracker": lambda: HazardTrackingResourceAdaptor(
        StreamOrderedPoolMemoryResource(rmm.mr.CudaAsyncMemoryResource()), on_hazard="raise"
    ),
    "naive_cache": lambda: NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()),
}


@pytest.fixture(params=sorted(RESOURCES))
def mr(request):
    return RESOURCES[request.param]()


def test_stream_none_raises_type_error_like_rmm(mr):
    # rmm's test_device_buffer.py::test_memory_resource_{allocate,deallocate}_stream_none, on
    # rmm's own resources: TypeError("stream argument cannot be None"). The pool used to take
    # None as stream 0, so those two tests failed with the pool as current device resource.
    reference = rmm.mr.CudaMemoryResource()
    with pytest.raises(TypeError, match="stream argument cannot be None"):
        reference.allocate(1024, stream=None)
    with pytest.raises(TypeError, match="stream argument cannot be None"):
        mr.allocate(1024, stream=None)
    ptr = mr.allocate(1024)
    with pytest.raises(TypeError, match="stream argument cannot be None"):
        mr.deallocate(ptr, 1024, stream=None)
    mr.deallocate(ptr, 1024)  # the refused free changed nothing: the block is still live
    if not isinstance(mr, NaiveCachingMemoryResource):  # rmm_fences.unsafe checks no frees
        # ...and now it is gone: a second free is refused (the tracker with on_hazard="raise"
        # reports it as a double_free HazardError).
        with pytest.raises((ValueError, HazardError), match="double"):
            mr.deallocate(ptr, 1024)


def test_every_stream_type_rmm_accepts(mr, cupy):
    # rmm's resources take an rmm Stream; rmm_fences' take that and any stream object.
    streams = [
        rmm.pylibrmm.stream.DEFAULT_STREAM,
        rmm.pylibrmm.stream.Stream(),
        rmm.pylibrmm.stream.PER_THREAD_DEFAULT_STREAM,
        rmm.pylibrmm.stream.LEGACY_DEFAULT_STREAM,
    ]
    if not isinstance(mr, NaiveCachingMemoryResource):  # inherits rmm's allocate: Stream only
        streams.append(cupy.cuda.Stream())
    for s in streams:
        ptr = mr.allocate(4096, s)
        assert ptr != 0
        mr.deallocate(ptr, 4096, s)
    with pytest.raises(TypeError, match="stream"):
        mr.allocate(4096, 1234)
    cupy.cuda.Device().synchronize()


def test_device_buffer_over_each_resource(mr, rng):
    # rmm.DeviceBuffer through the resource, real data round trip.
    import numpy as np

    host = rng.standard_normal(1 << 16).astype(np.float64)
    buf = rmm.DeviceBuffer(ptr=host.ctypes.data, size=host.nbytes, mr=mr)
    back = buf.copy_to_host().view(np.float64)
    np.testing.assert_array_equal(back, host)
    del buf
