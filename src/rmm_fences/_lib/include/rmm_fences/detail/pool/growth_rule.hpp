/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: how much a growth asks the upstream for, and how the pool splits
 * the chunk it gets. Pure functions: no state, no locks, no CUDA call.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/blocks.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace rmm_fences::mr::detail::pool {

/// 64 MiB: a pool below it doubles when it grows; the most a growth adds beyond the request
/// while the calling stream is captured; the first chunk with `maximum_growth_size`.
inline constexpr std::size_t small_pool_bytes = std::size_t{64} << 20;
/// Chunks grown without `maximum_growth_size` are multiples of this.
inline constexpr std::size_t growth_granularity = std::size_t{2} << 20;
/// A growth adds the larger of the request and 1/this of the pool (the pool grows by half).
inline constexpr std::size_t growth_divisor = 2;
/// The most a growth adds beyond the request without `maximum_growth_size` (the pool grows
/// by half up to this): the part of the last growth that may stay unused.
inline constexpr std::size_t default_growth_limit = std::size_t{512} << 20;
/// A request of at least 1/this of the pool grows it by the request alone.
inline constexpr std::size_t big_request_fraction = 8;
/// A request of at most this many bytes is small (the threshold of PyTorch's caching
/// allocator's small blocks): in a pool of at least `small_pool_bytes` it grows the pool by
/// `growth_granularity`, or by what small requests have grown it by since the last growth for
/// a larger one, whichever is more.
inline constexpr std::size_t small_request_bytes = std::size_t{1} << 20;

/// What the growth rule looks at.
struct growth_state {
  std::size_t held{};  ///< bytes the pool holds from the upstream
  std::size_t need{};  ///< the request rounded to the granule, plus its alignment padding
  std::optional<std::size_t> room;  ///< bytes left below `maximum_pool_size` (empty: no bound)
  std::optional<std::size_t> maximum_growth_size;  ///< the bound on a chunk beyond the request
  bool capturing{};                                ///< the requesting stream is captured
  /// Bytes the growths for small requests took since the last growth for a larger one.
  std::size_t small_streak{};
};

/**
 * @brief The chunk a growth asks the upstream for (`need <= room`).
 *
 * Chunks are multiples of `growth_granularity`, at least the request. Below
 * `small_pool_bytes` the pool doubles, from the first request (rmm's pool's rule). From
 * there, a request of at least 1/`big_request_fraction` of the pool gets a chunk of its own
 * size (doubling a large pool for one block would hold about the pool's size again); a smaller
 * one grows the pool by half, by at most `default_growth_limit` (the last growth leaves at
 * most a third of the pool, and at most `default_growth_limit`, unused, where doubling leaves
 * half), and a small one (at most `small_request_bytes`) by at most `growth_granularity` or
 * `small_streak`, whichever is more: small blocks need little room, so a pool grown for large
 * blocks does not take hundreds of MiB for one of them, while a pool that small requests keep
 * growing still grows geometrically. With `maximum_growth_size` the chunk is the larger of the
 * request and min(pool size, or `small_pool_bytes` at first, `maximum_growth_size`). In capture the
 * growth beyond the request is at most `small_pool_bytes` (a capture needs a few blocks: it does
 * not double the pool). A bounded pool whose growth would leave less room than it takes takes all
 * of it: the remainder, a chunk apart, could never serve a block as large as this one.
 */
[[nodiscard]] inline std::size_t growth_chunk(growth_state const& s) noexcept
{
  std::size_t step = 0;
  if (s.maximum_growth_size) {
    step = std::min(s.held == 0 ? small_pool_bytes : s.held, *s.maximum_growth_size);
  } else {
    auto rule = s.held < small_pool_bytes ? s.held
                : s.need >= s.held / big_request_fraction
                  ? 0
                  : std::min(s.held / growth_divisor, default_growth_limit);
    if (s.held >= small_pool_bytes && s.need <= small_request_bytes) {
      rule = std::min(rule, std::max(growth_granularity, s.small_streak));
    }
    step =
      (std::max(s.need, rule) + growth_granularity - 1) / growth_granularity * growth_granularity;
  }
  if (s.capturing) { step = std::min(step, small_pool_bytes); }
  auto const room = s.room.value_or(SIZE_MAX);
  auto chunk      = std::min(room, std::max(s.need, step));
  if (s.room && !s.capturing && room - chunk < chunk) { chunk = room; }
  return round_to_granule(chunk);
}

/// The next try after the upstream refused `chunk`: half of it, at least `need`; none once
/// `chunk` was at most `need`.
[[nodiscard]] inline std::optional<std::size_t> smaller_chunk(std::size_t chunk,
                                                              std::size_t need) noexcept
{
  if (chunk <= need) { return std::nullopt; }
  return round_to_granule(std::max(need, chunk / 2));
}

/// A new chunk split for its first user: the block at the alignment from its start, and the
/// parts before (alignment padding) and after it.
struct carved_chunk {
  char* block{};
  std::array<untagged_block, 2> parts{};
  std::size_t part_count{};

  [[nodiscard]] std::span<untagged_block const> rest() const noexcept
  { return {parts.data(), part_count}; }
};

/// Carves `size` bytes at `align` from the start of the chunk `[ptr, ptr + chunk)`.
[[nodiscard]] inline carved_chunk carve_chunk(char* ptr,
                                              std::size_t chunk,
                                              std::size_t size,
                                              std::size_t align) noexcept
{
  carved_chunk c;
  auto const a = reinterpret_cast<std::uintptr_t>(ptr);
  c.block      = reinterpret_cast<char*>((a + align - 1) / align * align);
  if (c.block > ptr) { c.parts[c.part_count++] = {ptr, static_cast<std::size_t>(c.block - ptr)}; }
  if (c.block + size < ptr + chunk) {
    c.parts[c.part_count++] = {c.block + size,
                               static_cast<std::size_t>(ptr + chunk - (c.block + size))};
  }
  return c;
}

}  // namespace rmm_fences::mr::detail::pool
