/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream keys of the hazard tracker's records: how a per-thread default stream is told apart.
 */
#pragma once

#include <atomic>
#include <cstdint>

namespace rmm_fences::mr::detail {

/**
 * @brief Stream keys of per-thread default streams.
 *
 * The per-thread default stream's handle (2 in CUDA) names another stream on every thread, so
 * its key carries a token of the thread: `(token << 3) | 2`, token >= 1. Stream handles are
 * pointers to driver objects (8-byte aligned), so such a key never equals a handle. No lock:
 * the token counter is an atomic.
 */
struct per_thread_stream_keys {
  static constexpr std::uintptr_t tag = 2;

  /// A token of the calling thread, never reused in the process (counted from 1).
  static std::uint64_t this_thread_token() noexcept
  {
    static std::atomic<std::uint64_t> next{1};
    thread_local std::uint64_t const token = next.fetch_add(1, std::memory_order_relaxed);
    return token;
  }

  static constexpr std::uintptr_t key(std::uint64_t token) noexcept
  { return (static_cast<std::uintptr_t>(token) << 3U) | tag; }

  static constexpr bool is_per_thread(std::uintptr_t key) noexcept
  { return (key & 7U) == tag && key > 7U; }
};

}  // namespace rmm_fences::mr::detail
