/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/unmapping_vmm_memory_resource_impl.hpp>

#include <rmm/cuda_device.hpp>

#include <cuda/memory_resource>

#include <cstddef>

namespace rmm_fences::mr {

/**
 * @brief UNSAFE ON PURPOSE: CUDA virtual memory whose free unmaps the physical memory at once.
 *
 * A kernel still reading a freed block faults (error 700). Wrap it in
 * `sync_on_free_resource_adaptor` (deferred mode) to make it safe. Copies share one state.
 */
class unmapping_vmm_memory_resource
  : public cuda::mr::shared_resource<detail::unmapping_vmm_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::unmapping_vmm_memory_resource_impl>;

 public:
  friend void get_property(unmapping_vmm_memory_resource const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

  /**
   * @param reserve_size bytes of virtual address range reserved once (rounded up to the
   * allocation granularity)
   * @param device the device whose memory backs the allocations
   */
  unmapping_vmm_memory_resource(std::size_t reserve_size, rmm::cuda_device_id device)
    : shared_base(
        cuda::std::in_place_type<detail::unmapping_vmm_memory_resource_impl>, reserve_size, device)
  {
  }

  /// The device's allocation granularity: every block is a multiple of it.
  [[nodiscard]] std::size_t granularity() const noexcept { return get().granularity(); }
  /// Bytes of virtual address range reserved at construction.
  [[nodiscard]] std::size_t reserve_size() const noexcept { return get().reserve_size(); }
  /// Bytes of physical memory mapped now.
  [[nodiscard]] std::size_t mapped_bytes() const { return get().mapped_bytes(); }
};

static_assert(cuda::mr::resource_with<unmapping_vmm_memory_resource, cuda::mr::device_accessible>,
              "unmapping_vmm_memory_resource does not satisfy the cuda::mr::resource concept");

}  // namespace rmm_fences::mr
