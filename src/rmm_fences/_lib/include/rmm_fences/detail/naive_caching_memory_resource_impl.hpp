/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/missing_gpu.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/process_is_exiting.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/**
 * @brief Implementation of `naive_caching_memory_resource`: UNSAFE ON PURPOSE.
 *
 * A freed block is cached under its (size, alignment) and handed to the next allocation of that
 * size on any stream at once, with no fence: work still queued on the freeing stream races with
 * the new owner. It exists to reproduce that hazard.
 */
class naive_caching_memory_resource_impl {
 public:
  explicit naive_caching_memory_resource_impl(
    cuda::mr::any_resource<cuda::mr::device_accessible> upstream)
    : upstream_{std::move(upstream)}, device_{rmm::get_current_cuda_device()}
  {
  }

  ~naive_caching_memory_resource_impl()
  {
    if (rmm::process_is_exiting()) { return; }
    rmm::cuda_set_device_raii guard{device_};
    release();
  }

  naive_caching_memory_resource_impl(naive_caching_memory_resource_impl const&)            = delete;
  naive_caching_memory_resource_impl(naive_caching_memory_resource_impl&&)                 = delete;
  naive_caching_memory_resource_impl& operator=(naive_caching_memory_resource_impl const&) = delete;
  naive_caching_memory_resource_impl& operator=(naive_caching_memory_resource_impl&&)      = delete;

  bool operator==(naive_caching_memory_resource_impl const& other) const noexcept
  { return this == std::addressof(other); }
  bool operator!=(naive_caching_memory_resource_impl const& other) const noexcept
  { return !(*this == other); }

  /// A cached block of exactly this size and alignment if any (no fence!), else the upstream's.
  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cache_.find({bytes, alignment});
      if (it != cache_.end() && !it->second.empty()) {
        auto* ptr = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= bytes;
        ++hits_;
        return ptr;
      }
      ++misses_;
    }
    try {
      return upstream_.allocate(stream, bytes, alignment);
    } catch (...) {
      rethrow_allocation_error("NaiveCachingMemoryResource");
    }
  }

  /// Caches the block at once, whatever work is still queued on it. A null free is a no-op
  /// (a null block cached would be handed out).
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  {
    if (ptr == nullptr) { return; }
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      cache_[{bytes, alignment}].push_back(ptr);
      cached_bytes_ += bytes;
      return;
    } catch (...) {
    }
    upstream_.deallocate(stream, ptr, bytes, alignment);
  }

  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    auto* ptr = allocate(cuda::stream_ref{cudaStream_t{}}, bytes, alignment);
    cuda::stream_ref{cudaStream_t{}}.sync();
    return ptr;
  }

  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  { deallocate(cuda::stream_ref{cudaStream_t{}}, ptr, bytes, alignment); }

  /// Returns every cached block to the upstream (on the default stream).
  void release() noexcept
  {
    std::map<std::pair<std::size_t, std::size_t>, std::vector<void*>> cache;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cache.swap(cache_);
      cached_bytes_ = 0;
    }
    for (auto const& [key, ptrs] : cache) {
      for (auto* ptr : ptrs) {
        upstream_.deallocate(cuda::stream_ref{cudaStream_t{}}, ptr, key.first, key.second);
      }
    }
  }

  [[nodiscard]] rmm::device_async_resource_ref get_upstream_resource() const noexcept
  {
    return rmm::device_async_resource_ref{
      const_cast<cuda::mr::any_resource<cuda::mr::device_accessible>&>(upstream_)};
  }

  /// Bytes held in the cache.
  [[nodiscard]] std::size_t cached_bytes() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }

  /// Allocations served from the cache.
  [[nodiscard]] std::uint64_t hits() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return hits_;
  }

  /// Allocations that went upstream.
  [[nodiscard]] std::uint64_t misses() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return misses_;
  }

  friend void get_property(naive_caching_memory_resource_impl const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

 private:
  cuda::mr::any_resource<cuda::mr::device_accessible> upstream_;
  rmm::cuda_device_id device_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::size_t, std::size_t>, std::vector<void*>> cache_;  // guarded
  std::size_t cached_bytes_{};                                               // guarded
  std::uint64_t hits_{};                                                     // guarded
  std::uint64_t misses_{};                                                   // guarded
};

}  // namespace rmm_fences::mr::detail
