# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
# The replay engine of rmm_fences_bench.replay (_replay.hpp, no CUDA): cimported by _loops.pyx
# and by the host test harness (tests/native), which runs it over a host resource.

from libc.stddef cimport size_t
from libc.stdint cimport uint8_t, uint32_t, uint64_t


cdef extern from "rmm_fences_bench/_replay.hpp" namespace "rmm_fences::bench::replay" nogil:
    cdef cppclass replay_trace_t "rmm_fences::bench::replay::trace":
        pass

    cdef struct replay_result "rmm_fences::bench::replay::result":
        double seconds
        uint64_t allocations
        uint64_t frees
        uint64_t errors
        uint64_t skipped_frees
        uint64_t leftovers
        uint64_t peak_live_bytes
        uint64_t trace_peak_live_bytes
        uint64_t footprint_bytes
        double fragmentation

    replay_trace_t c_make_trace "rmm_fences::bench::replay::make_trace"(
        size_t events, const uint32_t* thread, const uint8_t* is_free, const uint64_t* id,
        const uint64_t* size, const uint32_t* stream, size_t threads, size_t streams) except +
