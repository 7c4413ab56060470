/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the words of a census, the read-only listing of every block of the
 * pool's chunks with the place that holds it (for tests and tools; no locks, no CUDA call).
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace rmm_fences::mr::detail::pool {

/// Where a block of the pool's chunks is, as a census sees it.
enum class block_place : int {
  live,            ///< handed out (its size rounded to the granule)
  cached,          ///< in a stream's cache, freed after its last fence record: only that
                   ///< stream reuses it until the fencing rule shares it
  cached_covered,  ///< in a stream's cache, covered by a record: shared once another stream
                   ///< runs short (or the stream is retired)
  shared,          ///< in the shared list, no fence: any stream takes it
  shared_fenced,   ///< in the shared list behind fences: another stream takes it after a
                   ///< stream wait (a captured one only once a query finds them complete)
  graph,           ///< a captured stream's cache, or kept for a graph that may replay it
  orphan,          ///< left by a slot retired without a record: only a device sync frees it
};

/// The number of `block_place` values.
inline constexpr int block_places = 7;

/**
 * @brief One block of a census. `owner`: the stream identity whose slot holds it (live, cached,
 * a captured stream's cache); for a shared block behind fences, the identity whose fence
 * guards it when every fence it needs is one slot's; else the core's `shared_owner` for shared
 * blocks, `orphan_owner` for orphans and retired slots' live blocks, `graph_owner` for
 * graphs' kept blocks. `fences`: the fence records a shared block's tag names.
 */
struct census_block {
  char* ptr{};
  std::size_t size{};
  block_place place{};
  std::uint64_t owner{};
  std::size_t fences{};
};

}  // namespace rmm_fences::mr::detail::pool
