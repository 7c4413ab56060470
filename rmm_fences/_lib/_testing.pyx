# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""The policy cores on host memory with hand-signalled fences (tests only).

Runs the very C++ cores that the resources run on the GPU, with manual fences (or a simulated
device) in place of CUDA events and host allocators in place of the upstream. Needs no GPU.
"""

from cython.operator cimport dereference as deref
from libc.stddef cimport size_t
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libcpp cimport bool
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.set cimport set as cpp_set
from libcpp.string cimport string
from libcpp.vector cimport vector


from rmm_fences._lib._pool cimport pool_stats_dict, stream_ordered_pool_stats
from rmm_fences._lib._tracking cimport (
    allocation_fields,
    allocation_record,
    hazard_fields,
    hazard_record,
    hazard_tracker_stats,
    tracker_stats_dict,
)
from rmm_fences._lib._sync_on_free cimport (
    mode_from_name,
    stats_dict,
    sync_mode,
    sync_on_free_stats,
)


cdef extern from "rmm_fences/testing/host_sync_on_free.hpp" namespace "rmm_fences::testing":
    cdef cppclass fence_entry "rmm_fences::testing::fence_board::fence":
        uintptr_t stream
        bool recorded
        bool signalled

    cdef cppclass fence_board:
        vector[fence_entry] fences
        cpp_set[uintptr_t] capturing
        uint64_t forced_waits
        bool fail_next_record
        void signal(size_t) except +
        void signal_stream(uintptr_t)
        void signal_all()

    cdef cppclass release_record "rmm_fences::testing::host_upstream::release_record":
        uintptr_t ptr
        size_t bytes
        uintptr_t stream
        bool fence_signalled

    cdef cppclass host_upstream:
        vector[release_record] releases
        size_t used()

    cdef cppclass core_type "rmm_fences::detail::sync_on_free_core<rmm_fences::testing::host_platform, rmm_fences::testing::host_upstream>":
        size_t pending_bytes() except +
        size_t pending_count() except +
        sync_on_free_stats stats() except +

    cdef cppclass host_sync_on_free:
        host_sync_on_free(sync_mode, optional[size_t], size_t) except +
        void* allocate(uintptr_t, size_t, size_t) except +MemoryError
        int64_t deallocate(uintptr_t, void*, size_t, size_t) except +
        size_t flush() except +
        core_type& core()
        fence_board& board()
        host_upstream& upstream()


cdef class HostSyncOnFree:
    """SyncOnFree's core over host memory; fences are signalled by the test."""

    cdef unique_ptr[host_sync_on_free] c_obj

    def __cinit__(self, mode="deferred", max_pending_bytes=None, size_t upstream_limit=1 << 40):
        cdef optional[size_t] cap
        if max_pending_bytes is not None:
            cap = <size_t>max_pending_bytes
        self.c_obj.reset(new host_sync_on_free(mode_from_name(mode), cap, upstream_limit))

    def allocate(self, size_t nbytes, uintptr_t stream=0, size_t alignment=256) -> int:
        return <uintptr_t>deref(self.c_obj).allocate(stream, nbytes, alignment)

    def deallocate(self, uintptr_t ptr, size_t nbytes, uintptr_t stream=0, size_t alignment=256):
        """Free; returns the id of the fence the block waits for, or None."""
        cdef int64_t fence = deref(self.c_obj).deallocate(stream, <void*>ptr, nbytes, alignment)
        return None if fence < 0 else fence

    def flush(self) -> int:
        return deref(self.c_obj).flush()

    def signal(self, size_t fence) -> None:
        """Signal `fence` and, as a stream completes in order, every earlier one of its stream."""
        deref(self.c_obj).board().signal(fence)

    def signal_stream(self, uintptr_t stream) -> None:
        deref(self.c_obj).board().signal_stream(stream)

    def begin_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).board().capturing.insert(stream)

    def end_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).board().capturing.erase(stream)

    def fail_next_record(self) -> None:
        deref(self.c_obj).board().fail_next_record = True

    def clear_fail_next_record(self) -> None:
        deref(self.c_obj).board().fail_next_record = False

    def fence(self, size_t fence) -> dict:
        cdef fence_entry f = deref(self.c_obj).board().fences.at(fence)
        return {"stream": f.stream, "recorded": f.recorded, "signalled": f.signalled}

    @property
    def fence_count(self) -> int:
        return deref(self.c_obj).board().fences.size()

    @property
    def forced_waits(self) -> int:
        return deref(self.c_obj).board().forced_waits

    @property
    def releases(self) -> list:
        """Blocks the upstream got back, in order: (ptr, nbytes, stream, fence_signalled)."""
        return [
            (r.ptr, r.bytes, r.stream, r.fence_signalled)
            for r in deref(self.c_obj).upstream().releases
        ]

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
    def stats(self) -> dict:
        return stats_dict(deref(self.c_obj).core().stats())


cdef extern from "rmm_fences/testing/host_pool.hpp" namespace "rmm_fences::testing":
    cdef cppclass wait_record "std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>":
        pass

    cdef cppclass pool_log:
        uint64_t now()
        uint64_t records

    cdef cppclass pool_core_type "rmm_fences::detail::stream_ordered_pool_core<rmm_fences::testing::host_pool_platform, rmm_fences::testing::host_chunk_upstream>":
        stream_ordered_pool_stats stats()
        size_t pool_size()

    cdef cppclass host_pool:
        host_pool(size_t, optional[size_t], size_t) except +
        void* allocate(uint64_t, size_t, size_t) except +
        int deallocate(uint64_t, void*, size_t, size_t*) except +
        void deallocate_unchecked(uint64_t, void*, size_t) except +
        void retire(uint64_t) except +
        size_t release() except +
        void begin_capture(uint64_t, uint64_t) except +
        void end_capture(uint64_t) except +
        void alias(uint64_t, uint64_t) except +
        void mark_foreign(uint64_t) except +
        void fail_next(int, int) except +
        void free_inside_next_sync(uint64_t, void*, size_t) except +
        uint64_t hook_free_clock()
        size_t run_threads(int, int, uint64_t) nogil except +
        vector[string] violations() except +
        pool_core_type& core()
        pool_log& log()


cdef extern from *:
    """
    #include <rmm_fences/testing/host_pool.hpp>
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


_POOL_FAULTS = {"record": 0, "stream_wait": 1, "sync_device": 2, "sync_stream": 3}


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
                  size_t upstream_limit=1 << 40):
        cdef optional[size_t] cap
        if maximum_pool_size is not None:
            cap = <size_t>maximum_pool_size
        self.c_obj.reset(new host_pool(initial_pool_size, cap, upstream_limit))
        self._next_capture_id = 1

    def allocate(self, size_t nbytes, uint64_t stream=0, size_t alignment=256) -> int:
        return <uintptr_t>deref(self.c_obj).allocate(stream, nbytes, alignment)

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

    def begin_capture(self, uint64_t stream, capture_id=None) -> int:
        """Start capturing ``stream``; streams forked into one capture share ``capture_id``
        (a new one by default). Returns the capture id."""
        cdef uint64_t cid
        if capture_id is None:
            cid = self._next_capture_id
            self._next_capture_id += 1
        else:
            cid = capture_id
        deref(self.c_obj).begin_capture(stream, cid)
        return cid

    def end_capture(self, uint64_t stream) -> None:
        deref(self.c_obj).end_capture(stream)

    def alias_stream(self, uint64_t stream, uint64_t identity) -> None:
        """From now on ``stream`` reports ``identity`` (two streams, one identity)."""
        deref(self.c_obj).alias(stream, identity)

    def mark_foreign_stream(self, uint64_t stream) -> None:
        """``stream`` belongs to another device from now on."""
        deref(self.c_obj).mark_foreign(stream)

    def fail_next(self, kind, int count=1) -> None:
        """The next ``count`` calls of ``kind`` fail: one of ``record``, ``stream_wait``,
        ``sync_device``, ``sync_stream``."""
        if kind not in _POOL_FAULTS:
            raise ValueError(f"kind must be one of {sorted(_POOL_FAULTS)}, got {kind!r}")
        deref(self.c_obj).fail_next(_POOL_FAULTS[kind], count)

    def free_inside_next_sync(self, uintptr_t ptr, size_t nbytes, uint64_t stream) -> None:
        """Inside the next device sync (after its synchronization point), "another thread"
        frees ``ptr`` on ``stream``."""
        deref(self.c_obj).free_inside_next_sync(stream, <void*>ptr, nbytes)

    @property
    def hook_free_clock(self) -> int:
        return deref(self.c_obj).hook_free_clock()

    def run_threads(self, int threads, int iterations, uint64_t seed=0) -> int:
        """Real threads on their own streams (see host_pool::run_threads), without the GIL;
        returns how many allocations ran out of memory."""
        cdef size_t n
        with nogil:
            n = deref(self.c_obj).run_threads(threads, iterations, seed)
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
    def stats(self) -> dict:
        return pool_stats_dict(deref(self.c_obj).core().stats())


cdef extern from "rmm_fences/testing/host_tracker.hpp" namespace "rmm_fences::testing":
    cdef cppclass sim_device:
        cpp_set[uintptr_t] capturing
        size_t fences_in_use
        void launch(uintptr_t) except +
        bool idle(uintptr_t) except +
        bool step(uintptr_t) except +
        size_t acquire() except +
        void release(size_t) except +
        void record(size_t, uintptr_t) except +
        bool ready(size_t) except +
        void wait(uintptr_t, size_t) except +

    cdef cppclass sim_upstream_state "rmm_fences::testing::sim_upstream::state":
        uint64_t allocations
        uint64_t deallocations
        uint64_t bad_deallocations

    cdef cppclass sim_tracker_core:
        void* allocate(uintptr_t, size_t, size_t, hazard_record*) except +
        bool deallocate(uintptr_t, void*, size_t, size_t, hazard_record*) except +
        bool record_stream(void*, uintptr_t) except +
        void poll() except +
        vector[allocation_record] outstanding() except +
        vector[hazard_record] hazards() except +
        void reset() except +
        hazard_tracker_stats stats() except +
        size_t pending_checks() except +

    cdef cppclass sim_hazard_tracker:
        sim_hazard_tracker(bool) except +
        sim_device& device()
        sim_tracker_core& core()
        const sim_upstream_state& upstream()
        int64_t annotations()


cdef class SimHazardTracker:
    """The hazard tracker's core on a simulated device.

    Streams are integers; ``launch(s)`` queues work on ``s`` that ``step(s)`` completes in
    order. The upstream is a naive cache (``stream_ordered=False``: a freed block goes to the
    next request of its size on any stream) or reuses blocks only on the freeing stream.
    """

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

    def launch(self, uintptr_t stream) -> None:
        deref(self.c_obj).device().launch(stream)

    def step(self, uintptr_t stream) -> bool:
        return deref(self.c_obj).device().step(stream)

    def idle(self, uintptr_t stream) -> bool:
        return deref(self.c_obj).device().idle(stream)

    def order(self, uintptr_t waiter, uintptr_t source) -> None:
        """What a user does to order ``waiter`` after ``source``: record and wait on a fence."""
        cdef sim_device* d = &deref(self.c_obj).device()
        cdef size_t f = d.acquire()
        d.record(f, source)
        d.wait(waiter, f)
        d.release(f)

    def mark(self, uintptr_t stream) -> int:
        """A model fence recorded on ``stream`` now (for the test's own bookkeeping)."""
        cdef sim_device* d = &deref(self.c_obj).device()
        cdef size_t f = d.acquire()
        d.record(f, stream)
        return f

    def done(self, size_t fence) -> bool:
        return deref(self.c_obj).device().ready(fence)

    def forget(self, size_t fence) -> None:
        deref(self.c_obj).device().release(fence)

    def begin_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).device().capturing.insert(stream)

    def end_capture(self, uintptr_t stream) -> None:
        deref(self.c_obj).device().capturing.erase(stream)

    @property
    def fences_in_use(self) -> int:
        return deref(self.c_obj).device().fences_in_use

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
        cdef const sim_upstream_state* u = &deref(self.c_obj).upstream()
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
        return tracker_stats_dict(deref(self.c_obj).core().stats())
