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
 * `sync_mode::stream` synchronizes the freeing stream, and `sync_mode::deferred` hands the block
 * to the upstream only once an event recorded on the freeing stream after the free completed,
 * never blocking the host in `deallocate`. Consecutive deferred frees on one stream share one
 * event, recorded once `max_batch_frees` frees or `max_batch_bytes` bytes are waiting for it
 * (and whenever the adaptor needs the blocks back). With `reuse_on_stream`, a deferred-mode
 * allocation first takes back a block of the same size and alignment among the last 16 frees
 * on its own stream: stream order puts the new work after the old (no event, no upstream
 * call).
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
   * @param max_batch_frees in deferred mode, the most frees on one stream that wait for one
   * event before it is recorded (at least 1; 1: an event per free)
   * @param max_batch_bytes in deferred mode, the most bytes freed on one stream that wait for
   * one event before it is recorded (positive); no byte limit when empty
   * @param reuse_on_stream in deferred mode, an allocation may take back a block of its size
   * and alignment among the last 16 frees on its own stream (not capturing)
   * @throws std::invalid_argument when `max_batch_frees` or `max_batch_bytes` is 0
   */
  explicit sync_on_free_resource_adaptor(
    cuda::mr::any_resource<cuda::mr::device_accessible> upstream,
    sync_mode mode                               = sync_mode::deferred,
    std::optional<std::size_t> max_pending_bytes = std::nullopt,
    std::size_t max_batch_frees                  = default_max_batch_frees,
    std::optional<std::size_t> max_batch_bytes   = default_max_batch_bytes,
    bool reuse_on_stream                         = true)
    : shared_base(cuda::std::in_place_type<detail::sync_on_free_resource_adaptor_impl>,
                  std::move(upstream),
                  mode,
                  max_pending_bytes,
                  max_batch_frees,
                  max_batch_bytes,
                  reuse_on_stream)
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
  [[nodiscard]] std::size_t max_batch_frees() const noexcept { return get().max_batch_frees(); }
  [[nodiscard]] std::optional<std::size_t> max_batch_bytes() const noexcept
  { return get().max_batch_bytes(); }
  /// Whether a deferred-mode allocation may take back a block freed lately on its stream.
  [[nodiscard]] bool reuse_on_stream() const noexcept { return get().reuse_on_stream(); }
  /// Bytes freed by the caller that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_bytes() const { return get().pending_bytes(); }
  /// Freed blocks that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_count() const { return get().pending_count(); }
  [[nodiscard]] sync_on_free_stats stats() const { return get().stats(); }
};

static_assert(cuda::mr::resource_with<sync_on_free_resource_adaptor, cuda::mr::device_accessible>,
              "sync_on_free_resource_adaptor does not satisfy the cuda::mr::resource concept");

}  // namespace rmm_fences::mr
