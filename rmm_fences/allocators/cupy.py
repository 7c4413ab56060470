# SPDX-License-Identifier: Apache-2.0
"""A CuPy allocator over an RMM resource, cheap per call.

``rmm.allocators.cupy.rmm_cupy_allocator`` builds an rmm ``Stream`` and a ``DeviceBuffer`` and
queries pointer attributes on every call. This one binds the resource once, allocates and
frees on CuPy's current stream (rmm ``Stream`` objects are cached per handle) and passes the
device id to CuPy, so no attribute query is made.

>>> import cupy, rmm
>>> from rmm_fences.allocators.cupy import CupyAllocator
>>> cupy.cuda.set_allocator(CupyAllocator(rmm.mr.CudaAsyncMemoryResource()))  # doctest: +SKIP
"""

from __future__ import annotations

import cupy

from rmm_fences._streams import rmm_stream

__all__ = ["CupyAllocator"]


class _Block:
    """Owner of one allocation: frees it, on the stream it was allocated on, when CuPy drops
    the last reference.

    ``cupy_stream`` is CuPy's stream object of that stream, kept alive so that CuPy does not
    destroy the stream (it does when its last reference dies) while the block still has to be
    freed on it: an array may outlive the stream it was allocated on.
    """

    __slots__ = ("mr", "ptr", "nbytes", "stream", "cupy_stream")

    def __init__(self, mr, ptr, nbytes, stream, cupy_stream):
        self.mr = mr
        self.ptr = ptr
        self.nbytes = nbytes
        self.stream = stream
        self.cupy_stream = cupy_stream

    def __del__(self):
        self.mr.deallocate(self.ptr, self.nbytes, self.stream)


class CupyAllocator:
    """``cupy.cuda.set_allocator(CupyAllocator(mr))``: CuPy's device memory from ``mr``.

    Parameters
    ----------
    mr : DeviceMemoryResource, optional
        The resource (default: rmm's current device resource for ``device``, read once here).
    device : int, optional
        The device whose memory ``mr`` serves (default: the current device).

    Each allocation is made on CuPy's current stream and freed on that same stream when the
    array dies, without a sync: the resource must order reuse by stream, as rmm_fences'
    resources and rmm's pool and CudaAsync do. The allocation keeps a reference to CuPy's
    stream object, so a ``cupy.cuda.Stream`` lives (is not destroyed) until the last array
    allocated on it is freed. A ``cupy.cuda.ExternalStream`` does not own its stream: whoever
    owns it must keep it alive until those arrays are freed.
    """

    __slots__ = ("mr", "device")

    def __init__(self, mr=None, device=None):
        import rmm

        self.device = cupy.cuda.runtime.getDevice() if device is None else int(device)
        if mr is None:
            mr = rmm.mr.get_per_device_resource(self.device)
        if not isinstance(mr, rmm.mr.DeviceMemoryResource):
            raise TypeError(
                f"mr must be None or an rmm.mr.DeviceMemoryResource, got {type(mr).__name__}"
            )
        self.mr = mr

    def __call__(self, nbytes: int) -> cupy.cuda.MemoryPointer:
        cupy_stream = cupy.cuda.get_current_stream()
        stream = rmm_stream(cupy_stream.ptr)
        ptr = self.mr.allocate(nbytes, stream)
        owner = _Block(self.mr, ptr, nbytes, stream, cupy_stream)
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner, self.device)
        return cupy.cuda.MemoryPointer(mem, 0)

    def __repr__(self):
        return f"CupyAllocator({type(self.mr).__name__}(), device={self.device})"
