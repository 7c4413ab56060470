/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/vmm_api.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/error.hpp>
#include <rmm/process_is_exiting.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace rmm_fences::mr::detail {

/**
 * @brief Implementation of `unmapping_vmm_memory_resource`: UNSAFE ON PURPOSE.
 *
 * Reserves one virtual address range at construction. Each allocation takes a piece of it
 * (first fit, in multiples of the device's allocation granularity) and backs it with physical
 * memory (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`). A free unmaps and releases the
 * physical memory at once and keeps the range: a kernel still using the block faults
 * (illegal address, error 700; the context is lost).
 */
class unmapping_vmm_memory_resource_impl {
 public:
  unmapping_vmm_memory_resource_impl(std::size_t reserve_size, rmm::cuda_device_id device)
    : api_{vmm_api::for_device(device.value(), prop_, granularity_)}, device_{device}
  {
    rmm::cuda_set_device_raii guard{device_};
    reserved_ = round_up(reserve_size);
    if (api_.address_reserve(&base_, reserved_, granularity_, 0, 0) != CUDA_SUCCESS) {
      throw rmm::out_of_memory("vmm_unmap: cuMemAddressReserve of " + std::to_string(reserved_) +
                               " bytes failed");
    }
    free_.emplace(base_, reserved_);
  }

  /// Unmaps what is still mapped and gives the range back (no CUDA call at process exit).
  ~unmapping_vmm_memory_resource_impl()
  {
    if (rmm::process_is_exiting()) { return; }
    rmm::cuda_set_device_raii guard{device_};
    for (auto const& [ptr, block] : live_) {
      (void)api_.unmap(ptr, block.size);
      (void)api_.release(block.handle);
    }
    (void)api_.address_free(base_, reserved_);
  }

  unmapping_vmm_memory_resource_impl(unmapping_vmm_memory_resource_impl const&)            = delete;
  unmapping_vmm_memory_resource_impl& operator=(unmapping_vmm_memory_resource_impl const&) = delete;

  bool operator==(unmapping_vmm_memory_resource_impl const& other) const noexcept
  { return this == std::addressof(other); }
  bool operator!=(unmapping_vmm_memory_resource_impl const& other) const noexcept
  { return !(*this == other); }

  /// Maps fresh physical memory at a free piece of the range; rmm::out_of_memory when the
  /// range or the device's memory is exhausted.
  [[nodiscard]] void* allocate(cuda::stream_ref,
                               std::size_t bytes,
                               std::size_t = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    auto const size = round_up(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.begin();
    while (it != free_.end() && it->second < size) {
      ++it;
    }
    if (it == free_.end()) {
      throw rmm::out_of_memory("vmm_unmap: no free " + std::to_string(size) +
                               " bytes left in the reserved range of " + std::to_string(reserved_) +
                               " bytes");
    }
    auto const ptr = it->first;
    rmm::cuda_set_device_raii guard{device_};
    CUmemGenericAllocationHandle handle{};
    if (api_.create(&handle, size, &prop_, 0) != CUDA_SUCCESS) {
      throw rmm::out_of_memory("vmm_unmap: cuMemCreate of " + std::to_string(size) +
                               " bytes failed (device memory exhausted)");
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags    = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (api_.map(ptr, size, 0, handle, 0) != CUDA_SUCCESS) {
      (void)api_.release(handle);
      throw rmm::out_of_memory("vmm_unmap: cuMemMap failed");
    }
    if (api_.set_access(ptr, size, &access, 1) != CUDA_SUCCESS) {
      (void)api_.unmap(ptr, size);
      (void)api_.release(handle);
      throw rmm::out_of_memory("vmm_unmap: cuMemSetAccess failed");
    }
    take_locked(it, size);
    live_.emplace(ptr, mapping{size, handle});
    mapped_ += size;
    return reinterpret_cast<void*>(ptr);
  }

  /// Unmaps and releases the physical memory at once (no fence: that is the hazard). A null
  /// free is a no-op.
  void deallocate(cuda::stream_ref,
                  void* p,
                  std::size_t,
                  std::size_t = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  {
    if (p == nullptr) { return; }
    auto const ptr = reinterpret_cast<CUdeviceptr>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto const it = live_.find(ptr);
    if (it == live_.end()) { return; }
    rmm::cuda_set_device_raii guard{device_};
    (void)api_.unmap(ptr, it->second.size);
    (void)api_.release(it->second.handle);
    mapped_ -= it->second.size;
    give_back_locked(ptr, it->second.size);
    live_.erase(it);
  }

  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  { return allocate(cuda::stream_ref{cudaStream_t{}}, bytes, alignment); }

  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  { deallocate(cuda::stream_ref{cudaStream_t{}}, ptr, bytes, alignment); }

  [[nodiscard]] std::size_t granularity() const noexcept { return granularity_; }
  [[nodiscard]] std::size_t reserve_size() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t mapped_bytes() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return mapped_;
  }

  friend void get_property(unmapping_vmm_memory_resource_impl const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

 private:
  struct mapping {
    std::size_t size{};
    CUmemGenericAllocationHandle handle{};
  };

  [[nodiscard]] std::size_t round_up(std::size_t n) const noexcept
  { return (n + granularity_ - 1) / granularity_ * granularity_; }

  void take_locked(std::map<CUdeviceptr, std::size_t>::iterator it, std::size_t size)
  {
    auto const rest_ptr  = it->first + size;
    auto const rest_size = it->second - size;
    free_.erase(it);
    if (rest_size != 0) { free_.emplace(rest_ptr, rest_size); }
  }

  /// Returns [ptr, ptr + size) to the free ranges, merged with its neighbours.
  void give_back_locked(CUdeviceptr ptr, std::size_t size)
  {
    auto next = free_.lower_bound(ptr);
    if (next != free_.end() && ptr + size == next->first) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == ptr) {
        prev->second += size;
        return;
      }
    }
    free_.emplace(ptr, size);
  }

  // Before `api_`, whose initialization fills them (`vmm_api::for_device`).
  CUmemAllocationProp prop_{};
  std::size_t granularity_{};
  rmm_fences::mr::detail::vmm_api const& api_;
  rmm::cuda_device_id device_;
  std::size_t reserved_{};
  CUdeviceptr base_{};
  mutable std::mutex mutex_;
  std::map<CUdeviceptr, std::size_t> free_;
  std::map<CUdeviceptr, mapping> live_;
  std::size_t mapped_{};
};

}  // namespace rmm_fences::mr::detail
