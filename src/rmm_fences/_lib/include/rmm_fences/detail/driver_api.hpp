/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism (docs/design.md#layers, CUDA platforms): the few driver entry points on the
 * deferred-free hot path, obtained through the runtime (no link against libcuda). The driver calls
 * skip the runtime's per-call bookkeeping; every caller falls back to the runtime call when an
 * entry point is missing or the driver reports no current context.
 */
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace rmm_fences::mr::detail {

/// The driver's entry point `name` of ABI `version` (through the runtime), or nullptr where
/// the driver does not provide it.
template <typename Fn>
Fn driver_entry_point(char const* name, int version = 12000) noexcept
{
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) !=
        cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

/// Driver entry points, loaded once per process.
struct driver_api {
  using event_record_fn  = CUresult (*)(CUevent, CUstream);
  using event_query_fn   = CUresult (*)(CUevent);
  using is_capturing_fn  = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  using stream_get_id_fn = CUresult (*)(CUstream, unsigned long long*);
  using stream_wait_fn   = CUresult (*)(CUstream, CUevent, unsigned int);
  using exchange_mode_fn = CUresult (*)(CUstreamCaptureMode*);
  using address_range_fn = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);

  event_record_fn event_record{};
  event_query_fn event_query{};
  is_capturing_fn stream_is_capturing{};
  stream_get_id_fn stream_get_id{};
  stream_wait_fn stream_wait_event{};
  exchange_mode_fn exchange_capture_mode{};
  address_range_fn mem_get_address_range{};

  /// The process-wide table (entries stay null where the driver does not provide them).
  static driver_api const& get() noexcept
  {
    static driver_api const api = load();
    return api;
  }

 private:
  template <typename Fn>
  static Fn entry(char const* name) noexcept
  { return driver_entry_point<Fn>(name); }

  static driver_api load() noexcept
  {
    driver_api api;
    api.event_record          = entry<event_record_fn>("cuEventRecord");
    api.event_query           = entry<event_query_fn>("cuEventQuery");
    api.stream_is_capturing   = entry<is_capturing_fn>("cuStreamIsCapturing");
    api.stream_get_id         = entry<stream_get_id_fn>("cuStreamGetId");
    api.stream_wait_event     = entry<stream_wait_fn>("cuStreamWaitEvent");
    api.exchange_capture_mode = entry<exchange_mode_fn>("cuThreadExchangeStreamCaptureMode");
    api.mem_get_address_range = entry<address_range_fn>("cuMemGetAddressRange");
    return api;
  }
};

/**
 * @brief Puts the calling thread in relaxed stream-capture mode for its lifetime.
 *
 * In the default (global) mode, "potentially unsafe" calls such as `cuStreamGetId` or
 * `cudaMalloc` made while any capture is under way fail and invalidate that capture; relaxed
 * mode allows them. The previous mode is restored on exit. Cheap: a thread-local exchange.
 */
class relaxed_capture_scope {
 public:
  relaxed_capture_scope() noexcept
  {
    if (auto const exchange = driver_api::get().exchange_capture_mode; exchange != nullptr) {
      mode_   = CU_STREAM_CAPTURE_MODE_RELAXED;
      active_ = exchange(&mode_) == CUDA_SUCCESS;
    }
  }
  ~relaxed_capture_scope()
  {
    if (active_) { (void)driver_api::get().exchange_capture_mode(&mode_); }
  }
  relaxed_capture_scope(relaxed_capture_scope const&)            = delete;
  relaxed_capture_scope& operator=(relaxed_capture_scope const&) = delete;

 private:
  CUstreamCaptureMode mode_{};
  bool active_{};
};

}  // namespace rmm_fences::mr::detail
