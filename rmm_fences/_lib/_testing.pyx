# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""The SyncOnFree policy core on host memory with hand-signalled fences (tests only).

Runs the very C++ core that ``SyncOnFreeResourceAdaptor`` runs on the GPU, with a
``fence_board`` in place of CUDA events and a byte-limited host allocator in place of the
upstream. Needs no GPU.
"""

from cython.operator cimport dereference as deref
from libc.stddef cimport size_t
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libcpp cimport bool
from libcpp.memory cimport unique_ptr
from libcpp.optional cimport optional
from libcpp.set cimport set as cpp_set
from libcpp.vector cimport vector


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
