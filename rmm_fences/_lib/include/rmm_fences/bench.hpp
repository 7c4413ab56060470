/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm/aligned.hpp>
#include <rmm/detail/error.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <rmm_fences/detail/driver_api.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rmm_fences::bench {

/**
 * @brief Mean host nanoseconds of one allocate + deallocate pair of `bytes` on `stream`.
 *
 * Runs `warmup` untimed pairs first. Only host time is measured: no kernel touches the blocks.
 */
inline double alloc_free_ns(rmm::device_async_resource_ref mr,
                            std::size_t bytes,
                            std::uint64_t iterations,
                            cuda::stream_ref stream,
                            std::uint64_t warmup)
{
  for (std::uint64_t i = 0; i < warmup; ++i) {
    mr.deallocate(stream, mr.allocate(stream, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT), bytes,
                  rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
  auto const start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < iterations; ++i) {
    mr.deallocate(stream, mr.allocate(stream, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT), bytes,
                  rmm::CUDA_ALLOCATION_ALIGNMENT);
  }
  auto const stop = std::chrono::steady_clock::now();
  auto const ns   = std::chrono::duration<double, std::nano>(stop - start).count();
  return iterations == 0 ? 0.0 : ns / static_cast<double>(iterations);
}

/// Host nanoseconds of the CUDA calls a deferred free makes (means over `iterations`), through
/// the runtime and through the driver entry points the resources use (0 where missing).
struct fence_costs {
  double event_record{};            ///< cudaEventRecord of a timing-disabled event
  double event_query{};             ///< cudaEventQuery of a completed event
  double stream_is_capturing{};     ///< cudaStreamIsCapturing
  double cu_event_record{};         ///< cuEventRecord
  double cu_event_query{};          ///< cuEventQuery
  double cu_stream_is_capturing{};  ///< cuStreamIsCapturing
};

/// Measures `fence_costs` on `stream` (which should be idle).
inline fence_costs fence_call_ns(cuda::stream_ref stream, std::uint64_t iterations)
{
  using clock = std::chrono::steady_clock;
  auto time = [iterations](auto&& call) {
    auto const start = clock::now();
    for (std::uint64_t i = 0; i < iterations; ++i) {
      call();
    }
    return std::chrono::duration<double, std::nano>(clock::now() - start).count() /
           static_cast<double>(iterations);
  };
  cudaEvent_t event{};
  RMM_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  auto const cu_event  = reinterpret_cast<CUevent>(event);
  auto const cu_stream = reinterpret_cast<CUstream>(stream.get());
  auto const& api      = rmm_fences::detail::driver_api::get();
  cudaStreamCaptureStatus status{};
  CUstreamCaptureStatus cu_status{};
  fence_costs costs;
  costs.event_record = time([&] { (void)cudaEventRecord(event, stream.get()); });
  (void)cudaEventSynchronize(event);
  costs.event_query         = time([&] { (void)cudaEventQuery(event); });
  costs.stream_is_capturing = time([&] { (void)cudaStreamIsCapturing(stream.get(), &status); });
  if (api.event_record != nullptr) {
    costs.cu_event_record = time([&] { (void)api.event_record(cu_event, cu_stream); });
    (void)cudaEventSynchronize(event);
  }
  if (api.event_query != nullptr) {
    costs.cu_event_query = time([&] { (void)api.event_query(cu_event); });
  }
  if (api.stream_is_capturing != nullptr) {
    costs.cu_stream_is_capturing =
      time([&] { (void)api.stream_is_capturing(cu_stream, &cu_status); });
  }
  (void)cudaEventDestroy(event);
  return costs;
}

}  // namespace rmm_fences::bench
