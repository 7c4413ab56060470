/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: what slots retired for idleness leave. Their cached blocks cannot
 * be fenced (their streams may be gone), so only a device synchronization frees them; the
 * blocks they handed out stay findable here for their frees.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/pool/chunk_registry.hpp>
#include <rmm_fences/detail/pool/live_blocks.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/// Orphaned free blocks and the live blocks of retired slots, under one mutex (taken after
/// the slot table's, never with a slot's; only the chunk registry's is taken under it).
class orphans {
 public:
  explicit orphans(chunk_registry const& chunks) noexcept : chunks_{chunks} {}

  /// Lists blocks only a device synchronization frees (one that finds no host memory is lost
  /// to the pool, never handed out twice).
  template <typename Blocks>
  void add(Blocks const& blocks) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    insert_or_lose_locked(blocks_, blocks, no_tag{}, chunks_);
    bytes_.store(blocks_.free_bytes(), std::memory_order_relaxed);
  }

  /// Keeps a retired slot's live blocks (key, bytes) for their frees (one that finds no host
  /// memory is lost: its free will be refused).
  void adopt_live(std::vector<std::pair<std::uintptr_t, std::size_t>> const& live) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto const& [key, bytes] : live) {
      try {
        live_.track(key, bytes);
      } catch (...) {
      }
    }
  }

  /// A free of a retired slot's live block: `not_live` when it is not one.
  free_result forget_live(std::uintptr_t key, std::size_t bytes) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.forget(key, bytes).value_or(free_result{free_check::unknown, 0});
  }

  /// Takes every orphaned block out.
  std::vector<untagged_block> take_all()
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_.store(0, std::memory_order_relaxed);
    return blocks_.take_all();
  }

  /// Calls `f(ptr, size)` for every orphaned block.
  template <typename F>
  void for_each(F&& f)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.for_each([&](char* p, std::size_t n, no_tag&) { f(p, n); });
  }

  /// Calls `f(key, bytes)` for every live block of a retired slot.
  template <typename F>
  void for_each_live(F&& f)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.for_each(f);
  }

  /// Forgets everything (at shutdown).
  void clear() noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_ = free_list<no_tag>{};
    live_.clear();
    bytes_.store(0, std::memory_order_relaxed);
  }

  /// Bytes orphaned.
  [[nodiscard]] std::size_t bytes() const noexcept
  { return bytes_.load(std::memory_order_relaxed); }

 private:
  chunk_registry const& chunks_;
  std::mutex mutex_;
  free_list<no_tag> blocks_;
  live_blocks live_;
  std::atomic<std::size_t> bytes_{};
};

}  // namespace rmm_fences::mr::detail::pool
