# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""The policy cores on host memory with hand-signalled fences (tests only: built with
-DRMM_FENCES_BUILD_TESTS=ON beside this file, never installed).

Runs the very C++ cores that the resources run on the GPU, with manual fences (or a simulated
device) in place of CUDA events and host allocators in place of the upstream. Needs no GPU.
"""

from cython.operator cimport dereference as deref
from libc.stddef cimport size_t
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libcpp cimport bool
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.set cimport set as cpp_set
from libcpp.string cimport string
from libcpp.vector cimport vector


from rmm_fences._lib._cores cimport (
    allocation_fields,
    allocation_record,
    batch_bytes_from,
    batch_frees_from,
    default_max_batch_bytes,
    default_max_batch_frees,
    free_problem,
    free_result,
    hazard_fields,
    hazard_record,
    hazard_tracker_stats,
    mode_from_name,
    stream_ordered_pool_stats,
    sync_mode,
    sync_on_free_stats,
    torch_allocator_stats,
)
from rmm_fences_bench._replay cimport replay_result


cdef extern from "rmm_fences_testing/host_sync_on_free.hpp" namespace "rmm_fences::testing":
    cdef cppclass fence_entry "rmm_fences::testing::fence_board::fence":
        uintptr_t stream
        uint64_t stream_id
        uint64_t position
        bool recorded
        bool signalled

    cdef cppclass fence_board:
        vector[fence_entry] fences
        int fail_query
        int fail_wait
        int fail_sync_device
        int fail_sync_stream
        int fail_record
        int fail_stream_id
        bool global_capture
        uint64_t forced_waits
        uint64_t waits_ok
        uint64_t syncs_ok
        uint64_t failed_calls
        uint64_t invalidated_captures
        uint64_t identity_queries
        uint64_t records
        uint64_t released_fence_use
        bool recycle_fences
        fence_entry fence_at(size_t) except +
        void signal(size_t) except +
        void signal_stream(uintptr_t) except +
        void signal_all() except +
        void begin_capture(uintptr_t) except +
        void end_capture(uintptr_t) except +
        void reuse_handle(uintptr_t) except +
        uint64_t resolve(uintptr_t) except +
        void launch(uintptr_t) except +

    cdef cppclass release_record "rmm_fences::testing::host_upstream::release_record":
        uintptr_t ptr
        size_t bytes
        uintptr_t stream
        bool fence_signalled

    cdef cppclass host_upstream:
        vector[release_record] releases_copy() except +
        vector[release_record] releases
        uint64_t bad_frees
        size_t used() except +

    cdef cppclass core_type "rmm_fences::mr::detail::sync_on_free_core<rmm_fences::testing::host_platform, rmm_fences::testing::host_upstream>":  # noqa: E501 (a C++ name)
        size_t pending_bytes() except +
        size_t pending_count() except +
        size_t live_count() except +
        size_t max_batch_frees()
        optional[size_t] max_batch_bytes()
        sync_on_free_stats stats() except +

    cdef struct platform_calls:
        uint64_t is_capturing
        uint64_t key
        uint64_t stream_id
        uint64_t acquire_fence
        uint64_t record
        uint64_t ready
        uint64_t ready_complete
        uint64_t release_fence
        uint64_t host_wait
        uint64_t sync_stream
        uint64_t sync_device
        uint64_t upstream_allocate
        uint64_t upstream_deallocate
        uint64_t heap_allocations
        uint64_t heap_frees
        uint64_t heap_failures

    cdef struct thread_run_result:
        uint64_t frees
        uint64_t unsafe_releases
        uint64_t reuses
        uint64_t unsafe_reuses
        uint64_t upstream_bad_frees
        uint64_t lost
        uint64_t syncs_counted
        uint64_t syncs_succeeded
        uint64_t invalidated_captures
        uint64_t pending_after_flush
        uint64_t released_fence_use

    cdef cppclass host_sync_on_free:
        host_sync_on_free(
            sync_mode, optional[size_t], size_t, size_t, optional[size_t], bool
        ) except +
        void* allocate(uintptr_t, size_t, size_t) except +MemoryError
        uint64_t reuses()
        uint64_t unsafe_reuses()
        free_result deallocate(uintptr_t, void*, size_t, size_t, int64_t*) except +
        void deallocate_unchecked(uintptr_t, void*, size_t, size_t) except +
        size_t flush() except +
        void free_in_capture_after_next_device_sync(uintptr_t, void*, size_t) except +
        int64_t fence_of(void*) except +
        thread_run_result run_threads(int, int, uint64_t) nogil except +
        platform_calls run_pairs(
            uintptr_t, size_t, uint64_t, bool, uint64_t, uint64_t) except +MemoryError
        platform_calls calls() except +
        core_type& core()
        fence_board& board()
        host_upstream& upstream()

    int host_thread


cdef tuple _release_tuple(release_record r):
    """A block the upstream got back, as ``HostSyncOnFree.releases`` lists it."""
    return (r.ptr, r.bytes, r.stream, r.fence_signalled)


cdef class HostSyncOnFree:
    """SyncOnFree's core over host memory; fences are signalled by the test.

    Streams are handles (ints); handle 2 is the per-thread default stream, a different stream
    for each simulated thread (:meth:`set_thread`). Each free first launches "work" on its
    stream that uses the block; the upstream logs whether that work had completed when it got
    the block back. ``max_batch_frees``, ``max_batch_bytes`` and ``reuse_on_stream`` are the
    adaptor's (same defaults, same checks). :attr:`reuses` checks every pending block handed
    out again.
    """

    cdef unique_ptr[host_sync_on_free] c_obj

    def __cinit__(self, mode="deferred", max_pending_bytes=None, size_t upstream_limit=1 << 40,
                  max_batch_frees=default_max_batch_frees,
                  max_batch_bytes=default_max_batch_bytes, bint reuse_on_stream=True):
        cdef optional[size_t] cap
        cdef size_t c_batch_frees = batch_frees_from(max_batch_frees)
        cdef optional[size_t] c_batch_bytes = batch_bytes_from(max_batch_bytes)
        if max_pending_bytes is not None:
            cap = <size_t>max_pending_bytes
        self.c_obj.reset(new host_sync_on_free(
            mode_from_name(mode), cap, upstream_limit, c_batch_frees, c_batch_bytes,
            reuse_on_stream))

    @property
    def max_batch_frees(self) -> int:
        return deref(self.c_obj).core().max_batch_frees()

    @property
    def max_batch_bytes(self):
        cdef optional[size_t] nbytes = deref(self.c_obj).core().max_batch_bytes()
        return deref(nbytes) if nbytes.has_value() else None

    def fence_of(self, uintptr_t ptr):
        """The fence the pending block at ``ptr`` waits for, or None (no fence recorded for it
        yet, or not pending)."""
        cdef int64_t f = deref(self.c_obj).fence_of(<void*>ptr)
        return None if f < 0 else f

    @property
    def recycle_fences(self) -> bool:
        """Released fences are handed out again (as CUDA's event pool does)."""
        return deref(self.c_obj).board().recycle_fences

    @recycle_fences.setter
    def recycle_fences(self, bool value) -> None:
        deref(self.c_obj).board().recycle_fences = value

    def allocate(self, size_t nbytes, uintptr_t stream=0, size_t alignment=256) -> int:
        return <uintptr_t>deref(self.c_obj).allocate(stream, nbytes, alignment)

    def deallocate(self, uintptr_t ptr, size_t nbytes, uintptr_t stream=0, size_t alignment=256):
        """Free (checked); returns the id of the fence the block waits for, or None (released,
        parked, or in a batch whose fence is not recorded yet).

        Raises ValueError, as the GPU adaptor does, on a rejected free.
        """
        cdef int64_t fence = -1
        cdef free_result r = deref(self.c_obj).deallocate(
            stream, <void*>ptr, nbytes, alignment, &fence)
        problem = free_problem(r, ptr, nbytes)
        if problem is not None:
            raise ValueError(problem)
        return None if fence < 0 else fence

    def deallocate_unchecked(self, uintptr_t ptr, size_t nbytes, uintptr_t stream=0,
                             size_t alignment=256) -> None:
        """The noexcept C++ ``deallocate``: a bad free is counted and printed on stderr."""
        deref(self.c_obj).deallocate_unchecked(stream, <void*>ptr, nbytes, alignment)

    def flush(self) -> int:
        return deref(self.c_obj).flush()

    def signal(self, size_t fence) -> None:
        """Signal `fence` and, as a stream completes in order, every earlier one of its stream."""
        deref(self.c_obj).board().signal(fence)

    def signal_stream(self, uintptr_t stream) -> None:
        deref(self.c_obj).board().signal_stream(stream)

    def signal_all(self) -> None:
        deref(self.c_obj).board().signal_all()

    def launch(self, uintptr_t stream) -> None:
        """Queue work on ``stream`` (captured, not run, while it captures)."""
        deref(self.c_obj).board().launch(stream)

    def begin_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).board().begin_capture(stream)

    def end_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).board().end_capture(stream)

    def reuse_handle(self, uintptr_t stream) -> None:
        """The stream behind ``stream`` is destroyed; a new stream gets the same handle."""
        deref(self.c_obj).board().reuse_handle(stream)

    def stream_id(self, uintptr_t stream) -> int:
        return deref(self.c_obj).board().resolve(stream)

    @staticmethod
    def set_thread(int thread) -> None:
        """The simulated thread of the calling Python thread (its per-thread default stream)."""
        global host_thread
        host_thread = thread

    def fail_next(self, str kind, int count=1) -> None:
        """The next ``count`` calls of ``kind`` fail: query, wait, sync_device, sync_stream,
        record or stream_id."""
        cdef fence_board* b = &deref(self.c_obj).board()
        if kind == "query":
            b.fail_query = count
        elif kind == "wait":
            b.fail_wait = count
        elif kind == "sync_device":
            b.fail_sync_device = count
        elif kind == "sync_stream":
            b.fail_sync_stream = count
        elif kind == "record":
            b.fail_record = count
        elif kind == "stream_id":
            b.fail_stream_id = count
        else:
            raise ValueError(
                "kind must be 'query', 'wait', 'sync_device', 'sync_stream', 'record' or "
                f"'stream_id', got {kind!r}"
            )

    def fail_next_record(self) -> None:
        deref(self.c_obj).board().fail_record = 1

    def clear_fail_next_record(self) -> None:
        deref(self.c_obj).board().fail_record = 0

    @property
    def global_capture(self) -> bool:
        """Another thread captures in the global mode: every query, wait and sync fails."""
        return deref(self.c_obj).board().global_capture

    @global_capture.setter
    def global_capture(self, bool value) -> None:
        deref(self.c_obj).board().global_capture = value

    def free_in_capture_after_next_device_sync(self, uintptr_t ptr, size_t nbytes,
                                               uintptr_t stream) -> None:
        """Right after the next successful device sync, "another thread" launches work on
        ``stream``, and frees ``ptr`` there in capture: that sync does not cover it."""
        deref(self.c_obj).free_in_capture_after_next_device_sync(stream, <void*>ptr, nbytes)

    def run_threads(self, int workers=4, int iterations=2000, uint64_t random_state=1) -> dict:
        """Real threads racing frees, polls, flushes, captures and faults (see the C++)."""
        cdef thread_run_result r
        with nogil:
            r = deref(self.c_obj).run_threads(workers, iterations, random_state)
        return r  # the struct's fields, by name

    def run_pairs(self, size_t nbytes, uint64_t pairs, uintptr_t stream=7,
                  str fences="complete_next_call", uint64_t lag=0,
                  uint64_t fail_heap_every=0) -> dict:
        """``pairs`` allocate + deallocate pairs of ``nbytes`` on ``stream`` with no work on it
        (the native alloc/free benchmark's loop); returns the calls they made on the platform
        (``is_capturing``, ``key``, ``stream_id``, ``acquire_fence``, ``record``, ``ready``
        (fence queries) and ``ready_complete`` (those that found the fence complete),
        ``release_fence``, ``host_wait``, ``sync_stream``, ``sync_device``) and the upstream
        (``upstream_allocate``, ``upstream_deallocate``), and the heap allocations and frees
        the core made itself (``heap_allocations``, ``heap_frees``: operator new and delete,
        not counting the harness's platform and upstream). The counts start again from 0.

        ``fences``: ``"complete_next_call"``, a fence is complete from the next call on (a
        device processes a record asynchronously: a query in the call that recorded it finds
        it pending); ``"complete_at_record"``, complete as soon as it is recorded.
        ``lag`` (with ``"complete_next_call"``): a fence recorded in pair j is complete only
        from pair j + 1 + ``lag`` on (several fences pending at once).
        ``fail_heap_every``: every n-th heap allocation of the core fails (``heap_failures``
        counts them); a pair whose allocation fails frees nothing.
        """
        if fences not in ("complete_next_call", "complete_at_record"):
            raise ValueError(
                "fences must be 'complete_next_call' or 'complete_at_record', "
                f"got {fences!r}"
            )
        if lag > 0 and fences != "complete_next_call":
            raise ValueError(f"lag={lag} needs fences='complete_next_call', got {fences!r}")
        return deref(self.c_obj).run_pairs(
            stream, nbytes, pairs, fences == "complete_at_record", lag, fail_heap_every
        )

    @property
    def calls(self) -> dict:
        """The platform and upstream calls so far, since the last :meth:`run_pairs` (its
        keys)."""
        return deref(self.c_obj).calls()

    def fence(self, size_t fence) -> dict:
        cdef fence_entry f = deref(self.c_obj).board().fence_at(fence)
        return {"stream": f.stream, "recorded": f.recorded, "signalled": f.signalled}

    @property
    def fence_count(self) -> int:
        return deref(self.c_obj).board().fences.size()

    @property
    def forced_waits(self) -> int:
        return deref(self.c_obj).board().forced_waits

    @property
    def board_counts(self) -> dict:
        """What the platform saw: successful waits and syncs, failed calls, identity queries
        on a capturing stream (each would have invalidated a capture)."""
        cdef fence_board* b = &deref(self.c_obj).board()
        return {
            "waits_ok": b.waits_ok,
            "syncs_ok": b.syncs_ok,
            "failed_calls": b.failed_calls,
            "invalidated_captures": b.invalidated_captures,
            "identity_queries": b.identity_queries,
            "records": b.records,
            "released_fence_use": b.released_fence_use,
        }

    @property
    def reuses(self) -> dict:
        """Pending blocks handed out again without passing through the upstream (``reuses``)
        and, of those, the ones handed to another stream (or a capture) before the work that
        used them ended (``unsafe``)."""
        return {"reuses": deref(self.c_obj).reuses(), "unsafe": deref(self.c_obj).unsafe_reuses()}

    @property
    def releases(self) -> list:
        """Blocks the upstream got back, in order: (ptr, nbytes, stream, work_done)."""
        return [_release_tuple(r) for r in deref(self.c_obj).upstream().releases_copy()]

    def releases_since(self, size_t start) -> list:
        """``releases[start:]`` without copying the earlier ones (a replay that follows the
        releases call by call); call it from the thread that makes the calls."""
        cdef vector[release_record]* done = &deref(self.c_obj).upstream().releases
        return [_release_tuple(done[0][i]) for i in range(start, done[0].size())]

    @property
    def upstream_bad_frees(self) -> int:
        return deref(self.c_obj).upstream().bad_frees

    @property
    def upstream_used(self) -> int:
        return deref(self.c_obj).upstream().used()

    @property
    def pending_bytes(self) -> int:
        return deref(self.c_obj).core().pending_bytes()

    @property
    def pending_count(self) -> int:
        return deref(self.c_obj).core().pending_count()

    @property
    def live_count(self) -> int:
        return deref(self.c_obj).core().live_count()

    @property
    def stats(self) -> dict:
        return deref(self.c_obj).core().stats()


cdef extern from "rmm_fences_testing/host_ring_deque.hpp" namespace "rmm_fences::testing":
    cdef cppclass host_ring_deque:
        void push_back(int64_t) except +MemoryError
        void pop_front()
        size_t erase_at(size_t)
        size_t insert_at(size_t, int64_t) except +MemoryError
        void shrink(size_t)
        vector[int64_t] values() except +
        size_t size()
        size_t capacity()


cdef class HostRingDeque:
    """The ring deque that holds a stream's queue of the deferred free list, over integers,
    by position (checked against a list by the tests)."""

    cdef host_ring_deque c_obj

    def push_back(self, int64_t value) -> None:
        self.c_obj.push_back(value)

    def pop_front(self) -> None:
        if self.c_obj.size() == 0:
            raise IndexError("pop_front: the deque is empty")
        self.c_obj.pop_front()

    def erase(self, size_t index) -> int:
        """Erases the element at ``index``; returns the position of the one that followed."""
        if index >= self.c_obj.size():
            raise IndexError(f"index {index} out of range for size {self.c_obj.size()}")
        return self.c_obj.erase_at(index)

    def insert(self, size_t index, int64_t value) -> int:
        """Inserts ``value`` before ``index`` (at most the size); returns its position."""
        if index > self.c_obj.size():
            raise IndexError(f"index {index} out of range for size {self.c_obj.size()}")
        return self.c_obj.insert_at(index, value)

    def shrink(self, size_t kept) -> None:
        self.c_obj.shrink(kept)

    @property
    def values(self) -> list:
        return list(self.c_obj.values())

    @property
    def capacity(self) -> int:
        return self.c_obj.capacity()

    def __len__(self) -> int:
        return self.c_obj.size()


cdef extern from "rmm_fences/detail/pointer_map.hpp" namespace "rmm_fences::mr::detail":
    cdef cppclass pointer_map[V]:
        pointer_map(size_t) except +MemoryError
        size_t size()
        size_t find_index(uintptr_t)
        V* find(uintptr_t)
        void insert_or_assign(uintptr_t, V) except +
        V& find_or_insert(uintptr_t) except +
        V take(uintptr_t)


cdef class HostPointerMap:
    """The address -> value hash map of the pool's, tracker's and allocators' live blocks, over
    integers (``find``/``find_index`` give None for an absent key)."""

    cdef unique_ptr[pointer_map[uint64_t]] c_obj

    def __cinit__(self, size_t capacity=16):
        self.c_obj.reset(new pointer_map[uint64_t](capacity))

    def insert(self, uintptr_t key, uint64_t value) -> None:
        deref(self.c_obj).insert_or_assign(key, value)

    def find(self, uintptr_t key):
        cdef uint64_t* v = deref(self.c_obj).find(key)
        return None if v == NULL else v[0]

    def find_index(self, uintptr_t key):
        cdef size_t i = deref(self.c_obj).find_index(key)
        return None if i == <size_t>-1 else i

    def find_or_insert(self, uintptr_t key, uint64_t value) -> int:
        """The value found for ``key`` (0 for a key just inserted: every empty slot holds 0);
        a 0 found is then set to ``value`` in place, as the tracker fills a new record."""
        cdef uint64_t* slot = &deref(self.c_obj).find_or_insert(key)
        cdef uint64_t found = slot[0]
        if found == 0:
            slot[0] = value
        return found

    def take(self, uintptr_t key) -> int:
        return deref(self.c_obj).take(key)

    def __len__(self) -> int:
        return deref(self.c_obj).size()


cdef extern from "rmm_fences_testing/host_pool_census.hpp" namespace "rmm_fences::testing":
    cdef cppclass census_entry:
        int place
        uint64_t owner
        int size_class
        size_t bytes
        size_t blocks

    cdef cppclass census_chunk:
        uintptr_t ptr
        size_t size
        size_t live
        size_t free_bytes
        size_t largest_free
        size_t free_blocks

    cdef cppclass pool_census:
        size_t pool_bytes
        vector[size_t] place_bytes
        vector[size_t] place_largest
        vector[census_entry] entries
        vector[census_chunk] chunks

    vector[size_t] census_size_bound_list() except +


cdef extern from "rmm_fences_testing/host_pool.hpp" namespace "rmm_fences::testing":
    cdef cppclass wait_record "std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>":
        pass

    cdef cppclass growth_census:
        uint64_t clock
        uint64_t stream
        size_t chunk
        pool_census census

    const uint64_t host_pool_orphan_owner "rmm_fences::testing::host_pool::orphan_owner"
    const uint64_t host_pool_graph_owner "rmm_fences::testing::host_pool::graph_owner"
    const uint64_t host_pool_shared_owner "rmm_fences::testing::host_pool::shared_owner"

    cdef cppclass pool_log:
        uint64_t now()
        uint64_t records

    cdef cppclass pool_core_type "rmm_fences::mr::detail::stream_ordered_pool_core<rmm_fences::testing::host_pool_platform, rmm_fences::testing::host_chunk_upstream>":  # noqa: E501 (a C++ name)
        stream_ordered_pool_stats stats()
        size_t pool_size()

    cdef cppclass host_page_arena:
        size_t page_size()
        size_t physical_bytes()
        size_t spare_bytes()
        size_t mapped_bytes()
        size_t peak_physical_bytes()
        uint64_t maps()
        uint64_t unmaps()
        size_t address_high_mark()
        uint64_t page_calls()
        uint64_t now_ns()
        uint64_t busy_ns()

    cdef struct host_arena_costs:
        uint64_t call_ns
        uint64_t page_ns
        double remap_time_fraction

    cdef cppclass host_pool:
        host_pool(size_t, optional[size_t], size_t, optional[size_t], size_t, size_t,
                  host_arena_costs) except +
        host_page_arena* arena()
        void* allocate(uint64_t, size_t, size_t) except +
        void* allocate_cached_first(uint64_t, size_t, size_t) except +
        int deallocate(uint64_t, void*, size_t, size_t*) except +
        void deallocate_unchecked(uint64_t, void*, size_t) except +
        void retire(uint64_t) except +
        size_t release() except +
        bint synchronize_and_reclaim() except +
        bint holds_unfenced_blocks() except +
        void begin_capture(uint64_t, uint64_t, int) except +
        void end_capture(uint64_t) except +
        bint instantiate(uint64_t) except +
        bint launch(uint64_t) except +
        bint destroy_exec(uint64_t) except +
        bint destroy_graph(uint64_t) except +
        bint graph_released(uint64_t) except +
        void alias(uint64_t, uint64_t) except +
        void mark_foreign(uint64_t) except +
        void fail_next(int, int) except +
        void complete(uint64_t) except +
        void complete_all() except +
        void set_idle(bint) except +
        void destroy_stream(uint64_t) except +
        uint64_t fences_held() except +
        void free_inside_next_sync(uint64_t, void*, size_t) except +
        uint64_t hook_free_clock()
        size_t run_threads(int, int, uint64_t) nogil except +
        size_t run_stream_churn(int, int, uint64_t) nogil except +
        size_t run_graph_churn(int, int, uint64_t) nogil except +
        vector[string] violations() except +
        pool_census census() except +
        void record_growths() except +
        const vector[growth_census]& growths()
        pool_core_type& core()
        pool_log& log()


cdef extern from *:
    """
    #include <rmm_fences_testing/host_pool.hpp>
    static PyObject* rmm_fences_pool_waits(rmm_fences::testing::host_pool& p)
    {
      std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> w;
      {
        std::lock_guard<std::mutex> lock(p.log().mutex);
        w = p.log().waits;
      }
      PyObject* out = PyList_New(0);
      for (auto const& [waiter, stream, clock] : w) {
        PyObject* t = Py_BuildValue("(KKK)", (unsigned long long)waiter,
                                    (unsigned long long)stream, (unsigned long long)clock);
        PyList_Append(out, t);
        Py_DECREF(t);
      }
      return out;
    }
    static PyObject* rmm_fences_pool_syncs(rmm_fences::testing::host_pool& p)
    {
      std::vector<std::uint64_t> s;
      {
        std::lock_guard<std::mutex> lock(p.log().mutex);
        s = p.log().syncs;
      }
      PyObject* out = PyList_New(0);
      for (auto c : s) {
        PyObject* t = PyLong_FromUnsignedLongLong(c);
        PyList_Append(out, t);
        Py_DECREF(t);
      }
      return out;
    }
    static PyObject* rmm_fences_pool_stream_syncs(rmm_fences::testing::host_pool& p)
    {
      std::vector<std::pair<std::uint64_t, std::uint64_t>> s;
      {
        std::lock_guard<std::mutex> lock(p.log().mutex);
        s = p.log().stream_syncs;
      }
      PyObject* out = PyList_New(0);
      for (auto const& [stream, clock] : s) {
        PyObject* t = Py_BuildValue("(KK)", (unsigned long long)stream, (unsigned long long)clock);
        PyList_Append(out, t);
        Py_DECREF(t);
      }
      return out;
    }
    static PyObject* rmm_fences_pool_upstream_calls(rmm_fences::testing::host_pool& p)
    {
      std::vector<std::tuple<bool, std::uintptr_t, std::size_t, std::uint64_t, std::uint64_t>> c;
      {
        std::lock_guard<std::mutex> lock(p.log().mutex);
        c = p.log().upstream_calls;
      }
      PyObject* out = PyList_New(0);
      for (auto const& [alloc, ptr, size, stream, clock] : c) {
        PyObject* t = Py_BuildValue("(sKKKK)", alloc ? "allocate" : "deallocate",
                                    (unsigned long long)ptr, (unsigned long long)size,
                                    (unsigned long long)stream, (unsigned long long)clock);
        PyList_Append(out, t);
        Py_DECREF(t);
      }
      return out;
    }
    static PyObject* rmm_fences_pool_free_blocks(rmm_fences::testing::host_pool& p)
    {
      PyObject* out = PyList_New(0);
      for (auto const& [ptr, size, owner] : p.free_blocks()) {
        PyObject* t = Py_BuildValue("(KKK)", (unsigned long long)ptr, (unsigned long long)size,
                                    (unsigned long long)owner);
        PyList_Append(out, t);
        Py_DECREF(t);
      }
      return out;
    }
    static PyObject* rmm_fences_pool_chunks(rmm_fences::testing::host_pool& p)
    {
      PyObject* out = PyList_New(0);
      for (auto const& [ptr, size] : p.chunks()) {
        PyObject* t = Py_BuildValue("(KK)", (unsigned long long)ptr, (unsigned long long)size);
        PyList_Append(out, t);
        Py_DECREF(t);
      }
      return out;
    }
    """
    object rmm_fences_pool_waits(host_pool&)
    object rmm_fences_pool_syncs(host_pool&)
    object rmm_fences_pool_stream_syncs(host_pool&)
    object rmm_fences_pool_upstream_calls(host_pool&)
    object rmm_fences_pool_free_blocks(host_pool&) except +
    object rmm_fences_pool_chunks(host_pool&) except +


#: The places of a pool census (``HostStreamOrderedPool.census``), in the core's order
#: (``pool::block_place``).
POOL_CENSUS_PLACES = (
    "live", "cached", "cached_covered", "shared", "shared_fenced", "graph", "orphan",
)
_CENSUS_BOUNDS = tuple(census_size_bound_list())


def _size_label(size_t n) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


#: A census's size classes, smallest first: free and live blocks below each bound, then the
#: rest.
POOL_CENSUS_SIZE_CLASSES = tuple(f"< {_size_label(b)}" for b in _CENSUS_BOUNDS) + (
    f">= {_size_label(_CENSUS_BOUNDS[-1])}",
)


cdef object _census_owner(uint64_t owner):
    """A census's owner: a stream identity, or what holds blocks of no stream."""
    if owner == host_pool_orphan_owner:
        return "orphans"
    if owner == host_pool_graph_owner:
        return "graphs"
    if owner == host_pool_shared_owner:
        return "shared"
    return owner


cdef dict _census_dict(const pool_census& c):
    """A census as a dict: ``pool_bytes``; ``places`` (bytes per place, summing to
    ``pool_bytes``); ``largest`` (place -> its largest block); ``by_owner`` ((place, owner) ->
    bytes); ``by_size_class`` ((place, size class) -> bytes); ``blocks`` (place -> blocks);
    ``chunks`` (one dict per chunk, in address order)."""
    places = {name: c.place_bytes[k] for k, name in enumerate(POOL_CENSUS_PLACES)}
    largest = {name: c.place_largest[k] for k, name in enumerate(POOL_CENSUS_PLACES)}
    by_owner = {}
    by_size = {}
    blocks = dict.fromkeys(POOL_CENSUS_PLACES, 0)
    cdef census_entry e
    cdef size_t i
    for i in range(c.entries.size()):
        e = c.entries[i]
        place = POOL_CENSUS_PLACES[e.place]
        key = (place, _census_owner(e.owner))
        by_owner[key] = by_owner.get(key, 0) + e.bytes
        key = (place, POOL_CENSUS_SIZE_CLASSES[e.size_class])
        by_size[key] = by_size.get(key, 0) + e.bytes
        blocks[place] += e.blocks
    cdef census_chunk ch
    chunks = []
    for i in range(c.chunks.size()):
        ch = c.chunks[i]
        chunks.append({"ptr": ch.ptr, "size": ch.size, "live": ch.live, "free": ch.free_bytes,
                       "largest_free": ch.largest_free, "free_blocks": ch.free_blocks})
    return {"pool_bytes": c.pool_bytes, "places": places, "largest": largest,
            "by_owner": by_owner, "by_size_class": by_size, "blocks": blocks, "chunks": chunks}


_POOL_FAULTS = {
    "record": 0, "stream_wait": 1, "sync_device": 2, "sync_stream": 3, "query": 4, "retain": 5,
}
_CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}


cdef class HostStreamOrderedPool:
    """The stream-ordered pool's core over host chunks; every fence, wait and sync logged
    against a clock that advances once per call, with fault injection and an oracle.

    ``deallocate`` raises ``ValueError`` for a free the pool refuses (as
    :meth:`StreamOrderedPoolMemoryResource.deallocate` does); ``deallocate_unchecked`` is the
    ``noexcept`` free that rmm's resource_ref reaches (refusals are only counted).
    """

    cdef unique_ptr[host_pool] c_obj
    cdef uint64_t _next_capture_id

    def __cinit__(self, size_t initial_pool_size=0, maximum_pool_size=None,
                  size_t upstream_limit=1 << 40, maximum_growth_size=None,
                  size_t arena_page_size=0, size_t arena_reserve_size=0,
                  uint64_t arena_call_ns=0, uint64_t arena_page_ns=0,
                  double arena_remap_time_fraction=1.0):
        cdef optional[size_t] cap
        cdef optional[size_t] growth
        cdef host_arena_costs costs
        costs.call_ns = arena_call_ns
        costs.page_ns = arena_page_ns
        costs.remap_time_fraction = arena_remap_time_fraction
        if maximum_pool_size is not None:
            cap = <size_t>maximum_pool_size
        if maximum_growth_size is not None:
            growth = <size_t>maximum_growth_size
        self.c_obj.reset(
            new host_pool(initial_pool_size, cap, upstream_limit, growth, arena_page_size,
                          arena_reserve_size, costs)
        )
        self._next_capture_id = 1

    def allocate(self, size_t nbytes, uint64_t stream=0, size_t alignment=256) -> int:
        return <uintptr_t>deref(self.c_obj).allocate(stream, nbytes, alignment)

    def allocate_cached_first(self, size_t nbytes, uint64_t stream=0,
                              size_t alignment=256) -> int:
        """The Python resource's ``allocate``: the same-stream path alone, then the rest."""
        return <uintptr_t>deref(self.c_obj).allocate_cached_first(stream, nbytes, alignment)

    def deallocate(self, uintptr_t ptr, size_t nbytes, uint64_t stream=0) -> None:
        cdef size_t allocated = 0
        cdef int status = deref(self.c_obj).deallocate(stream, <void*>ptr, nbytes, &allocated)
        if status == 0:
            return
        if status == 2:
            raise ValueError(f"size mismatch: allocated {allocated} bytes, freed with {nbytes}")
        if status == 3:
            raise ValueError(f"stream of another device: cannot free {ptr:#x} on it")
        raise ValueError(f"double free or foreign pointer: {ptr:#x} is not a live block")

    def deallocate_unchecked(self, uintptr_t ptr, size_t nbytes, uint64_t stream=0) -> None:
        deref(self.c_obj).deallocate_unchecked(stream, <void*>ptr, nbytes)

    def retire_stream(self, uint64_t stream) -> None:
        deref(self.c_obj).retire(stream)

    def release(self) -> int:
        return deref(self.c_obj).release()

    def holds_unfenced_blocks(self) -> bool:
        """Whether the destructor would synchronize the device first (free blocks that no
        fence covers remain; caches a record covers are shared first)."""
        return deref(self.c_obj).holds_unfenced_blocks()

    def synchronize_and_reclaim(self) -> bool:
        """The named reclaim: a device sync, then the blocks it orders are free again."""
        return deref(self.c_obj).synchronize_and_reclaim()

    def begin_capture(self, uint64_t stream, capture_id=None, mode="global") -> int:
        """Start capturing ``stream``; streams forked into one capture share ``capture_id``
        (a new one by default). ``mode``: ``global``, ``thread_local`` or ``relaxed``.
        Returns the capture id, which names the capture's graph."""
        cdef uint64_t cid
        if mode not in _CAPTURE_MODES:
            raise ValueError(f"mode must be one of {sorted(_CAPTURE_MODES)}, got {mode!r}")
        if capture_id is None:
            cid = self._next_capture_id
            self._next_capture_id += 1
        else:
            cid = capture_id
        deref(self.c_obj).begin_capture(stream, cid, _CAPTURE_MODES[mode])
        return cid

    def end_capture(self, uint64_t stream) -> None:
        """``stream`` leaves its capture; when the last stream leaves, the graph exists."""
        deref(self.c_obj).end_capture(stream)

    def instantiate(self, uint64_t capture_id) -> bool:
        """An executable graph of the capture's graph (False: no graph to instantiate)."""
        return deref(self.c_obj).instantiate(capture_id)

    def launch(self, uint64_t capture_id) -> bool:
        """Launch an executable graph of the capture (False: none)."""
        return deref(self.c_obj).launch(capture_id)

    def destroy_exec(self, uint64_t capture_id) -> bool:
        """Destroy one executable graph of the capture (False: none)."""
        return deref(self.c_obj).destroy_exec(capture_id)

    def destroy_graph(self, uint64_t capture_id) -> bool:
        """Destroy the capture's graph (False: no graph, or destroyed already)."""
        return deref(self.c_obj).destroy_graph(capture_id)

    def graph_released(self, uint64_t capture_id) -> bool:
        """True once the graph and every executable graph of it are destroyed."""
        return deref(self.c_obj).graph_released(capture_id)

    def alias_stream(self, uint64_t stream, uint64_t identity) -> None:
        """From now on ``stream`` reports ``identity`` (two streams, one identity)."""
        deref(self.c_obj).alias(stream, identity)

    def mark_foreign_stream(self, uint64_t stream) -> None:
        """``stream`` belongs to another device from now on."""
        deref(self.c_obj).mark_foreign(stream)

    def fail_next(self, kind, int count=1) -> None:
        """The next ``count`` calls of ``kind`` fail: one of ``record``, ``stream_wait``,
        ``sync_device``, ``sync_stream``, ``query`` (a fence test), ``retain`` (a user object
        retained into a capture's graph)."""
        if kind not in _POOL_FAULTS:
            raise ValueError(f"kind must be one of {sorted(_POOL_FAULTS)}, got {kind!r}")
        deref(self.c_obj).fail_next(_POOL_FAULTS[kind], count)

    def complete(self, uint64_t stream) -> None:
        """The work queued so far on ``stream`` has run: its fences query as complete."""
        deref(self.c_obj).complete(stream)

    def complete_all(self) -> None:
        """The work queued so far on every stream has run."""
        deref(self.c_obj).complete_all()

    def set_idle(self, bint on=True) -> None:
        """From now on, streams run no work (a replay of an allocation log): every fence
        recorded is complete, and a query finds it so."""
        deref(self.c_obj).set_idle(on)

    def destroy_stream(self, uint64_t stream) -> None:
        """``stream`` is destroyed and its handle reused by a new stream: the pool sees the
        same identity, the oracle another stream."""
        deref(self.c_obj).destroy_stream(stream)

    @property
    def fences_held(self) -> int:
        """Fences (events) the pool holds now: acquired and not yet released."""
        return deref(self.c_obj).fences_held()

    def free_inside_next_sync(self, uintptr_t ptr, size_t nbytes, uint64_t stream) -> None:
        """Inside the next device sync (after its synchronization point), "another thread"
        frees ``ptr`` on ``stream``."""
        deref(self.c_obj).free_inside_next_sync(stream, <void*>ptr, nbytes)

    @property
    def hook_free_clock(self) -> int:
        return deref(self.c_obj).hook_free_clock()

    def run_threads(self, int threads, int iterations, uint64_t random_state=0) -> int:
        """Real threads on their own streams (see host_pool::run_threads), without the GIL;
        returns how many allocations ran out of memory."""
        cdef size_t n
        with nogil:
            n = deref(self.c_obj).run_threads(threads, iterations, random_state)
        return n

    def run_stream_churn(self, int threads, int tasks, uint64_t random_state=0) -> int:
        """Real threads, a new stream per task (see host_pool::run_stream_churn), without the
        GIL; returns how many allocations ran out of memory."""
        cdef size_t n
        with nogil:
            n = deref(self.c_obj).run_stream_churn(threads, tasks, random_state)
        return n

    def run_graph_churn(self, int threads, int tasks, uint64_t random_state=0) -> int:
        """Real threads with graphs (see host_pool::run_graph_churn), without the GIL;
        returns how many allocations ran out of memory."""
        cdef size_t n
        with nogil:
            n = deref(self.c_obj).run_graph_churn(threads, tasks, random_state)
        return n

    @property
    def violations(self) -> list:
        """What the oracle saw: blocks reused without the wait they needed, live overlaps."""
        return [v.decode() for v in deref(self.c_obj).violations()]

    @property
    def clock(self) -> int:
        return deref(self.c_obj).log().now()

    @property
    def waits(self) -> list:
        """(waiter stream, recording stream, clock of the record waited on), in order."""
        return rmm_fences_pool_waits(deref(self.c_obj))

    @property
    def syncs(self) -> list:
        return rmm_fences_pool_syncs(deref(self.c_obj))

    @property
    def stream_syncs(self) -> list:
        """(stream, clock) of each host sync of one stream."""
        return rmm_fences_pool_stream_syncs(deref(self.c_obj))

    @property
    def upstream_calls(self) -> list:
        """("allocate" or "deallocate", address, bytes, stream, clock) of each upstream call."""
        return rmm_fences_pool_upstream_calls(deref(self.c_obj))

    @property
    def records(self) -> int:
        return deref(self.c_obj).log().records

    @property
    def free_blocks(self) -> list:
        """(address, size, owner stream identity or 0 when shared)."""
        return rmm_fences_pool_free_blocks(deref(self.c_obj))

    @property
    def chunks(self) -> list:
        return rmm_fences_pool_chunks(deref(self.c_obj))

    def pool_size(self) -> int:
        return deref(self.c_obj).core().pool_size()

    @property
    def arena(self) -> dict | None:
        """The page arena's pages (``arena_page_size`` given), else None: ``page_size``,
        ``physical_bytes`` (mapped and spare), ``spare_bytes``, ``mapped_bytes``,
        ``peak_physical_bytes``, ``maps``, ``unmaps``, ``address_high_mark`` (the end of the
        highest page mapped so far, from the start of the reserve: address space used),
        ``page_calls`` (pages mapped and unmapped, and ranges mapped: the CUDA arena's driver
        calls), ``now_ns`` and ``busy_ns`` (the modelled time, and its part in page calls, at
        ``arena_call_ns`` per call of the pool and ``arena_page_ns`` per page call)."""
        cdef host_page_arena* a = deref(self.c_obj).arena()
        if a == NULL:
            return None
        return {"page_size": a.page_size(), "physical_bytes": a.physical_bytes(),
                "spare_bytes": a.spare_bytes(), "mapped_bytes": a.mapped_bytes(),
                "peak_physical_bytes": a.peak_physical_bytes(), "maps": a.maps(),
                "unmaps": a.unmaps(), "address_high_mark": a.address_high_mark(),
                "page_calls": a.page_calls(), "now_ns": a.now_ns(), "busy_ns": a.busy_ns()}

    def census(self) -> dict:
        """Where the pool's bytes are now, by place (``POOL_CENSUS_PLACES``), owner stream,
        size class and chunk (see ``_census_dict``). The places sum to ``pool_size()`` and the
        blocks tile the chunks: ``RuntimeError`` otherwise."""
        return _census_dict(deref(self.c_obj).census())

    def record_growths(self) -> None:
        """From now on, a census before each upstream allocation (``growths``)."""
        deref(self.c_obj).record_growths()

    @property
    def growths(self) -> list:
        """One dict per upstream allocation since ``record_growths``: ``clock``, ``stream``,
        ``chunk`` (bytes asked for) and ``census`` (the pool just before, after its own
        attempts to find a block)."""
        cdef size_t i
        cdef const growth_census* g
        out = []
        for i in range(deref(self.c_obj).growths().size()):
            g = &deref(self.c_obj).growths()[i]
            out.append({"clock": g.clock, "stream": g.stream, "chunk": g.chunk,
                        "census": _census_dict(g.census)})
        return out

    @property
    def stats(self) -> dict:
        return deref(self.c_obj).core().stats()


cdef extern from "rmm_fences/detail/pool/growth_rule.hpp" \
        namespace "rmm_fences::mr::detail::pool" nogil:
    cdef struct growth_state:
        size_t held
        size_t need
        optional[size_t] room
        optional[size_t] maximum_growth_size
        bool capturing
        size_t small_streak

    size_t c_growth_chunk "rmm_fences::mr::detail::pool::growth_chunk"(
        const growth_state&) noexcept


def pool_growth_chunk(size_t held, size_t need, room=None, maximum_growth_size=None,
                      bint capturing=False, size_t small_streak=0) -> int:
    """The chunk the stream-ordered pool's growth rule asks the upstream for, given the
    bytes the pool ``held``, the bytes a request ``need``s (rounded to the granule, plus its
    alignment padding), the ``room`` left below ``maximum_pool_size`` (None: no bound), the
    pool's ``maximum_growth_size``, whether the requesting stream is ``capturing`` and the
    bytes growths for small requests took since the last growth for a larger one
    (``small_streak``)."""
    cdef growth_state s
    s.held = held
    s.need = need
    if room is not None:
        s.room = <size_t>room
    if maximum_growth_size is not None:
        s.maximum_growth_size = <size_t>maximum_growth_size
    s.capturing = capturing
    s.small_streak = small_streak
    return c_growth_chunk(s)


# The hazard tracker on a simulated device.
from libcpp.string cimport string  # noqa: E402


cdef extern from "rmm_fences_testing/host_tracker.hpp" namespace "rmm_fences::testing":
    cdef cppclass sim_device:
        cpp_set[uintptr_t] capturing
        cpp_set[uintptr_t] failing_records
        cpp_set[uintptr_t] failing_queries
        cpp_set[uintptr_t] failing_waits
        size_t fail_next_records
        size_t fail_next_queries
        size_t fail_next_waits
        size_t fences_in_use
        uint64_t fences_acquired
        uint64_t fences_released
        void launch(uintptr_t) except +
        bool idle(uintptr_t) except +
        bool step(uintptr_t) except +
        size_t acquire() except +
        void release(size_t) except +
        bool record(size_t, uintptr_t, bool) except +
        bool ready(size_t) except +
        bool wait(uintptr_t, size_t, bool) except +

    cdef cppclass sim_upstream_state "rmm_fences::testing::sim_upstream::state":
        uint64_t allocations
        uint64_t deallocations
        uint64_t bad_deallocations

    cdef cppclass sim_tracker_core:
        void* allocate(uintptr_t, size_t, size_t, hazard_record*) except +
        bool deallocate(uintptr_t, void*, size_t, size_t, hazard_record*) except +
        bool record_stream(void*, uintptr_t) except +
        void poll() except +
        void release_fences()
        vector[allocation_record] outstanding() except +
        vector[hazard_record] hazards() except +
        void reset() except +
        hazard_tracker_stats stats() except +
        size_t pending_checks() except +

    cdef cppclass thread_run:
        uint64_t allocations
        uint64_t frees
        uint64_t handed_over
        uint64_t busy_frees
        uint64_t foreign
        uint64_t checks
        vector[string] errors

    cdef cppclass sim_hazard_tracker:
        sim_hazard_tracker(bool) except +
        sim_device& device()
        sim_tracker_core& core()
        sim_upstream_state& upstream()
        int64_t annotations()
        void hand_out_next(uintptr_t) except +
        thread_run run_threads(unsigned, unsigned, unsigned, uint64_t) except + nogil

    uintptr_t sim_key "rmm_fences::testing::sim_hazard_tracker::key"(uintptr_t)
    void sim_set_thread "rmm_fences::testing::sim_hazard_tracker::set_simulated_thread"(
        uint64_t)
    uintptr_t sim_per_thread_key \
        "rmm_fences::testing::sim_hazard_tracker::per_thread_key"(uint64_t)


cdef class SimHazardTracker:
    """The hazard tracker's core on a simulated device.

    Streams are integers; ``launch(s)`` queues work on ``s`` that ``step(s)`` completes in
    order. Stream 2 (``PER_THREAD``, as ``cudaStreamPerThread``) is the calling thread's
    per-thread default stream: ``as_thread(n)`` makes the calling thread simulated thread
    ``n`` (0: itself), ``per_thread_key(n)`` is the key of thread ``n``'s per-thread stream in
    records. The upstream is a naive cache (``stream_ordered=False``: a freed block goes to
    the next request of its size on any stream) or reuses blocks only on the freeing stream;
    ``hand_out_next(ptr)`` makes it return ``ptr`` next. Faults: ``fail_records``,
    ``fail_queries``, ``fail_waits`` (sets of streams whose tracker calls fail) and
    ``fail_next(kind, n)``.
    """

    PER_THREAD = 2

    cdef unique_ptr[sim_hazard_tracker] c_obj

    def __cinit__(self, bint stream_ordered):
        self.c_obj.reset(new sim_hazard_tracker(stream_ordered))

    def allocate(self, size_t nbytes, uintptr_t stream=0, bint strict=False):
        """The address, or ``(None, hazard)`` when a strict call was stopped."""
        cdef hazard_record stopped
        cdef void* ptr = deref(self.c_obj).core().allocate(
            stream, nbytes, 256, &stopped if strict else NULL)
        if ptr == NULL:
            return None, hazard_fields(stopped)
        return <uintptr_t>ptr

    def deallocate(self, uintptr_t ptr, size_t nbytes, uintptr_t stream=0, bint strict=False):
        """None, or the hazard fields that stopped a strict free."""
        cdef hazard_record stopped
        if deref(self.c_obj).core().deallocate(stream, <void*>ptr, nbytes, 256,
                                               &stopped if strict else NULL):
            return hazard_fields(stopped)
        return None

    def record_stream(self, uintptr_t ptr, uintptr_t stream) -> bool:
        return deref(self.c_obj).core().record_stream(<void*>ptr, stream)

    def poll(self) -> None:
        deref(self.c_obj).core().poll()

    def reset(self) -> None:
        deref(self.c_obj).core().reset()

    def release_fences(self) -> None:
        """What the resource does at its end: every fence the core holds goes back."""
        deref(self.c_obj).core().release_fences()

    @staticmethod
    def as_thread(uint64_t thread) -> None:
        """Make the calling thread simulated thread ``thread`` (0: its own identity)."""
        sim_set_thread(thread)

    @staticmethod
    def key(uintptr_t stream) -> int:
        """The key of stream handle ``stream`` on the calling (simulated) thread."""
        return sim_key(stream)

    @staticmethod
    def per_thread_key(uint64_t thread) -> int:
        return sim_per_thread_key(thread)

    def launch(self, uintptr_t stream) -> None:
        deref(self.c_obj).device().launch(sim_key(stream))

    def step(self, uintptr_t stream) -> bool:
        return deref(self.c_obj).device().step(sim_key(stream))

    def idle(self, uintptr_t stream) -> bool:
        return deref(self.c_obj).device().idle(sim_key(stream))

    def order(self, uintptr_t waiter, uintptr_t source) -> None:
        """What a user does to order ``waiter`` after ``source``: record and wait on a fence."""
        cdef sim_device* d = &deref(self.c_obj).device()
        cdef size_t f = d.acquire()
        d.record(f, sim_key(source), False)
        d.wait(sim_key(waiter), f, False)
        d.release(f)

    def mark(self, uintptr_t stream) -> int:
        """A model fence recorded on ``stream`` now (for the test's own bookkeeping)."""
        cdef sim_device* d = &deref(self.c_obj).device()
        cdef size_t f = d.acquire()
        d.record(f, sim_key(stream), False)
        return f

    def done(self, size_t fence) -> bool:
        return deref(self.c_obj).device().ready(fence)

    def forget(self, size_t fence) -> None:
        deref(self.c_obj).device().release(fence)

    def begin_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).device().capturing.insert(sim_key(stream))

    def end_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).device().capturing.erase(sim_key(stream))

    def fail_records(self, uintptr_t stream, bint on=True) -> None:
        """The tracker's event records on ``stream`` fail (or no longer)."""
        if on:
            deref(self.c_obj).device().failing_records.insert(sim_key(stream))
        else:
            deref(self.c_obj).device().failing_records.erase(sim_key(stream))

    def fail_queries(self, uintptr_t stream, bint on=True) -> None:
        """Queries of fences last recorded on ``stream`` fail (or no longer)."""
        if on:
            deref(self.c_obj).device().failing_queries.insert(sim_key(stream))
        else:
            deref(self.c_obj).device().failing_queries.erase(sim_key(stream))

    def fail_waits(self, uintptr_t stream, bint on=True) -> None:
        """Device-side waits enqueued on ``stream`` by the tracker fail (or no longer)."""
        if on:
            deref(self.c_obj).device().failing_waits.insert(sim_key(stream))
        else:
            deref(self.c_obj).device().failing_waits.erase(sim_key(stream))

    def fail_next(self, str kind, size_t count=1) -> None:
        """The next ``count`` tracker calls of ``kind`` ("record", "query", "wait") fail."""
        cdef sim_device* d = &deref(self.c_obj).device()
        if kind == "record":
            d.fail_next_records = count
        elif kind == "query":
            d.fail_next_queries = count
        elif kind == "wait":
            d.fail_next_waits = count
        else:
            raise ValueError(f"kind must be 'record', 'query' or 'wait', got {kind!r}")

    def hand_out_next(self, uintptr_t ptr) -> None:
        """The upstream's next allocation returns ``ptr`` (live or not)."""
        deref(self.c_obj).hand_out_next(ptr)

    def run_threads(self, unsigned threads, unsigned phases, unsigned steps,
                    uint64_t random_state=0) -> dict:
        """Real threads on this tracker (see ``sim_hazard_tracker::run_threads``), GIL
        released; what they did and the invariant violations found (``errors``)."""
        cdef thread_run r
        with nogil:
            r = deref(self.c_obj).run_threads(threads, phases, steps, random_state)
        return {
            "allocations": r.allocations, "frees": r.frees, "handed_over": r.handed_over,
            "busy_frees": r.busy_frees, "foreign": r.foreign, "checks": r.checks,
            "errors": [e.decode() for e in r.errors],
        }

    @property
    def fences_in_use(self) -> int:
        return deref(self.c_obj).device().fences_in_use

    @property
    def fence_counts(self) -> tuple:
        """(acquired, released) over the device's life (the tracker's and the test's)."""
        cdef sim_device* d = &deref(self.c_obj).device()
        return (d.fences_acquired, d.fences_released)

    @property
    def hazards(self) -> list:
        """Hazard field tuples (see ``hazard_fields``), oldest first."""
        return [hazard_fields(h) for h in deref(self.c_obj).core().hazards()]

    @property
    def outstanding(self) -> list:
        return [allocation_fields(a) for a in deref(self.c_obj).core().outstanding()]

    @property
    def upstream_calls(self) -> tuple:
        """(allocations, deallocations, deallocations of blocks it never handed out)."""
        cdef sim_upstream_state* u = &deref(self.c_obj).upstream()
        return (u.allocations, u.deallocations, u.bad_deallocations)

    @property
    def annotations(self) -> int:
        """NVTX regions registered and not unregistered."""
        return deref(self.c_obj).annotations()

    @property
    def pending_checks(self) -> int:
        return deref(self.c_obj).core().pending_checks()

    @property
    def stats(self) -> dict:
        return deref(self.c_obj).core().stats()


cdef extern from "rmm_fences_testing/host_torch.hpp" namespace "rmm_fences::testing":
    cdef cppclass torch_event:
        string kind
        uint64_t a
        uint64_t b
        uint64_t c

    cdef cppclass torch_log:
        int fail_acquire
        int fail_record
        int fail_wait
        int fail_sync
        int64_t live_fences
        uint64_t waits_ok
        uint64_t syncs_ok
        uint64_t unsafe_frees

    cdef cppclass torch_core_type "rmm_fences::mr::detail::torch_allocator_core<rmm_fences::testing::torch_host_platform, rmm_fences::testing::torch_host_upstream>":  # noqa: E501 (a C++ name)
        torch_allocator_stats stats() except +
        void reset_peak()
        size_t live_count() except +

    cdef cppclass torch_host_upstream:
        size_t used() except +
        uint64_t bad_frees() except +

    cdef struct torch_thread_result:
        uint64_t allocations
        uint64_t frees
        uint64_t records
        uint64_t unknown_records
        uint64_t ooms
        uint64_t unsafe_frees
        uint64_t upstream_bad_frees
        uint64_t upstream_used
        uint64_t waits_ok
        uint64_t syncs_ok
        int64_t live_fences
        uint64_t live_count

    cdef cppclass host_torch_allocator:
        host_torch_allocator(size_t) except +
        void* allocate(uintptr_t, size_t) except +MemoryError
        void* try_allocate(uintptr_t, size_t) except +
        bool record_stream(void*, uintptr_t) except +
        void deallocate(void*, size_t, uintptr_t) except +
        torch_thread_result run_threads(int, int, uint64_t) nogil except +
        vector[torch_event] events() except +
        void clear_events() except +
        torch_core_type& core()
        torch_log& log()
        torch_host_upstream& upstream()


#: The arguments each logged event kind carries.
_TORCH_EVENT_ARITY = {
    "acquire": 1, "release": 1, "record": 2, "record_failed": 2, "wait": 2, "wait_failed": 2,
    "sync": 1, "sync_failed": 1, "alloc": 3, "free": 3,
}


cdef class HostTorchAllocator:
    """The PyTorch allocator's core over host memory, with a logging platform.

    Streams are handles (ints). Every platform and upstream call is logged in order
    (:attr:`events`): ``("acquire", fence)``, ``("record", fence, stream)``, ``("wait", waiter,
    fence)``, ``("release", fence)``, ``("sync", stream)``, their ``*_failed`` forms, ``("alloc",
    ptr, stream, nbytes)`` and ``("free", ptr, stream, nbytes)``. The upstream counts an unsafe
    free when a stream that used the block was not ordered before its release.
    """

    cdef unique_ptr[host_torch_allocator] c_obj

    def __cinit__(self, size_t upstream_limit=1 << 40):
        self.c_obj.reset(new host_torch_allocator(upstream_limit))

    def allocate(self, size_t nbytes, uintptr_t stream=1) -> int:
        """Raises MemoryError when the upstream's limit is reached (its out_of_memory)."""
        return <uintptr_t>deref(self.c_obj).allocate(stream, nbytes)

    def try_allocate(self, size_t nbytes, uintptr_t stream=1) -> int:
        """The MemPool route's allocation: 0 when the upstream's limit is reached."""
        return <uintptr_t>deref(self.c_obj).try_allocate(stream, nbytes)

    def record_stream(self, uintptr_t ptr, uintptr_t stream) -> bool:
        """``Tensor.record_stream``; returns whether ``ptr`` is a live block."""
        return deref(self.c_obj).record_stream(<void*>ptr, stream)

    def deallocate(self, uintptr_t ptr, size_t nbytes, uintptr_t stream=1) -> None:
        """PyTorch's free (noexcept: a bad free is counted and printed on stderr)."""
        deref(self.c_obj).deallocate(<void*>ptr, nbytes, stream)

    def fail_next(self, str kind, int count=1) -> None:
        """The next ``count`` calls of ``kind`` fail: acquire, record, wait or sync."""
        cdef torch_log* log = &deref(self.c_obj).log()
        if kind == "acquire":
            log.fail_acquire = count
        elif kind == "record":
            log.fail_record = count
        elif kind == "wait":
            log.fail_wait = count
        elif kind == "sync":
            log.fail_sync = count
        else:
            raise ValueError(f"kind must be 'acquire', 'record', 'wait' or 'sync', got {kind!r}")

    @property
    def events(self) -> list:
        out = []
        for e in deref(self.c_obj).events():
            kind = e.kind.decode("ascii")
            out.append((kind, e.a, e.b, e.c)[: 1 + _TORCH_EVENT_ARITY[kind]])
        return out

    def clear_events(self) -> None:
        deref(self.c_obj).clear_events()

    @property
    def stats(self) -> dict:
        return deref(self.c_obj).core().stats()

    def reset_peak(self) -> None:
        deref(self.c_obj).core().reset_peak()

    @property
    def live_count(self) -> int:
        return deref(self.c_obj).core().live_count()

    @property
    def live_fences(self) -> int:
        """Fences acquired and not released."""
        return deref(self.c_obj).log().live_fences

    @property
    def unsafe_frees(self) -> int:
        return deref(self.c_obj).log().unsafe_frees

    @property
    def upstream_used(self) -> int:
        return deref(self.c_obj).upstream().used()

    @property
    def upstream_bad_frees(self) -> int:
        return deref(self.c_obj).upstream().bad_frees()

    def run_threads(self, int workers=4, int iterations=2000, uint64_t random_state=1) -> dict:
        """Real threads racing allocations, record_stream and frees under faults (the C++)."""
        cdef torch_thread_result r
        with nogil:
            r = deref(self.c_obj).run_threads(workers, iterations, random_state)
        return r  # the struct's fields, by name


cdef extern from "rmm_fences_testing/host_replay.hpp" namespace "rmm_fences::testing":
    cdef cppclass replay_call "rmm_fences::testing::recording_host_resource::call":
        uint64_t seq
        bool is_free
        uintptr_t ptr
        size_t size
        uintptr_t stream

    cdef cppclass host_replay_run:
        replay_result result
        vector[replay_call] calls
        uint64_t thread_starts

    cdef cppclass host_replay_options:
        size_t fail_size
        size_t slow_size
        uint64_t slow_us
        size_t pool_chunk_bytes
        size_t pool_initial_bytes
        bool measure_footprint
        size_t spike_bytes
        bool ordered

    host_replay_run c_host_replay "rmm_fences::testing::host_replay"(
        const vector[uint32_t]&, const vector[uint8_t]&, const vector[uint64_t]&,
        const vector[uint64_t]&, const vector[uint32_t]&, size_t, const vector[uintptr_t]&,
        uint64_t, const host_replay_options&) nogil except +


def host_replay(trace, streams=None, uint64_t repeat=1, size_t fail_size=0,
                size_t slow_size=0, uint64_t slow_us=0, *, size_t pool_chunk_bytes=0,
                size_t pool_initial_bytes=0, bint measure_footprint=False,
                size_t spike_bytes=0, ordered=False) -> dict:
    """Replays ``trace`` (an ``rmm_fences_bench.Trace``) with the engine of
    ``rmm_fences_bench.replay`` (one real thread per recorded thread) on a malloc-backed host
    resource that records its calls and counts the bytes it holds. ``streams``: the handle of
    each recorded stream (default: 100 + index). Allocations of ``fail_size`` bytes throw;
    allocations of ``slow_size`` bytes sleep ``slow_us`` first.

    ``pool_chunk_bytes`` > 0: the replay runs on a host pool over that resource, which takes
    chunks of that size (or of the request, if larger) and keeps freed blocks for requests of
    their size (``pool_initial_bytes``: a chunk made before the replay). ``measure_footprint``:
    the replay's footprint meter counts the bytes the recording resource holds.
    ``spike_bytes``: allocated and freed on the recording resource before the replay (and
    before the pool's initial chunk), a peak the footprint must leave out. ``ordered``: every
    event in the trace's recorded order, as ``rmm_fences_bench.replay(..., ordered=True)``.

    Returns the engine's counters and ``calls``: ``(seq, "allocate" | "free", ptr, size,
    stream)`` in call order (with a pool: its chunks); ``thread_starts``: how often the
    per-thread set-up ran.
    """
    if ordered is not True and ordered is not False:
        raise TypeError(f"ordered must be a bool, got {type(ordered).__name__}")
    cdef vector[uint32_t] thread = trace.thread.tolist()
    cdef vector[uint8_t] is_free = trace.action.tolist()
    cdef vector[uint64_t] ids = trace.id.tolist()
    cdef vector[uint64_t] sizes = trace.size.tolist()
    cdef vector[uint32_t] stream = trace.stream.tolist()
    cdef size_t threads = trace.threads
    if streams is None:
        streams = [100 + k for k in range(trace.streams)]
    cdef vector[uintptr_t] handles = streams
    cdef host_replay_options options
    options.fail_size = fail_size
    options.slow_size = slow_size
    options.slow_us = slow_us
    options.pool_chunk_bytes = pool_chunk_bytes
    options.pool_initial_bytes = pool_initial_bytes
    options.measure_footprint = measure_footprint
    options.spike_bytes = spike_bytes
    options.ordered = ordered
    cdef host_replay_run run
    with nogil:
        run = c_host_replay(thread, is_free, ids, sizes, stream, threads, handles, repeat,
                            options)
    cdef dict out = run.result  # the engine's result struct, by field name
    out["thread_starts"] = run.thread_starts
    out["calls"] = [(c.seq, "free" if c.is_free else "allocate", c.ptr, c.size, c.stream)
                    for c in run.calls]
    return out
