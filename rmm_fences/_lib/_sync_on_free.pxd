# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""Declarations shared by the SyncOnFree bindings (GPU resource and host test harness)."""

from libc.stddef cimport size_t
from libc.stdint cimport uint64_t


cdef extern from "rmm_fences/detail/sync_on_free_core.hpp" namespace "rmm_fences::mr" nogil:
    cdef enum class sync_mode(int):
        device
        stream
        deferred

    cdef struct sync_on_free_stats:
        uint64_t syncs
        uint64_t deferred
        uint64_t released
        uint64_t oom_retries
        uint64_t parked
        uint64_t peak_pending_bytes
        uint64_t failed_syncs
        uint64_t rejected_frees

    cdef enum class free_check(int):
        ok
        untracked
        unknown
        pending
        size_mismatch

    cdef struct free_result:
        free_check check
        size_t allocated_bytes


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


cdef inline dict stats_dict(sync_on_free_stats s):
    return {
        "syncs": s.syncs,
        "deferred": s.deferred,
        "released": s.released,
        "oom_retries": s.oom_retries,
        "parked": s.parked,
        "peak_pending_bytes": s.peak_pending_bytes,
        "failed_syncs": s.failed_syncs,
        "rejected_frees": s.rejected_frees,
    }


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
