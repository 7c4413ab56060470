/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm/aligned.hpp>
#include <rmm/detail/error.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

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

/// Host nanoseconds of the CUDA calls a deferred free makes (means over `iterations`).
struct fence_costs {
  double event_record{};       ///< cudaEventRecord of an idle timing-disabled event
  double event_query{};        ///< cudaEventQuery of a completed event
  double stream_is_capturing{};///< cudaStreamIsCapturing
};

/// Measures `fence_costs` on `stream` (which should be idle).
inline fence_costs fence_call_ns(cuda::stream_ref stream, std::uint64_t iterations)
{
  using clock = std::chrono::steady_clock;
  auto per_call = [iterations](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::nano>(b - a).count() /
           static_cast<double>(iterations);
  };
  cudaEvent_t event{};
  RMM_CUDA_TRY(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  fence_costs costs;
  auto t0 = clock::now();
  for (std::uint64_t i = 0; i < iterations; ++i) {
    (void)cudaEventRecord(event, stream.get());
  }
  auto t1 = clock::now();
  (void)cudaEventSynchronize(event);
  auto t2 = clock::now();
  for (std::uint64_t i = 0; i < iterations; ++i) {
    (void)cudaEventQuery(event);
  }
  auto t3 = clock::now();
  cudaStreamCaptureStatus status{};
  for (std::uint64_t i = 0; i < iterations; ++i) {
    (void)cudaStreamIsCapturing(stream.get(), &status);
  }
  auto t4 = clock::now();
  (void)cudaEventDestroy(event);
  costs.event_record        = per_call(t0, t1);
  costs.event_query         = per_call(t2, t3);
  costs.stream_is_capturing = per_call(t3, t4);
  return costs;
}

}  // namespace rmm_fences::bench
