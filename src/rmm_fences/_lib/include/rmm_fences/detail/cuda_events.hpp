/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism (docs/design.md#layers, CUDA platforms): pooled events as fences, capture state,
 * stream keys and identities, device guard.
 */
#pragma once

#include <rmm_fences/detail/driver_api.hpp>
#include <rmm_fences/detail/stream_identity.hpp>

#include <rmm/cuda_device.hpp>
#include <rmm/detail/error.hpp>
#include <rmm/error.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace rmm_fences::mr::detail {

/// What a non-blocking test of a fence found.
enum class fence_state : int {
  complete = 0,  ///< the work before the record ran
  pending  = 1,  ///< not yet
  failed   = 2,  ///< the test itself failed (no information): never read as complete
};

/**
 * @brief A pool of timing-disabled events of one device, reused as fences.
 *
 * Thread-safe. Events are created on the pool's device and destroyed with the pool.
 */
class event_pool {
 public:
  explicit event_pool(rmm::cuda_device_id device) : device_{device} {}

  event_pool(event_pool const&)            = delete;
  event_pool& operator=(event_pool const&) = delete;

  ~event_pool() { destroy_all(); }

  /// An unrecorded event of the pool's device (created when the pool is empty).
  [[nodiscard]] cudaEvent_t acquire()
  {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        auto event = free_.back();
        free_.pop_back();
        return event;
      }
    }
    rmm::cuda_set_device_raii guard{device_};
    cudaEvent_t event{};
    RMM_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }

  /// Returns an event whose fence is no longer needed.
  void release(cudaEvent_t event) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      free_.push_back(event);
    } catch (...) {
      (void)cudaEventDestroy(event);
    }
  }

  /// Destroys every pooled event (call only when the CUDA context is still alive).
  void destroy_all() noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto event : free_) {
      (void)cudaEventDestroy(event);
    }
    free_.clear();
  }

  /// Forgets the pooled events without CUDA calls (process exit).
  void abandon() noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.clear();
  }

 private:
  rmm::cuda_device_id device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

/**
 * @brief True when `stream` is being captured into a graph (no event query or sync on it).
 *
 * The legacy default stream reports `cudaErrorStreamCaptureImplicit` while a blocking stream
 * is captured: that counts as capturing too.
 */
inline bool is_capturing(cuda::stream_ref stream) noexcept
{
  if (auto const query = driver_api::get().stream_is_capturing; query != nullptr) {
    CUstreamCaptureStatus status{CU_STREAM_CAPTURE_STATUS_NONE};
    auto const result = query(reinterpret_cast<CUstream>(stream.get()), &status);
    if (result == CUDA_SUCCESS) { return status != CU_STREAM_CAPTURE_STATUS_NONE; }
    if (result == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) { return true; }
  }
  cudaStreamCaptureStatus status{cudaStreamCaptureStatusNone};
  auto const result = cudaStreamIsCapturing(stream.get(), &status);
  if (result == cudaSuccess) { return status != cudaStreamCaptureStatusNone; }
  (void)cudaGetLastError();
  return result == cudaErrorStreamCaptureImplicit;
}

/**
 * @brief The CUDA operations every platform shares: pooled or created events as fences
 * (`fence_type`), `record`, the fence tests `query` / `ready`, `host_wait` (the host blocks),
 * `device_wait` (a stream waits on the device: the host does not block), `is_capturing`,
 * `sync_stream`; how streams are named: `key` and back `stream`, `query_stream_id`,
 * `captured_stream_id`; `sync_device_of` for the platforms' `sync_device`.
 *
 * `query`, `ready`, `host_wait`, `record`, `device_wait` and `sync_stream` run in relaxed
 * capture mode: while another thread captures in the global mode (the default of
 * `cudaStreamBeginCapture` and `torch.cuda.graph`), an event query, record or sync from this
 * thread would otherwise fail and invalidate that capture. An error is never read as
 * "complete": `query` says `failed`, `ready` false and `host_wait` false, so no caller may
 * release a block or count a check on it. `deferred_free_list` uses `ready` and `host_wait`
 * (and the platform's `release_fence`, once the last block sharing a fence left the list).
 */
struct cuda_platform_base {
  using fence_type = cudaEvent_t;

  static fence_state query(cudaEvent_t event) noexcept
  {
    relaxed_capture_scope relaxed;
    if (auto const q = driver_api::get().event_query; q != nullptr) {
      auto const result = q(event);
      if (result == CUDA_SUCCESS) { return fence_state::complete; }
      if (result == CUDA_ERROR_NOT_READY) { return fence_state::pending; }
      // anything else (no current context, say): ask the runtime, which sets one up
    }
    auto const status = cudaEventQuery(event);
    if (status == cudaSuccess) { return fence_state::complete; }
    (void)cudaGetLastError();
    return status == cudaErrorNotReady ? fence_state::pending : fence_state::failed;
  }

  /// True only when the event is known to have completed.
  static bool ready(cudaEvent_t event) noexcept { return query(event) == fence_state::complete; }

  /// Blocks the host until the event completed; false when the wait failed (nothing is known
  /// then).
  static bool host_wait(cudaEvent_t event) noexcept
  {
    relaxed_capture_scope relaxed;
    if (cudaEventSynchronize(event) == cudaSuccess) { return true; }
    (void)cudaGetLastError();
    return false;
  }

  /// Records `event` after the work queued on `stream`; false: not recorded.
  static bool record(cudaEvent_t event, cuda::stream_ref stream) noexcept
  {
    relaxed_capture_scope relaxed;
    if (auto const rec = driver_api::get().event_record; rec != nullptr) {
      if (rec(reinterpret_cast<CUevent>(event), reinterpret_cast<CUstream>(stream.get())) ==
          CUDA_SUCCESS) {
        return true;
      }
    }
    if (cudaEventRecord(event, stream.get()) == cudaSuccess) { return true; }
    (void)cudaGetLastError();
    return false;
  }

  /// Enqueues on `waiter` a wait for `event` (device side: the host does not block).
  static bool device_wait(cuda::stream_ref waiter, cudaEvent_t event) noexcept
  {
    relaxed_capture_scope relaxed;
    if (auto const wait = driver_api::get().stream_wait_event; wait != nullptr) {
      if (wait(reinterpret_cast<CUstream>(waiter.get()), reinterpret_cast<CUevent>(event), 0) ==
          CUDA_SUCCESS) {
        return true;
      }
    }
    if (cudaStreamWaitEvent(waiter.get(), event, 0) == cudaSuccess) { return true; }
    (void)cudaGetLastError();
    return false;
  }

  static bool is_capturing(cuda::stream_ref stream) noexcept
  { return rmm_fences::mr::detail::is_capturing(stream); }

  /// Blocks the host until `stream`'s work ran; false when that failed (nothing is known then).
  static bool sync_stream(cuda::stream_ref stream) noexcept
  {
    relaxed_capture_scope relaxed;
    if (cudaStreamSynchronize(stream.get()) == cudaSuccess) { return true; }
    (void)cudaGetLastError();
    return false;
  }

  /**
   * @brief The key of `stream` in a core's records, without a CUDA call: its handle; the legacy
   * default stream is 0 however it is named, and the per-thread default stream (one handle on
   * every thread, another stream on each) is keyed by its thread (`per_thread_stream_keys`).
   */
  static std::uintptr_t key(cuda::stream_ref stream) noexcept
  {
    auto const handle = stream.get();
    if (handle == cudaStreamPerThread) {
      return per_thread_stream_keys::key(per_thread_stream_keys::this_thread_token());
    }
    return handle == cudaStreamLegacy ? 0 : reinterpret_cast<std::uintptr_t>(handle);
  }

  /// The stream of `key`, or nullopt for another thread's per-thread default stream (its
  /// handle would name the calling thread's own).
  static std::optional<cuda::stream_ref> stream(std::uintptr_t key) noexcept
  {
    if (per_thread_stream_keys::is_per_thread(key)) {
      if (key != per_thread_stream_keys::key(per_thread_stream_keys::this_thread_token())) {
        return std::nullopt;
      }
      return cuda::stream_ref{cudaStreamPerThread};
    }
    return cuda::stream_ref{reinterpret_cast<cudaStream_t>(key)};
  }

  /**
   * @brief The process-unique id of the stream `handle` (`cuStreamGetId`, else the runtime's
   * `cudaStreamGetId`): never reused, so a handle reused after `cudaStreamDestroy` has a new
   * one. Empty when neither answers.
   *
   * Never on a capturing stream: the query would invalidate the capture. The caller chooses the
   * capture mode it runs in (a `relaxed_capture_scope` or not).
   */
  static std::optional<std::uint64_t> query_stream_id(cudaStream_t handle) noexcept
  {
    unsigned long long id{};
    if (auto const get = driver_api::get().stream_get_id; get != nullptr) {
      if (get(reinterpret_cast<CUstream>(handle), &id) == CUDA_SUCCESS) { return id; }
    }
    if (cudaStreamGetId(handle, &id) == cudaSuccess) { return id; }
    (void)cudaGetLastError();
    return std::nullopt;
  }

  /**
   * @brief The identity of the capturing stream `handle`: its capture id mixed with its handle
   * (`capturing_stream_identity`, bit 62 set: stream ids never reach it), or, when the capture
   * cannot be asked, the handle with bits 61 and 62 set.
   */
  static std::uint64_t captured_stream_id(cudaStream_t handle) noexcept
  {
    cudaStreamCaptureStatus status{};
    unsigned long long id{};
    if (cudaStreamGetCaptureInfo(handle, &status, &id) == cudaSuccess) {
      return capturing_stream_identity(id, reinterpret_cast<std::uintptr_t>(handle));
    }
    (void)cudaGetLastError();
    return (std::uint64_t{3} << 61) | reinterpret_cast<std::uintptr_t>(handle);
  }

 protected:
  /// Synchronizes `device` (in the caller's capture mode); false when that failed.
  static bool sync_device_of(rmm::cuda_device_id device) noexcept
  {
    rmm::cuda_set_device_raii guard{device};
    if (cudaDeviceSynchronize() == cudaSuccess) { return true; }
    (void)cudaGetLastError();
    return false;
  }
};

/**
 * @brief The CUDA side of `sync_on_free_core`: pooled events as fences on one device.
 *
 * Records, stream waits and syncs run in relaxed capture mode: while another thread captures in
 * the global mode, this thread's calls then neither fail for that reason nor invalidate that
 * capture (an identity query needs no such scope: `stream_id`). A sync that fails returns
 * false (the core never counts it or frees on it).
 */
class cuda_platform : public cuda_platform_base {
 public:
  using stream_type   = cuda::stream_ref;
  using out_of_memory = rmm::out_of_memory;

  explicit cuda_platform(rmm::cuda_device_id device) : device_{device}, events_{device} {}

  /// A pooled event; one is created (in relaxed capture mode) when the pool is empty.
  [[nodiscard]] cudaEvent_t acquire_fence()
  {
    relaxed_capture_scope relaxed;
    return events_.acquire();
  }

  void release_fence(cudaEvent_t event) noexcept { events_.release(event); }

  /// Synchronizes the adaptor's device; false when that failed (nothing is known then).
  bool sync_device() noexcept
  {
    relaxed_capture_scope relaxed;
    return sync_device_of(device_);
  }

  /// The process-unique id of `stream` (`query_stream_id`), or 0 when unknown. Never called on
  /// a capturing stream; asked of one that is not, it leaves another thread's global-mode
  /// capture valid (docs/design.md#stream-identity-and-capture), so it runs in the caller's
  /// capture mode: no exchange of it.
  static std::uint64_t stream_id(cuda::stream_ref stream) noexcept
  { return query_stream_id(stream.get()).value_or(0); }

  static cuda::stream_ref default_stream() noexcept { return cuda::stream_ref{cudaStream_t{}}; }

  [[nodiscard]] rmm::cuda_device_id device() const noexcept { return device_; }

  [[nodiscard]] event_pool& events() noexcept { return events_; }

 private:
  rmm::cuda_device_id device_;
  event_pool events_;
};

}  // namespace rmm_fences::mr::detail
