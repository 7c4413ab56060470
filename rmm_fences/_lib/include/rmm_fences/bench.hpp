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

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

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
  double cu_stream_get_id{};        ///< cuStreamGetId
  double relaxed_capture_scope{};   ///< two cuThreadExchangeStreamCaptureMode (enter, leave)
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
  if (api.stream_get_id != nullptr) {
    unsigned long long id{};
    costs.cu_stream_get_id = time([&] { (void)api.stream_get_id(cu_stream, &id); });
  }
  costs.relaxed_capture_scope = time([] { rmm_fences::detail::relaxed_capture_scope scope; });
  (void)cudaEventDestroy(event);
  return costs;
}

/**
 * @brief Operations per second of a random allocate/free mix (the shape of RMM's
 * RANDOM_ALLOCATIONS benchmark): sizes uniform in [min_size, max_size], at most `max_live`
 * blocks and `max_live_bytes` live, each step allocating or freeing a random live block.
 * Everything still live at the end is freed (and timed).
 */
inline double random_allocations_ops(rmm::device_async_resource_ref mr,
                                     std::uint64_t operations,
                                     std::size_t max_live,
                                     std::size_t min_size,
                                     std::size_t max_size,
                                     std::size_t max_live_bytes,
                                     std::uint64_t seed,
                                     cuda::stream_ref stream)
{
  std::mt19937_64 rng{seed};
  std::uniform_int_distribution<std::size_t> size_of{min_size, max_size};
  std::vector<std::pair<void*, std::size_t>> live;
  live.reserve(max_live);
  std::size_t live_bytes = 0;
  std::uint64_t done     = 0;
  auto const start       = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < operations; ++i) {
    auto const size    = size_of(rng);
    bool const can_add = live.size() < max_live && live_bytes + size <= max_live_bytes;
    if (can_add && (live.empty() || (rng() & 1U) != 0)) {
      live.emplace_back(mr.allocate(stream, size, rmm::CUDA_ALLOCATION_ALIGNMENT), size);
      live_bytes += size;
    } else {
      auto const k = static_cast<std::size_t>(rng() % live.size());
      std::swap(live[k], live.back());
      mr.deallocate(stream, live.back().first, live.back().second,
                    rmm::CUDA_ALLOCATION_ALIGNMENT);
      live_bytes -= live.back().second;
      live.pop_back();
    }
    ++done;
  }
  for (auto const& [p, n] : live) {
    mr.deallocate(stream, p, n, rmm::CUDA_ALLOCATION_ALIGNMENT);
    ++done;
  }
  auto const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(done) / s;
}

/**
 * @brief Aggregate allocate+free pairs per second of one thread per stream, each running
 * `iterations` pairs of `bytes` on its own stream, started together.
 */
inline double threaded_alloc_free_pairs(rmm::device_async_resource_ref mr,
                                        std::size_t bytes,
                                        std::uint64_t iterations,
                                        std::vector<cudaStream_t> const& streams)
{
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  int device = 0;
  RMM_CUDA_TRY(cudaGetDevice(&device));
  for (auto handle : streams) {
    threads.emplace_back([&, handle] {
      (void)cudaSetDevice(device);
      cuda::stream_ref stream{handle};
      for (int i = 0; i < 100; ++i) {  // warm up: the stream's slot, caches
        mr.deallocate(stream, mr.allocate(stream, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT), bytes,
                      rmm::CUDA_ALLOCATION_ALIGNMENT);
      }
      ready.fetch_add(1);
      while (!go.load()) {}
      for (std::uint64_t i = 0; i < iterations; ++i) {
        mr.deallocate(stream, mr.allocate(stream, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT), bytes,
                      rmm::CUDA_ALLOCATION_ALIGNMENT);
      }
    });
  }
  while (ready.load() < streams.size()) {}
  auto const start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& t : threads) {
    t.join();
  }
  auto const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(iterations * streams.size()) / s;
}

/**
 * @brief Aggregate calls per second of one driver query made by one thread per stream, all
 * started together: `which` is 0 for cuStreamIsCapturing, 1 for cuStreamGetId. Shows whether
 * the driver serializes the queries a stream-keyed allocator needs on every call.
 */
inline double threaded_stream_queries(int which,
                                      std::uint64_t iterations,
                                      std::vector<cudaStream_t> const& streams)
{
  auto const& api = rmm_fences::detail::driver_api::get();
  if (api.stream_is_capturing == nullptr || api.stream_get_id == nullptr) { return 0.0; }
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  int device = 0;
  RMM_CUDA_TRY(cudaGetDevice(&device));
  for (auto handle : streams) {
    threads.emplace_back([&, handle] {
      (void)cudaSetDevice(device);
      auto const s = reinterpret_cast<CUstream>(handle);
      CUstreamCaptureStatus status{};
      unsigned long long id{};
      ready.fetch_add(1);
      while (!go.load()) {}
      for (std::uint64_t i = 0; i < iterations; ++i) {
        if (which == 0) {
          (void)api.stream_is_capturing(s, &status);
        } else {
          (void)api.stream_get_id(s, &id);
        }
      }
    });
  }
  while (ready.load() < streams.size()) {}
  auto const start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& t : threads) {
    t.join();
  }
  auto const secs =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(iterations * streams.size()) / secs;
}

}  // namespace rmm_fences::bench
