/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/cuda_events.hpp>
#include <rmm_fences/detail/missing_gpu.hpp>
#include <rmm_fences/detail/sync_on_free_core.hpp>

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
 * @brief Implementation of `sync_on_free_resource_adaptor`: the policy core on CUDA events,
 * bound to the device current at construction.
 */
class sync_on_free_resource_adaptor_impl {
  using upstream_type = cuda::mr::any_resource<cuda::mr::device_accessible>;
  using core_type =
    rmm_fences::mr::detail::sync_on_free_core<rmm_fences::mr::detail::cuda_platform, upstream_type>;

 public:
  /// Throws `std::invalid_argument` when `max_batch_frees` or `max_batch_bytes` is 0.
  sync_on_free_resource_adaptor_impl(upstream_type upstream,
                                     sync_mode mode,
                                     std::optional<std::size_t> max_pending_bytes,
                                     std::size_t max_batch_frees,
                                     std::optional<std::size_t> max_batch_bytes,
                                     bool reuse_on_stream)
    : core_{std::move(upstream),
            mode,
            max_pending_bytes,
            batch_limits{max_batch_frees, max_batch_bytes},
            reuse_on_stream,
            rmm::get_current_cuda_device()}
  {
  }

  /// Drains every pending block to the upstream, unless the process is exiting (no CUDA call).
  ~sync_on_free_resource_adaptor_impl()
  {
    auto& platform = core_.platform();
    if (rmm::process_is_exiting()) {
      platform.events().abandon();
      return;
    }
    rmm::cuda_set_device_raii guard{platform.device()};
    try {
      core_.drain(/*include_parked=*/true, platform.default_stream());
    } catch (...) {
      // Out of host memory while draining: the remaining blocks are leaked, never reused early.
    }
    platform.events().destroy_all();
  }

  sync_on_free_resource_adaptor_impl(sync_on_free_resource_adaptor_impl const&)            = delete;
  sync_on_free_resource_adaptor_impl(sync_on_free_resource_adaptor_impl&&)                 = delete;
  sync_on_free_resource_adaptor_impl& operator=(sync_on_free_resource_adaptor_impl const&) = delete;
  sync_on_free_resource_adaptor_impl& operator=(sync_on_free_resource_adaptor_impl&&)      = delete;

  bool operator==(sync_on_free_resource_adaptor_impl const& other) const noexcept
  { return this == std::addressof(other); }
  bool operator!=(sync_on_free_resource_adaptor_impl const& other) const noexcept
  { return !(*this == other); }

  /// Returns ready blocks upstream, then allocates; drains and retries once on out-of-memory.
  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    try {
      return core_.allocate(stream, bytes, alignment);
    } catch (...) {
      rethrow_allocation_error("SyncOnFreeResourceAdaptor");
    }
  }

  /// Frees by the mode's rule; never blocks in deferred mode. A bad free (double free, foreign
  /// pointer, size mismatch) changes nothing: counted in `rejected_frees`, one line on stderr.
  /// A null free is a no-op (nothing counted, nothing reaches the upstream).
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  {
    if (ptr == nullptr) { return; }
    core_.deallocate(stream, ptr, bytes, alignment);
  }

  /**
   * @brief `deallocate` that returns what the check of the free found instead of printing it.
   *
   * On a double free, a foreign pointer or a size mismatch nothing is done. A null free is a
   * no-op: `untracked`, nothing counted, nothing reaches the upstream.
   */
  rmm_fences::mr::free_result deallocate_checked(
    cuda::stream_ref stream,
    void* ptr,
    std::size_t bytes,
    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  {
    if (ptr == nullptr) { return {rmm_fences::mr::free_check::untracked, 0}; }
    return core_.deallocate_checked(stream, ptr, bytes, alignment);
  }

  /// Allocates on the default stream and synchronizes it.
  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT)
  {
    auto const stream = core_.platform().default_stream();
    auto* ptr         = allocate(stream, bytes, alignment);
    stream.sync();
    return ptr;
  }

  /// Frees on the default stream, by the mode's rule.
  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept
  { deallocate(core_.platform().default_stream(), ptr, bytes, alignment); }

  /// Blocks until every pending block went upstream, except those whose fence wait and a device
  /// synchronization both failed (a capture under way): they stay pending. Batches of streams
  /// other than the default stream have no fence yet: a device synchronization covers them.
  void flush()
  {
    auto& platform = core_.platform();
    rmm::cuda_set_device_raii guard{platform.device()};
    core_.drain(/*include_parked=*/true, platform.default_stream());
  }

  [[nodiscard]] rmm::device_async_resource_ref get_upstream_resource() const noexcept
  { return rmm::device_async_resource_ref{const_cast<upstream_type&>(core_.upstream())}; }

  [[nodiscard]] sync_mode mode() const noexcept { return core_.mode(); }
  [[nodiscard]] std::optional<std::size_t> max_pending_bytes() const noexcept
  { return core_.max_pending_bytes(); }
  [[nodiscard]] std::size_t max_batch_frees() const noexcept { return core_.max_batch_frees(); }
  [[nodiscard]] std::optional<std::size_t> max_batch_bytes() const noexcept
  { return core_.max_batch_bytes(); }

  [[nodiscard]] bool reuse_on_stream() const noexcept { return core_.reuse_on_stream(); }
  [[nodiscard]] std::size_t pending_bytes() const { return core_.pending_bytes(); }
  [[nodiscard]] std::size_t pending_count() const { return core_.pending_count(); }
  [[nodiscard]] std::size_t live_count() const { return core_.live_count(); }
  [[nodiscard]] sync_on_free_stats stats() const { return core_.stats(); }

  friend void get_property(sync_on_free_resource_adaptor_impl const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

 private:
  core_type core_;
};

}  // namespace rmm_fences::mr::detail
