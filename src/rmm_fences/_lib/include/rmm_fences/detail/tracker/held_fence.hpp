/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * A fence of the hazard tracker's platform that cannot be lost on a throw.
 */
#pragma once

namespace rmm_fences::mr::detail::tracker {

/**
 * @brief A fence acquired from `Platform`, released when it goes out of scope unless `take()`n.
 *
 * No lock: a local of one call, under the tracker's mutex.
 */
template <typename Platform>
class held_fence {
 public:
  using fence_type = typename Platform::fence_type;

  explicit held_fence(Platform& platform) : platform_{platform}, fence_{platform.acquire_fence()} {}
  held_fence(held_fence const&)            = delete;
  held_fence& operator=(held_fence const&) = delete;
  ~held_fence()
  {
    if (held_) { platform_.release_fence(fence_); }
  }

  [[nodiscard]] fence_type get() const noexcept { return fence_; }

  /// The fence, now the caller's to release.
  fence_type take() noexcept
  {
    held_ = false;
    return fence_;
  }

 private:
  Platform& platform_;
  fence_type fence_;
  bool held_{true};
};

}  // namespace rmm_fences::mr::detail::tracker
