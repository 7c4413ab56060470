/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * A census of the stream-ordered pool's core, summed (CPU tests and tools only): the bytes of
 * its chunks by place (live, a stream's cache, shared, behind fences, graphs', orphaned), by
 * owner stream and by size class, and per chunk. It reads the core through the read-only
 * `pool::census` and checks that the blocks tile the chunks: every byte of every chunk in exactly
 * one block, so that the places' bytes sum to the pool's size.
 */
#pragma once

#include <rmm_fences/detail/pool/census.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace rmm_fences::testing {

/// Upper bounds of a census's size classes (the last class has none): powers of 4 from 1 MiB.
inline constexpr std::array<std::size_t, 6> census_size_bounds{std::size_t{1} << 20,
                                                               std::size_t{4} << 20,
                                                               std::size_t{16} << 20,
                                                               std::size_t{64} << 20,
                                                               std::size_t{256} << 20,
                                                               std::size_t{1} << 30};

/// `census_size_bounds` as a list (for Python).
inline std::vector<std::size_t> census_size_bound_list()
{ return {census_size_bounds.begin(), census_size_bounds.end()}; }

/// The size class of a block of `size` bytes: the first bound above it (or one past the last).
inline int census_size_class(std::size_t size) noexcept
{
  auto const it = std::upper_bound(census_size_bounds.begin(), census_size_bounds.end(), size);
  return static_cast<int>(it - census_size_bounds.begin());
}

/// Bytes of one (place, owner, size class).
struct census_entry {
  int place{};
  std::uint64_t owner{};
  int size_class{};
  std::size_t bytes{};
  std::size_t blocks{};
};

/// One upstream chunk in a census: its live and free bytes, its largest free block.
struct census_chunk {
  std::uintptr_t ptr{};
  std::size_t size{};
  std::size_t live{};
  std::size_t free_bytes{};
  std::size_t largest_free{};
  std::size_t free_blocks{};
};

/// A census summed: `place_bytes` (indexed by `block_place`) sums to `pool_bytes`;
/// `place_largest`, the largest block of each place.
struct pool_census {
  std::size_t pool_bytes{};
  std::vector<std::size_t> place_bytes;
  std::vector<std::size_t> place_largest;
  std::vector<census_entry> entries;  // in (place, owner, size class) order
  std::vector<census_chunk> chunks;   // in address order
};

namespace detail {

using census_block = rmm_fences::mr::detail::pool::census_block;

[[noreturn]] inline void census_mismatch(std::string const& what)
{ throw std::logic_error("pool census: " + what); }

/// Sums `blocks` (sorted by address) chunk by chunk, checking that they tile each chunk.
inline std::vector<census_chunk> census_chunks(
  std::vector<census_block> const& blocks, std::vector<std::pair<char*, std::size_t>> const& chunks)
{
  std::vector<census_chunk> out;
  std::size_t i = 0;
  for (auto const& [start, size] : chunks) {
    census_chunk c{reinterpret_cast<std::uintptr_t>(start), size};
    char* at = start;
    for (; i < blocks.size() && blocks[i].ptr < start + size; ++i) {
      auto const& b = blocks[i];
      if (b.ptr != at || b.ptr + b.size > start + size) {
        std::ostringstream os;
        os << "block at " << static_cast<void*>(b.ptr) << " (" << b.size << " bytes, place "
           << static_cast<int>(b.place) << ") does not follow " << static_cast<void*>(at)
           << " in the chunk at " << static_cast<void*>(start) << " (" << size << " bytes)";
        census_mismatch(os.str());
      }
      at += b.size;
      if (b.place == rmm_fences::mr::detail::pool::block_place::live) {
        c.live += b.size;
      } else {
        c.free_bytes += b.size;
        c.largest_free = std::max(c.largest_free, b.size);
        ++c.free_blocks;
      }
    }
    if (at != start + size) {
      census_mismatch("the chunk at " + std::to_string(reinterpret_cast<std::uintptr_t>(start)) +
                      " has " + std::to_string(start + size - at) + " bytes in no block");
    }
    out.push_back(c);
  }
  if (i != blocks.size()) { census_mismatch("a block lies outside every chunk"); }
  return out;
}

/// Sums `blocks` by (place, owner, size class) and by place.
inline void census_sums(std::vector<census_block> const& blocks, pool_census& out)
{
  std::map<std::tuple<int, std::uint64_t, int>, std::pair<std::size_t, std::size_t>> sums;
  out.place_bytes.assign(rmm_fences::mr::detail::pool::block_places, 0);
  out.place_largest.assign(rmm_fences::mr::detail::pool::block_places, 0);
  for (auto const& b : blocks) {
    auto const place = static_cast<int>(b.place);
    auto& s          = sums[{place, b.owner, census_size_class(b.size)}];
    s.first += b.size;
    ++s.second;
    out.place_bytes[static_cast<std::size_t>(place)] += b.size;
    auto& largest = out.place_largest[static_cast<std::size_t>(place)];
    largest       = std::max(largest, b.size);
  }
  for (auto const& [key, s] : sums) {
    auto const& [place, owner, size_class] = key;
    out.entries.push_back({place, owner, size_class, s.first, s.second});
  }
}

}  // namespace detail

/**
 * @brief The census of `core` (a `stream_ordered_pool_core`; no other call in flight).
 * @throws std::logic_error when the blocks do not tile the chunks or their bytes do not sum
 * to the pool's size
 */
template <typename Core>
pool_census take_census(Core& core)
{
  std::vector<detail::census_block> blocks;
  rmm_fences::mr::detail::pool::census(core,
                                       [&](detail::census_block const& b) { blocks.push_back(b); });
  std::sort(
    blocks.begin(), blocks.end(), [](auto const& a, auto const& b) { return a.ptr < b.ptr; });
  pool_census out;
  out.pool_bytes = core.pool_size();
  out.chunks     = detail::census_chunks(blocks, core.chunks());
  detail::census_sums(blocks, out);
  std::size_t total = 0;
  for (auto const n : out.place_bytes) {
    total += n;
  }
  if (total != out.pool_bytes) {
    detail::census_mismatch("the places hold " + std::to_string(total) + " bytes, the pool " +
                            std::to_string(out.pool_bytes));
  }
  return out;
}

}  // namespace rmm_fences::testing
