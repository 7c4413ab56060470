# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""RMM memory resources of rmm_fences, bound as subclasses of rmm's resources."""

from cython.operator cimport dereference as deref
from libc.stddef cimport size_t
from libc.stdint cimport uint64_t, uintptr_t
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.vector cimport vector
from cuda.bindings.cyruntime cimport cudaStream_t

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


cdef extern from "cuda.h" nogil:
    ctypedef void* CUfunction "CUfunction"


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
        double cu_stream_get_id
        double relaxed_capture_scope

    fence_costs c_fence_call_ns "rmm_fences::bench::fence_call_ns"(
        stream_ref stream, uint64_t iterations) except +

    double c_random_allocations_ops "rmm_fences::bench::random_allocations_ops"(
        device_async_resource_ref mr, uint64_t operations, size_t max_live, size_t min_size,
        size_t max_size, size_t max_live_bytes, uint64_t seed, stream_ref stream) except +

    double c_threaded_stream_queries "rmm_fences::bench::threaded_stream_queries"(
        int which, uint64_t iterations, const vector[cudaStream_t]& streams) except +

    double c_threaded_alloc_free_pairs "rmm_fences::bench::threaded_alloc_free_pairs"(
        device_async_resource_ref mr, size_t nbytes, uint64_t iterations,
        const vector[cudaStream_t]& streams) except +

    cdef struct stress_stats:
        uint64_t iterations
        uint64_t allocations
        uint64_t bytes
        uint64_t cross_stream_frees
        uint64_t out_of_memory
        uint64_t checks
        double seconds

    stress_stats c_stress "rmm_fences::bench::stress"(
        device_async_resource_ref mr, const vector[cudaStream_t]& streams, double seconds,
        CUfunction fill, CUfunction check, unsigned long long* errors, size_t max_bytes,
        size_t max_live, uint64_t seed, unsigned long long check_delay_ns) except +


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


cdef Stream _resource_stream(object stream):
    """The stream argument of a resource's allocate/deallocate, by rmm's contract: omitted is
    the default stream; None is refused (rmm raises the same TypeError)."""
    if stream is None:
        raise TypeError(
            "stream argument cannot be None: omit it for the default stream, or pass an rmm "
            "Stream (e.g. rmm.pylibrmm.stream.DEFAULT_STREAM) or a CuPy, Numba, cuda.core or "
            "__cuda_stream__ stream")
    return _as_stream(stream)


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
        "cu_stream_get_id": c.cu_stream_get_id,
        "relaxed_capture_scope": c.relaxed_capture_scope,
    }


def random_allocations(DeviceMemoryResource mr not None, size_t operations=100000, *,
                       size_t max_live=10000, min_size=256, max_size="4MiB",
                       max_live_bytes="16GiB", uint64_t seed=0, stream=None) -> float:
    """Operations per second of a random allocate/free mix, timed in C++ without the GIL.

    The shape of RMM's RANDOM_ALLOCATIONS benchmark: sizes uniform in
    ``[min_size, max_size]``, at most ``max_live`` blocks and ``max_live_bytes`` live; each
    step allocates or frees a random live block. Blocks still live at the end are freed.
    """
    cdef size_t lo = parse_bytes(min_size, "min_size")
    cdef size_t hi = parse_bytes(max_size, "max_size")
    cdef size_t cap = parse_bytes(max_live_bytes, "max_live_bytes")
    if lo == 0 or hi < lo:
        raise ValueError(f"need 0 < min_size <= max_size, got {lo} and {hi}")
    if max_live == 0:
        raise ValueError("max_live must be positive, got 0")
    cdef Stream s = _as_stream(stream)
    cdef stream_ref c_stream = s.view()
    cdef double ops
    with nogil:
        ops = c_random_allocations_ops(mr.get_mr(), operations, max_live, lo, hi, cap, seed,
                                       c_stream)
    return ops


cdef vector[cudaStream_t] _stream_handles(object streams) except *:
    cdef vector[cudaStream_t] handles
    cdef Stream rs
    for x in streams:
        rs = _as_stream(x)
        handles.push_back(rs.view().get())
    if handles.size() == 0:
        raise ValueError("streams must hold at least one stream")
    return handles


def threaded_alloc_free(DeviceMemoryResource mr not None, nbytes, size_t iterations,
                        streams) -> float:
    """Aggregate allocate+free pairs per second of one C++ thread per stream in ``streams``
    (rmm, CuPy, cuda.core or ``__cuda_stream__`` streams), all started together."""
    cdef size_t c_nbytes = parse_bytes(nbytes, "nbytes")
    cdef vector[cudaStream_t] handles = _stream_handles(streams)
    cdef double pairs
    with nogil:
        pairs = c_threaded_alloc_free_pairs(mr.get_mr(), c_nbytes, iterations, handles)
    return pairs


def stress(DeviceMemoryResource mr not None, streams, double seconds, *,
           uintptr_t fill_kernel, uintptr_t check_kernel, uintptr_t errors,
           max_bytes="4MiB", size_t max_live=32, uint64_t seed=0,
           unsigned long long check_delay_ns=20000) -> dict:
    """Multi-threaded data-checking stress of ``mr``: one C++ thread per stream, without the
    GIL, for ``seconds``.

    Each thread allocates random sizes (256 B to ``max_bytes``) on its stream, fills each
    block with a pattern keyed by (thread, allocation) with ``fill_kernel``, keeps some live
    (at most ``max_live`` per thread), and before every free checks the pattern with
    ``check_kernel``, which adds each mismatching word to the device counter at ``errors``.
    Frees happen on the thread's own stream or on another thread's stream after an event wait.
    Out-of-memory is counted and answered by freeing half of the thread's live blocks. All
    streams are synchronized before this returns; the caller reads ``errors``.

    Parameters
    ----------
    mr : DeviceMemoryResource
        The resource under test.
    streams : list
        One stream per thread (rmm, CuPy, cuda.core or ``__cuda_stream__`` streams).
    seconds : float
        How long the threads loop.
    fill_kernel, check_kernel : int
        ``CUfunction`` handles (CuPy: ``RawKernel.kernel.ptr``) of
        ``fill(unsigned* a, unsigned long long n, unsigned key)`` and
        ``check(const unsigned* a, unsigned long long n, unsigned key,
        unsigned long long* errors, unsigned long long delay_ns)`` in the current device's
        primary context (``check`` waits ``delay_ns`` before it reads).
    errors : int
        Device address of an ``unsigned long long`` counter.
    max_bytes : int or str
        Largest allocation (at least 256).
    max_live : int
        Blocks each thread may keep live across iterations.
    seed : int
        Seeds the sizes, choices and patterns.
    check_delay_ns : int
        How long each check kernel waits before reading its block (keeps freed blocks in use
        on the device while the host runs ahead, which widens every reuse race).

    Returns a dict: ``iterations``, ``allocations``, ``bytes``, ``cross_stream_frees``,
    ``out_of_memory``, ``checks``, ``seconds``.
    """
    cdef size_t c_max_bytes = parse_bytes(max_bytes, "max_bytes")
    if c_max_bytes < 256:
        raise ValueError(f"max_bytes must be at least 256, got {c_max_bytes}")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"seconds must be positive and finite, got {seconds}")
    for name, value in (("fill_kernel", fill_kernel), ("check_kernel", check_kernel),
                        ("errors", errors)):
        if value == 0:
            raise ValueError(f"{name} must be a non-null handle or device address, got 0")
    cdef vector[cudaStream_t] handles = _stream_handles(streams)
    cdef stress_stats c
    with nogil:
        c = c_stress(mr.get_mr(), handles, seconds, <CUfunction>fill_kernel,
                     <CUfunction>check_kernel, <unsigned long long*>errors, c_max_bytes,
                     max_live, seed, check_delay_ns)
    return {
        "iterations": c.iterations,
        "allocations": c.allocations,
        "bytes": c.bytes,
        "cross_stream_frees": c.cross_stream_frees,
        "out_of_memory": c.out_of_memory,
        "checks": c.checks,
        "seconds": c.seconds,
    }


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


def threaded_stream_queries(query, size_t iterations, streams) -> float:
    """Aggregate calls per second of ``query`` ("is_capturing" or "get_id", the driver's
    cuStreamIsCapturing / cuStreamGetId) from one C++ thread per stream in ``streams``."""
    queries = {"is_capturing": 0, "get_id": 1}
    if query not in queries:
        raise ValueError(f"query must be 'is_capturing' or 'get_id', got {query!r}")
    cdef int which = queries[query]
    cdef vector[cudaStream_t] handles = _stream_handles(streams)
    cdef double calls
    with nogil:
        calls = c_threaded_stream_queries(which, iterations, handles)
    return calls


include "_hazard_tracking.pxi"
include "_vmm.pxi"
