/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/hazard_tracking_resource_adaptor_impl.hpp>

#include <cuda/memory_resource>

namespace rmm_fences::mr {

/**
 * @brief Tracks every live allocation with its streams and reports the hazards of freeing
 * while device work may still use a block: `freed_in_flight`, `reuse_before_fence`,
 * `cross_stream_free`, `double_free`, `foreign_free`, `size_mismatch`, and an upstream that
 * hands out a live address, `allocated_while_live` (docs/hazard_tracking.md).
 *
 * Bad frees never reach the upstream. Hazards are recorded (and handed to a hook), never
 * thrown from `deallocate`. A check that cannot be made (stream capture, a failed event
 * record, query or wait, another thread's per-thread default stream) is counted in
 * `stats().unchecked`, never read as passed.
 *
 * Copyable: copies share one state (`cuda::mr::shared_resource`).
 */
class hazard_tracking_resource_adaptor
  : public cuda::mr::shared_resource<detail::hazard_tracking_resource_adaptor_impl> {
  using shared_base = cuda::mr::shared_resource<detail::hazard_tracking_resource_adaptor_impl>;

 public:
  /// Enables the `cuda::mr::device_accessible` property.
  friend void get_property(hazard_tracking_resource_adaptor const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

  /**
   * @brief Wraps `upstream`, on the current device.
   *
   * @param upstream the resource that serves the allocations
   * @param upstream_stream_ordered whether `upstream` orders reuse by stream (or frees
   * synchronously); when false every free is fenced and checked
   * @param nvtx register each allocation as an NVTX memory region of its device allocation
   * (a pool chunk), for compute-sanitizer; costs nothing without a tool attached
   */
  explicit hazard_tracking_resource_adaptor(
    cuda::mr::any_resource<cuda::mr::device_accessible> upstream,
    bool upstream_stream_ordered,
    bool nvtx = true)
    : shared_base(cuda::std::in_place_type<detail::hazard_tracking_resource_adaptor_impl>,
                  std::move(upstream),
                  upstream_stream_ordered,
                  nvtx)
  {
  }
};

static_assert(
  cuda::mr::resource_with<hazard_tracking_resource_adaptor, cuda::mr::device_accessible>,
  "hazard_tracking_resource_adaptor does not satisfy the cuda::mr::resource concept");

}  // namespace rmm_fences::mr
