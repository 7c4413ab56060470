/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm/aligned.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream>

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

}  // namespace rmm_fences::bench
