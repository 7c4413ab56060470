# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""RMM memory resources of rmm_fences, bound as subclasses of rmm's resources."""

from cython.operator cimport dereference as deref
from libc.stddef cimport size_t
from libc.stdint cimport uint64_t, uintptr_t
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.vector cimport vector

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

from rmm_fences._lib._pool cimport pool_stats_dict, stream_ordered_pool_stats
from rmm_fences._lib._sync_on_free cimport (
    free_problem,
    free_result,
    mode_from_name,
    stats_dict,
    sync_mode,
    sync_on_free_stats,
)


cdef extern from "rmm_fences/sync_on_free_resource_adaptor.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass sync_on_free_resource_adaptor_impl \
            "rmm_fences::mr::detail::sync_on_free_resource_adaptor_impl":
        void* allocate(stream_ref stream, size_t nbytes) except +
        free_result deallocate_checked(stream_ref stream, void* ptr, size_t nbytes) noexcept
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


cdef extern from "rmm_fences/stream_ordered_pool_memory_resource.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass stream_ordered_pool_memory_resource_impl \
            "rmm_fences::mr::detail::stream_ordered_pool_memory_resource_impl":
        void* try_allocate_cached(stream_ref stream, size_t nbytes) except +
        void* allocate(stream_ref stream, size_t nbytes) except +
        void deallocate(stream_ref stream, void* ptr, size_t nbytes) noexcept
        int deallocate_checked(stream_ref stream, void* ptr, size_t nbytes,
                               size_t* allocated_bytes) noexcept
        void retire_stream(stream_ref stream) except +
        size_t release() except +
        size_t pool_size()
        stream_ordered_pool_stats stats()

    cdef cppclass stream_ordered_pool_memory_resource:
        stream_ordered_pool_memory_resource(
            any_resource[device_accessible] upstream,
            size_t initial_pool_size,
            optional[size_t] maximum_pool_size,
        ) except +
        stream_ordered_pool_memory_resource_impl& get()


# rmm declares the template of make_device_async_resource_ref (librmm/memory_resource.pxd);
# these are its overloads for our resources.
cdef extern from *:
    optional[device_async_resource_ref] make_device_async_resource_ref(
        sync_on_free_resource_adaptor&) except +
    optional[device_async_resource_ref] make_device_async_resource_ref(
        naive_caching_memory_resource&) except +
    optional[device_async_resource_ref] make_device_async_resource_ref(
        stream_ordered_pool_memory_resource&) except +


def _check_upstream(upstream_mr):
    if not isinstance(upstream_mr, DeviceMemoryResource):
        raise TypeError(
            "upstream_mr must be an rmm.mr.DeviceMemoryResource "
            f"(e.g. rmm.mr.CudaMemoryResource()), got {type(upstream_mr).__name__}"
        )


include "_stream_arg.pxi"


cdef Stream _resource_stream(object stream):
    """The stream argument of a resource's allocate/deallocate, by rmm's contract: omitted is
    the default stream; None is refused (rmm raises the same TypeError)."""
    if stream is None:
        raise TypeError(
            "stream argument cannot be None: omit it for the default stream, or pass an rmm "
            "Stream (e.g. rmm.pylibrmm.stream.DEFAULT_STREAM) or a CuPy, Numba, cuda.core or "
            "__cuda_stream__ stream")
    return _as_stream(stream)


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

    def allocate(self, size_t nbytes, stream=DEFAULT_STREAM):
        """Allocate ``nbytes`` on ``stream`` from the upstream (retrying once after the pending
        frees went upstream when it is short).

        ``stream``: an rmm ``Stream`` or a CuPy, Numba, cuda.core or ``__cuda_stream__``
        stream (default: the default stream; None raises TypeError, as rmm's resources do).
        """
        cdef Stream s = _resource_stream(stream)
        cdef stream_ref c_stream = s.view()
        cdef void* ptr
        with nogil:
            ptr = deref(self.c_obj).get().allocate(c_stream, nbytes)
        return <uintptr_t>ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, stream=DEFAULT_STREAM):
        """Free ``ptr`` of ``nbytes`` bytes on ``stream``, by the adaptor's mode.

        Parameters
        ----------
        ptr : int
            A pointer returned by :meth:`allocate` and not freed since.
        nbytes : int
            The size it was allocated with.
        stream : rmm Stream, __cuda_stream__ object or None
            The stream whose queued work may still use the block (default: the default
            stream; None raises TypeError, as rmm's resources do).

        Raises
        ------
        ValueError
            On a double free, a pointer the adaptor did not allocate, or a size that does not
            match the allocation; nothing is freed then.
        """
        cdef Stream s = _resource_stream(stream)
        cdef stream_ref c_stream = s.view()
        cdef free_result r
        with nogil:
            r = deref(self.c_obj).get().deallocate_checked(c_stream, <void*>ptr, nbytes)
        problem = free_problem(r, ptr, nbytes)
        if problem is not None:
            raise ValueError(problem)

    def flush(self) -> None:
        """Block until every pending block went upstream.

        Waits for the fence of each pending block. Blocks freed during a stream capture, and
        blocks whose fence wait failed, are returned once a device synchronization succeeds;
        while a capture is under way they stay pending (nothing is released on a failure).
        """
        with nogil:
            deref(self.c_obj).get().flush()

    @property
    def stats(self) -> dict:
        """Counters: ``syncs`` (host waits that succeeded), ``deferred`` (frees that returned
        at once), ``released`` (pending blocks handed upstream), ``oom_retries``, ``parked``
        (frees listed without a fence: during stream capture, or when none could be recorded),
        ``peak_pending_bytes``, ``failed_syncs`` (syncs and fence waits that failed: nothing
        was released on them), ``rejected_frees`` (double frees, foreign pointers, size
        mismatches)."""
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
    A failed query, wait or synchronization (another thread capturing in the global mode,
    say) never releases a block: it stays pending and is retried. During stream capture
    nothing is queried or synchronized on the capturing stream: its frees wait, unfenced,
    until a later call on that very stream outside capture (when the adaptor can verify the
    stream's identity) or a successful device synchronization (:meth:`flush`, out of memory).
    Double frees, foreign pointers and size mismatches are rejected before any upstream call.
    The adaptor belongs to the device that is current when it is constructed.

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


cdef class _StreamOrderedPoolMemoryResource(UpstreamResourceAdaptor):
    cdef unique_ptr[stream_ordered_pool_memory_resource] c_obj
    cdef object _maximum_pool_size

    def __cinit__(self, DeviceMemoryResource upstream_mr, initial_pool_size=None,
                  maximum_pool_size=None):
        cdef size_t initial = 0
        cdef optional[size_t] maximum
        if initial_pool_size is not None:
            initial = parse_bytes(initial_pool_size, "initial_pool_size")
        if maximum_pool_size is not None:
            self._maximum_pool_size = parse_bytes(maximum_pool_size, "maximum_pool_size")
            if self._maximum_pool_size < initial:
                raise ValueError(
                    f"maximum_pool_size ({self._maximum_pool_size}) must be at least "
                    f"initial_pool_size ({initial})"
                )
            maximum = <size_t>self._maximum_pool_size
        with nogil:
            self.c_obj.reset(new stream_ordered_pool_memory_resource(
                any_resource[device_accessible](upstream_mr.get_mr()), initial, maximum,
            ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def allocate(self, size_t nbytes, stream=DEFAULT_STREAM):
        """Allocate ``nbytes`` on ``stream`` (see :class:`rmm.mr.DeviceMemoryResource`).

        ``stream`` is an rmm ``Stream`` or a CuPy, Numba, cuda.core or ``__cuda_stream__``
        stream; None raises TypeError, as rmm's resources do. The same-stream path runs
        without releasing the GIL (it never blocks and takes tens of nanoseconds); only a
        miss, which may grow the pool, releases it.
        """
        cdef Stream rs = <Stream>stream if type(stream) is Stream else _resource_stream(stream)
        cdef stream_ref s = rs.view()
        cdef void* ptr = deref(self.c_obj).get().try_allocate_cached(s, nbytes)
        if ptr == NULL:
            with nogil:
                ptr = deref(self.c_obj).get().allocate(s, nbytes)
        return <uintptr_t>ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, stream=DEFAULT_STREAM):
        """Free ``ptr`` on ``stream``: reusable on ``stream`` at once, elsewhere after a fence.

        Never blocks (at most one event record), so the GIL is kept.

        Raises
        ------
        TypeError
            When ``stream`` is None or not a stream.
        ValueError
            When ``ptr`` is not a live block of this pool (a double free or a foreign
            pointer), when ``nbytes`` differs from the size it was allocated with, or when
            ``stream`` belongs to another device. The pool is then left unchanged (the refusal
            is counted in ``stats["rejected_frees"]``).
        """
        cdef Stream rs = <Stream>stream if type(stream) is Stream else _resource_stream(stream)
        cdef size_t allocated = 0
        cdef int status = deref(self.c_obj).get().deallocate_checked(
            rs.view(), <void*>ptr, nbytes, &allocated)
        if status == 0:
            return
        if status == 2:
            raise ValueError(
                f"size mismatch: allocated {allocated} bytes, freed with {nbytes} "
                f"(pointer {ptr:#x}); the pool is unchanged"
            )
        if status == 3:
            raise ValueError(
                f"stream of another device: cannot free {ptr:#x} on it; the pool is unchanged"
            )
        raise ValueError(
            f"double free or foreign pointer: {ptr:#x} ({nbytes} bytes) is not a live block "
            "of this pool; the pool is unchanged"
        )

    def pool_size(self) -> int:
        """Bytes held from the upstream."""
        return deref(self.c_obj).get().pool_size()

    @property
    def maximum_pool_size(self):
        """The bound on :meth:`pool_size`, or ``None``."""
        return self._maximum_pool_size

    def release(self) -> int:
        """Synchronize the device, then return every wholly free chunk to the upstream.

        Returns the number of bytes returned. Blocks cached by streams are reclaimed first.
        """
        cdef size_t n
        with nogil:
            n = deref(self.c_obj).get().release()
        return n

    def retire_stream(self, stream) -> None:
        """Fence ``stream`` and hand the blocks it freed to every stream; call this before
        destroying a stream that freed memory into the pool.

        Without it, blocks freed on a destroyed stream stay reserved for it until the pool
        runs short (one device synchronization then reclaims them) or :meth:`release`.
        """
        cdef Stream s = _as_stream(stream)
        cdef stream_ref c_stream = s.view()
        with nogil:
            deref(self.c_obj).get().retire_stream(c_stream)

    @property
    def stats(self) -> dict:
        """Counters: ``current_bytes``, ``peak_bytes``, ``pool_bytes``, ``same_stream_reuse``,
        ``cross_stream_reuse``, ``upstream_growths``, ``fences``, ``stream_waits``,
        ``reclaim_syncs``, ``retired_streams``, ``rejected_frees``."""
        return pool_stats_dict(deref(self.c_obj).get().stats())


class StreamOrderedPoolMemoryResource(_StreamOrderedPoolMemoryResource):
    """A pool that is safe without any host synchronization: reuse follows stream order.

    Parameters
    ----------
    upstream_mr : DeviceMemoryResource
        Where chunks come from.
    initial_pool_size : int or str, optional
        Bytes taken from the upstream at construction (``"1GiB"`` accepted). ``None``
        (default): nothing until the first allocation, then 64 MiB or the request.
    maximum_pool_size : int or str, optional
        The most bytes the pool may hold. ``None`` (default): no bound.

    Notes
    -----
    A block freed on stream S is reused on S at once (no CUDA call but the stream identity
    query, none at all on the default stream). Another stream T
    takes it only after enqueuing ``cudaStreamWaitEvent`` on a fence recorded on S after the
    free; S records one fence per batch (once it caches 32 blocks or 1/16 of the pool in bytes,
    its last exact-size frees counted only once another stream ran short), never one per free,
    and never while it is being captured. The pool grows by doubling,
    trying smaller chunks when the upstream is short, allocating each chunk on the requesting
    stream (on a pool-owned stream while the requesting stream is captured); right before
    raising :class:`MemoryError` it synchronizes the device once and reclaims what that sync
    covers. A double free, a foreign pointer or a wrong size raises :class:`ValueError` and
    leaves the pool unchanged.
    Streams that freed memory should be retired with :meth:`retire_stream` before they are
    destroyed. The pool belongs to the device current at construction.
    """

    def __new__(cls, upstream_mr, initial_pool_size=None, maximum_pool_size=None):
        _check_upstream(upstream_mr)
        return super().__new__(cls, upstream_mr, initial_pool_size, maximum_pool_size)

    def __init__(self, upstream_mr, initial_pool_size=None, maximum_pool_size=None):
        pass

    def __repr__(self):
        return (
            f"{type(self).__name__}({type(self.get_upstream()).__name__}(), "
            f"pool_size={self.pool_size()}, maximum_pool_size={self.maximum_pool_size!r})"
        )


include "_hazard_tracking.pxi"
include "_vmm.pxi"
