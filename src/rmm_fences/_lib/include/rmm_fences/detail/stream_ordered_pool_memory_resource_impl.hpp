/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/cuda_page_arena.hpp>
#include <rmm_fences/detail/cuda_pool_platform.hpp>
#include <rmm_fences/detail/missing_gpu.hpp>
#include <rmm_fences/detail/stream_ordered_pool_core.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/process_is_exiting.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

namespace rmm_fences::mr::detail {

/// Builds a pool over the device's own pages (`stream_ordered_pool_memory_resource`'s
/// `device_pages` constructor).
struct device_pages_tag {};

/// Where the pool's memory comes from: an upstream resource that hands out chunks, or the
/// device's own pages through a page arena (`arena()`, detail/pool/page_arena.hpp).
class pool_upstream {
 public:
  using resource_type = cuda::mr::any_resource<cuda::mr::device_accessible>;

  explicit pool_upstream(resource_type resource) : resource_{std::move(resource)} {}
  pool_upstream(device_pages_tag, std::unique_ptr<cuda_page_arena> arena) : arena_{std::move(arena)}
  {
  }

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  { return resource_->allocate(stream, bytes, alignment); }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment)
  { resource_->deallocate(stream, ptr, bytes, alignment); }

  /// The page arena, or nullptr (an upstream resource).
  [[nodiscard]] cuda_page_arena* arena() const noexcept { return arena_.get(); }
  /// The upstream resource, or nullptr (a page arena).
  [[nodiscard]] resource_type* resource() noexcept
  { return resource_ ? std::addressof(*resource_) : nullptr; }

 private:
  std::optional<resource_type> resource_;
  std::unique_ptr<cuda_page_arena> arena_;
};

/**
 * @brief Implementation of `stream_ordered_pool_memory_resource`: the pool's policy core on
 * CUDA streams and events, bound to the device current at construction.
 */
class stream_ordered_pool_memory_resource_impl {
  using upstream_type = pool_upstream;
  using core_type =
    rmm_fences::mr::detail::stream_ordered_pool_core<rmm_fences::mr::detail::cuda_pool_platform,
                                                     upstream_type>;

 public:
  stream_ordered_pool_memory_resource_impl(pool_upstream::resource_type upstream,
                                           std::size_t initial_pool_size,
                                           std::optional<std::size_t> maximum_pool_size,
                                           std::optional<std::size_t> maximum_growth_size)
  try
    : core_{pool_upstream{std::move(upstream)},
            initial_pool_size,
            maximum_pool_size,
            maximum_growth_size,
            rmm::get_current_cuda_device()} {
  } catch (...) {
    rethrow_allocation_error("StreamOrderedPoolMemoryResource");  // the initial pool
  }

  /// A pool over the pages of the device current now (`reserve_size`: the address space it
  /// may grow in; empty: four times the device's memory; `remap_time_fraction`: the share of
  /// its time it may spend moving pages).
  stream_ordered_pool_memory_resource_impl(device_pages_tag,
                                           std::size_t initial_pool_size,
                                           std::optional<std::size_t> maximum_pool_size,
                                           std::optional<std::size_t> reserve_size,
                                           double remap_time_fraction)
  try
    : core_{pool_upstream{device_pages_tag{},
                          std::make_unique<cuda_page_arena>(
                            rmm::get_current_cuda_device(), reserve_size, remap_time_fraction)},
            initial_pool_size,
            maximum_pool_size,
            std::nullopt,
            rmm::get_current_cuda_device()} {
  } catch (...) {
    rethrow_allocation_error("VmmPoolMemoryResource");
  }

  /**
   * @brief Returns the chunks upstream on the pool's own stream after a stream wait on every
   * fence; at process exit, no CUDA call.
   *
   * Free blocks whose last use no fence covers (a live stream's cache, a gone stream's
   * orphans) are ordered by a device synchronization first: the only wait the pool makes on
   * its own, and only then. A chunk holding blocks of a graph that may still replay stays
   * allocated (the graph keeps using it).
   */
  ~stream_ordered_pool_memory_resource_impl()
  {
    if (rmm::process_is_exiting()) {
      core_.shutdown(/*device_alive=*/false);
      return;
    }
    rmm::cuda_set_device_raii guard{core_.platform().device()};
    if (core_.holds_unfenced_blocks()) { (void)core_.platform().sync_device(); }
    core_.shutdown(/*device_alive=*/true);
  }

  stream_ordered_pool_memory_resource_impl(stream_ordered_pool_memory_resource_impl const&) =
    delete;
  stream_ordered_pool_memory_resource_impl(stream_ordered_pool_memory_resource_impl&&) = delete;
  stream_ordered_pool_memory_resource_impl& operator=(
    stream_ordered_pool_memory_resource_impl const&) = delete;
  stream_ordered_pool_memory_resource_impl& operator=(stream_ordered_pool_memory_resource_impl&&) =
    delete;

  bool operator==(stream_ordered_pool_memory_resource_impl const& other) const noexcept
  { return this == std::addressof(other); }
  bool operator!=(stream_ordered_pool_memory_resource_impl const& other) const noexcept
  { return !(*this == other); }

  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    try {
      return core_.allocate(stream, bytes, alignment);
    } catch (...) {
      rethrow_allocation_error("StreamOrderedPoolMemoryResource");
    }
  }

  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  { core_.deallocate(stream, ptr, bytes, alignment); }

  /**
   * @brief `deallocate` that tells what it found: 0 freed, 1 not a live block of this pool
   * (double free or foreign pointer), 2 size mismatch (`allocated_bytes` set), 3 a stream of
   * another device. A refused free changes nothing (and is counted in `rejected_frees`).
   */
  [[nodiscard]] int deallocate_checked(cuda::stream_ref stream,
                                       void* ptr,
                                       std::size_t bytes,
                                       std::size_t* allocated_bytes) noexcept
  {
    auto const r = core_.deallocate_checked(stream, ptr, bytes);
    if (allocated_bytes != nullptr) { *allocated_bytes = r.allocated_bytes; }
    return pool::status_code(r);
  }

  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    auto const stream = core_.platform().default_stream();
    auto* ptr         = allocate(stream, bytes, alignment);
    stream.sync();
    return ptr;
  }

  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  { deallocate(core_.platform().default_stream(), ptr, bytes, alignment); }

  /// Fences `stream` and shares its cached blocks; call before destroying the stream.
  void retire_stream(cuda::stream_ref stream) { core_.retire_stream(stream); }

  /// Returns whole free chunks upstream, ordered by stream waits; returns their bytes.
  std::size_t release()
  {
    rmm::cuda_set_device_raii guard{core_.platform().device()};
    return core_.release();
  }

  /// The named reclaim: a device synchronization, then every block it orders is free again.
  bool synchronize_and_reclaim()
  {
    rmm::cuda_set_device_raii guard{core_.platform().device()};
    auto& platform = core_.platform();
    return core_.reclaim_after([&platform] {
      [[maybe_unused]] auto relaxed = platform.relax();
      return platform.sync_device();
    });
  }

  [[nodiscard]] std::size_t pool_size() const noexcept { return core_.pool_size(); }
  [[nodiscard]] std::optional<std::size_t> maximum_pool_size() const noexcept
  { return core_.maximum_pool_size(); }
  [[nodiscard]] std::optional<std::size_t> maximum_growth_size() const noexcept
  { return core_.maximum_growth_size(); }
  [[nodiscard]] stream_ordered_pool_stats stats() { return core_.stats(); }

  /// The same-stream path alone (never blocks, no CUDA call but the stream identity): a block
  /// freed earlier on `stream`, or nullptr. `allocate` tries it first.
  [[nodiscard]] void* try_allocate_cached(cuda::stream_ref stream,
                                          std::size_t bytes,
                                          std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  { return core_.try_allocate_cached(stream, bytes, alignment); }

  /// The upstream resource (a pool over the device's pages has none: std::logic_error).
  [[nodiscard]] rmm::device_async_resource_ref get_upstream_resource() const
  {
    auto* resource = const_cast<upstream_type&>(core_.upstream()).resource();
    if (resource == nullptr) {
      throw std::logic_error("a pool over the device's pages has no upstream resource");
    }
    return rmm::device_async_resource_ref{*resource};
  }

  /// Bytes of device pages held (mapped and spare) by a pool over the device's pages; else
  /// `pool_size()`.
  [[nodiscard]] std::size_t physical_bytes() const noexcept { return core_.physical_bytes(); }

  friend void get_property(stream_ordered_pool_memory_resource_impl const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

 private:
  core_type core_;
};

}  // namespace rmm_fences::mr::detail
