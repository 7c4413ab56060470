/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/cuda_tracker_platform.hpp>
#include <rmm_fences/detail/hazard_tracker_core.hpp>
#include <rmm_fences/detail/missing_gpu.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/process_is_exiting.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <memory>
#include <optional>

namespace rmm_fences::mr::detail {

/**
 * @brief Implementation of `hazard_tracking_resource_adaptor`: the tracker core on CUDA events,
 * bound to the device current at construction.
 */
class hazard_tracking_resource_adaptor_impl {
  using upstream_type = cuda::mr::any_resource<cuda::mr::device_accessible>;

 public:
  using core_type =
    rmm_fences::mr::detail::hazard_tracker_core<rmm_fences::mr::detail::cuda_tracker_platform,
                                                upstream_type>;

  hazard_tracking_resource_adaptor_impl(upstream_type upstream,
                                        bool upstream_stream_ordered,
                                        bool nvtx)
    : core_{std::move(upstream), upstream_stream_ordered, rmm::get_current_cuda_device(), nvtx}
  {
  }

  /// Live blocks are not freed (they are the caller's); the fences held go back to the pool.
  ~hazard_tracking_resource_adaptor_impl()
  {
    if (rmm::process_is_exiting()) {
      core_.abandon_fences();
      core_.platform().events().abandon();
      return;
    }
    core_.release_fences();
    core_.platform().events().destroy_all();
  }

  hazard_tracking_resource_adaptor_impl(hazard_tracking_resource_adaptor_impl const&) = delete;
  hazard_tracking_resource_adaptor_impl(hazard_tracking_resource_adaptor_impl&&)      = delete;
  hazard_tracking_resource_adaptor_impl& operator=(hazard_tracking_resource_adaptor_impl const&) =
    delete;
  hazard_tracking_resource_adaptor_impl& operator=(hazard_tracking_resource_adaptor_impl&&) =
    delete;

  bool operator==(hazard_tracking_resource_adaptor_impl const& other) const noexcept
  { return this == std::addressof(other); }
  bool operator!=(hazard_tracking_resource_adaptor_impl const& other) const noexcept
  { return !(*this == other); }

  /// Allocates from the upstream and tracks the block (hazards are recorded, never thrown).
  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    try {
      return core_.allocate(stream, bytes, alignment);
    } catch (...) {
      rethrow_allocation_error("HazardTrackingResourceAdaptor");
    }
  }

  /// Frees a tracked block; a bad free is recorded and never reaches the upstream. A null free
  /// is a no-op (nothing recorded, nothing reaches the upstream).
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  {
    if (ptr == nullptr) { return; }
    try {
      (void)core_.deallocate(stream, ptr, bytes, alignment);
    } catch (...) {
      // the core releases the block before anything that can throw; nothing else to do
    }
  }

  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    auto const stream = cuda::stream_ref{cudaStream_t{}};
    auto* ptr         = allocate(stream, bytes, alignment);
    stream.sync();
    return ptr;
  }

  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  { deallocate(cuda::stream_ref{cudaStream_t{}}, ptr, bytes, alignment); }

  [[nodiscard]] rmm::device_async_resource_ref get_upstream_resource() const noexcept
  { return rmm::device_async_resource_ref{const_cast<upstream_type&>(core_.upstream())}; }

  [[nodiscard]] core_type& core() noexcept { return core_; }

  /// Whether a tool (compute-sanitizer, Nsight) took the NVTX annotations so far.
  [[nodiscard]] bool nvtx_active() noexcept { return core_.platform().nvtx().tool_attached(); }

  friend void get_property(hazard_tracking_resource_adaptor_impl const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

 private:
  core_type core_;
};

}  // namespace rmm_fences::mr::detail
