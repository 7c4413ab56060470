/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: its totals and counts (relaxed atomics: statistics, never
 * decisions).
 */
#pragma once

#include <rmm_fences/mr/stats.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rmm_fences::mr::detail::pool {

/// Bytes a stream's allocation balance may drift before it is added to the pool's totals
/// (so streams on different threads do not contend on one counter).
inline constexpr std::int64_t accounting_batch = std::int64_t{4} << 20;

/// Bytes in use (settled balances) and their peak, and the counts of `stats()` that no other
/// part keeps.
struct pool_counters {
  /// Adds `delta` bytes in use; samples the peak.
  void add_current(std::int64_t delta) noexcept
  {
    if (delta == 0) { return; }
    auto const now = current_bytes.fetch_add(delta, std::memory_order_relaxed) + delta;
    auto peak      = peak_bytes.load(std::memory_order_relaxed);
    while (now > 0 && static_cast<std::size_t>(now) > peak &&
           !peak_bytes.compare_exchange_weak(
             peak, static_cast<std::size_t>(now), std::memory_order_relaxed)) {}
  }

  /// Counts an allocation made on a slower path straight into the totals; returns `ptr`.
  void* account(void* ptr, std::size_t size) noexcept
  {
    add_current(static_cast<std::int64_t>(size));
    return ptr;
  }

  /// Copies the counts into `s`.
  void fill(rmm_fences::mr::stream_ordered_pool_stats& s) const noexcept
  {
    s.current_bytes    = static_cast<std::uint64_t>(current_bytes.load(std::memory_order_relaxed));
    s.peak_bytes       = peak_bytes.load(std::memory_order_relaxed);
    s.upstream_growths = growths.load(std::memory_order_relaxed);
    s.reclaim_syncs    = reclaim_syncs.load(std::memory_order_relaxed);
    s.retired_streams  = retired_streams.load(std::memory_order_relaxed);
    s.rejected_frees   = rejected_frees.load(std::memory_order_relaxed);
  }

  /// Counts one more of `counter`.
  static void bump(std::atomic<std::uint64_t>& counter, std::uint64_t n = 1) noexcept
  { counter.fetch_add(n, std::memory_order_relaxed); }

  std::atomic<std::int64_t> current_bytes{};  // settled balances (exact after `stats`)
  std::atomic<std::size_t> peak_bytes{};
  std::atomic<std::uint64_t> growths{};
  std::atomic<std::uint64_t> reclaim_syncs{};
  std::atomic<std::uint64_t> retired_streams{};
  std::atomic<std::uint64_t> rejected_frees{};
  std::atomic<std::uint64_t> retired_hits{};  // same-stream reuse of retired slots
};

}  // namespace rmm_fences::mr::detail::pool
