/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism of the hazard tracker: pooled events as fences (tested with
 * `cuda_platform_base::query`: an error is `failed`, never complete), device-side waits,
 * capture state, stream keys (`cuda_platform_base::key` and `stream`) and NVTX annotations.
 */
#pragma once

#include <rmm_fences/detail/cuda_events.hpp>
#include <rmm_fences/detail/driver_api.hpp>
#include <rmm_fences/detail/nvtx_memory.hpp>

#include <rmm/cuda_device.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace rmm_fences::mr::detail {

/// `hazard_tracker_core`'s platform on one CUDA device.
class cuda_tracker_platform : public cuda_platform_base {
 public:
  using stream_type = cuda::stream_ref;
  using fence_state = rmm_fences::mr::detail::fence_state;

  cuda_tracker_platform(rmm::cuda_device_id device, bool nvtx) : events_{device}, nvtx_{nvtx} {}

  [[nodiscard]] cudaEvent_t acquire_fence() { return events_.acquire(); }
  void release_fence(cudaEvent_t event) noexcept { events_.release(event); }

  void annotate_allocation(void* ptr, std::size_t bytes) noexcept { nvtx_.on_allocate(ptr, bytes); }
  void annotate_free(void* ptr) noexcept { nvtx_.on_free(ptr); }

  [[nodiscard]] event_pool& events() noexcept { return events_; }
  [[nodiscard]] nvtx_memory_annotator const& nvtx() const noexcept { return nvtx_; }

 private:
  event_pool events_;
  nvtx_memory_annotator nvtx_;
};

}  // namespace rmm_fences::mr::detail
