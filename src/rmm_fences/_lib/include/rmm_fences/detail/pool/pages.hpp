/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: page arithmetic of a pool over a page arena (page_arena.hpp).
 * Pure functions: no state, no locks, no CUDA call.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace rmm_fences::mr::detail::pool {

/// A growth unmaps free pages first when the pool would hold more than the most bytes it had
/// in use plus 1/this of them.
inline constexpr std::size_t arena_slack_divisor = 16;

/// `n` rounded up to a multiple of `page` (a power of two).
[[nodiscard]] constexpr std::size_t round_to_page(std::size_t n, std::size_t page) noexcept
{ return (n + page - 1) & ~(page - 1); }

/// The whole pages inside `[ptr, ptr + size)`: (start, bytes), bytes 0 when none.
[[nodiscard]] inline std::pair<char*, std::size_t> inner_pages(char* ptr,
                                                               std::size_t size,
                                                               std::size_t page) noexcept
{
  auto const a  = reinterpret_cast<std::uintptr_t>(ptr);
  auto const lo = (a + page - 1) & ~(std::uintptr_t{page} - 1);
  auto const hi = (a + size) & ~(std::uintptr_t{page} - 1);
  if (hi <= lo) { return {nullptr, 0}; }
  return {reinterpret_cast<char*>(lo), static_cast<std::size_t>(hi - lo)};
}

/// The most a pool whose peak of bytes in use is `peak` (or `in_use`, if more) holds before
/// a growth unmaps free pages first.
[[nodiscard]] constexpr std::size_t arena_budget(std::size_t peak, std::size_t in_use) noexcept
{
  auto const most = std::max(peak, in_use);
  return most + most / arena_slack_divisor;
}

}  // namespace rmm_fences::mr::detail::pool
