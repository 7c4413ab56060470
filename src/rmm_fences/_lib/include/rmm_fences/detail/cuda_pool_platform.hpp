/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism (docs/design.md#layers, CUDA platforms) of the stream-ordered pool: stream
 * identity, fences, fence queries (`ready`, from `cuda_platform_base`), device-side waits.
 */
#pragma once

#include <rmm_fences/detail/cuda_events.hpp>
#include <rmm_fences/detail/driver_api.hpp>

#include <rmm/cuda_device.hpp>
#include <rmm/detail/error.hpp>
#include <rmm/error.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>

namespace rmm_fences::mr::detail {

/// `stream_ordered_pool_core`'s platform on one CUDA device.
class cuda_pool_platform : public cuda_platform_base {
 public:
  using stream_type   = cuda::stream_ref;
  using out_of_memory = rmm::out_of_memory;

  /// The identity used for the legacy default stream (real stream ids count up from small
  /// numbers and never reach it).
  static constexpr std::uint64_t legacy_stream_id = std::numeric_limits<std::uint64_t>::max();

  explicit cuda_pool_platform(rmm::cuda_device_id device) : device_{device} {}
  cuda_pool_platform(cuda_pool_platform const&)            = delete;
  cuda_pool_platform& operator=(cuda_pool_platform const&) = delete;

  [[nodiscard]] rmm::cuda_device_id device() const noexcept { return device_; }

  /**
   * @brief The identity of `stream`: `cuStreamGetId`, unique for the process's lifetime, so a
   * handle reused after `cudaStreamDestroy` is a new identity. The legacy default stream
   * (handle 0 or `cudaStreamLegacy`) has a fixed identity without a call; the per-thread
   * default stream's identity is looked up once per thread and device.
   *
   * `cuStreamGetId` on a capturing stream invalidates the capture in every capture mode (seen
   * on the H200, driver 580), so a capturing stream is identified by its capture id mixed with
   * its handle (`captured_stream_id`): streams forked into one capture share the id, and must
   * not share a cache (their branches run in parallel in the graph).
   */
  std::uint64_t stream_id(cuda::stream_ref stream) const noexcept
  {
    auto const handle = stream.get();
    if (handle == nullptr || handle == cudaStreamLegacy) { return legacy_stream_id; }
    if (rmm_fences::mr::detail::is_capturing(stream)) { return captured_stream_id(handle); }
    if (handle == cudaStreamPerThread) {
      thread_local int cached_device = -1;
      thread_local std::uint64_t cached_id{};
      if (cached_device != device_.value()) {
        cached_id     = query_id(handle);
        cached_device = device_.value();
      }
      return cached_id;
    }
    return query_id(handle);
  }

  /**
   * @brief A new event: the fence of one stream slot, re-recorded at each of its fences.
   *
   * The core keeps it while its slot or a block it tags needs it, so the events held stay
   * bounded however many streams come and go (`stats["fence_events"]`). Created and destroyed
   * in relaxed capture mode: a slot is retired, and its fence dropped, during ordinary calls,
   * possibly while another thread captures in the global mode.
   */
  [[nodiscard]] cudaEvent_t acquire_fence() const
  {
    rmm::cuda_set_device_raii guard{device_};
    relaxed_capture_scope relaxed;
    cudaEvent_t event{};
    RMM_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }

  static void release_fence(cudaEvent_t event) noexcept
  {
    relaxed_capture_scope relaxed;
    if (cudaEventDestroy(event) != cudaSuccess) { (void)cudaGetLastError(); }
  }

  /// Synchronizes the pool's device: only for the resource's named reclaim and its
  /// destructor, never from the policy core.
  bool sync_device() const noexcept { return sync_device_of(device_); }

  /**
   * @brief Ties `fn(ctx)` to the graph `stream` captures into: a user object whose destructor
   * is `fn(ctx)`, retained by the graph being captured (`cudaGraphRetainUserObject` with
   * `cudaGraphUserObjectMove`); every executable graph instantiated from it retains it too,
   * and the driver releases an executable graph's references once its launches complete. So
   * `fn(ctx)` runs, on a thread of the driver, once the graph and every executable graph of it
   * are destroyed and no launch is pending. False, and `fn(ctx)` at once, when `stream` is not
   * captured or no user object could be retained (then `fn` runs when it is released).
   */
  static bool retain_until_graph_destroyed(cuda::stream_ref stream,
                                           void (*fn)(void*),
                                           void* ctx) noexcept
  {
    cudaStreamCaptureStatus status{};
    cudaGraph_t graph{};
    if (cudaStreamGetCaptureInfo(stream.get(), &status, nullptr, &graph) != cudaSuccess ||
        status != cudaStreamCaptureStatusActive || graph == nullptr) {
      (void)cudaGetLastError();
      fn(ctx);
      return false;
    }
    cudaUserObject_t object{};
    if (cudaUserObjectCreate(&object, ctx, fn, 1, cudaUserObjectNoDestructorSync) != cudaSuccess) {
      (void)cudaGetLastError();
      fn(ctx);
      return false;
    }
    if (cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove) != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaUserObjectRelease(object, 1);  // runs fn(ctx): the hold stays unattached
      return false;
    }
    return true;
  }

  /**
   * @brief False when `stream` is known to belong to another device than the pool's.
   *
   * Called once per stream identity (when its slot is created). Uses `cuStreamGetDevice`
   * (CUDA 12.8 drivers and later; without it, only the legacy and per-thread default streams
   * are checked, against the current device). A capturing stream is not checked (a query
   * could invalidate the capture).
   */
  bool stream_on_device(cuda::stream_ref stream) const noexcept
  {
    auto const handle = stream.get();
    if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
      int current = -1;
      if (cudaGetDevice(&current) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
      }
      return current == device_.value();
    }
    if (rmm_fences::mr::detail::is_capturing(stream)) { return true; }
    using get_device_fn   = CUresult (*)(CUstream, CUdevice*);
    static auto const get = driver_entry_point<get_device_fn>("cuStreamGetDevice", 12080);
    if (get == nullptr) { return true; }
    relaxed_capture_scope relaxed;
    CUdevice dev{};
    if (get(reinterpret_cast<CUstream>(handle), &dev) != CUDA_SUCCESS) { return true; }
    return static_cast<int>(dev) == device_.value();
  }

  /// The pool's own non-blocking stream on its device (created on first use).
  cuda::stream_ref private_stream()
  {
    std::lock_guard<std::mutex> lock(private_mutex_);
    if (private_ == nullptr) {
      rmm::cuda_set_device_raii guard{device_};
      relaxed_capture_scope relaxed;
      RMM_CUDA_TRY(cudaStreamCreateWithFlags(&private_, cudaStreamNonBlocking));
    }
    return cuda::stream_ref{private_};
  }

  void destroy_private_stream() noexcept
  {
    std::lock_guard<std::mutex> lock(private_mutex_);
    if (private_ != nullptr) {
      rmm::cuda_set_device_raii guard{device_};
      (void)cudaStreamDestroy(private_);  // its pending work still runs (no host wait)
      (void)cudaGetLastError();
      private_ = nullptr;
    }
  }

  static void report_rejected_free(char const* line) noexcept
  { std::fprintf(stderr, "%s\n", line); }

  static cuda::stream_ref default_stream() noexcept { return cuda::stream_ref{cudaStream_t{}}; }

  /// Scope for calls that are not capture-safe (upstream growth, device sync).
  static relaxed_capture_scope relax() noexcept { return {}; }

  [[noreturn]] static void throw_out_of_memory(std::size_t bytes, std::size_t pool_bytes)
  {
    throw rmm::out_of_memory{"StreamOrderedPoolMemoryResource: cannot allocate " +
                             std::to_string(bytes) + " bytes (pool holds " +
                             std::to_string(pool_bytes) + " bytes)"};
  }

 private:
  static std::uint64_t query_id(cudaStream_t handle) noexcept
  {
    // `handle` is not capturing (checked first); a query of it leaves another stream's
    // global-mode capture valid (docs/stream_ordered_pool.md, measured on an H200), so no
    // capture-mode exchange.
    if (auto const id = query_stream_id(handle)) { return *id; }
    // An invalid handle: give it an identity of its own that is never shared.
    return reinterpret_cast<std::uintptr_t>(handle) | (std::uint64_t{1} << 63);
  }

  rmm::cuda_device_id device_;
  std::mutex private_mutex_;
  cudaStream_t private_{};
};

}  // namespace rmm_fences::mr::detail
