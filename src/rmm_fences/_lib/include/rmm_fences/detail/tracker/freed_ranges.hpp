/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazard tracker's watch of freed ranges over an upstream that is not stream-ordered: each
 * freed block until the fence recorded at its free completes.
 */
#pragma once

#include <rmm_fences/detail/tracker/held_fence.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>

namespace rmm_fences::mr::detail::tracker {

/**
 * @brief Freed ranges whose fence has not completed, by address and in order of their free.
 *
 * No lock: `hazard_tracker_core` calls every member under its mutex. Every fence watched is
 * released exactly once: when its range settles, is reused or dropped, or by `release_all`.
 */
template <typename Platform>
class freed_ranges {
 public:
  using fence_type  = typename Platform::fence_type;
  using fence_state = typename Platform::fence_state;

  /// The most ranges watched (the oldest is dropped, unchecked), and the ranges tested per poll.
  static constexpr std::size_t max_ranges     = 1U << 16U;
  static constexpr std::size_t polls_per_call = 16;

  /// A freed block: its size, the freeing stream (key) and the fence recorded at the free.
  struct range {
    std::size_t size{};
    std::uintptr_t stream{};
    fence_type fence{};
    std::uint64_t serial{};
  };

  explicit freed_ranges(Platform& platform) : platform_{platform} {}

  [[nodiscard]] bool empty() const noexcept { return ranges_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return ranges_.size(); }

  /// Watches [ptr, ptr + size), freed on `stream`, until `fence` completes; takes the fence.
  /// At the cap the oldest range is dropped and counted in `unchecked`.
  void watch(std::uintptr_t ptr,
             std::size_t size,
             std::uintptr_t stream,
             held_fence<Platform>& fence,
             std::uint64_t& unchecked)
  {
    if (ranges_.size() >= max_ranges) {
      drop_oldest();
      unchecked += 1;
    }
    auto const serial = serial_ + 1;
    auto const it     = ranges_.emplace(ptr, range{size, stream, fence.get(), serial});
    try {
      order_.emplace_back(ptr, serial);
    } catch (...) {
      ranges_.erase(it);
      throw;
    }
    (void)fence.take();
    serial_   = serial;
    max_size_ = std::max(max_size_, size);
  }

  /**
   * @brief Stops watching every range overlapping [ptr, ptr + bytes) (live again); returns the
   * first whose fence, tested, is pending and whose stream is not `stream`. A failed test is
   * counted in `unchecked`.
   */
  std::optional<range> take_overlapping(std::uintptr_t ptr,
                                        std::size_t bytes,
                                        std::uintptr_t stream,
                                        std::uint64_t& unchecked)
  {
    auto const first = ptr >= max_size_ ? ptr - max_size_ + 1 : 0;
    std::optional<range> found;
    for (auto it = ranges_.lower_bound(first); it != ranges_.end() && it->first < ptr + bytes;) {
      auto const& r = it->second;
      if (it->first + r.size <= ptr) {
        ++it;
        continue;
      }
      auto const state =
        !found && r.stream != stream ? platform_.query(r.fence) : fence_state::complete;
      if (state == fence_state::failed) { unchecked += 1; }
      if (state == fence_state::pending) { found = r; }
      platform_.release_fence(r.fence);
      it = ranges_.erase(it);
    }
    return found;
  }

  /// Stops watching the oldest ranges whose fence completed (at most `polls_per_call`; a
  /// pending or failed test stops the walk, retried later).
  void poll()
  {
    if (order_.empty()) { return; }
    for (std::size_t i = 0; i < polls_per_call && !ranges_.empty(); ++i) {
      auto const it = oldest();
      if (it == ranges_.end() || platform_.query(it->second.fence) != fence_state::complete) {
        break;
      }
      platform_.release_fence(it->second.fence);
      ranges_.erase(it);
      order_.pop_front();
    }
    if (ranges_.empty()) {
      order_.clear();
      max_size_ = 0;
    }
  }

  /// Releases every fence watched and forgets the ranges.
  void release_all() noexcept
  {
    for (auto& [start, r] : ranges_) {
      platform_.release_fence(r.fence);
    }
    clear();
  }

  /// Forgets the ranges without platform calls.
  void clear() noexcept
  {
    ranges_.clear();
    order_.clear();
  }

 private:
  using iterator = typename std::multimap<std::uintptr_t, range>::iterator;

  /// The oldest watched range (already settled entries of `order_` are skipped).
  iterator oldest()
  {
    while (!order_.empty()) {
      auto const [ptr, serial] = order_.front();
      auto [lo, hi]            = ranges_.equal_range(ptr);
      for (auto it = lo; it != hi; ++it) {
        if (it->second.serial == serial) { return it; }
      }
      order_.pop_front();
    }
    return ranges_.end();
  }

  void drop_oldest()
  {
    auto const it = oldest();
    if (it == ranges_.end()) { return; }
    platform_.release_fence(it->second.fence);
    ranges_.erase(it);
    order_.pop_front();
  }

  Platform& platform_;
  std::multimap<std::uintptr_t, range> ranges_;
  std::deque<std::pair<std::uintptr_t, std::uint64_t>> order_;
  std::size_t max_size_{};
  std::uint64_t serial_{};
};

}  // namespace rmm_fences::mr::detail::tracker
