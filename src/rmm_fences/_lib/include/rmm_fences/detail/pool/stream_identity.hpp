/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the identity of a stream while it is captured (no CUDA call; the
 * CUDA platform and the host test platform compute it alike).
 */
#pragma once

#include <cstdint>

namespace rmm_fences::mr::detail {

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
