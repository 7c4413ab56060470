/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core (docs/design.md#layers, policy cores): a free list with O(log n) best fit and
 * coalescing. No CUDA calls, no locks: its owner serializes access.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/// Every block boundary of the pool is a multiple of this (and so is every block size).
inline constexpr std::size_t pool_granularity = 256;

/// Largest size `round_to_granule` takes: above it the rounding would wrap to 0.
inline constexpr std::size_t max_granule_size = SIZE_MAX - pool_granularity + 1;

/// `bytes` rounded up to the pool granularity (0 becomes one granule). Callers check
/// `bytes <= max_granule_size` first (the pool refuses larger requests as out-of-memory).
inline std::size_t round_to_granule(std::size_t bytes) noexcept
{
  if (bytes == 0) { return pool_granularity; }
  return (bytes + pool_granularity - 1) / pool_granularity * pool_granularity;
}

/**
 * @brief Free blocks ordered by address (for coalescing) and by size (for best fit).
 *
 * Each block carries a `Tag` (the fences a user of the block must wait for). Tags of merged
 * neighbours are combined with `Tag::merge(a, b)`; a split keeps the tag on both parts.
 *
 * Invariants:
 *  - blocks never overlap, and two blocks adjacent in memory are never both listed unless a
 *    chunk boundary lies between them (`is_chunk_start(boundary)` is true);
 *  - `by_size_` holds exactly one (size, address) entry per block of `by_addr_`;
 *  - every address and size is a multiple of `pool_granularity`;
 *  - `free_bytes()` is the sum of the listed sizes.
 */
template <typename Tag>
class free_list {
 public:
  struct block {
    char* ptr{};
    std::size_t size{};
    Tag tag{};
  };

  /**
   * @brief Lists `[ptr, ptr + size)`, merging it with free neighbours of the same chunk.
   *
   * @param is_chunk_start tells whether an address starts an upstream chunk (no merge across)
   */
  template <typename IsChunkStart>
  void insert(char* ptr, std::size_t size, Tag tag, IsChunkStart&& is_chunk_start)
  {
    auto next = by_addr_.lower_bound(ptr);
    if (next != by_addr_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.size == ptr && !is_chunk_start(ptr)) {
        ptr = prev->first;
        size += prev->second.size;
        tag = Tag::merge(std::move(prev->second.tag), std::move(tag));
        erase(prev);
      }
    }
    if (next != by_addr_.end() && ptr + size == next->first && !is_chunk_start(next->first)) {
      size += next->second.size;
      tag = Tag::merge(std::move(tag), std::move(next->second.tag));
      erase(next);
    }
    by_addr_.emplace(ptr, node{size, std::move(tag)});
    by_size_.emplace(size, ptr);
    free_bytes_ += size;
  }

  /**
   * @brief Takes the smallest block that holds `size` bytes at `alignment`.
   *
   * Splits off what is not needed (before the aligned start and after the end), keeping those
   * parts listed with the same tag. `size` must be a multiple of the granularity and
   * `alignment` a power of two.
   * @return the block, or a block with `ptr == nullptr` when none fits
   */
  block take_best_fit(std::size_t size, std::size_t alignment, std::size_t below = SIZE_MAX)
  {
    return take_best_fit_if(size, alignment, SIZE_MAX, [](Tag const&) { return true; }, below);
  }

  /**
   * @brief Takes the best fit as `take_best_fit` does when it is at most `max_size` bytes.
   *
   * @param fit set to the best fit's size, taken or not (0 when no block fits)
   */
  block take_best_fit_within(std::size_t size,
                             std::size_t alignment,
                             std::size_t max_size,
                             std::size_t& fit)
  {
    fit = 0;
    for (auto it = by_size_.lower_bound({size, nullptr}); it != by_size_.end(); ++it) {
      if (!fits(*it, size, alignment)) { continue; }
      fit = it->first;
      if (fit > max_size) { return {}; }
      return carve(by_addr_.find(it->second), size, alignment);
    }
    return {};
  }

  /**
   * @brief Takes the smallest block that holds `size` bytes at `alignment` and whose tag
   * `usable(tag)` accepts, looking at no more than `max_candidates` blocks that fit (in
   * best-fit order: size, then address) and at none of `below` bytes or more. Splits as
   * `take_best_fit` does.
   * @return the block, or a block with `ptr == nullptr` when none of those is usable
   */
  template <typename Usable>
  block take_best_fit_if(std::size_t size,
                         std::size_t alignment,
                         std::size_t max_candidates,
                         Usable&& usable,
                         std::size_t below = SIZE_MAX)
  {
    auto it = by_size_.lower_bound({size, nullptr});
    for (std::size_t seen = 0; it != by_size_.end() && it->first < below && seen < max_candidates;
         ++it) {
      if (!fits(*it, size, alignment)) { continue; }  // big enough only without the padding
      ++seen;
      auto const found = by_addr_.find(it->second);
      if (usable(std::as_const(found->second.tag))) { return carve(found, size, alignment); }
    }
    return {};
  }

  /// The size of the listed block that starts at `ptr` (0: none).
  [[nodiscard]] std::size_t size_of_block_at(char* ptr) const
  {
    auto it = by_addr_.find(ptr);
    return it == by_addr_.end() ? 0 : it->second.size;
  }

  /// The listed block that ends at `end`: (start, size), or (nullptr, 0).
  [[nodiscard]] std::pair<char*, std::size_t> block_ending_at(char* end) const
  {
    auto it = by_addr_.lower_bound(end);
    if (it == by_addr_.begin()) { return {nullptr, 0}; }
    --it;
    if (it->first + it->second.size != end) { return {nullptr, 0}; }
    return {it->first, it->second.size};
  }

  /// Takes exactly the listed block starting at `ptr` (which must be listed).
  block take(char* ptr)
  {
    auto it = by_addr_.find(ptr);
    block b{it->first, it->second.size, std::move(it->second.tag)};
    erase(it);
    return b;
  }

  /// Moves every block out, in address order.
  std::vector<block> take_all()
  {
    std::vector<block> out;
    out.reserve(by_addr_.size());
    for (auto& [ptr, n] : by_addr_) {
      out.push_back({ptr, n.size, std::move(n.tag)});
    }
    by_addr_.clear();
    by_size_.clear();
    free_bytes_ = 0;
    return out;
  }

  /// Calls `f(ptr, size, tag&)` for every block in address order.
  template <typename F>
  void for_each(F&& f)
  {
    for (auto& [ptr, n] : by_addr_) {
      f(ptr, n.size, n.tag);
    }
  }

  [[nodiscard]] std::size_t free_bytes() const noexcept { return free_bytes_; }
  [[nodiscard]] std::size_t block_count() const noexcept { return by_addr_.size(); }
  [[nodiscard]] bool empty() const noexcept { return by_addr_.empty(); }

 private:
  struct node {
    std::size_t size;
    Tag tag;
  };
  using addr_map = std::map<char*, node>;

  static char* aligned_end(char* p, std::size_t alignment) noexcept
  {
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    return reinterpret_cast<char*>((a + alignment - 1) / alignment * alignment);
  }

  /// True when the listed block `entry` (size, address) holds `size` bytes at `alignment`.
  static bool fits(std::pair<std::size_t, char*> const& entry,
                   std::size_t size,
                   std::size_t alignment) noexcept
  {
    auto const slack = alignment > pool_granularity ? alignment - pool_granularity : 0;
    return entry.first >= size + slack ||
           aligned_end(entry.second, alignment) + size <= entry.second + entry.first;
  }

  void erase(typename addr_map::iterator it)
  {
    by_size_.erase({it->second.size, it->first});
    free_bytes_ -= it->second.size;
    by_addr_.erase(it);
  }

  block carve(typename addr_map::iterator it, std::size_t size, std::size_t alignment)
  {
    char* const start     = it->first;
    std::size_t const all = it->second.size;
    Tag tag               = it->second.tag;
    erase(it);
    char* const ptr = aligned_end(start, alignment);
    if (ptr > start) { relist(start, static_cast<std::size_t>(ptr - start), tag); }
    if (ptr + size < start + all) {
      relist(ptr + size, static_cast<std::size_t>(start + all - (ptr + size)), tag);
    }
    return {ptr, size, std::move(tag)};
  }

  /// Lists a part split off a block (its neighbours are allocated: no merge to try).
  void relist(char* ptr, std::size_t size, Tag const& tag)
  {
    by_addr_.emplace(ptr, node{size, tag});
    by_size_.emplace(size, ptr);
    free_bytes_ += size;
  }

  addr_map by_addr_;
  std::set<std::pair<std::size_t, char*>> by_size_;
  std::size_t free_bytes_{};
};

}  // namespace rmm_fences::mr::detail
