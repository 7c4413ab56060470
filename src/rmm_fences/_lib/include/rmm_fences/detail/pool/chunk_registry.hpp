/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the chunks it holds from the upstream (no CUDA call).
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>

#include <atomic>
#include <cstddef>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/**
 * @brief The upstream chunks (address -> size) and their total.
 *
 * Free lists ask it where chunks start: two free neighbours merge only within one chunk, so a
 * chunk the shared list holds whole can go back upstream. Its mutex is the last one a thread
 * takes (every free list asks it with its own lock held).
 */
class chunk_registry {
 public:
  /// Registers a chunk taken from the upstream.
  void add(char* ptr, std::size_t size)
  {
    {
      std::unique_lock<std::shared_mutex> lock(mutex_);
      chunks_.emplace(ptr, size);
    }
    note_added(size);
  }

  /// Registers `[ptr, ptr + size)` as one chunk with the chunks that end at `ptr` and start
  /// at its end, if any (a page arena's growth: free blocks then merge across the boundaries).
  void add_merging(char* ptr, std::size_t size)
  {
    {
      std::unique_lock<std::shared_mutex> lock(mutex_);
      auto start  = ptr;
      auto length = size;
      if (auto next = chunks_.find(ptr + size); next != chunks_.end()) {
        length += next->second;
        chunks_.erase(next);
      }
      auto it = chunks_.lower_bound(ptr);
      if (it != chunks_.begin() && std::prev(it)->first + std::prev(it)->second == ptr) {
        std::prev(it)->second += length;
      } else {
        chunks_.emplace(start, length);
      }
    }
    note_added(size);
  }

  /// Takes `[ptr, ptr + size)`, inside one chunk, out of it (pages a page arena unmapped): the
  /// parts before and after stay chunks of their own.
  void remove(char* ptr, std::size_t size)
  {
    {
      std::unique_lock<std::shared_mutex> lock(mutex_);
      auto it                    = std::prev(chunks_.upper_bound(ptr));
      auto const [start, length] = *it;
      chunks_.erase(it);
      if (start < ptr) { chunks_.emplace(start, static_cast<std::size_t>(ptr - start)); }
      if (ptr + size < start + length) {
        chunks_.emplace(ptr + size, static_cast<std::size_t>(start + length - (ptr + size)));
      }
    }
    bytes_.fetch_sub(size, std::memory_order_relaxed);
  }

  /// True when `ptr` starts a chunk.
  [[nodiscard]] bool is_start(char* ptr) const
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return chunks_.count(ptr) > 0;
  }

  /// `is_start` as a free list's `insert` takes it.
  [[nodiscard]] auto start_test() const
  {
    return [this](char* p) { return is_start(p); };
  }

  /**
   * @brief Takes out of `list` and out of the registry every chunk `list` holds whole
   * (caller holds the lock that guards `list`).
   */
  template <typename Tag>
  std::vector<typename free_list<Tag>::block> take_whole_locked(free_list<Tag>& list)
  {
    std::vector<typename free_list<Tag>::block> whole;
    std::unique_lock<std::shared_mutex> lock(mutex_);
    std::vector<char*> starts;
    list.for_each([&](char* p, std::size_t n, Tag&) {
      if (auto it = chunks_.find(p); it != chunks_.end() && it->second == n) {
        starts.push_back(p);
      }
    });
    for (char* p : starts) {
      whole.push_back(list.take(p));
      bytes_.fetch_sub(chunks_[p], std::memory_order_relaxed);
      chunks_.erase(p);
    }
    return whole;
  }

  /// Forgets the chunk that holds `ptr`, if any (it is then never returned upstream).
  void forget_containing(char* ptr) noexcept
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = chunks_.upper_bound(ptr);
    if (it != chunks_.begin()) { chunks_.erase(std::prev(it)); }
  }

  /// The chunks as (address, size), in address order.
  [[nodiscard]] std::vector<std::pair<char*, std::size_t>> snapshot() const
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return {chunks_.begin(), chunks_.end()};
  }

  /// Forgets every chunk (the owner returned them, or leaves them to the upstream).
  void clear() noexcept
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    chunks_.clear();
    bytes_.store(0, std::memory_order_relaxed);
  }

  /// Bytes held from the upstream.
  [[nodiscard]] std::size_t bytes() const noexcept
  { return bytes_.load(std::memory_order_relaxed); }

  /// The most bytes held at once.
  [[nodiscard]] std::size_t peak_bytes() const noexcept
  { return peak_.load(std::memory_order_relaxed); }

 private:
  void note_added(std::size_t size) noexcept
  {
    auto const now = bytes_.fetch_add(size, std::memory_order_relaxed) + size;
    auto peak      = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {}
  }

  mutable std::shared_mutex mutex_;
  std::map<char*, std::size_t> chunks_;
  std::atomic<std::size_t> bytes_{};
  std::atomic<std::size_t> peak_{};
};

/// Lists each of `blocks` in `list` with `tag` (the caller guards `list`); a block that finds
/// no host memory is lost to the pool, never handed out twice.
template <typename Tag, typename Blocks>
void insert_or_lose_locked(free_list<Tag>& list,
                           Blocks const& blocks,
                           Tag const& tag,
                           chunk_registry const& chunks) noexcept
{
  for (auto const& b : blocks) {
    try {
      list.insert(b.ptr, b.size, tag, chunks.start_test());
    } catch (...) {
    }
  }
}

}  // namespace rmm_fences::mr::detail::pool
