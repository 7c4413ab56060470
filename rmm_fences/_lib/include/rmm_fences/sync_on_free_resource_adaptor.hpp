/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/sync_on_free_resource_adaptor_impl.hpp>
#include <rmm_fences/mr/free_result.hpp>
#include <rmm_fences/mr/stats.hpp>
#include <rmm_fences/mr/sync_mode.hpp>

#include <rmm/aligned.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <optional>

namespace rmm_fences::mr {

/**
 * @brief Makes freeing safe while kernels may still use the block, over any upstream.
 *
 * `sync_mode::device` synchronizes the device before each free (what cudaFree does),
 * `sync_mode::stream` synchronizes the freeing stream, and `sync_mode::deferred` records an
 * event on the freeing stream and hands the block to the upstream only once the event completed,
 * never blocking the host in `deallocate`.
 *
 * Copyable: copies share one state (`cuda::mr::shared_resource`).
 */
class sync_on_free_resource_adaptor
  : public cuda::mr::shared_resource<detail::sync_on_free_resource_adaptor_impl> {
  using shared_base = cuda::mr::shared_resource<detail::sync_on_free_resource_adaptor_impl>;

 public:
  /// Enables the `cuda::mr::device_accessible` property.
  friend void get_property(sync_on_free_resource_adaptor const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

  /**
   * @brief Wraps `upstream`, on the current device.
   *
   * @param upstream resource that receives the blocks once they are safe to reuse
   * @param mode when a freed block may go upstream
   * @param max_pending_bytes in deferred mode, the most bytes left pending before the oldest
   * fences are waited on; no cap when empty
   */
  explicit sync_on_free_resource_adaptor(
    cuda::mr::any_resource<cuda::mr::device_accessible> upstream,
    sync_mode mode                               = sync_mode::deferred,
    std::optional<std::size_t> max_pending_bytes = std::nullopt)
    : shared_base(cuda::std::in_place_type<detail::sync_on_free_resource_adaptor_impl>,
                  std::move(upstream),
                  mode,
                  max_pending_bytes)
  {
  }

  /// `deallocate` that returns what the check of the free found instead of printing it: on a
  /// double free, a foreign pointer or a size mismatch nothing is done.
  free_result deallocate_checked(cuda::stream_ref stream,
                                 void* ptr,
                                 std::size_t bytes,
                                 std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  { return get().deallocate_checked(stream, ptr, bytes, alignment); }

  /// Blocks until every pending block went upstream (see the implementation for the exceptions).
  void flush() { get().flush(); }

  [[nodiscard]] sync_mode mode() const noexcept { return get().mode(); }
  [[nodiscard]] std::optional<std::size_t> max_pending_bytes() const noexcept
  { return get().max_pending_bytes(); }
  /// Bytes freed by the caller that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_bytes() const { return get().pending_bytes(); }
  /// Freed blocks that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_count() const { return get().pending_count(); }
  [[nodiscard]] sync_on_free_stats stats() const { return get().stats(); }
};

static_assert(cuda::mr::resource_with<sync_on_free_resource_adaptor, cuda::mr::device_accessible>,
              "sync_on_free_resource_adaptor does not satisfy the cuda::mr::resource concept");

}  // namespace rmm_fences::mr
