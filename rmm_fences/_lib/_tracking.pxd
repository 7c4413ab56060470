# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""Declarations shared by the hazard tracker bindings (GPU resource, simulated device)."""

from libc.stddef cimport size_t
from libc.stdint cimport uint64_t, uintptr_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef extern from "rmm_fences/detail/hazard_tracker_core.hpp" namespace "rmm_fences::detail" nogil:
    cdef cppclass stack_trace:
        string to_string() except +

    cdef enum class hazard_kind(int):
        freed_in_flight
        reuse_before_fence
        cross_stream_free
        double_free
        foreign_free
        size_mismatch
        leak
        allocated_while_live

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

    cdef cppclass hazard_tracker_stats:
        uint64_t allocations
        uint64_t deallocations
        uint64_t rejected_frees
        uint64_t fences
        uint64_t stream_waits
        uint64_t unchecked
        uint64_t hazards
        size_t allocated_bytes
        size_t peak_bytes


cdef inline str _stack_text(shared_ptr[const stack_trace] stack):
    if not stack:
        return None
    return stack.get().to_string().decode("utf-8", "replace")


cdef inline tuple hazard_fields(const hazard_record& h):
    """(kind, ptr, size, tracked_size, stream, streams, stack, allocation_stack, serial, raised)."""
    kinds = ("freed_in_flight", "reuse_before_fence", "cross_stream_free", "double_free",
             "foreign_free", "size_mismatch", "leak", "allocated_while_live")
    return (
        kinds[<int>h.kind], h.ptr, h.size, h.tracked_size, h.stream, tuple(h.streams),
        _stack_text(h.stack), _stack_text(h.allocation_stack), h.serial, h.raised,
    )


cdef inline tuple allocation_fields(const allocation_record& a):
    """(ptr, size, stream, declared streams, stack)."""
    return (a.ptr, a.size, a.stream, tuple(a.declared), _stack_text(a.stack))


cdef inline dict tracker_stats_dict(hazard_tracker_stats s):
    return {
        "allocations": s.allocations,
        "deallocations": s.deallocations,
        "rejected_frees": s.rejected_frees,
        "fences": s.fences,
        "stream_waits": s.stream_waits,
        "unchecked": s.unchecked,
        "hazards": s.hazards,
        "allocated_bytes": s.allocated_bytes,
        "peak_bytes": s.peak_bytes,
    }
