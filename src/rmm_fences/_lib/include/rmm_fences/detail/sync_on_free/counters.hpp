/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The counters of SyncOnFree that are updated without its list's lock.
 */
#pragma once

#include <rmm_fences/mr/stats.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rmm_fences::mr::detail::sync_on_free {

/**
 * @brief Monotonic counters of a `sync_on_free_core`.
 *
 * No lock: each is an atomic counted with relaxed order (a snapshot is not a consistent cut).
 * The counts kept with the list (`parked`, `deferred`, `peak_pending_bytes`) are the
 * `pending_list`'s, under its lock.
 */
struct counters {
  std::atomic<std::uint64_t> syncs{};
  std::atomic<std::uint64_t> released{};
  std::atomic<std::uint64_t> oom_retries{};
  std::atomic<std::uint64_t> failed_syncs{};
  std::atomic<std::uint64_t> rejected_frees{};
  std::atomic<std::uint64_t> fences{};

  static void add(std::atomic<std::uint64_t>& counter, std::size_t n) noexcept
  { counter.fetch_add(n, std::memory_order_relaxed); }

  void count_syncs(std::size_t n) noexcept
  {
    if (n > 0) { add(syncs, n); }
  }

  void count_failures(std::size_t n) noexcept
  {
    if (n > 0) { add(failed_syncs, n); }
  }

  /// Fills the fields of `s` these counters hold.
  void fill(rmm_fences::mr::sync_on_free_stats& s) const noexcept
  {
    s.syncs          = syncs.load(std::memory_order_relaxed);
    s.released       = released.load(std::memory_order_relaxed);
    s.oom_retries    = oom_retries.load(std::memory_order_relaxed);
    s.failed_syncs   = failed_syncs.load(std::memory_order_relaxed);
    s.rejected_frees = rejected_frees.load(std::memory_order_relaxed);
    s.fences         = fences.load(std::memory_order_relaxed);
  }
};

}  // namespace rmm_fences::mr::detail::sync_on_free
