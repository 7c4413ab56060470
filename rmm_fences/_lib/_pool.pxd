# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""Declarations shared by the stream-ordered pool bindings (GPU resource, host harness)."""

from libc.stdint cimport uint64_t


cdef extern from "rmm_fences/detail/stream_ordered_pool_core.hpp" namespace "rmm_fences::mr":
    cdef cppclass stream_ordered_pool_stats:
        uint64_t current_bytes
        uint64_t peak_bytes
        uint64_t pool_bytes
        uint64_t same_stream_reuse
        uint64_t cross_stream_reuse
        uint64_t upstream_growths
        uint64_t fences
        uint64_t stream_waits
        uint64_t reclaim_syncs
        uint64_t retired_streams
        uint64_t rejected_frees


cdef inline dict pool_stats_dict(stream_ordered_pool_stats s):
    return {
        "current_bytes": s.current_bytes,
        "peak_bytes": s.peak_bytes,
        "pool_bytes": s.pool_bytes,
        "same_stream_reuse": s.same_stream_reuse,
        "cross_stream_reuse": s.cross_stream_reuse,
        "upstream_growths": s.upstream_growths,
        "fences": s.fences,
        "stream_waits": s.stream_waits,
        "reclaim_syncs": s.reclaim_syncs,
        "retired_streams": s.retired_streams,
        "rejected_frees": s.rejected_frees,
    }
