/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism of the hazard tracker: pooled events as fences (tested with
 * `cuda_platform_base::query`: an error is `failed`, never complete), device-side waits,
 * capture state and NVTX annotations.
 */
#pragma once

#include <rmm_fences/detail/cuda_events.hpp>
#include <rmm_fences/detail/driver_api.hpp>
#include <rmm_fences/detail/hazard_tracker_core.hpp>
#include <rmm_fences/detail/nvtx_memory.hpp>

#include <rmm/cuda_device.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace rmm_fences::mr::detail {

/// `hazard_tracker_core`'s platform on one CUDA device.
class cuda_tracker_platform : public cuda_platform_base {
 public:
  using stream_type = cuda::stream_ref;
  using fence_state = rmm_fences::mr::detail::fence_state;

  cuda_tracker_platform(rmm::cuda_device_id device, bool nvtx) : events_{device}, nvtx_{nvtx} {}

  /**
   * @brief The stream handle; the legacy default stream is 0 however it is named, and the
   * per-thread default stream (one handle on every thread, another stream on each) is keyed by
   * its thread (`per_thread_stream_keys`).
   */
  static std::uintptr_t key(cuda::stream_ref stream) noexcept
  {
    auto const handle = stream.get();
    if (handle == cudaStreamLegacy) { return 0; }
    if (handle == cudaStreamPerThread) {
      return per_thread_stream_keys::key(per_thread_stream_keys::this_thread_token());
    }
    return reinterpret_cast<std::uintptr_t>(handle);
  }

  /// The stream of `key`, or nullopt for another thread's per-thread default stream (its
  /// handle would name the calling thread's own).
  static std::optional<cuda::stream_ref> stream(std::uintptr_t key) noexcept
  {
    if (per_thread_stream_keys::is_per_thread(key)) {
      if (key != per_thread_stream_keys::key(per_thread_stream_keys::this_thread_token())) {
        return std::nullopt;
      }
      return cuda::stream_ref{cudaStreamPerThread};
    }
    return cuda::stream_ref{reinterpret_cast<cudaStream_t>(key)};
  }

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
