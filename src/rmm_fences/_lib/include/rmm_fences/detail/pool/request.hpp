/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: one allocation request as it travels the pool's paths, and the
 * requests the pool refuses.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/stream_slot.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace rmm_fences::mr::detail::pool {

/// Largest alignment accepted.
inline constexpr std::size_t max_alignment = std::size_t{1} << 30;
/// Requests above this raise out-of-memory at once (no upstream holds half the address
/// space; and rounding to the granule cannot overflow below it).
inline constexpr std::size_t max_request = SIZE_MAX / 2;
static_assert(max_request <= max_granule_size);

/// One allocation: its stream, sizes and alignment, and the stream's slot once found.
template <typename Platform>
struct alloc_request {
  using stream_type = typename Platform::stream_type;

  alloc_request(stream_type s, std::size_t b, std::size_t alignment) noexcept
    : stream{s}, bytes{b}, size{round_to_granule(b)}, align{std::max(alignment, pool_granularity)}
  {
  }

  stream_type stream;
  std::size_t bytes;              // as asked: the live block's record, which its free matches
  std::size_t size;               // rounded up to the granule: what the block spans
  std::size_t align;              // at least the granule
  stream_slot<Platform>* slot{};  // the stream's slot, pinned on the slower paths

  /// Bytes a growth must add for the block, alignment padding included.
  [[nodiscard]] std::size_t need() const noexcept
  { return size + (align > pool_granularity ? align : 0); }
};

/// True for a request the pool may serve: at most `max_request` bytes, at a power-of-two
/// alignment of at most `max_alignment`.
[[nodiscard]] inline bool valid_alignment(std::size_t alignment) noexcept
{ return alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment <= max_alignment; }

[[nodiscard]] inline bool valid_request(std::size_t bytes, std::size_t alignment) noexcept
{ return bytes <= max_request && valid_alignment(alignment); }

/// Refuses a request `valid_request` refused: std::invalid_argument for the alignment, else
/// the platform's out-of-memory (`pool_bytes` held).
template <typename Platform>
[[noreturn]] void reject_request(std::size_t bytes, std::size_t alignment, std::size_t pool_bytes)
{
  if (!valid_alignment(alignment)) {
    throw std::invalid_argument(
      "StreamOrderedPoolMemoryResource: alignment must be a power of two from 1 to " +
      std::to_string(max_alignment) + " (1 GiB), got " + std::to_string(alignment));
  }
  Platform::throw_out_of_memory(bytes, pool_bytes);
}

}  // namespace rmm_fences::mr::detail::pool
