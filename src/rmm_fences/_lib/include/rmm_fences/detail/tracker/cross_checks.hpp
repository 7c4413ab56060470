/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazard tracker's deferred checks of cross-stream frees over a stream-ordered upstream.
 */
#pragma once

#include <rmm_fences/detail/stack_trace.hpp>
#include <rmm_fences/mr/hazards.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::tracker {

/**
 * @brief Frees on another stream than the allocation stream while that stream had work
 * queued: each a hazard if the free's fence completes while that work is still running.
 *
 * No lock: `hazard_tracker_core` calls every member under its mutex. Each check holds two
 * fences, released exactly once: when it settles, or by `release_all`.
 */
template <typename Platform>
class cross_checks {
 public:
  using fence_type  = typename Platform::fence_type;
  using fence_state = typename Platform::fence_state;

  struct check {
    std::uintptr_t ptr{};
    std::size_t size{};
    std::uintptr_t free_stream{};
    std::uintptr_t user_stream{};
    fence_type user_fence{};
    fence_type free_fence{};
    std::shared_ptr<stack_trace const> stack;
    std::shared_ptr<stack_trace const> allocation_stack;
  };

  explicit cross_checks(Platform& platform) : platform_{platform} {}

  [[nodiscard]] bool empty() const noexcept { return checks_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return checks_.size(); }

  /// Starts a check; it owns both fences once this returns. May throw (nothing changed).
  void add(check c) { checks_.push_back(std::move(c)); }

  /**
   * @brief Settles the checks with an answer. A free is proven unordered when its fence
   * completes before the work that was queued on the allocation stream at the free: `note`
   * gets that `cross_stream_free`. Settled either way once one completes; a failed test settles
   * it, counted in `unchecked` (a later answer could hide the order in between).
   */
  template <typename Note>
  void settle(std::uint64_t& unchecked, Note&& note)
  {
    for (auto it = checks_.begin(); it != checks_.end();) {
      auto const user = platform_.query(it->user_fence);
      auto const free =
        user == fence_state::pending ? platform_.query(it->free_fence) : fence_state::pending;
      if (user == fence_state::pending && free == fence_state::pending) {
        ++it;
        continue;
      }
      if (user == fence_state::failed || free == fence_state::failed) { unchecked += 1; }
      if (user == fence_state::pending && free == fence_state::complete) {
        note(hazard_record{.kind             = hazard_kind::cross_stream_free,
                           .ptr              = it->ptr,
                           .size             = it->size,
                           .tracked_size     = it->size,
                           .stream           = it->free_stream,
                           .streams          = {it->user_stream},
                           .stack            = it->stack,
                           .allocation_stack = it->allocation_stack});
      }
      platform_.release_fence(it->user_fence);
      platform_.release_fence(it->free_fence);
      it = checks_.erase(it);
    }
  }

  /// Releases the fences of every check and forgets them.
  void release_all() noexcept
  {
    for (auto& c : checks_) {
      platform_.release_fence(c.user_fence);
      platform_.release_fence(c.free_fence);
    }
    clear();
  }

  /// Forgets the checks without platform calls.
  void clear() noexcept { checks_.clear(); }

 private:
  Platform& platform_;
  std::vector<check> checks_;
};

}  // namespace rmm_fences::mr::detail::tracker
