/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The counters of the resources (`stats()`).
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace rmm_fences::mr {

/// Counters of a `sync_on_free_resource_adaptor` (monotonic, except the peak).
struct sync_on_free_stats {
  std::uint64_t syncs{};               ///< host waits that succeeded (syncs, fence waits)
  std::uint64_t deferred{};            ///< frees listed to wait for a fence, returned at once
  std::uint64_t released{};            ///< listed blocks handed to the upstream
  std::uint64_t oom_retries{};         ///< allocations retried after draining pending blocks
  std::uint64_t parked{};              ///< frees listed without a fence (capture, no fence)
  std::uint64_t peak_pending_bytes{};  ///< largest pending total seen (after the cap applied)
  std::uint64_t failed_syncs{};        ///< syncs and fence waits that failed (nothing released)
  std::uint64_t rejected_frees{};      ///< double frees, foreign pointers, size mismatches
  std::uint64_t fences{};  ///< fences recorded (one per batch of frees on a stream, at most)
  /// Allocations served by a block freed lately on their own stream (deferred mode): the
  /// stream orders its new work after the old, so neither a fence nor the upstream is needed.
  std::uint64_t same_stream_reuse{};
};

/// Counters of a `stream_ordered_pool_memory_resource`.
struct stream_ordered_pool_stats {
  std::uint64_t current_bytes{};  ///< bytes allocated to users now
  std::uint64_t peak_bytes{};     ///< most bytes allocated to users at once
  std::uint64_t pool_bytes{};     ///< bytes held from the upstream (or mapped: device pages)
  /// Bytes of device memory held: `pool_bytes`, and over the device's pages the spare pages
  /// too (unmapped, kept for the next growth until `release`).
  std::uint64_t physical_bytes{};
  std::uint64_t peak_physical_bytes{};  ///< the most `physical_bytes` held at once
  /// Over the device's pages: bytes of free pages unmapped to be mapped where the pool grew
  /// (instead of holding more), and the time those moves took, in nanoseconds.
  std::uint64_t remapped_bytes{};
  std::uint64_t remap_ns{};
  std::uint64_t same_stream_reuse{};   ///< allocations served from the stream's own frees
  std::uint64_t cross_stream_reuse{};  ///< allocations that waited on another stream's fence
  std::uint64_t upstream_growths{};    ///< chunks taken from the upstream
  std::uint64_t fences{};              ///< fences recorded (one per batch of cached frees)
  std::uint64_t stream_waits{};        ///< stream-to-fence waits enqueued (no host sync)
  std::uint64_t reclaim_syncs{};       ///< reclaims after `synchronize_and_reclaim` (never its own)
  std::uint64_t retired_streams{};     ///< streams retired through `retire_stream`
  std::uint64_t rejected_frees{};      ///< frees refused (double, foreign, wrong size)
  /// Per-stream slots held now: one per stream identity in use, each with its cache and
  /// fence. Slots unused since the last sweep (streams that went away) are retired once 64 or
  /// more are held, so this stays bounded however many streams come and go.
  std::uint64_t stream_slots{};
  /// Events held as fences: one per slot that fenced, plus those of retired slots whose
  /// fences still guard shared blocks (dropped once a query finds them complete).
  std::uint64_t fence_events{};
  /// Free bytes held for graphs that may still replay: what streams freed while captured,
  /// until the graph and every executable graph of it are destroyed.
  std::uint64_t graph_bytes{};
  /// Free bytes of streams that went away (their slots retired idle) whose last frees no
  /// event covers: only `synchronize_and_reclaim` frees them.
  std::uint64_t orphan_bytes{};
};

/// Counters of the tracker.
struct hazard_tracker_stats {
  std::uint64_t allocations{};
  std::uint64_t deallocations{};   ///< frees that reached the upstream
  std::uint64_t rejected_frees{};  ///< bad frees kept from the upstream
  std::uint64_t fences{};          ///< fences recorded
  std::uint64_t stream_waits{};    ///< device-side waits for declared streams
  /// Checks that could not be made: a stream being captured, a failed event record, query or
  /// stream wait, a stream the freeing thread cannot name (another thread's per-thread default
  /// stream), a watched range dropped at the cap, no fence to be had.
  std::uint64_t unchecked{};
  std::uint64_t hazards{};  ///< hazards observed (including dropped ones)
  std::size_t allocated_bytes{};
  std::size_t peak_bytes{};
};

/// Counters of the PyTorch allocator core (`rmm_fences.allocators.torch`): monotonic, except
/// `current_*` and the peaks (reset by `reset_peak`).
struct torch_allocator_stats {
  std::uint64_t allocations{};             ///< blocks handed to PyTorch
  std::uint64_t frees{};                   ///< blocks PyTorch gave back (accepted frees)
  std::uint64_t current_allocations{};     ///< blocks PyTorch holds now
  std::uint64_t peak_allocations{};        ///< most blocks held at once
  std::uint64_t allocated_bytes{};         ///< bytes of every block handed out
  std::uint64_t freed_bytes{};             ///< bytes of every accepted free
  std::uint64_t current_bytes{};           ///< bytes PyTorch holds now
  std::uint64_t peak_bytes{};              ///< most bytes held at once
  std::uint64_t num_ooms{};                ///< allocations the upstream refused (out of memory)
  std::uint64_t record_stream_calls{};     ///< `record_stream` calls on a live block
  std::uint64_t recorded_frees{};          ///< frees of a block recorded on another stream
  std::uint64_t stream_waits{};            ///< allocation stream waits on a recorded stream
  std::uint64_t stream_syncs{};            ///< host syncs of a recorded stream (wait failed)
  std::uint64_t leaked_blocks{};           ///< blocks kept from the upstream (no safe order)
  std::uint64_t leaked_bytes{};            ///< their bytes
  std::uint64_t rejected_frees{};          ///< unknown pointers, double frees, size mismatches
  std::uint64_t unknown_record_streams{};  ///< `record_stream` on a pointer not live here
};

}  // namespace rmm_fences::mr
