# SPDX-License-Identifier: Apache-2.0
"""A CuPy allocator over an RMM resource, cheap per call.

``rmm.allocators.cupy.rmm_cupy_allocator`` builds an rmm ``Stream`` and a ``DeviceBuffer`` and
queries pointer attributes on every call. This one allocates and frees on CuPy's current
stream (rmm ``Stream`` objects are cached per handle) and passes the device id to CuPy, so no
attribute query is made. ``CupyAllocator()`` takes each allocation from rmm's current device
resource, looked up on every call as ``rmm_cupy_allocator`` does; ``CupyAllocator(mr)`` from
``mr`` alone.

>>> import cupy
>>> from rmm_fences.allocators.cupy import CupyAllocator
>>> cupy.cuda.set_allocator(CupyAllocator())  # doctest: +SKIP
"""

from __future__ import annotations

import weakref

import rmm

from rmm_fences._optional import require
from rmm_fences._streams import rmm_stream

cupy = require("cupy", "rmm_fences.allocators.cupy")

__all__ = ["CupyAllocator"]


class _Stream:
    """The blocks allocated on one CuPy stream object and not freed yet.

    Each block keeps CuPy's stream object alive, so CuPy (which destroys a stream when its
    object dies) cannot destroy it before the block is freed, except in a reference cycle:
    when the cyclic garbage collector finds the stream object and the arrays unreachable
    together (an exception's traceback holding both is enough), it runs their ``__del__`` in
    any order, and the stream may be destroyed before an array is freed on it. Using a
    destroyed stream handle is undefined behaviour (a segmentation fault in the driver).

    The collector clears weak references, and calls their callbacks, before it runs any
    ``__del__``. So ``_retire`` runs while the stream is still valid, and frees on it every
    block still pending there: those blocks are garbage too (each one refers to the stream
    object, so none is reachable once the stream object is not), exactly as if their own
    ``__del__`` had run first. When the stream object dies by reference count instead, no
    block is pending (each holds a reference) and ``_retire`` does nothing.
    """

    __slots__ = ("rmm", "key", "blocks", "ref", "__weakref__")

    def __init__(self, cupy_stream):
        self.rmm = rmm_stream(cupy_stream.ptr)
        self.key = id(cupy_stream)
        self.blocks = {}  # ptr -> (resource, nbytes): allocated here and not freed yet
        self.ref = weakref.ref(cupy_stream, self._retire)

    def _retire(self, _ref):
        self.ref = None  # the weakref held this bound method: no cycle left to collect
        if _STREAMS.get(self.key) is self:
            del _STREAMS[self.key]
        blocks, self.blocks = self.blocks, {}
        error = None
        for ptr, (mr, nbytes) in blocks.items():
            try:
                mr.deallocate(ptr, nbytes, self.rmm)
            except Exception as exc:  # noqa: BLE001 - free the others, then report
                error = error or exc
        if error is not None:
            raise error


_STREAMS: dict[int, _Stream] = {}  # id(CuPy stream object) -> its _Stream, while it lives


def _stream_of(cupy_stream) -> _Stream:
    st = _STREAMS.get(id(cupy_stream))
    if st is None:
        st = _STREAMS[id(cupy_stream)] = _Stream(cupy_stream)
    return st


class _Block:
    """Owner of one allocation: frees it, on the stream it was allocated on, when CuPy drops
    the last reference (or earlier, when the stream object dies in the same reference cycle:
    see ``_Stream``).

    ``cupy_stream`` is CuPy's stream object of that stream, kept alive so that CuPy does not
    destroy the stream while the block still has to be freed on it: an array may outlive the
    stream it was allocated on.
    """

    __slots__ = ("ptr", "stream", "cupy_stream")

    def __init__(self, mr, ptr, nbytes, stream, cupy_stream):
        self.ptr = ptr
        self.stream = stream
        self.cupy_stream = cupy_stream
        stream.blocks[ptr] = (mr, nbytes)  # the resource and size live only there

    def __del__(self):
        st = self.stream
        entry = st.blocks.pop(self.ptr, None)
        if entry is not None:  # not freed by _Stream._retire
            entry[0].deallocate(self.ptr, entry[1], st.rmm)


class CupyAllocator:
    """``cupy.cuda.set_allocator(CupyAllocator())``: CuPy's device memory from rmm.

    Parameters
    ----------
    mr : DeviceMemoryResource, optional
        The resource every allocation comes from. ``None`` (default): rmm's current device
        resource (``rmm.mr.get_current_device_resource()``) of CuPy's current device, looked
        up on every call, as ``rmm.allocators.cupy.rmm_cupy_allocator`` does: a resource set
        with ``rmm.mr.set_current_device_resource`` later serves the allocations made after.
    device : int, optional
        Only with a given ``mr``: the device whose memory ``mr`` serves (default: the current
        device). With ``mr=None`` each allocation belongs to the device current at the call.

    Each allocation is made on CuPy's current stream and freed on that same stream when the
    array dies, without a sync, by the resource that allocated it (also when the current
    device resource changed in between; the block keeps that resource alive until its free):
    the resource must order reuse by stream, as rmm_fences' resources and rmm's pool and
    CudaAsync do. The allocation keeps a reference to CuPy's stream object, so a
    ``cupy.cuda.Stream`` lives (is not destroyed) until the last array allocated on it is
    freed. A ``cupy.cuda.ExternalStream`` does not own its stream: whoever owns it must keep
    it alive until those arrays are freed. A request of 0 bytes reaches no resource (as with
    rmm's ``DeviceBuffer``): CuPy gets a null pointer and nothing is freed.

    Raises
    ------
    TypeError
        ``mr`` is neither None nor an ``rmm.mr.DeviceMemoryResource``, or ``device`` is given
        with ``mr=None``.
    """

    __slots__ = ("mr", "device")

    def __init__(
        self, mr: rmm.mr.DeviceMemoryResource | None = None, device: int | None = None
    ) -> None:
        if mr is None:
            if device is not None:
                raise TypeError(
                    "device is only for a given mr; with mr=None each allocation comes from "
                    "rmm's current device resource of the device current at the call "
                    f"(got device={device!r})"
                )
            self.mr = self.device = None
            return
        if not isinstance(mr, rmm.mr.DeviceMemoryResource):
            raise TypeError(
                "mr must be None (rmm's current device resource, looked up on every call) or "
                f"an rmm.mr.DeviceMemoryResource, got {type(mr).__name__}"
            )
        self.device = cupy.cuda.runtime.getDevice() if device is None else int(device)
        self.mr = mr

    def __call__(self, nbytes: int) -> cupy.cuda.MemoryPointer:
        device = cupy.cuda.runtime.getDevice() if self.mr is None else self.device
        if nbytes == 0:  # as rmm's DeviceBuffer: no allocation, so no (null) free to make
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
        mr = self.mr
        if mr is None:  # rmm_cupy_allocator's resource: the current one, on every call
            mr = rmm.mr.get_per_device_resource(device)
        cupy_stream = cupy.cuda.get_current_stream()
        stream = _stream_of(cupy_stream)
        ptr = mr.allocate(nbytes, stream.rmm)
        try:  # the block frees through mr, whatever the current resource is by then
            owner = _Block(mr, ptr, nbytes, stream, cupy_stream)
        except BaseException:  # not registered (no host memory): nothing else would free it
            mr.deallocate(ptr, nbytes, stream.rmm)
            raise
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device)
        return cupy.cuda.MemoryPointer(mem, 0)

    def __repr__(self):
        if self.mr is None:
            return "CupyAllocator(mr=None)"
        return f"CupyAllocator({type(self.mr).__name__}(), device={self.device})"
