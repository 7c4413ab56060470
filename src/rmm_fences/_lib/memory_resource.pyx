# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""RMM memory resources of rmm_fences, bound as subclasses of rmm's resources.

The C++ classes are declared in memory_resource.pxd; this module holds only the Python-facing
classes. Each resource is one ``cdef class`` over its public C++ class, in rmm's shape: its
``__cinit__`` builds the C++ resource from the arguments, with the defaults of the signature.
An adaptor's upstream is checked by rmm's ``UpstreamResourceAdaptor.__cinit__``, which runs
first, as for rmm's own adaptors: ``None`` raises rmm's ``Exception("Argument `upstream_mr` must
not be None")`` and any other type Cython's ``TypeError`` naming ``upstream_mr``.

The class docstring opens with the constructor's signature and the ``--`` line of CPython's
text signatures, so that ``inspect.signature`` and ``help`` show it (a cdef class's
``__init__`` has none); tests/package/test_adaptor_defaults.py checks it against the defaults
the ``__cinit__`` applies and against the stub.
"""

import atexit
import sys
import warnings
import weakref

from cpython.ref cimport PyObject
from cython.operator cimport dereference as deref
from libc.stddef cimport size_t
from libc.stdint cimport uint64_t, uintptr_t
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.string cimport string

from rmm.librmm.cuda_stream_ref cimport stream_ref
from rmm.librmm.memory_resource cimport (
    any_resource,
    device_accessible,
    percent_of_free_device_memory,
)
from rmm.librmm.per_device_resource cimport cuda_device_id
from rmm.pylibrmm.memory_resource._memory_resource cimport (
    DeviceMemoryResource,
    UpstreamResourceAdaptor,
)
from rmm.pylibrmm.stream cimport Stream

from rmm.pylibrmm.stream import DEFAULT_STREAM

from rmm_fences._hazards import (
    HazardError,
    HazardWarning,
    allocation_from_fields,
    format_report,
    hazard_from_fields,
    leak_record,
)
from rmm_fences._sizes import parse_bytes

from rmm_fences._lib._cores cimport (
    allocation_fields,
    batch_bytes_from,
    batch_frees_from,
    default_max_batch_bytes,
    default_max_batch_frees,
    free_problem,
    hazard_fields,
    hazard_kind_names,
    hazard_record,
    hazard_tracker_stats,
    mode_from_name,
)

#: The hazard kinds, in the order of the C++ ``hazard_kind`` (re-exported by ``_hazards``).
HAZARD_KINDS = hazard_kind_names()


cdef Stream as_stream(object stream):
    """The stream argument of the native calls: None is the default stream."""
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


cdef Stream _resource_stream(object stream):
    """The stream argument of a resource's allocate/deallocate, by rmm's contract: omitted is
    the default stream; None is refused (rmm raises the same TypeError)."""
    if stream is None:
        raise TypeError(
            "stream argument cannot be None: omit it for the default stream, or pass an rmm "
            "Stream (e.g. rmm.pylibrmm.stream.DEFAULT_STREAM) or a CuPy, Numba, cuda.core or "
            "__cuda_stream__ stream")
    return as_stream(stream)


cdef class SyncOnFreeResourceAdaptor(UpstreamResourceAdaptor):
    """SyncOnFreeResourceAdaptor(upstream_mr, mode="deferred", max_pending_bytes=None,
  max_batch_frees=16, max_batch_bytes=67108864, reuse_on_stream=True)
--

Make freeing safe while kernels may still use the block, over any upstream.

    Parameters
    ----------
    upstream_mr : DeviceMemoryResource
        Receives each freed block once no device work can still use it.
    mode : {"deferred", "stream", "device"}
        ``"device"`` synchronizes the device before each free (what ``cudaFree`` does);
        ``"stream"`` synchronizes the freeing stream; ``"deferred"`` (default) returns at
        once: the block goes upstream only after an event recorded on the freeing stream
        after the free completed, checked without blocking on allocate and deallocate calls,
        and by :meth:`flush`. Consecutive frees on one stream share one event, and an
        allocation takes back a block of its size among the last 16 frees on its own stream
        (no event, no upstream call: the stream orders the new work after the old).
    max_pending_bytes : int or str, optional
        Deferred mode only: once more bytes than this are pending, wait for the oldest
        fences. Accepts ints or strings such as ``"1GiB"``. ``None`` (default): no cap.
    max_batch_frees : int, optional
        Deferred mode only: the event shared by a stream's frees is recorded once this many
        frees wait for it (default 16; at least 1; 1: an event per free).
    max_batch_bytes : int or str, optional
        Deferred mode only: the event is also recorded once this many bytes wait for it
        (default 64 MiB, positive; ints or strings such as ``"64MiB"``). ``None``: no byte
        limit.
    reuse_on_stream : bool, default True
        Deferred mode only: an allocation takes back a block of its size and alignment among
        the last 16 frees on its own stream when the stream is not capturing (the CUB
        temp-storage loop: no event, no upstream call). ``False``: every block goes upstream
        once its event completed.

    Notes
    -----
    A batch's event is recorded only during a call on the stream that freed it (that stream
    may be destroyed once its free returned): the last frees on a stream that is not used
    again go upstream after a device synchronization (:meth:`flush`, out of memory).
    If the upstream runs out of memory, the calling stream's batch gets its event, every
    pending fence is waited on (and the device synchronized for blocks without one), those
    blocks go upstream and the allocation is retried once before :class:`MemoryError` is
    raised.
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
    cdef unique_ptr[sync_on_free_resource_adaptor] c_obj
    cdef str _mode
    cdef object _max_pending_bytes

    def __cinit__(self, DeviceMemoryResource upstream_mr, mode="deferred",
                  max_pending_bytes=None, max_batch_frees=default_max_batch_frees,
                  max_batch_bytes=default_max_batch_bytes, reuse_on_stream=True):
        if not isinstance(reuse_on_stream, bool):
            raise TypeError(
                f"reuse_on_stream must be True or False, got {type(reuse_on_stream).__name__}"
            )
        cdef sync_mode c_mode = mode_from_name(mode)
        cdef optional[size_t] c_cap
        cdef size_t c_batch_frees = batch_frees_from(max_batch_frees)
        cdef optional[size_t] c_batch_bytes = batch_bytes_from(max_batch_bytes)
        if max_pending_bytes is not None:
            self._max_pending_bytes = parse_bytes(max_pending_bytes, "max_pending_bytes")
            c_cap = <size_t>self._max_pending_bytes
        self._mode = mode
        self.c_obj.reset(new sync_on_free_resource_adaptor(
            any_resource[device_accessible](upstream_mr.get_mr()),
            c_mode,
            c_cap,
            c_batch_frees,
            c_batch_bytes,
            reuse_on_stream,
        ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def __repr__(self):
        return (
            f"{type(self).__name__}({type(self.get_upstream()).__name__}(), "
            f"mode={self.mode!r}, max_pending_bytes={self.max_pending_bytes!r}, "
            f"max_batch_frees={self.max_batch_frees!r}, "
            f"max_batch_bytes={self.max_batch_bytes!r}, "
            f"reuse_on_stream={self.reuse_on_stream!r})"
        )

    @property
    def mode(self) -> str:
        """When a freed block may go upstream: ``"device"``, ``"stream"`` or ``"deferred"``."""
        return self._mode

    @property
    def max_pending_bytes(self):
        """The cap on pending bytes in deferred mode, or ``None``."""
        return self._max_pending_bytes

    @property
    def reuse_on_stream(self) -> bool:
        """Deferred mode: an allocation takes back a block of its size among the last 16 frees
        on its own stream (``False`` in the other modes)."""
        return deref(self.c_obj).reuse_on_stream()

    @property
    def max_batch_frees(self) -> int:
        """Deferred mode: the most frees on one stream that wait for one event before it is
        recorded."""
        return deref(self.c_obj).max_batch_frees()

    @property
    def max_batch_bytes(self):
        """Deferred mode: the most bytes freed on one stream that wait for one event before it
        is recorded, or ``None`` (no byte limit)."""
        cdef optional[size_t] nbytes = deref(self.c_obj).max_batch_bytes()
        return deref(nbytes) if nbytes.has_value() else None

    @property
    def pending_bytes(self) -> int:
        """Bytes freed by the caller that did not reach the upstream yet."""
        return deref(self.c_obj).pending_bytes()

    @property
    def pending_count(self) -> int:
        """Number of freed blocks that did not reach the upstream yet."""
        return deref(self.c_obj).pending_count()

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
            ptr = deref(self.c_obj).allocate(c_stream, nbytes, CUDA_ALLOCATION_ALIGNMENT)
        return <uintptr_t>ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, stream=DEFAULT_STREAM):
        """Free ``ptr`` of ``nbytes`` bytes on ``stream``, by the adaptor's mode.

        Parameters
        ----------
        ptr : int
            A pointer returned by :meth:`allocate` and not freed since. 0 (a null pointer) is a
            no-op whatever ``nbytes``, as for rmm's resources: nothing is counted or freed.
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
            r = deref(self.c_obj).deallocate_checked(c_stream, <void*>ptr, nbytes)
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
            deref(self.c_obj).flush()

    @property
    def stats(self) -> dict:
        """Counters: ``syncs`` (host waits that succeeded), ``deferred`` (frees listed to wait
        for a fence, returned at once), ``released`` (pending blocks handed upstream),
        ``oom_retries``, ``parked`` (frees listed without a fence: during stream capture, or
        when none could be recorded), ``peak_pending_bytes``, ``failed_syncs`` (syncs and
        fence waits that failed: nothing was released on them), ``rejected_frees`` (double
        frees, foreign pointers, size mismatches), ``fences`` (events recorded: one per batch
        of frees on a stream at most), ``same_stream_reuse`` (allocations served by a block
        freed lately on their own stream: no event, no upstream call).

        What the adaptor does, not allocation statistics: for those, ``rmm.statistics``
        (rmm's ``StatisticsResourceAdaptor`` over it, docs/index.md#statistics)."""
        return deref(self.c_obj).stats()


cdef class NaiveCachingMemoryResource(UpstreamResourceAdaptor):
    """NaiveCachingMemoryResource(upstream_mr)
--

UNSAFE ON PURPOSE: a cache that reuses freed blocks on any stream without a fence.

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
    cdef unique_ptr[naive_caching_memory_resource] c_obj

    def __cinit__(self, DeviceMemoryResource upstream_mr):
        self.c_obj.reset(new naive_caching_memory_resource(
            any_resource[device_accessible](upstream_mr.get_mr())
        ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def __repr__(self):
        return f"{type(self).__name__}({type(self.get_upstream()).__name__}())"

    def release(self) -> None:
        """Return every cached block to the upstream."""
        with nogil:
            deref(self.c_obj).release()

    @property
    def cached_bytes(self) -> int:
        """Bytes held in the cache."""
        return deref(self.c_obj).cached_bytes()

    @property
    def hits(self) -> int:
        """Allocations served from the cache (without any fence)."""
        return deref(self.c_obj).hits()

    @property
    def misses(self) -> int:
        """Allocations that went to the upstream."""
        return deref(self.c_obj).misses()


cdef object _pool_sizes(initial_pool_size, maximum_pool_size):
    """(initial bytes, maximum bytes or None) of a pool's arguments, checked."""
    cdef size_t initial
    if initial_pool_size is None:  # rmm's PoolMemoryResource: half the free memory
        initial = percent_of_free_device_memory(50)
    else:
        initial = parse_bytes(initial_pool_size, "initial_pool_size")
    if maximum_pool_size is None:
        return initial, None
    maximum = parse_bytes(maximum_pool_size, "maximum_pool_size")
    if maximum < initial:
        raise ValueError(
            f"maximum_pool_size ({maximum}) must be at least initial_pool_size ({initial}"
            + (", half the free device memory)" if initial_pool_size is None else ")")
        )
    return initial, maximum


cdef double _remap_fraction(value) except -1.0:
    """``remap_time_fraction``, checked: a number within [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"remap_time_fraction must be a number within [0, 1], got {type(value).__name__}"
        )
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(f"remap_time_fraction must be within [0, 1], got {value!r}")
    return value


cdef uintptr_t _pool_allocate(stream_ordered_pool_memory_resource* mr, size_t nbytes,
                              object stream) except? 0:
    """The pools' allocate: the same-stream path with the GIL, a miss without it."""
    cdef Stream rs = <Stream>stream if type(stream) is Stream else _resource_stream(stream)
    cdef stream_ref s = rs.view()
    cdef void* ptr = mr.try_allocate_cached(s, nbytes)
    if ptr == NULL:
        with nogil:
            ptr = mr.allocate(s, nbytes, CUDA_ALLOCATION_ALIGNMENT)
    return <uintptr_t>ptr


cdef object _pool_deallocate(stream_ordered_pool_memory_resource* mr, uintptr_t ptr,
                             size_t nbytes, object stream):
    """The pools' checked free: ValueError for a free the pool refuses (it is unchanged)."""
    cdef Stream rs = <Stream>stream if type(stream) is Stream else _resource_stream(stream)
    cdef size_t allocated = 0
    cdef int status = mr.deallocate_checked(rs.view(), <void*>ptr, nbytes, &allocated)
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


cdef size_t _pool_release(stream_ordered_pool_memory_resource* mr) except? 0:
    cdef size_t n
    with nogil:
        n = mr.release()
    return n


cdef cbool _pool_reclaim(stream_ordered_pool_memory_resource* mr) except? False:
    cdef cbool ok
    with nogil:
        ok = mr.synchronize_and_reclaim()
    return ok


cdef object _pool_retire(stream_ordered_pool_memory_resource* mr, object stream):
    cdef Stream s = as_stream(stream)
    cdef stream_ref c_stream = s.view()
    with nogil:
        mr.retire_stream(c_stream)


cdef class StreamOrderedPoolMemoryResource(UpstreamResourceAdaptor):
    """StreamOrderedPoolMemoryResource(upstream_mr, initial_pool_size=0, maximum_pool_size=None,
  maximum_growth_size=None)
--

A pool that is safe without any host synchronization: reuse follows stream order.

    Parameters
    ----------
    upstream_mr : DeviceMemoryResource
        Where chunks come from.
    initial_pool_size : int, str or None
        Bytes taken from the upstream at construction (``"1GiB"`` accepted). ``0`` (default):
        nothing until the first allocation, then the request rounded up to 2 MiB. ``None``:
        half the free device memory, as for ``rmm.mr.PoolMemoryResource`` (whose default it
        is; rmm computes it). The defaults differ on purpose: a pool that starts empty and
        grows on demand leaves the device to the processes beside it.
    maximum_pool_size : int or str, optional
        The most bytes the pool may hold. ``None`` (default): no bound.
    maximum_growth_size : int or str, optional
        The largest chunk one growth takes from the upstream beyond what the request needs:
        a growth takes the larger of the request and ``min(pool_size(), maximum_growth_size)``.
        ``None`` (default): chunks of whole 2 MiB; the pool doubles below 64 MiB, as rmm's
        pool does, then a request of at least 1/8 of the pool gets a chunk of its own size
        and a smaller one grows the pool by half, by at most 512 MiB beyond the request, but
        a request of at most 1 MiB by 2 MiB, or by what such requests grew it by since the
        last growth for a larger one, whichever is more; a small request takes a tight free
        block before splitting a big one its stream freed.
        A bound limits each growth of a large pool,
        at the cost of more chunks (a block never spans two, so a fragmented pool may grow
        more).

    Notes
    -----
    A block freed on stream S is reused on S at once (no CUDA call but the stream identity
    query, none at all on the default stream). Another stream T
    takes it only after enqueuing ``cudaStreamWaitEvent`` on a fence recorded on S after the
    free; S records a fence after each of its first 16 frees (the blocks stay in its cache,
    covered: shared with that record when another stream runs short or S's slot is retired),
    then one fence per batch (once it caches 32 blocks or 1/16 of the pool in bytes, its last
    exact-size frees counted only once another stream ran short), and never while it is being
    captured. A block freed while its stream is
    captured belongs to the capture's graph until the graph and every executable graph
    instantiated from it are destroyed. The pool grows as ``maximum_growth_size`` says (at most
    ``maximum_growth_size`` beyond the request), trying smaller chunks when the upstream is
    short, allocating each chunk on the requesting stream (on a pool-owned stream while the
    requesting stream is captured). It never synchronizes the device on its own: only
    :meth:`synchronize_and_reclaim` does, and the destructor when free blocks that no fence
    covers remain. A null ``ptr`` is a no-op free; a double free, a foreign pointer or a wrong
    size raises :class:`ValueError` and leaves the pool unchanged.
    Streams that freed memory should be retired with :meth:`retire_stream` before they are
    destroyed. The pool belongs to the device current at construction.
    """
    cdef unique_ptr[stream_ordered_pool_memory_resource] c_obj
    cdef object _maximum_pool_size
    cdef object _maximum_growth_size

    def __cinit__(self, DeviceMemoryResource upstream_mr, initial_pool_size=0,
                  maximum_pool_size=None, maximum_growth_size=None):
        cdef size_t initial
        cdef optional[size_t] maximum
        cdef optional[size_t] growth
        initial, self._maximum_pool_size = _pool_sizes(initial_pool_size, maximum_pool_size)
        if self._maximum_pool_size is not None:
            maximum = <size_t>self._maximum_pool_size
        if maximum_growth_size is not None:
            self._maximum_growth_size = parse_bytes(maximum_growth_size, "maximum_growth_size")
            if self._maximum_growth_size == 0:
                raise ValueError(
                    "maximum_growth_size must be a positive size (or None for the default "
                    "growth), got 0"
                )
            growth = <size_t>self._maximum_growth_size
        with nogil:
            self.c_obj.reset(new stream_ordered_pool_memory_resource(
                any_resource[device_accessible](upstream_mr.get_mr()), initial, maximum, growth,
            ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def __repr__(self):
        return (
            f"{type(self).__name__}({type(self.get_upstream()).__name__}(), "
            f"pool_size={self.pool_size()}, maximum_pool_size={self.maximum_pool_size!r}, "
            f"maximum_growth_size={self.maximum_growth_size!r})"
        )

    def allocate(self, size_t nbytes, stream=DEFAULT_STREAM):
        """Allocate ``nbytes`` on ``stream`` (see :class:`rmm.mr.DeviceMemoryResource`).

        ``stream`` is an rmm ``Stream`` or a CuPy, Numba, cuda.core or ``__cuda_stream__``
        stream; None raises TypeError, as rmm's resources do. The same-stream path runs
        without releasing the GIL (it never blocks and takes tens of nanoseconds); only a
        miss, which may grow the pool, releases it.
        """
        return _pool_allocate(self.c_obj.get(), nbytes, stream)

    def deallocate(self, uintptr_t ptr, size_t nbytes, stream=DEFAULT_STREAM):
        """Free ``ptr`` on ``stream``: reusable on ``stream`` at once, elsewhere after a fence.

        Never blocks (at most one event record), so the GIL is kept. A ``ptr`` of 0 (a null
        pointer) is a no-op whatever ``nbytes``, as for rmm's resources: nothing is counted.

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
        _pool_deallocate(self.c_obj.get(), ptr, nbytes, stream)

    def pool_size(self) -> int:
        """Bytes held from the upstream."""
        return deref(self.c_obj).pool_size()

    @property
    def maximum_pool_size(self):
        """The bound on :meth:`pool_size`, or ``None``."""
        return self._maximum_pool_size

    @property
    def maximum_growth_size(self):
        """The largest chunk a growth takes beyond the request, or ``None`` (the default growth)."""
        return self._maximum_growth_size

    def release(self) -> int:
        """Return every chunk that is wholly free and shared to the upstream.

        Never waits: the chunks go back on the pool's own stream after a stream wait on the
        fences of their last users. A stream's cache that a fence record covers is shared
        first; blocks still cached by a stream that no record covers (its last frees), held for
        a graph that may still replay, or left by streams that went away stay. Returns the
        number of bytes returned.
        """
        return _pool_release(self.c_obj.get())

    def synchronize_and_reclaim(self) -> bool:
        """Synchronize the device, then make free for every stream what that orders.

        The one call of the pool that waits, and it waits for all work of the device: the
        streams' cached blocks and the blocks of streams that went away without
        :meth:`retire_stream` (``stats["orphan_bytes"]``) become free for any stream. Blocks of
        graphs that may still replay stay theirs. A device synchronization invalidates a
        global-mode capture in any thread: do not call this while one may be under way.
        Returns False (and changes nothing) when the synchronization fails.
        """
        return _pool_reclaim(self.c_obj.get())

    def retire_stream(self, stream) -> None:
        """Fence ``stream`` and hand the blocks it freed to every stream; call this before
        destroying a stream that freed memory into the pool.

        Without it, the last frees of a destroyed stream that no fence covers (each of a
        stream's first 16 frees records a fence that covers its cache) become orphans once
        its idle slot is retired: only :meth:`synchronize_and_reclaim` frees them
        (``stats["orphan_bytes"]``).
        """
        _pool_retire(self.c_obj.get(), stream)

    @property
    def stats(self) -> dict:
        """Counters: ``current_bytes``, ``peak_bytes``, ``pool_bytes``, ``physical_bytes`` and
        ``peak_physical_bytes`` (device memory held now and at most: ``pool_bytes`` here),
        ``same_stream_reuse``,
        ``cross_stream_reuse``, ``upstream_growths``, ``fences``, ``stream_waits``,
        ``reclaim_syncs`` (calls of :meth:`synchronize_and_reclaim` that synchronized),
        ``retired_streams``, ``rejected_frees``, ``stream_slots`` (slots held now: one per
        stream in use; idle ones are retired once 64 are held), ``fence_events`` (events held
        now as fences), ``graph_bytes`` (free bytes held for graphs that may still replay),
        ``orphan_bytes`` (free bytes of streams that went away, whose last frees no fence
        covers).

        ``current_bytes`` counts the blocks handed out now, each rounded up to a multiple of
        256 bytes (rmm's ``Statistics.current_bytes`` counts the bytes asked for);
        ``peak_bytes`` is sampled (a short peak may be missed by up to 4 MiB per stream). For
        allocation statistics use ``rmm.statistics`` (docs/index.md#statistics)."""
        return deref(self.c_obj).stats()


cdef class VmmPoolMemoryResource(DeviceMemoryResource):
    """VmmPoolMemoryResource(initial_pool_size=0, maximum_pool_size=None, *, reserve_size=None,
  remap_time_fraction=0.05)
--

The stream-ordered pool over device pages it maps itself (CUDA's virtual memory
    management): the leanest footprint of the pools here.

    The same rules as :class:`StreamOrderedPoolMemoryResource` (a block freed on a stream is
    reused on it at once, elsewhere after a stream wait on a fence; no host synchronization),
    but no upstream: the pool reserves one virtual address range and backs it with pages of
    the device's minimum allocation granularity (2 MiB on current GPUs). It grows at the top
    of its mapped range by what the free block there lacks, so free blocks merge across
    growths. When a growth would make it hold more than 1/16 over the most bytes it had in
    use, it first unmaps whole pages of free blocks whose work is done (a query found their
    fences complete: an unmap takes effect at once) and maps those pages where it grows, as
    long as such moves have taken at most ``remap_time_fraction`` of its time; past that it
    maps more pages instead (it holds more, but never spends more time).

    Parameters
    ----------
    initial_pool_size : int, str or None
        Bytes mapped at construction (``"1GiB"`` accepted). ``0`` (default): nothing until
        the first allocation. ``None``: half the free device memory.
    maximum_pool_size : int or str, optional
        The most bytes of pages the pool may hold (:meth:`physical_bytes`). ``None``
        (default): no bound.
    reserve_size : int or str, optional
        The address space reserved, which the mapped range never passes (address space costs
        no device memory). ``None`` (default): four times the device's memory.
    remap_time_fraction : float, default 0.05
        The most of its time, within ``[0, 1]``, the pool spends moving free pages (an unmap
        and a map per page) to hold less memory once its peak in use stopped rising, kept over
        any second or more. ``0``: pages move only while the peak rises, when the device is
        out of memory or past ``maximum_pool_size``; ``1``: whenever the budget asks.

    Notes
    -----
    Costs: a growth maps its pages one by one (``cuMemCreate``, ``cuMemMap``, one
    ``cuMemSetAccess``), and may unmap pages first (``cuMemUnmap``); the same-stream path is
    the pool's. Pages cached by a stream since its last fence record, or held for a graph
    that may still replay, are never unmapped. Raises ``RuntimeError`` where the driver lacks
    the virtual memory API. The pool belongs to the device current at construction.
    """
    cdef unique_ptr[stream_ordered_pool_memory_resource] c_obj
    cdef object _maximum_pool_size
    cdef object _reserve_size
    cdef double _remap_time_fraction

    def __cinit__(self, initial_pool_size=0, maximum_pool_size=None, *, reserve_size=None,
                  remap_time_fraction=0.05):
        cdef size_t initial
        cdef optional[size_t] maximum
        cdef optional[size_t] reserve
        self._remap_time_fraction = _remap_fraction(remap_time_fraction)
        initial, self._maximum_pool_size = _pool_sizes(initial_pool_size, maximum_pool_size)
        if self._maximum_pool_size is not None:
            maximum = <size_t>self._maximum_pool_size
        if reserve_size is not None:
            self._reserve_size = parse_bytes(reserve_size, "reserve_size")
            if self._reserve_size < max(initial, self._maximum_pool_size or 0):
                raise ValueError(
                    f"reserve_size ({self._reserve_size}) must be at least initial_pool_size "
                    f"({initial}) and maximum_pool_size ({self._maximum_pool_size})"
                )
            reserve = <size_t>self._reserve_size
        with nogil:
            self.c_obj.reset(new stream_ordered_pool_memory_resource(
                device_pages_tag(), initial, maximum, reserve, self._remap_time_fraction,
            ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def __repr__(self):
        return (
            f"{type(self).__name__}(pool_size={self.pool_size()}, "
            f"physical_bytes={self.physical_bytes()}, "
            f"maximum_pool_size={self.maximum_pool_size!r})"
        )

    def allocate(self, size_t nbytes, stream=DEFAULT_STREAM):
        """Allocate ``nbytes`` on ``stream`` (as
        :meth:`StreamOrderedPoolMemoryResource.allocate`)."""
        return _pool_allocate(self.c_obj.get(), nbytes, stream)

    def deallocate(self, uintptr_t ptr, size_t nbytes, stream=DEFAULT_STREAM):
        """Free ``ptr`` on ``stream`` (as :meth:`StreamOrderedPoolMemoryResource.deallocate`:
        ``ValueError`` for a double free, a foreign pointer or a wrong size)."""
        _pool_deallocate(self.c_obj.get(), ptr, nbytes, stream)

    def pool_size(self) -> int:
        """Bytes of the pool's mapped range."""
        return deref(self.c_obj).pool_size()

    def physical_bytes(self) -> int:
        """Bytes of device pages held: mapped, and spare (unmapped, kept for the next growth
        until :meth:`release`)."""
        return deref(self.c_obj).physical_bytes()

    @property
    def maximum_pool_size(self):
        """The bound on :meth:`physical_bytes`, or ``None``."""
        return self._maximum_pool_size

    @property
    def reserve_size(self):
        """The address space asked for, or ``None`` (four times the device's memory)."""
        return self._reserve_size

    @property
    def remap_time_fraction(self) -> float:
        """The most of its time the pool spends moving free pages to where it grows."""
        return self._remap_time_fraction

    def release(self) -> int:
        """Unmap every whole page of free blocks whose work is done (their fences complete)
        and free the spare pages: never waits. Returns the bytes of pages freed."""
        return _pool_release(self.c_obj.get())

    def synchronize_and_reclaim(self) -> bool:
        """As :meth:`StreamOrderedPoolMemoryResource.synchronize_and_reclaim`."""
        return _pool_reclaim(self.c_obj.get())

    def retire_stream(self, stream) -> None:
        """As :meth:`StreamOrderedPoolMemoryResource.retire_stream`."""
        _pool_retire(self.c_obj.get(), stream)

    @property
    def stats(self) -> dict:
        """As :attr:`StreamOrderedPoolMemoryResource.stats` (``pool_bytes``: the mapped
        range; ``physical_bytes``: the pages held, mapped and spare; ``remapped_bytes`` and
        ``remap_ns``: the free pages moved to where the pool grew, and the time it took)."""
        return deref(self.c_obj).stats()


cdef extern from "Python.h":
    ctypedef struct PyFrameObject:
        pass
    PyFrameObject* PyEval_GetFrame()  # borrowed; the first complete frame of this thread, or NULL


def _python_frames():
    """The calling thread's Python frames as text (innermost last; None where it has none), as
    ``capture_stacks`` records them: up to 32, without source lookups (cheap on every call).

    From the first complete frame (``PyEval_GetFrame``), not ``sys._getframe(0)``: called from C
    while Python tears down the frame of a function that C called, CPython 3.12 and later have
    that call's entry frame current, and ``sys._getframe(0)`` builds a frame object from its
    uninitialized fields (a frame named ``<interpreter trampoline>``, or a crash)."""
    cdef PyFrameObject* top = PyEval_GetFrame()
    if top == NULL:
        return None
    frame = <object><PyObject*>top
    lines = []
    while frame is not None and len(lines) < 32:
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        frame = frame.f_back
    return "\n".join(reversed(lines))


cdef cbool _python_stack(string& out) noexcept with gil:
    """The calling thread's Python frames (innermost last), if it has any."""
    text = _python_frames()
    if not text:
        return False
    out = text.encode()
    return True


cdef void _warn_hazard(const hazard_record& h, void* context) noexcept with gil:
    record = hazard_from_fields(hazard_fields(h))
    warnings.warn(HazardWarning(record.message), stacklevel=2)


# Trackers alive at interpreter exit: hooks off (no callback into a finalizing interpreter),
# and leaks reported where asked.
_live_trackers = weakref.WeakSet()


@atexit.register
def _trackers_at_exit():
    for tracker in list(_live_trackers):
        tracker._at_exit()


def _pointer_of(buffer_or_ptr) -> int:
    if isinstance(buffer_or_ptr, int):
        return buffer_or_ptr
    cai = getattr(buffer_or_ptr, "__cuda_array_interface__", None)
    if cai is not None:
        return cai["data"][0]
    ptr = getattr(buffer_or_ptr, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    raise TypeError(
        "buffer_or_ptr must be an int pointer, an object with __cuda_array_interface__ "
        f"(CuPy, Numba, PyTorch) or a .ptr attribute (rmm DeviceBuffer); got "
        f"{type(buffer_or_ptr).__name__}"
    )


def _check_tracker_options(upstream_stream_ordered, capture_stacks, on_hazard, nvtx,
                           report_at_exit):
    """The tracker's arguments after the upstream: ValueError or TypeError naming the bad one."""
    if on_hazard not in ("warn", "raise", "record"):
        raise ValueError(
            f"on_hazard must be one of 'warn', 'raise', 'record'; got {on_hazard!r}")
    for name, value in (("capture_stacks", capture_stacks), ("nvtx", nvtx),
                        ("report_at_exit", report_at_exit)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if upstream_stream_ordered is not None and not isinstance(upstream_stream_ordered, bool):
        raise TypeError(
            "upstream_stream_ordered must be None (infer) or a bool, got "
            f"{type(upstream_stream_ordered).__name__}")


cdef class HazardTrackingResourceAdaptor(UpstreamResourceAdaptor):
    """HazardTrackingResourceAdaptor(upstream_mr, *, upstream_stream_ordered=None,
  capture_stacks=False, on_hazard="warn", nvtx=True, report_at_exit=False)
--

Track every live allocation and report the hazards of freeing while work may use it.

    Parameters
    ----------
    upstream_mr : DeviceMemoryResource
        Serves the allocations.
    upstream_stream_ordered : bool, optional
        Whether the upstream orders reuse by stream, or frees synchronously. ``None``
        (default): inferred from the resource's ``stream_ordered`` in
        ``rmm_fences.specs.RESOURCES`` -- ``CudaAsyncMemoryResource``, ``PoolMemoryResource``,
        ``ArenaMemoryResource``, ``BinningMemoryResource``, ``FixedSizeMemoryResource``,
        :class:`rmm_fences.StreamOrderedPoolMemoryResource` and
        :class:`rmm_fences.SyncOnFreeResourceAdaptor` are stream-ordered,
        ``CudaMemoryResource`` and ``ManagedMemoryResource`` free synchronously; statistics,
        limiting, logging and tracking adaptors take their upstream's answer; anything else
        (``rmm_fences.unsafe``, callback resources) is treated as not stream-ordered.
    capture_stacks : bool
        Record where each allocation and hazard came from: Python frames when the call came
        through Python, native frames otherwise. Off by default (it costs microseconds).
    on_hazard : {"warn", "raise", "record"}
        ``"warn"`` (default): a :class:`HazardWarning` when a hazard is seen, and a record.
        ``"raise"``: calls made from Python through :meth:`allocate` and :meth:`deallocate`
        raise :class:`HazardError` before anything reaches the upstream; hazards seen in
        calls from C++ (``DeviceBuffer``, CuPy, cuda.compute) are recorded and raised by the
        next :meth:`check`. ``"record"``: only record.
    nvtx : bool
        Register each allocation as an NVTX memory region of its device allocation (a pool
        chunk), so that ``compute-sanitizer --tool memcheck`` flags accesses outside the
        sub-allocation. Free without a tool attached. Default ``True``.
    report_at_exit : bool
        At interpreter exit, record the allocations still live as ``leak`` hazards and print
        :meth:`report` to stderr if there is any hazard. Default ``False``.

    Notes
    -----
    Hazards (the names of docs/design.md#hazards):

    - ``double_free``, ``foreign_free``, ``size_mismatch``: never reach the upstream.
    - ``freed_in_flight``: over an upstream that is not stream-ordered, a stream that used the
      block (the freeing stream, the allocation stream, declared streams) still had work
      queued at the free (an event recorded at the free is queried).
    - ``reuse_before_fence``: over such an upstream, a block handed out on a stream while the
      fence of its previous free on another stream had not completed.
    - ``cross_stream_free``: freed on a stream other than its allocation stream without being
      ordered after the work queued there: the fence recorded at the free completed while
      that work still ran. Declaring the use with :meth:`record_stream` orders the free. A
      free that cannot be ordered after another thread's per-thread default stream (its
      allocation stream or a declared one) is reported at once, and counted as unchecked.
    - ``allocated_while_live``: the upstream handed out an address that is still live; both
      allocations are tracked (each free takes the one of its size).
    - ``leak``: live at :meth:`report` or, with ``report_at_exit``, at exit.

    The tracker sees streams only through allocations, frees and :meth:`record_stream`: a
    block used on a stream it was never told about is invisible to it. Over a stream-ordered
    upstream a free on the allocation stream makes no CUDA call. A check that cannot be made
    is counted in ``stats["unchecked"]``, never passed nor reported falsely: while the stream
    involved is being captured, when an event record, query or stream wait fails, for
    another thread's per-thread default stream. Streams are identified by their handle, the
    per-thread default stream by handle and thread.

    Examples
    --------
    >>> import rmm
    >>> from rmm_fences import HazardTrackingResourceAdaptor
    >>> mr = HazardTrackingResourceAdaptor(rmm.mr.CudaAsyncMemoryResource())
    >>> rmm.mr.set_current_device_resource(mr)
    >>> print(mr.report())  # doctest: +SKIP
    """
    cdef unique_ptr[hazard_tracking_resource_adaptor] c_obj
    cdef readonly str on_hazard
    cdef readonly cbool upstream_stream_ordered
    cdef readonly cbool capture_stacks
    cdef readonly cbool nvtx
    cdef readonly cbool report_at_exit
    cdef cbool _strict
    cdef uint64_t _checked_serial
    cdef list _exit_leaks
    cdef object __weakref__

    def __cinit__(self, DeviceMemoryResource upstream_mr, *, upstream_stream_ordered=None,
                  capture_stacks=False, on_hazard="warn", nvtx=True, report_at_exit=False):
        _check_tracker_options(upstream_stream_ordered, capture_stacks, on_hazard, nvtx,
                               report_at_exit)
        if upstream_stream_ordered is None:
            upstream_stream_ordered = _infer_stream_ordered(upstream_mr)
        self.on_hazard = on_hazard
        self.upstream_stream_ordered = upstream_stream_ordered
        self.capture_stacks = capture_stacks
        self.nvtx = nvtx
        self.report_at_exit = report_at_exit
        self._strict = on_hazard == "raise"
        self._exit_leaks = []
        self.c_obj.reset(new hazard_tracking_resource_adaptor(
            any_resource[device_accessible](upstream_mr.get_mr()),
            self.upstream_stream_ordered,
            self.nvtx,
        ))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))
        if on_hazard == "warn":
            deref(self.c_obj).set_hazard_hook(_warn_hazard, <void*>self)
        if self.capture_stacks:
            deref(self.c_obj).set_capture_stacks(True, _python_stack)
        _live_trackers.add(self)

    def __repr__(self):
        return (
            f"{type(self).__name__}({type(self.get_upstream()).__name__}(), "
            f"upstream_stream_ordered={bool(self.upstream_stream_ordered)}, "
            f"on_hazard={self.on_hazard!r})"
        )

    def __dealloc__(self):
        if self.c_obj:
            deref(self.c_obj).set_hazard_hook(NULL, NULL)
            deref(self.c_obj).set_capture_stacks(False, NULL)

    def _at_exit(self):
        deref(self.c_obj).set_hazard_hook(NULL, NULL)
        deref(self.c_obj).set_capture_stacks(False, NULL)
        if self.report_at_exit:
            self._exit_leaks = [leak_record(a) for a in self.outstanding()]
            if self._exit_leaks or self.hazards:
                sys.stderr.write(self.report())

    def allocate(self, size_t nbytes, stream=DEFAULT_STREAM) -> int:
        """Allocate ``nbytes`` on ``stream`` from the upstream and track the block.

        With ``on_hazard="raise"``, a block that the upstream hands out before the fence of
        its previous free completed (``reuse_before_fence``) goes back to the upstream and
        :class:`HazardError` is raised.
        """
        cdef Stream s = _resource_stream(stream)
        cdef stream_ref c_stream = s.view()
        cdef hazard_record stopped
        cdef hazard_record* out = &stopped if self._strict else NULL
        cdef void* ptr
        with nogil:
            ptr = deref(self.c_obj).allocate_checked(
                c_stream, nbytes, CUDA_ALLOCATION_ALIGNMENT, out)
        if ptr == NULL and nbytes != 0 and self._strict:
            raise HazardError([hazard_from_fields(hazard_fields(stopped))])
        return <uintptr_t>ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, stream=DEFAULT_STREAM) -> None:
        """Free ``ptr`` on ``stream``.

        A double, foreign or wrong-size free never reaches the upstream. With
        ``on_hazard="raise"``, it raises :class:`HazardError`, and so does a free while a
        stream that used the block still has work queued over an upstream that is not
        stream-ordered (``freed_in_flight``); the block then stays allocated. A ``ptr`` of 0 (a
        null pointer) is a no-op whatever ``nbytes``, as for rmm's resources: nothing is
        recorded or freed.
        """
        cdef Stream s = _resource_stream(stream)
        cdef stream_ref c_stream = s.view()
        cdef hazard_record stopped
        cdef hazard_record* out = &stopped if self._strict else NULL
        cdef cbool halted
        with nogil:
            halted = deref(self.c_obj).deallocate_checked(
                c_stream, <void*>ptr, nbytes, CUDA_ALLOCATION_ALIGNMENT, out)
        if halted:
            raise HazardError([hazard_from_fields(hazard_fields(stopped))])

    def record_stream(self, buffer_or_ptr, stream) -> None:
        """Declare that ``stream`` uses the allocation ``buffer_or_ptr``.

        Its free is then ordered after the work queued on ``stream`` up to the free (the
        freeing stream waits on the device, the host never blocks), as
        ``torch.Tensor.record_stream`` promises. ``buffer_or_ptr``: the pointer an
        allocation returned, an rmm ``DeviceBuffer``, or an array with
        ``__cuda_array_interface__`` that starts at its allocation.

        Raises
        ------
        ValueError
            When ``buffer_or_ptr`` is not the start of a live allocation of this tracker, a
            null pointer (0) included.
        """
        cdef uintptr_t ptr = _pointer_of(buffer_or_ptr)
        if ptr == 0:
            raise ValueError(
                "buffer_or_ptr is a null pointer (0x0): record_stream takes a live allocation "
                "of this tracker (the pointer an allocation returned, or a buffer or array that "
                "starts at one)"
            )
        cdef Stream s = as_stream(stream)
        cdef stream_ref c_stream = s.view()
        if not deref(self.c_obj).record_stream(<void*>ptr, c_stream):
            raise ValueError(
                f"buffer_or_ptr ({ptr:#x}) is not the start of a live allocation of this "
                "tracker; record_stream takes the pointer an allocation returned"
            )

    @property
    def nvtx_active(self) -> bool:
        """Whether a tool (compute-sanitizer, Nsight Systems) took the NVTX memory
        annotations; known after the first allocation."""
        return deref(self.c_obj).nvtx_active()

    def outstanding(self) -> list:
        """The live allocations, oldest first, as :class:`AllocationRecord` objects."""
        return [allocation_from_fields(allocation_fields(a))
                for a in deref(self.c_obj).outstanding()]

    @property
    def allocated_bytes(self) -> int:
        """Bytes allocated and not freed."""
        return deref(self.c_obj).stats().allocated_bytes

    @property
    def peak_bytes(self) -> int:
        """The most bytes allocated at once since construction or :meth:`reset`."""
        return deref(self.c_obj).stats().peak_bytes

    @property
    def stream_bytes(self) -> dict:
        """Bytes allocated and not freed, per allocation stream key (the handle; 0: legacy
        default; a per-thread default stream: ``(thread << 3) | 2``)."""
        return {int(k): int(v) for k, v in deref(self.c_obj).stream_bytes()}

    @property
    def hazards(self) -> list:
        """Every hazard seen since construction or :meth:`reset`, as :class:`HazardRecord`
        objects, oldest first (the deferred checks that can be settled now are settled
        first)."""
        deref(self.c_obj).poll()
        return [hazard_from_fields(hazard_fields(h)) for h in deref(self.c_obj).hazards()] + (
            list(self._exit_leaks))

    @property
    def stats(self) -> dict:
        """Counters: ``allocations``, ``deallocations``, ``rejected_frees``, ``fences``,
        ``stream_waits``, ``unchecked`` (checks that could not be made: stream capture, a
        failed event record, query or stream wait, another thread's per-thread default
        stream), ``hazards``, ``allocated_bytes``, ``peak_bytes``, ``pending_checks``.

        ``allocated_bytes`` and ``peak_bytes`` count the non-empty allocations alive now and at
        most since construction or :meth:`reset`; rmm's ``StatisticsResourceAdaptor``
        (``rmm.statistics``) gives the full allocation statistics (docs/index.md#statistics)."""
        cdef dict out = deref(self.c_obj).stats()
        out["pending_checks"] = deref(self.c_obj).pending_checks()
        return out

    def check(self) -> None:
        """Raise :class:`HazardError` for the hazards seen since the last ``check()`` (or
        :meth:`reset`) that were not raised already."""
        hazards = self.hazards
        found = [h for h in hazards if h.serial > self._checked_serial and not h.raised]
        self._checked_serial = max([self._checked_serial] + [h.serial for h in hazards])
        if found:
            raise HazardError(found)

    def reset(self) -> None:
        """Forget the recorded hazards; the peak restarts from the bytes allocated now."""
        deref(self.c_obj).reset()
        self._checked_serial = 0
        self._exit_leaks = []

    def report(self, format="text") -> str:
        """The hazards seen and the allocations still live (reported as ``leak``).

        ``format``: ``"text"`` (one line per record, with stacks when captured) or
        ``"json"``.
        """
        if format not in ("text", "json"):
            raise ValueError(f"format must be 'text' or 'json', got {format!r}")
        hazards = [h for h in self.hazards if h.kind != "leak"]
        leaks = [leak_record(a) for a in self.outstanding()] or list(self._exit_leaks)
        cdef hazard_tracker_stats s = deref(self.c_obj).stats()
        summary = {
            "upstream": type(self.get_upstream()).__name__,
            "upstream_stream_ordered": bool(self.upstream_stream_ordered),
            "allocated_bytes": s.allocated_bytes,
            "peak_bytes": s.peak_bytes,
            "outstanding": len(leaks),
            "stream_bytes": {hex(k): v for k, v in self.stream_bytes.items()},
        }
        return format_report(summary, hazards, leaks, format)


def _infer_stream_ordered(mr) -> bool:
    """Whether ``mr`` orders reuse by stream or frees synchronously (see the tracker): the
    ``stream_ordered`` of its resource in ``rmm_fences.specs.RESOURCES``."""
    from rmm_fences.specs import _stream_ordered
    return _stream_ordered(mr)


cdef class UnmappingVmmMemoryResource(DeviceMemoryResource):
    """UnmappingVmmMemoryResource(reserve_size="64GiB", device=None)
--

UNSAFE ON PURPOSE: CUDA virtual memory whose free unmaps the physical memory at once.

    Reserves one virtual address range at construction (``cuMemAddressReserve``); each
    allocation takes a piece of it, in multiples of the device's allocation granularity, and
    maps fresh physical memory there (``cuMemCreate``, ``cuMemMap``, ``cuMemSetAccess``). A
    free unmaps and releases that memory at once and keeps the range, so a kernel still
    reading the block faults: illegal address (error 700), and the CUDA context is lost.
    Wrap it in ``SyncOnFreeResourceAdaptor(mr, mode="deferred")`` to make it safe.

    Parameters
    ----------
    reserve_size : int or str
        Virtual address range reserved once (``"64GiB"`` accepted; default 64 GiB). Costs no
        physical memory.
    device : int, optional
        The device whose memory backs the allocations (default: the current device).

    Raises
    ------
    MemoryError
        From ``allocate`` when the range or the device's memory is exhausted.
    """
    cdef unique_ptr[unmapping_vmm_memory_resource] c_obj
    cdef readonly int device

    def __cinit__(self, reserve_size="64GiB", device=None):
        cdef size_t nbytes = parse_bytes(reserve_size, "reserve_size")
        if nbytes == 0:
            raise ValueError("reserve_size must be positive, got 0")
        if device is None:
            from rmm_fences._cuda import current_device

            device = current_device()
        elif not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValueError(f"device must be None or a device ordinal >= 0, got {device!r}")
        self.device = device
        with nogil:
            self.c_obj.reset(new unmapping_vmm_memory_resource(
                nbytes, cuda_device_id(self.device)))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    def __repr__(self):
        return (f"{type(self).__name__}(reserve_size={self.reserve_size}, "
                f"device={self.device})")

    @property
    def granularity(self) -> int:
        """The device's allocation granularity: every block is a multiple of it."""
        return deref(self.c_obj).granularity()

    @property
    def reserve_size(self) -> int:
        """Bytes of virtual address range reserved at construction."""
        return deref(self.c_obj).reserve_size()

    @property
    def mapped_bytes(self) -> int:
        """Bytes of physical memory mapped now (live blocks, rounded to the granularity)."""
        return deref(self.c_obj).mapped_bytes()
