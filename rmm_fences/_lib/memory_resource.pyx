# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""RMM memory resources of rmm_fences, bound as subclasses of rmm's resources."""

from cython.operator cimport dereference as deref
from libc.stddef cimport size_t
from libc.stdint cimport uint64_t
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional

from rmm.librmm.cuda_stream_ref cimport stream_ref
from rmm.librmm.memory_resource cimport (
    any_resource,
    device_accessible,
    device_async_resource_ref,
)
from rmm.pylibrmm.memory_resource._memory_resource cimport (
    DeviceMemoryResource,
    UpstreamResourceAdaptor,
)
from rmm.pylibrmm.stream cimport Stream

from rmm.pylibrmm.stream import DEFAULT_STREAM

from rmm_fences._sizes import parse_bytes

from rmm_fences._lib._sync_on_free cimport (
    mode_from_name,
    stats_dict,
    sync_mode,
    sync_on_free_stats,
)


cdef extern from "rmm_fences/sync_on_free_resource_adaptor.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass sync_on_free_resource_adaptor_impl \
            "rmm_fences::mr::detail::sync_on_free_resource_adaptor_impl":
        void flush() except +
        size_t pending_bytes() except +
        size_t pending_count() except +
        sync_on_free_stats stats() except +

    cdef cppclass sync_on_free_resource_adaptor:
        sync_on_free_resource_adaptor(
            any_resource[device_accessible] upstream,
            sync_mode mode,
            optional[size_t] max_pending_bytes,
        ) except +
        sync_on_free_resource_adaptor_impl& get()


cdef extern from "rmm_fences/naive_caching_memory_resource.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass naive_caching_memory_resource_impl \
            "rmm_fences::mr::detail::naive_caching_memory_resource_impl":
        void release()
        size_t cached_bytes() except +
        uint64_t hits() except +
        uint64_t misses() except +

    cdef cppclass naive_caching_memory_resource:
        naive_caching_memory_resource(
            any_resource[device_accessible] upstream,
        ) except +
        naive_caching_memory_resource_impl& get()


cdef extern from "rmm_fences/bench.hpp" namespace "rmm_fences::bench" nogil:
    double c_alloc_free_ns "rmm_fences::bench::alloc_free_ns"(
        device_async_resource_ref mr,
        size_t nbytes,
        uint64_t iterations,
        stream_ref stream,
        uint64_t warmup,
    ) except +

    cdef struct fence_costs:
        double event_record
        double event_query
        double stream_is_capturing
        double cu_event_record
        double cu_event_query
        double cu_stream_is_capturing

    fence_costs c_fence_call_ns "rmm_fences::bench::fence_call_ns"(
        stream_ref stream, uint64_t iterations) except +


# rmm declares the template of make_device_async_resource_ref (librmm/memory_resource.pxd);
# these are its overloads for our resources.
cdef extern from *:
    optional[device_async_resource_ref] make_device_async_resource_ref(
        sync_on_free_resource_adaptor&) except +
    optional[device_async_resource_ref] make_device_async_resource_ref(
        naive_caching_memory_resource&) except +


def _check_upstream(upstream_mr):
    if not isinstance(upstream_mr, DeviceMemoryResource):
        raise TypeError(
            "upstream_mr must be an rmm.mr.DeviceMemoryResource "
            f"(e.g. rmm.mr.CudaMemoryResource()), got {type(upstream_mr).__name__}"
        )


cdef Stream _as_stream(object stream):
    if stream is None:
        return DEFAULT_STREAM
    if isinstance(stream, Stream):
        return stream
    try:
        return Stream(stream)
    except Exception as exc:
        raise TypeError(
            "stream must be None, an rmm Stream, or a CuPy, Numba, cuda.core or other "
            f"__cuda_stream__ stream; got {type(stream).__name__}"
        ) from exc


cdef class _SyncOnFreeResourceAdaptor(UpstreamResourceAdaptor):
    cdef unique_ptr[sync_on_free_resource_adaptor] c_obj
    cdef str _mode
    cdef object _max_pending_bytes

    def __cinit__(self, DeviceMemoryResource upstream_mr, mode="deferred",
                  max_pending_bytes=None):
        cdef sync_mode c_mode = mode_from_name(mode)
        cdef optional[size_t] c_cap
        if max_pending_bytes is not None:
            self._max_pending_bytes = parse_bytes(max_pending_bytes, "max_pending_bytes")
            c_cap = <size_t>self._max_pending_bytes
        self._mode = mode
        self.c_obj.reset(new sync_on_free_resource_adaptor(
            any_resource[device_accessible](upstream_mr.get_mr()),
            c_mode,
            c_cap,
        ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    @property
    def mode(self) -> str:
        """When a freed block may go upstream: ``"device"``, ``"stream"`` or ``"deferred"``."""
        return self._mode

    @property
    def max_pending_bytes(self):
        """The cap on pending bytes in deferred mode, or ``None``."""
        return self._max_pending_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes freed by the caller that did not reach the upstream yet."""
        return deref(self.c_obj).get().pending_bytes()

    @property
    def pending_count(self) -> int:
        """Number of freed blocks that did not reach the upstream yet."""
        return deref(self.c_obj).get().pending_count()

    def flush(self) -> None:
        """Block until every pending block went upstream.

        Waits for the fence of each pending block. Blocks freed during a stream capture are
        returned too once the device is idle; while a capture is under way they stay pending.
        """
        with nogil:
            deref(self.c_obj).get().flush()

    @property
    def stats(self) -> dict:
        """Counters: ``syncs`` (host waits), ``deferred`` (frees that returned at once),
        ``released`` (pending blocks handed upstream), ``oom_retries``, ``parked`` (frees
        during stream capture), ``peak_pending_bytes``."""
        return stats_dict(deref(self.c_obj).get().stats())


class SyncOnFreeResourceAdaptor(_SyncOnFreeResourceAdaptor):
    """Make freeing safe while kernels may still use the block, over any upstream.

    Parameters
    ----------
    upstream_mr : DeviceMemoryResource
        Receives each freed block once no device work can still use it.
    mode : {"deferred", "stream", "device"}
        ``"device"`` synchronizes the device before each free (what ``cudaFree`` does);
        ``"stream"`` synchronizes the freeing stream; ``"deferred"`` (default) records an
        event on the freeing stream and returns at once: the block goes upstream only after
        the event completed, checked without blocking on every allocate and deallocate, and
        by :meth:`flush`.
    max_pending_bytes : int or str, optional
        Deferred mode only: once more bytes than this are pending, wait for the oldest
        fences. Accepts ints or strings such as ``"1GiB"``. ``None`` (default): no cap.

    Notes
    -----
    If the upstream runs out of memory, every pending fence is waited on, those blocks go
    upstream and the allocation is retried once before :class:`MemoryError` is raised.
    During stream capture nothing is queried or synchronized on the capturing stream: its
    frees wait, unfenced, until the next call on that stream outside capture. The adaptor
    belongs to the device that is current when it is constructed.

    Examples
    --------
    >>> import rmm
    >>> from rmm_fences import SyncOnFreeResourceAdaptor
    >>> mr = SyncOnFreeResourceAdaptor(rmm.mr.CudaAsyncMemoryResource())
    >>> rmm.mr.set_current_device_resource(mr)
    """

    def __new__(cls, upstream_mr, mode="deferred", max_pending_bytes=None):
        _check_upstream(upstream_mr)
        return super().__new__(cls, upstream_mr, mode, max_pending_bytes)

    def __init__(self, upstream_mr, mode="deferred", max_pending_bytes=None):
        pass

    def __repr__(self):
        return (
            f"{type(self).__name__}({type(self.get_upstream()).__name__}(), "
            f"mode={self.mode!r}, max_pending_bytes={self.max_pending_bytes!r})"
        )


cdef class _NaiveCachingMemoryResource(UpstreamResourceAdaptor):
    cdef unique_ptr[naive_caching_memory_resource] c_obj

    def __cinit__(self, DeviceMemoryResource upstream_mr):
        self.c_obj.reset(new naive_caching_memory_resource(
            any_resource[device_accessible](upstream_mr.get_mr())
        ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def release(self) -> None:
        """Return every cached block to the upstream."""
        with nogil:
            deref(self.c_obj).get().release()

    @property
    def cached_bytes(self) -> int:
        """Bytes held in the cache."""
        return deref(self.c_obj).get().cached_bytes()

    @property
    def hits(self) -> int:
        """Allocations served from the cache (without any fence)."""
        return deref(self.c_obj).get().hits()

    @property
    def misses(self) -> int:
        """Allocations that went to the upstream."""
        return deref(self.c_obj).get().misses()


class NaiveCachingMemoryResource(_NaiveCachingMemoryResource):
    """UNSAFE ON PURPOSE: a cache that reuses freed blocks on any stream without a fence.

    A freed block is cached under its size and handed to the next allocation of that size,
    on any stream, at once. If a kernel queued before the free still reads or writes the
    block, the new owner races with it: silent corruption. This is the hazard that a custom
    allocator backing CUB temp storage creates when it frees without a synchronization, and
    this class exists to reproduce it. Never use it for real work; wrap it in
    :class:`rmm_fences.SyncOnFreeResourceAdaptor` to make it safe.

    Parameters
    ----------
    upstream_mr : DeviceMemoryResource
        Serves allocations that miss the cache; receives blocks on :meth:`release` and
        when the resource is destroyed.
    """

    def __new__(cls, upstream_mr):
        _check_upstream(upstream_mr)
        return super().__new__(cls, upstream_mr)

    def __init__(self, upstream_mr):
        pass

    def __repr__(self):
        return f"{type(self).__name__}({type(self.get_upstream()).__name__}())"


def alloc_free_ns(DeviceMemoryResource mr not None, nbytes, size_t iterations=10000,
                  stream=None, *, size_t warmup=100) -> float:
    """Mean nanoseconds of one ``allocate`` + ``deallocate`` pair, timed in C++.

    The loop runs without the GIL and touches no memory: it measures the host cost of the
    resource's calls (driver calls, locks, bookkeeping).

    Parameters
    ----------
    mr : DeviceMemoryResource
        Any rmm resource.
    nbytes : int or str
        Size of each allocation (``"1MiB"`` accepted).
    iterations : int
        Timed pairs.
    stream : optional
        None (the default stream), an rmm ``Stream``, or any CuPy, Numba, cuda.core or
        ``__cuda_stream__`` stream.
    warmup : int
        Untimed pairs run first.
    """
    cdef size_t c_nbytes = parse_bytes(nbytes, "nbytes")
    if iterations == 0:
        raise ValueError("iterations must be positive, got 0")
    cdef Stream s = _as_stream(stream)
    cdef stream_ref c_stream = s.view()
    cdef double ns
    with nogil:
        ns = c_alloc_free_ns(mr.get_mr(), c_nbytes, iterations, c_stream, warmup)
    return ns


def fence_call_ns(size_t iterations=100000, stream=None) -> dict:
    """Mean host nanoseconds of the CUDA calls a deferred free makes, on an idle ``stream``.

    Returns a dict with ``event_record`` (``cudaEventRecord``), ``event_query``
    (``cudaEventQuery`` of a completed event) and ``stream_is_capturing``, and the same
    through the driver entry points the resources call (``cu_*``; 0 where missing).
    """
    if iterations == 0:
        raise ValueError("iterations must be positive, got 0")
    cdef Stream s = _as_stream(stream)
    cdef stream_ref c_stream = s.view()
    cdef fence_costs c
    with nogil:
        c = c_fence_call_ns(c_stream, iterations)
    return {
        "event_record": c.event_record,
        "event_query": c.event_query,
        "stream_is_capturing": c.stream_is_capturing,
        "cu_event_record": c.cu_event_record,
        "cu_event_query": c.cu_event_query,
        "cu_stream_is_capturing": c.cu_stream_is_capturing,
    }
