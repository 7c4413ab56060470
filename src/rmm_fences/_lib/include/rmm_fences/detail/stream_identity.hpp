/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * How streams are named, without CUDA: the keys of per-thread default streams, and the identity
 * of a captured stream. `cuda_platform_base` (cuda_events.hpp) names CUDA streams with them; the
 * host test platforms name their simulated streams alike.
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

/**
 * @brief The identity of a stream while it is captured: a 64-bit mix of the capture id and
 * the stream handle, with bit 62 set and bit 63 clear.
 *
 * Every stream forked into one capture shares its capture id, so the id alone would give
 * parallel branches one cache (a block freed on one branch taken by another with no edge
 * between them). The handle tells the branches apart; the capture id tells apart per-thread
 * default streams (one handle value) captured by different threads, and successive captures
 * of one stream. Stream ids of the driver count up from small numbers and never reach bit 62.
 * Two different (capture id, handle) pairs share an identity with probability about 2^-62
 * per pair: a collision would let two streams of captures share one cache.
 */
inline std::uint64_t capturing_stream_identity(std::uint64_t capture_id,
                                               std::uint64_t handle) noexcept
{
  // splitmix64 finalizer over both words (a bijection of each given the other).
  std::uint64_t x = capture_id * 0x9E3779B97F4A7C15ULL ^ (handle + 0x632BE59BD9B4E019ULL);
  x ^= x >> 30U;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27U;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31U;
  return (x & ((std::uint64_t{1} << 62) - 1)) | (std::uint64_t{1} << 62);
}

}  // namespace rmm_fences::mr::detail
