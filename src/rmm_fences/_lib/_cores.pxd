# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""The public enums and structs of the resources (rmm_fences/mr/*.hpp, ``rmm_fences::mr``:
host-only headers, no CUDA, no rmm, shared with the policy cores), and the small conversions of
their records to Python.

Shared by the resources (memory_resource.pxd cimports them) and by the host test harness
(tests/native), which runs the same cores without CUDA and so cannot cimport
memory_resource.pxd: Cython includes every header named in a cimported .pxd.

The ``cdef struct`` counters convert to a ``dict`` (field order) when returned to Python.
"""

from libc.stddef cimport size_t
from libc.stdint cimport uint64_t, uintptr_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr
from libcpp.optional cimport optional
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef extern from "rmm_fences/mr/sync_mode.hpp" namespace "rmm_fences::mr" nogil:
    cdef enum class sync_mode(int):
        device
        stream
        deferred

    const size_t default_max_batch_frees
    const size_t default_max_batch_bytes


cdef extern from "rmm_fences/mr/free_result.hpp" namespace "rmm_fences::mr" nogil:
    cdef enum class free_check(int):
        ok
        untracked
        unknown
        pending
        size_mismatch
        foreign_stream

    cdef struct free_result:
        free_check check
        size_t allocated_bytes


cdef extern from "rmm_fences/detail/stack_trace.hpp" namespace "rmm_fences::mr::detail" nogil:
    cdef cppclass stack_trace:
        string to_string() except +


cdef extern from "rmm_fences/mr/stats.hpp" namespace "rmm_fences::mr" nogil:
    cdef struct sync_on_free_stats:
        uint64_t syncs
        uint64_t deferred
        uint64_t released
        uint64_t oom_retries
        uint64_t parked
        uint64_t peak_pending_bytes
        uint64_t failed_syncs
        uint64_t rejected_frees
        uint64_t fences
        uint64_t same_stream_reuse

    cdef struct stream_ordered_pool_stats:
        uint64_t current_bytes
        uint64_t peak_bytes
        uint64_t pool_bytes
        uint64_t physical_bytes
        uint64_t peak_physical_bytes
        uint64_t remapped_bytes
        uint64_t remap_ns
        uint64_t same_stream_reuse
        uint64_t cross_stream_reuse
        uint64_t upstream_growths
        uint64_t fences
        uint64_t stream_waits
        uint64_t reclaim_syncs
        uint64_t retired_streams
        uint64_t rejected_frees
        uint64_t stream_slots
        uint64_t fence_events
        uint64_t graph_bytes
        uint64_t orphan_bytes

    cdef struct hazard_tracker_stats:
        uint64_t allocations
        uint64_t deallocations
        uint64_t rejected_frees
        uint64_t fences
        uint64_t stream_waits
        uint64_t unchecked
        uint64_t hazards
        size_t allocated_bytes
        size_t peak_bytes

    cdef struct torch_allocator_stats:
        uint64_t allocations
        uint64_t frees
        uint64_t current_allocations
        uint64_t peak_allocations
        uint64_t allocated_bytes
        uint64_t freed_bytes
        uint64_t current_bytes
        uint64_t peak_bytes
        uint64_t num_ooms
        uint64_t record_stream_calls
        uint64_t recorded_frees
        uint64_t stream_waits
        uint64_t stream_syncs
        uint64_t leaked_blocks
        uint64_t leaked_bytes
        uint64_t rejected_frees
        uint64_t unknown_record_streams


cdef extern from "rmm_fences/mr/hazards.hpp" namespace "rmm_fences::mr" nogil:
    # the kinds are named by hazard_kind_name (see hazard_kind_names), not listed here
    cdef enum class hazard_kind(int):
        pass

    const char* hazard_kind_name(hazard_kind kind) noexcept

    cdef cppclass hazard_record:
        hazard_kind kind
        uintptr_t ptr
        size_t size
        size_t tracked_size
        uintptr_t stream
        vector[uintptr_t] streams
        shared_ptr[const stack_trace] stack
        shared_ptr[const stack_trace] allocation_stack
        uint64_t serial
        bool raised

    cdef cppclass allocation_record:
        uintptr_t ptr
        size_t size
        uintptr_t stream
        vector[uintptr_t] declared
        shared_ptr[const stack_trace] stack
        uint64_t serial


cdef inline sync_mode mode_from_name(object mode) except *:
    """The C++ mode of ``mode``; ValueError naming the valid modes otherwise."""
    if isinstance(mode, str):
        if mode == "device":
            return sync_mode.device
        if mode == "stream":
            return sync_mode.stream
        if mode == "deferred":
            return sync_mode.deferred
    raise ValueError(f"mode must be one of 'device', 'stream', 'deferred'; got {mode!r}")


cdef inline size_t batch_frees_from(object max_batch_frees) except? 0:
    """``max_batch_frees`` checked: an int of at least 1 (TypeError, ValueError otherwise)."""
    # (bool is C++'s bool here: True and False are refused by identity)
    if max_batch_frees is True or max_batch_frees is False or not isinstance(max_batch_frees, int):
        raise TypeError(
            f"max_batch_frees must be an int, got {type(max_batch_frees).__name__}")
    if max_batch_frees < 1:
        raise ValueError(f"max_batch_frees must be at least 1, got {max_batch_frees}")
    return <size_t>max_batch_frees


cdef inline optional[size_t] batch_bytes_from(object max_batch_bytes) except *:
    """``max_batch_bytes`` checked: None (no byte limit), or a positive int or size string."""
    cdef optional[size_t] out
    if max_batch_bytes is None:
        return out
    from rmm_fences._sizes import parse_bytes
    nbytes = parse_bytes(max_batch_bytes, "max_batch_bytes")
    if nbytes == 0:
        raise ValueError("max_batch_bytes must be positive or None (no byte limit), got 0")
    out = <size_t>nbytes
    return out


cdef inline str free_problem(free_result r, size_t ptr, size_t nbytes):
    """The problem of a rejected free, for a ValueError; None when the free was accepted."""
    if r.check == free_check.pending:
        return (f"double free of ptr={ptr:#x} (nbytes={nbytes}): the block was already freed "
                "and waits for its fence; nothing was freed")
    if r.check == free_check.unknown:
        return (f"ptr={ptr:#x} (nbytes={nbytes}) is not a live block of this adaptor: a double "
                "free (already returned upstream) or a pointer it did not allocate; nothing "
                "was freed")
    if r.check == free_check.size_mismatch:
        return (f"nbytes={nbytes} does not match the size of ptr={ptr:#x}, allocated with "
                f"nbytes={r.allocated_bytes}; nothing was freed")
    return None


cdef inline str _stack_text(shared_ptr[const stack_trace] stack):
    if not stack:
        return None
    return stack.get().to_string().decode("utf-8", "replace")


cdef inline tuple hazard_kind_names():
    """The names of the C++ ``hazard_kind`` values, in order (``_hazards.HAZARD_KINDS``)."""
    names = []
    cdef const char* name = hazard_kind_name(<hazard_kind>0)
    while name != NULL:
        names.append(name.decode("ascii"))
        name = hazard_kind_name(<hazard_kind>len(names))
    return tuple(names)


cdef inline tuple hazard_fields(const hazard_record& h):
    """(kind, ptr, size, tracked_size, stream, streams, stack, allocation_stack, serial, raised)."""
    return (
        hazard_kind_name(h.kind).decode("ascii"), h.ptr, h.size, h.tracked_size, h.stream,
        tuple(h.streams), _stack_text(h.stack), _stack_text(h.allocation_stack), h.serial, h.raised,
    )


cdef inline tuple allocation_fields(const allocation_record& a):
    """(ptr, size, stream, declared streams, stack)."""
    return (a.ptr, a.size, a.stream, tuple(a.declared), _stack_text(a.stack))
