/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/stream_ordered_pool_memory_resource_impl.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <rmm/aligned.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <optional>

namespace rmm_fences::mr {

/// Selects the constructor of `stream_ordered_pool_memory_resource` over the device's pages.
inline constexpr detail::device_pages_tag device_pages{};

/**
 * @brief A pool that is safe without any host synchronization: reuse follows stream order.
 *
 * A block freed on stream S is reused on S at once with no CUDA call. Another stream takes it
 * only after enqueuing a wait on a fence recorded on S after the free; fences are batched, one
 * event record per batch of cached frees. See `detail::stream_ordered_pool_core` for the design.
 *
 * Copyable: copies share one state (`cuda::mr::shared_resource`).
 */
class stream_ordered_pool_memory_resource
  : public cuda::mr::shared_resource<detail::stream_ordered_pool_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::stream_ordered_pool_memory_resource_impl>;

 public:
  friend void get_property(stream_ordered_pool_memory_resource const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

  /**
   * @param upstream where chunks come from
   * @param initial_pool_size bytes taken from the upstream at construction (0: on demand)
   * @param maximum_pool_size the most bytes the pool may hold (empty: no bound)
   * @param maximum_growth_size the largest chunk a growth takes beyond the request (empty:
   * chunks double the pool)
   */
  explicit stream_ordered_pool_memory_resource(
    cuda::mr::any_resource<cuda::mr::device_accessible> upstream,
    std::size_t initial_pool_size                  = 0,
    std::optional<std::size_t> maximum_pool_size   = std::nullopt,
    std::optional<std::size_t> maximum_growth_size = std::nullopt)
    : shared_base(cuda::std::in_place_type<detail::stream_ordered_pool_memory_resource_impl>,
                  std::move(upstream),
                  initial_pool_size,
                  maximum_pool_size,
                  maximum_growth_size)
  {
  }

  /**
   * A pool over the pages of the device current now (CUDA's virtual memory management): it
   * grows at the top of one reserved address range, its free blocks merge across growths, and
   * pages of free blocks whose work is done back new growths (`rmm_fences.mr.VmmPoolMemoryResource`
   * in Python).
   *
   * @param initial_pool_size bytes mapped at construction (0: on demand)
   * @param maximum_pool_size the most bytes of pages the pool may hold (empty: no bound)
   * @param reserve_size the address space it may grow in (empty: four times the device's
   * memory)
   * @param remap_time_fraction the most of its time, within [0, 1], the pool spends moving
   * free pages to where it grows (unmapping and mapping them) instead of holding more, once its
   * peak in use stopped rising: 0 only when the device is out of memory or past
   * `maximum_pool_size`, 1 whenever it would hold more than 1/16 over its peak in use; the
   * share is kept over any second or more
   * @throws std::invalid_argument for a `remap_time_fraction` outside [0, 1]
   */
  stream_ordered_pool_memory_resource(
    detail::device_pages_tag,
    std::size_t initial_pool_size                = 0,
    std::optional<std::size_t> maximum_pool_size = std::nullopt,
    std::optional<std::size_t> reserve_size      = std::nullopt,
    double remap_time_fraction                   = detail::pool::default_remap_time_fraction)
    : shared_base(cuda::std::in_place_type<detail::stream_ordered_pool_memory_resource_impl>,
                  detail::device_pages_tag{},
                  initial_pool_size,
                  maximum_pool_size,
                  reserve_size,
                  remap_time_fraction)
  {
  }

  /// The same-stream path alone (never blocks): a block freed earlier on `stream`, or nullptr.
  [[nodiscard]] void* try_allocate_cached(cuda::stream_ref stream,
                                          std::size_t bytes,
                                          std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  { return get().try_allocate_cached(stream, bytes, alignment); }

  /// `deallocate` that tells what it found: 0 freed, 1 not a live block (double free or foreign
  /// pointer), 2 size mismatch (`allocated_bytes` set), 3 a stream of another device.
  [[nodiscard]] int deallocate_checked(cuda::stream_ref stream,
                                       void* ptr,
                                       std::size_t bytes,
                                       std::size_t* allocated_bytes) noexcept
  { return get().deallocate_checked(stream, ptr, bytes, allocated_bytes); }

  /// Fences `stream` and shares its cached blocks; call before destroying the stream.
  void retire_stream(cuda::stream_ref stream) { get().retire_stream(stream); }
  /// Returns whole free chunks upstream, ordered by stream waits (no host or device sync);
  /// returns their bytes.
  std::size_t release() { return get().release(); }
  /// Synchronizes the device (waits for all its work), then frees the blocks of streams that
  /// went away and every stream's cached blocks for any stream (not the blocks of graphs
  /// that may still replay). Must not run while any thread captures in the global mode.
  bool synchronize_and_reclaim() { return get().synchronize_and_reclaim(); }
  [[nodiscard]] std::size_t pool_size() const noexcept { return get().pool_size(); }
  /// Bytes of device pages held, mapped and spare (a pool over an upstream: `pool_size()`).
  [[nodiscard]] std::size_t physical_bytes() const noexcept { return get().physical_bytes(); }
  [[nodiscard]] std::optional<std::size_t> maximum_pool_size() const noexcept
  { return get().maximum_pool_size(); }
  [[nodiscard]] std::optional<std::size_t> maximum_growth_size() const noexcept
  { return get().maximum_growth_size(); }
  [[nodiscard]] stream_ordered_pool_stats stats() { return get().stats(); }
};

static_assert(
  cuda::mr::resource_with<stream_ordered_pool_memory_resource, cuda::mr::device_accessible>,
  "stream_ordered_pool_memory_resource does not satisfy the cuda::mr::resource concept");

}  // namespace rmm_fences::mr
