# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""Benchmark and stress loops over any rmm resource, timed in C++ without the GIL (_loops.hpp).

The native half of :mod:`rmm_fences_bench`: built in place from benchmarks/ (CMake option
RMM_FENCES_BUILD_BENCHMARKS), never installed.
"""

from libc.stddef cimport size_t
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libcpp cimport bool as cpp_bool
from libcpp.memory cimport unique_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector
from cuda.bindings.cyruntime cimport cudaMemPool_t, cudaStream_t

from rmm.librmm.cuda_stream_ref cimport stream_ref
from rmm.librmm.memory_resource cimport (
    device_async_resource_ref,
    statistics_resource_adaptor,
)
from rmm.pylibrmm.memory_resource._memory_resource cimport (
    CudaAsyncMemoryResource,
    DeviceMemoryResource,
    StatisticsResourceAdaptor,
)
from rmm.pylibrmm.stream cimport Stream

from rmm_fences_bench._replay cimport c_make_trace, replay_result, replay_trace_t
from rmm_fences._lib.memory_resource cimport as_stream

from rmm_fences import VmmPoolMemoryResource
from rmm_fences._sizes import parse_bytes


cdef extern from "cuda.h" nogil:
    ctypedef void* CUfunction "CUfunction"


# rmm's declaration of cuda_async_memory_resource leaves out pool_handle()
cdef extern from "rmm/mr/cuda_async_memory_resource.hpp" nogil:
    cdef cppclass cuda_async_pool_owner "rmm::mr::cuda_async_memory_resource":
        cudaMemPool_t pool_handle() noexcept


cdef extern from "rmm_fences_bench/_core_pairs.hpp" namespace "rmm_fences::bench" nogil:
    cdef struct core_pair_result:
        double ns
        uint64_t fences
        uint64_t upstream_calls

    core_pair_result c_core_pair_ns "rmm_fences::bench::core_pair_ns"(
        const string& which, size_t nbytes, uint64_t iterations) except +


cdef extern from "rmm_fences_bench/_loops.hpp" namespace "rmm_fences::bench" nogil:
    double c_alloc_free_ns "rmm_fences::bench::alloc_free_ns"(
        device_async_resource_ref mr,
        size_t nbytes,
        uint64_t iterations,
        stream_ref stream,
        uint64_t warmup,
        stream_ref free_stream,
    ) except +

    cdef struct page_costs:
        double page
        double create
        double map
        double set_access
        double unmap
        double release

    page_costs c_page_call_ns "rmm_fences::bench::page_call_ns"(
        int device, size_t pages, size_t rounds
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
        size_t max_size, size_t max_live_bytes, uint64_t random_state,
        stream_ref stream) except +

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
        size_t max_live, uint64_t random_state, unsigned long long check_delay_ns) except +

    cdef cppclass rmm_footprint:
        rmm_footprint(statistics_resource_adaptor* statistics, cudaMemPool_t pool)
        void start() except +
        uint64_t peak() except +

    replay_result c_replay_trace "rmm_fences::bench::replay_trace"(
        device_async_resource_ref mr, const replay_trace_t& trace, vector[cudaStream_t] streams,
        const vector[uintptr_t]& recorded, uint64_t repeat, cpp_bool ordered,
        statistics_resource_adaptor* statistics, cudaMemPool_t pool) except +


def alloc_free_ns(DeviceMemoryResource mr not None, nbytes, size_t iterations=10000,
                  stream=None, *, size_t warmup=100, free_stream=None) -> float:
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
    free_stream : optional
        Where each block is freed (default: ``stream``). With another stream the allocations
        reuse blocks freed on another stream (a stream-ordered pool then makes ``stream`` wait
        on a fence of ``free_stream``).
    """
    cdef size_t c_nbytes = parse_bytes(nbytes, "nbytes")
    if iterations == 0:
        raise ValueError("iterations must be positive, got 0")
    cdef Stream s = as_stream(stream)
    cdef Stream fs = s if free_stream is None else as_stream(free_stream)
    cdef stream_ref c_stream = s.view()
    cdef stream_ref c_free_stream = fs.view()
    cdef double ns
    with nogil:
        ns = c_alloc_free_ns(mr.get_mr(), c_nbytes, iterations, c_stream, warmup, c_free_stream)
    return ns


def fence_call_ns(size_t iterations=100000, stream=None) -> dict:
    """Mean host nanoseconds of the CUDA calls a deferred free makes, on an idle ``stream``.

    Returns a dict with ``event_record`` (``cudaEventRecord``), ``event_query``
    (``cudaEventQuery`` of a completed event) and ``stream_is_capturing``, and the same
    through the driver entry points the resources call (``cu_*``; 0 where missing).
    """
    if iterations == 0:
        raise ValueError("iterations must be positive, got 0")
    cdef Stream s = as_stream(stream)
    cdef stream_ref c_stream = s.view()
    cdef fence_costs c
    with nogil:
        c = c_fence_call_ns(c_stream, iterations)
    return c  # the struct's fields, by name


def core_pair_ns(str core, nbytes, size_t iterations=1000000) -> dict:
    """Mean host nanoseconds of one allocate + deallocate pair of ``nbytes`` on one stream in a
    policy core alone: ``core`` ``"pool"`` (the stream-ordered pool's), ``"sync_on_free"``
    (SyncOnFree's, deferred mode, default batch limits) or ``"tracking_pool"`` (the hazard
    tracker's over the pool's), over platforms that make no CUDA call and an upstream of host
    memory. Needs no GPU.

    What a resource's pair costs beyond it is its CUDA calls (stream lookups, fence records)
    and rmm's dispatch. Returns a dict with ``ns``, ``fences`` (fences recorded during the
    timed pairs) and ``upstream_calls`` (the upstream's allocations and frees during them).
    """
    if iterations == 0:
        raise ValueError("iterations must be positive, got 0")
    cdef size_t c_nbytes = parse_bytes(nbytes, "nbytes")
    cdef string c_core = core.encode()
    cdef core_pair_result r
    with nogil:
        r = c_core_pair_ns(c_core, c_nbytes, iterations)
    return r  # the struct's fields, by name


def page_call_ns(size_t pages=64, size_t rounds=10, int device=-1) -> dict:
    """Mean host nanoseconds of the driver calls that move device pages, on an idle ``device``
    (-1: the current one).

    ``pages`` pages are created once, then ``rounds`` times mapped one by one, given access as
    one range and unmapped one by one. Returns a dict with ``page`` (bytes per page),
    ``create``, ``map``, ``unmap`` and ``release`` (per page) and ``set_access`` (per range of
    ``pages`` pages); all 0 where the driver lacks the virtual memory API.
    """
    if pages == 0 or rounds == 0:
        raise ValueError(f"pages and rounds must be positive, got {pages} and {rounds}")
    cdef page_costs c
    with nogil:
        c = c_page_call_ns(device, pages, rounds)
    return c  # the struct's fields, by name


def random_allocations(DeviceMemoryResource mr not None, size_t operations=100000, *,
                       size_t max_live=10000, min_size=256, max_size="4MiB",
                       max_live_bytes="16GiB", uint64_t random_state=0, stream=None) -> float:
    """Operations per second of a random allocate/free mix, timed in C++ without the GIL.

    The shape of RMM's RANDOM_ALLOCATIONS benchmark: sizes uniform in
    ``[min_size, max_size]``, at most ``max_live`` blocks and ``max_live_bytes`` live; each
    step allocates or frees a random live block. Blocks still live at the end are freed.
    ``random_state`` starts the random generator (the same value replays the same sequence).
    """
    cdef size_t lo = parse_bytes(min_size, "min_size")
    cdef size_t hi = parse_bytes(max_size, "max_size")
    cdef size_t cap = parse_bytes(max_live_bytes, "max_live_bytes")
    if lo == 0 or hi < lo:
        raise ValueError(f"need 0 < min_size <= max_size, got {lo} and {hi}")
    if max_live == 0:
        raise ValueError("max_live must be positive, got 0")
    cdef Stream s = as_stream(stream)
    cdef stream_ref c_stream = s.view()
    cdef double ops
    with nogil:
        ops = c_random_allocations_ops(mr.get_mr(), operations, max_live, lo, hi, cap,
                                       random_state, c_stream)
    return ops


cdef vector[cudaStream_t] _stream_handles(object streams) except *:
    cdef vector[cudaStream_t] handles
    cdef Stream rs
    for x in streams:
        rs = as_stream(x)
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
           max_bytes="4MiB", size_t max_live=32, uint64_t random_state=0,
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
    random_state : int
        Starts the random generator of the sizes, choices and patterns (the same value
        replays the same sequence per thread).
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
                     max_live, random_state, check_delay_ns)
    return c  # the struct's fields, by name


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


def footprint_layer(mr) -> tuple:
    """The layer of ``mr``'s chain (followed down through ``get_upstream()``) whose draw
    :func:`replay` reports as the chain's footprint, as ``(source, resource)``:

    - ``("cuda_async_pool", r)``: the chain ends in ``r``, an ``rmm.mr.CudaAsyncMemoryResource``
      or ``CudaAsyncViewMemoryResource``: the bytes its CUDA memory pool reserves;
    - ``("vmm_pool", r)``: the chain ends in ``r``, an ``rmm_fences.VmmPoolMemoryResource``:
      the most bytes of device pages it held (``stats["peak_physical_bytes"]``);
    - ``("statistics", r)``: the chain ends in ``r``, an ``rmm.mr.StatisticsResourceAdaptor``,
      over one resource that takes no upstream (``cuda``, ``managed``, ...): the bytes it holds
      from that resource (``rmm_fences_bench.with_footprint`` puts it there in a spec);
    - ``("none", None)``: neither; the footprint is not measured. A statistics adaptor higher
      up counts what the layers under it were asked for, not what they took from the device.
    """
    import rmm

    chain = [mr]
    while len(chain) < 256:
        upstream = getattr(chain[-1], "get_upstream", None)
        if upstream is None:
            break
        chain.append(upstream())
    leaf = chain[-1]
    if isinstance(leaf, (rmm.mr.CudaAsyncMemoryResource, rmm.mr.CudaAsyncViewMemoryResource)):
        return "cuda_async_pool", leaf
    if isinstance(leaf, VmmPoolMemoryResource):
        return "vmm_pool", leaf
    if len(chain) >= 2 and isinstance(chain[-2], rmm.mr.StatisticsResourceAdaptor):
        return "statistics", chain[-2]
    return "none", None


def replay(DeviceMemoryResource mr not None, trace, *, streams=None, uint64_t repeat=1,
           ordered=False) -> dict:
    """Replays an allocation log (a ``Trace``, see ``rmm_fences_bench.read_allocation_log``)
    on ``mr``, timed in C++ without the GIL.

    One C++ thread per recorded thread replays its events in recorded order, all started
    together; a free of a block another thread allocated waits (spinning, yielding) until that
    allocation happened. Nothing else orders the threads unless ``ordered``: then every event
    also waits for its turn in the trace's one recorded order (all threads), so the calls reach
    ``mr`` in that order and the replayed peak of live bytes is the trace's. No memory is
    touched: this is the host cost of the calls, as in :func:`alloc_free_ns`. An allocation
    that throws is counted in ``errors`` and the replay goes on (its free is skipped). Blocks
    the log never frees are freed after the timing.

    The footprint: the most bytes the chain held from the device at once during the replay (all
    repetitions, what it held before included), read at the layer :func:`footprint_layer`
    finds at the bottom of ``mr``'s chain (build the chain from
    ``rmm_fences_bench.with_footprint(spec)`` to have one), against the trace's own peak of live
    bytes.

    Parameters
    ----------
    mr : DeviceMemoryResource
        Any rmm resource.
    trace : Trace
        The log.
    streams : list, optional
        The stream of each recorded stream (index ``k`` of ``trace.stream_handles``; rmm,
        CuPy, cuda.core or ``__cuda_stream__`` streams). Default: one new non-blocking stream
        per recorded stream, except the recorded handles 0, 1 and 2 (the legacy default
        stream, ``cudaStreamLegacy``, ``cudaStreamPerThread``), which stay themselves; the new
        streams are synchronized and destroyed before this returns.
    repeat : int
        Replays, each from scratch (nothing live in between).
    ordered : bool
        False (default): free-running, the threads interleave as they run; for the rate of
        calls (``allocations_per_s``). True: every event on its recorded thread, in the trace's
        recorded order (a shared sequence counter: each thread waits, spinning then yielding,
        until it reaches its event's index, makes the call, advances it); the interleaving,
        hence ``peak_live_bytes`` and the footprint, no longer depend on timing: for comparing
        the footprints of chains. The waits are timed too: its ``allocations_per_s`` is not
        the chain's rate.

    Returns a dict: ``seconds`` (timed, summed over the replays), ``allocations_per_s``
    (allocations + frees made, per timed second: rmm's replay benchmark reports only the time
    of a replay), ``allocations``, ``frees``, ``errors``, ``skipped_frees``, ``leftovers``
    (sums over the replays), ``peak_live_bytes`` (most bytes live at once, as replayed, the
    largest repetition: free-running, threads interleave, so it may differ from the trace's;
    ordered, it is the trace's unless an allocation failed), ``trace_peak_live_bytes`` (most
    bytes live at once in the trace's recorded order), ``footprint_bytes`` (see above),
    ``fragmentation`` (``footprint_bytes / trace_peak_live_bytes``) and ``footprint_source``
    (the first item of :func:`footprint_layer`; with ``"none"``, ``footprint_bytes`` and
    ``fragmentation`` are None).

    Raises
    ------
    TypeError
        ``ordered`` is not a bool.
    ValueError
        ``repeat`` is 0, the trace holds no event, or ``streams`` has fewer streams than the
        trace records.
    """
    if ordered is not True and ordered is not False:
        raise TypeError(f"ordered must be a bool, got {type(ordered).__name__}")
    if repeat == 0:
        raise ValueError("repeat must be positive, got 0")
    if len(trace) == 0:
        raise ValueError("the trace holds no event")
    cdef const uint32_t[::1] thread = trace.thread
    cdef const uint8_t[::1] action = trace.action
    cdef const uint64_t[::1] ident = trace.id
    cdef const uint64_t[::1] size = trace.size
    cdef const uint32_t[::1] stream = trace.stream
    cdef vector[uintptr_t] recorded = [int(h) for h in trace.stream_handles]
    cdef vector[cudaStream_t] handles
    if streams is not None:
        if len(streams) < recorded.size():
            raise ValueError(f"streams must hold one stream per recorded stream "
                             f"({recorded.size()}), got {len(streams)}")
        handles = _stream_handles(streams)
    source, layer = footprint_layer(mr)
    cdef statistics_resource_adaptor* c_statistics = _statistics_of(source, layer)
    cdef cudaMemPool_t c_pool = _pool_of(source, layer)
    cdef replay_trace_t c_trace = c_make_trace(
        thread.shape[0], &thread[0], &action[0], &ident[0], &size[0], &stream[0],
        trace.threads, recorded.size())
    cdef replay_result r
    cdef cpp_bool c_ordered = ordered
    with nogil:
        r = c_replay_trace(mr.get_mr(), c_trace, handles, recorded, repeat, c_ordered,
                           c_statistics, c_pool)
    cdef dict out = r  # the struct's fields, by name
    calls = r.allocations + r.frees
    out["allocations_per_s"] = calls / r.seconds if r.seconds > 0 else 0.0
    out["footprint_source"] = source
    if source == "none":
        out["footprint_bytes"] = out["fragmentation"] = None
    elif source == "vmm_pool":  # the pool's own high-water mark of pages
        out["footprint_bytes"] = layer.stats["peak_physical_bytes"]
        out["fragmentation"] = out["footprint_bytes"] / max(r.trace_peak_live_bytes, 1)
    return out


cdef statistics_resource_adaptor* _statistics_of(str source, layer):
    """The statistics adaptor of a footprint layer (see footprint_layer), or NULL."""
    if source == "statistics":
        return (<StatisticsResourceAdaptor>layer).c_obj.get()
    return NULL


cdef cudaMemPool_t _pool_of(str source, layer):
    """The CUDA memory pool of a footprint layer (see footprint_layer), or NULL."""
    if source != "cuda_async_pool":
        return NULL
    if isinstance(layer, CudaAsyncMemoryResource):
        return (<cuda_async_pool_owner*>(
            (<CudaAsyncMemoryResource>layer).c_obj.get())).pool_handle()
    return <cudaMemPool_t><uintptr_t>int(layer.pool_handle())


cdef class FootprintMeter:
    """The most bytes a chain holds from the device between :meth:`start` and :meth:`peak`,
    read where :func:`replay` reads it (:func:`footprint_layer`: a CudaAsync leaf's memory
    pool, or a statistics adaptor over the leaf, as ``with_footprint`` puts it in a spec).

    ``source`` is the layer's kind; with ``"none"`` the chain has no such layer and
    :meth:`peak` returns None. Over a ``vmm_pool`` leaf the peak is its pages' high-water mark
    (``stats["peak_physical_bytes"]``, which cannot be reset): exact when the chain rose above
    the mark it had at :meth:`start`, or when it held its mark then; otherwise None (the peak
    since :meth:`start` lies between what it held then and that older mark). One measurement
    at a time per chain.
    """

    cdef unique_ptr[rmm_footprint] c_obj
    cdef readonly str source
    cdef object _mr  # the chain stays alive while measured
    cdef object _layer
    cdef object _vmm_start  # (physical bytes, peak physical bytes) at start, vmm_pool only

    def __init__(self, DeviceMemoryResource mr not None):
        source, layer = footprint_layer(mr)
        self.source = source
        self._mr = mr
        self._layer = layer
        self.c_obj.reset(new rmm_footprint(_statistics_of(source, layer), _pool_of(source, layer)))

    def start(self) -> None:
        """Starts a measurement (what the chain holds now counts as held)."""
        if self.source == "vmm_pool":
            stats = self._layer.stats
            self._vmm_start = (stats["physical_bytes"], stats["peak_physical_bytes"])
        self.c_obj.get().start()

    def peak(self):
        """The most bytes held since :meth:`start` (None without a footprint layer, or where a
        ``vmm_pool`` leaf cannot tell: see the class)."""
        if self.source == "none":
            return None
        if self.source == "vmm_pool":
            if self._vmm_start is None:
                raise RuntimeError("FootprintMeter.peak() before start()")
            held, mark = self._vmm_start
            now = self._layer.stats["peak_physical_bytes"]
            return now if now > mark or held == mark else None
        return self.c_obj.get().peak()
