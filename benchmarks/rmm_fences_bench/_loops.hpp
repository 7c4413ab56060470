/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// The native loops of rmm_fences_bench (its _loops extension): benchmark code, built in place
// from benchmarks/ and never installed with the package.

#include "_replay.hpp"

#include <rmm_fences/detail/driver_api.hpp>
#include <rmm_fences/detail/vmm_api.hpp>

#include <rmm/aligned.hpp>
#include <rmm/detail/error.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rmm_fences::bench {

/**
 * @brief Mean host nanoseconds of one allocate (on `stream`) + deallocate (on `free_stream`)
 * pair of `bytes`.
 *
 * With `free_stream` another stream than `stream`, the allocations reuse blocks freed on
 * another stream (cross-stream reuse: a stream-ordered pool makes `stream` wait on a fence of
 * `free_stream`). Runs `warmup` untimed pairs first. Only host time is measured: no
 * kernel touches the blocks.
 */
inline double alloc_free_ns(rmm::device_async_resource_ref mr,
                            std::size_t bytes,
                            std::uint64_t iterations,
                            cuda::stream_ref stream,
                            std::uint64_t warmup,
                            cuda::stream_ref free_stream)
{
  auto pair = [&] {
    mr.deallocate(free_stream,
                  mr.allocate(stream, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT),
                  bytes,
                  rmm::CUDA_ALLOCATION_ALIGNMENT);
  };
  for (std::uint64_t i = 0; i < warmup; ++i) {
    pair();
  }
  auto const start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < iterations; ++i) {
    pair();
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
  auto time   = [iterations](auto&& call) {
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
  auto const& api      = rmm_fences::mr::detail::driver_api::get();
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
  costs.relaxed_capture_scope = time([] { rmm_fences::mr::detail::relaxed_capture_scope scope; });
  (void)cudaEventDestroy(event);
  return costs;
}

/// Host nanoseconds per call of the driver calls that move device pages (means; `page` is the
/// device's page size in bytes, every other field 0 where the driver lacks the API).
struct page_costs {
  double page{};        ///< bytes per page (cuMemGetAllocationGranularity, minimum)
  double create{};      ///< cuMemCreate of one page
  double map{};         ///< cuMemMap of one page
  double set_access{};  ///< cuMemSetAccess of a range of `pages` mapped pages
  double unmap{};       ///< cuMemUnmap of one page
  double release{};     ///< cuMemRelease of one page
};

/**
 * @brief Measures `page_costs` on `device` (which should be idle; -1: the current device):
 * `pages` pages created
 * once, then `rounds` times mapped page by page into one of two address ranges, given access
 * as one range, and unmapped page by page (a vmm_pool growth that moves pages makes these
 * calls: an unmap where a page was free, a map where the pool grows, one access per range).
 */
inline page_costs page_call_ns(int device, std::size_t pages, std::size_t rounds)
{
  using clock = std::chrono::steady_clock;
  auto since  = [](clock::time_point start) {
    return std::chrono::duration<double, std::nano>(clock::now() - start).count();
  };
  namespace d = rmm_fences::mr::detail;
  page_costs costs;
  if (pages == 0 || rounds == 0 || !d::vmm_api::get().complete()) { return costs; }
  if (device < 0) { RMM_CUDA_TRY(cudaGetDevice(&device)); }
  CUmemAllocationProp prop{};
  std::size_t page = 0;
  auto const& api  = d::vmm_api::for_device(device, prop, page);
  costs.page       = static_cast<double>(page);
  // What is held, given back on every path: the reserved ranges, the pages, the mapped ones.
  std::array<CUdeviceptr, 2> range{};
  std::vector<CUmemGenericAllocationHandle> handles;
  CUdeviceptr mapped_base{};
  std::size_t mapped = 0;
  auto give_back     = [&] {
    for (std::size_t i = 0; i < mapped; ++i) {
      (void)api.unmap(mapped_base + i * page, page);
    }
    for (auto h : handles) {
      (void)api.release(h);
    }
    for (auto r : range) {
      if (r != 0) { (void)api.address_free(r, pages * page); }
    }
  };
  auto check = [](CUresult r, char const* what) {
    if (r != CUDA_SUCCESS) { throw std::runtime_error(std::string{what} + " failed"); }
  };
  try {
    for (auto& r : range) {
      check(api.address_reserve(&r, pages * page, page, 0, 0), "cuMemAddressReserve");
    }
    handles.reserve(pages);
    auto start = clock::now();
    for (std::size_t i = 0; i < pages; ++i) {
      CUmemGenericAllocationHandle h{};
      check(api.create(&h, page, &prop, 0), "cuMemCreate");
      handles.push_back(h);
    }
    costs.create = since(start) / static_cast<double>(pages);
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags    = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    double map_ns = 0, access_ns = 0, unmap_ns = 0;
    for (std::size_t r = 0; r < rounds; ++r) {
      mapped_base = range[r % 2];
      start       = clock::now();
      for (; mapped < pages; ++mapped) {
        check(api.map(mapped_base + mapped * page, page, 0, handles[mapped], 0), "cuMemMap");
      }
      map_ns += since(start);
      start = clock::now();
      check(api.set_access(mapped_base, pages * page, &access, 1), "cuMemSetAccess");
      access_ns += since(start);
      start = clock::now();
      for (; mapped > 0; --mapped) {
        check(api.unmap(mapped_base + (mapped - 1) * page, page), "cuMemUnmap");
      }
      unmap_ns += since(start);
    }
    auto const calls = static_cast<double>(pages * rounds);
    costs.map        = map_ns / calls;
    costs.set_access = access_ns / static_cast<double>(rounds);
    costs.unmap      = unmap_ns / calls;
    start            = clock::now();
    for (auto h : handles) {
      (void)api.release(h);
    }
    costs.release = since(start) / static_cast<double>(pages);
    handles.clear();
  } catch (...) {
    give_back();
    throw;
  }
  give_back();  // the two ranges
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
                                     std::uint64_t random_state,
                                     cuda::stream_ref stream)
{
  std::mt19937_64 rng{random_state};
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
      mr.deallocate(stream, live.back().first, live.back().second, rmm::CUDA_ALLOCATION_ALIGNMENT);
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
 * @brief One thread per stream, each on the caller's device: `warm_up(stream)`, then all
 * released together to run `body(stream)`. Returns the seconds from the release until the last
 * thread ended.
 */
template <typename WarmUp, typename Body>
double timed_threads(std::vector<cudaStream_t> const& streams, WarmUp warm_up, Body body)
{
  int device = 0;
  RMM_CUDA_TRY(cudaGetDevice(&device));
  return start_together(
    streams.size(),
    [&](std::size_t i) {
      (void)cudaSetDevice(device);
      warm_up(streams[i]);
    },
    [&](std::size_t i) { body(streams[i]); });
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
  auto pairs = [&](cudaStream_t handle, std::uint64_t count) {
    cuda::stream_ref stream{handle};
    for (std::uint64_t i = 0; i < count; ++i) {
      mr.deallocate(stream,
                    mr.allocate(stream, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT),
                    bytes,
                    rmm::CUDA_ALLOCATION_ALIGNMENT);
    }
  };
  auto const secs = timed_threads(
    streams,
    [&](cudaStream_t handle) { pairs(handle, 100); },  // warm up: the stream's slot, caches
    [&](cudaStream_t handle) { pairs(handle, iterations); });
  return static_cast<double>(iterations * streams.size()) / secs;
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
  auto const& api = rmm_fences::mr::detail::driver_api::get();
  if (api.stream_is_capturing == nullptr || api.stream_get_id == nullptr) { return 0.0; }
  auto const secs = timed_threads(
    streams,
    [](cudaStream_t) {},
    [&](cudaStream_t handle) {
      auto const s = reinterpret_cast<CUstream>(handle);
      CUstreamCaptureStatus status{};
      unsigned long long id{};
      for (std::uint64_t i = 0; i < iterations; ++i) {
        if (which == 0) {
          (void)api.stream_is_capturing(s, &status);
        } else {
          (void)api.stream_get_id(s, &id);
        }
      }
    });
  return static_cast<double>(iterations * streams.size()) / secs;
}

/// What `stress` did (the data check's error counter stays on the device).
struct stress_stats {
  std::uint64_t iterations{};          ///< loop turns of all threads
  std::uint64_t allocations{};         ///< successful allocations
  std::uint64_t bytes{};               ///< bytes of those allocations
  std::uint64_t cross_stream_frees{};  ///< frees on another thread's stream, after an event wait
  std::uint64_t out_of_memory{};       ///< allocations that raised out-of-memory (then reclaimed)
  std::uint64_t checks{};              ///< check kernels launched
  double seconds{};                    ///< wall time of the run, final synchronization included
};

namespace detail {

/// cuLaunchKernel, obtained through the runtime (no link against libcuda).
using launch_kernel_fn = CUresult (*)(CUfunction,
                                      unsigned,
                                      unsigned,
                                      unsigned,
                                      unsigned,
                                      unsigned,
                                      unsigned,
                                      unsigned,
                                      CUstream,
                                      void**,
                                      void**);

inline launch_kernel_fn launch_kernel_entry()
{
  static launch_kernel_fn const fn =
    rmm_fences::mr::detail::driver_entry_point<launch_kernel_fn>("cuLaunchKernel");
  return fn;
}

/// 32 bits of the pattern key of allocation `serial` of thread `thread` (splitmix64).
inline std::uint32_t pattern_key(std::uint64_t random_state,
                                 std::uint64_t thread,
                                 std::uint64_t serial)
{
  std::uint64_t z = random_state + 0x9E3779B97F4A7C15ULL * (thread * 0x100000001ULL + serial + 1);
  z               = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  z               = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
  return static_cast<std::uint32_t>((z ^ (z >> 31U)) & 0xFFFFFFFFULL);
}

}  // namespace detail

/**
 * @brief Multi-threaded data-checking stress of `mr`: one std::thread per stream, for `seconds`.
 *
 * Each thread loops on its own stream: allocates a random size (256 B to `max_bytes`, powers of
 * two and three quarters of them, so caches that match exact sizes reuse blocks), launches
 * `fill` to write a pattern keyed by (thread, allocation), then either keeps the block live
 * (at most `max_live` per thread, so a bounded pool fills up), or launches `check` (re-derives
 * the pattern and adds every mismatching word to `*errors` on the device) and frees it: on its
 * own stream, or on another thread's stream after recording an event on its own stream and
 * making the other stream wait for it (the stream-ordered contract of a cross-stream free). A
 * live block is checked again before it is freed, so an overwrite by another thread while it
 * was live is counted. An allocation that raises out-of-memory (`std::bad_alloc`, of which
 * `rmm::out_of_memory` is one) is counted, half of the thread's live blocks are checked and
 * freed, and the loop goes on. At the end every live block is checked and freed and all
 * streams are synchronized, so `*errors` is final when this returns.
 *
 * The kernels are `CUfunction`s of the current device's primary context, launched with
 * cuLaunchKernel: `fill(unsigned* a, unsigned long long n, unsigned key)` and
 * `check(unsigned const* a, unsigned long long n, unsigned key, unsigned long long* errors,
 * unsigned long long delay_ns)`, grid-stride loops over `n` words; `check` waits
 * `check_delay_ns` before reading, so a freed block stays in use while the host runs ahead.
 * The first exception of any thread (other than out-of-memory) stops all threads and is
 * rethrown after they are joined.
 */
inline stress_stats stress(rmm::device_async_resource_ref mr,
                           std::vector<cudaStream_t> const& streams,
                           double seconds,
                           CUfunction fill,
                           CUfunction check,
                           unsigned long long* errors,
                           std::size_t max_bytes,
                           std::size_t max_live,
                           std::uint64_t random_state,
                           unsigned long long check_delay_ns = 20000)
{
  auto const launch = detail::launch_kernel_entry();
  if (launch == nullptr) { throw std::runtime_error("stress: cuLaunchKernel is not available"); }
  if (streams.empty()) { throw std::invalid_argument("stress: streams must not be empty"); }
  if (max_bytes < 256) { throw std::invalid_argument("stress: max_bytes must be >= 256"); }
  int device = 0;
  RMM_CUDA_TRY(cudaGetDevice(&device));

  constexpr unsigned block_threads = 256;
  std::size_t max_shift            = 0;  // sizes 256 << k for k <= max_shift
  while (max_shift < 40 && (std::size_t{256} << (max_shift + 1)) <= max_bytes) {
    ++max_shift;
  }

  std::size_t const n = streams.size();
  std::vector<cudaEvent_t> events(n);
  for (auto& e : events) {
    RMM_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }

  std::atomic<bool> stop{false};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  std::atomic<std::uint64_t> iterations{0}, allocations{0}, bytes{0}, cross{0}, oom{0}, checks{0};

  auto const start    = std::chrono::steady_clock::now();
  auto const deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(seconds));

  auto worker = [&](std::size_t t) {
    struct block {
      void* ptr;
      std::size_t size;
      std::uint32_t key;
    };
    std::vector<block> live;
    live.reserve(max_live + 1);
    std::mt19937_64 rng{random_state * 0x2545F4914F6CDD1DULL + t};
    auto const own              = streams[t];
    auto const cu               = [](cudaStream_t s) { return reinterpret_cast<CUstream>(s); };
    std::uint64_t serial        = 0;
    std::uint64_t my_iterations = 0, my_allocations = 0, my_bytes = 0, my_cross = 0, my_oom = 0,
                  my_checks = 0;

    auto run = [&](CUfunction f, block const& b, bool with_errors) {
      auto* ptr             = b.ptr;
      unsigned long long nw = b.size / 4;
      unsigned key          = b.key;
      void* args_fill[]     = {&ptr, &nw, &key};
      auto delay            = check_delay_ns;
      void* args_check[]    = {&ptr, &nw, &key, &errors, &delay};
      auto const grid       = static_cast<unsigned>(
        std::min<std::size_t>(1024, (nw + block_threads - 1) / block_threads));
      CUresult const r = launch(f,
                                std::max(grid, 1U),
                                1,
                                1,
                                block_threads,
                                1,
                                1,
                                0,
                                cu(own),
                                with_errors ? args_check : args_fill,
                                nullptr);
      if (r != CUDA_SUCCESS) {
        throw std::runtime_error("stress: cuLaunchKernel failed with CUresult " +
                                 std::to_string(static_cast<int>(r)));
      }
    };
    // Checks `b` on the own stream, then frees it: on the own stream, or (cross) on another
    // thread's stream after that stream waits for an event recorded after the check.
    auto check_and_free = [&](block const& b, bool allow_cross) {
      run(check, b, true);
      ++my_checks;
      cudaStream_t on = own;
      if (allow_cross && n > 1 && (rng() % 2U) == 0) {
        auto other = static_cast<std::size_t>(rng() % (n - 1));
        if (other >= t) { ++other; }
        RMM_CUDA_TRY(cudaEventRecord(events[t], own));
        RMM_CUDA_TRY(cudaStreamWaitEvent(streams[other], events[t], 0));
        on = streams[other];
        ++my_cross;
      }
      mr.deallocate(cuda::stream_ref{on}, b.ptr, b.size, rmm::CUDA_ALLOCATION_ALIGNMENT);
    };
    auto free_random_live = [&](bool allow_cross) {
      auto const k = static_cast<std::size_t>(rng() % live.size());
      std::swap(live[k], live.back());
      auto const b = live.back();
      live.pop_back();
      check_and_free(b, allow_cross);
    };

    try {
      RMM_CUDA_TRY(cudaSetDevice(device));  // makes the primary context current (driver calls)
      while (!stop.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < deadline) {
        ++my_iterations;
        auto const shift = static_cast<std::size_t>(rng() % (max_shift + 1));
        std::size_t size = std::size_t{256} << shift;
        if ((rng() % 4U) == 0) { size = size / 4 * 3; }
        block b{nullptr, size, detail::pattern_key(random_state, t, serial++)};
        try {
          b.ptr = mr.allocate(cuda::stream_ref{own}, size, rmm::CUDA_ALLOCATION_ALIGNMENT);
        } catch (std::bad_alloc const&) {
          ++my_oom;
          for (auto k = (live.size() + 1) / 2; k > 0; --k) {
            free_random_live(true);
          }
          if (live.empty()) { std::this_thread::yield(); }
          continue;
        }
        ++my_allocations;
        my_bytes += size;
        run(fill, b, false);
        auto const action = rng() % 8U;
        if (action < 3 && live.size() < max_live) {
          live.push_back(b);  // kept live across iterations
        } else {
          check_and_free(b, true);
        }
        if (!live.empty() && (rng() % 4U) == 0) { free_random_live(true); }
      }
      while (!live.empty()) {
        free_random_live(true);
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) { failure = std::current_exception(); }
      }
      stop.store(true);
      // blocks still live are leaked to the resource on purpose: their kernels may still run
    }
    iterations += my_iterations;
    allocations += my_allocations;
    bytes += my_bytes;
    cross += my_cross;
    oom += my_oom;
    checks += my_checks;
  };

  std::vector<std::thread> threads;
  threads.reserve(n);
  try {
    for (std::size_t t = 0; t < n; ++t) {
      threads.emplace_back(worker, t);
    }
  } catch (...) {  // no thread for every stream: stop those that run, report it
    stop.store(true);
    std::lock_guard<std::mutex> lock(failure_mutex);
    if (!failure) { failure = std::current_exception(); }
  }
  for (auto& th : threads) {
    th.join();
  }
  cudaError_t sync_error = cudaSuccess;
  for (auto s : streams) {
    if (auto const e = cudaStreamSynchronize(s); e != cudaSuccess && sync_error == cudaSuccess) {
      sync_error = e;
    }
  }
  for (auto e : events) {
    (void)cudaEventDestroy(e);
  }
  auto const elapsed =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failure) { std::rethrow_exception(failure); }
  RMM_CUDA_TRY(sync_error);
  return stress_stats{iterations.load(),
                      allocations.load(),
                      bytes.load(),
                      cross.load(),
                      oom.load(),
                      checks.load(),
                      elapsed};
}

/// An rmm resource as the replay engine (_replay.hpp) calls it.
struct replay_resource {
  rmm::device_async_resource_ref mr;
  void* allocate(cuda::stream_ref stream, std::size_t bytes)
  { return mr.allocate(stream, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes) noexcept
  { mr.deallocate(stream, ptr, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT); }
};

/**
 * @brief The footprint meter of replay_trace (see replay::no_footprint): what an rmm chain
 * drew from the device at most, read at the bottom of the chain.
 *
 * With `pool` (the CUDA memory pool of a CudaAsync resource at the bottom): the pool's reserved
 * bytes, its high watermark reset at `start()` (what it reserved then counts too). Else with
 * `statistics` (an rmm statistics adaptor at the bottom): its bytes counter, a counter frame
 * pushed at `start()` and popped by `peak()` (what the adaptor's top frame counted at
 * `start()`, plus the frame's peak); the frame is popped on every path. Else nothing (0).
 */
class rmm_footprint {
 public:
  rmm_footprint(rmm::mr::statistics_resource_adaptor* statistics, cudaMemPool_t pool)
    : statistics_{statistics}, pool_{pool}
  {
  }
  rmm_footprint(rmm_footprint const&)            = delete;
  rmm_footprint& operator=(rmm_footprint const&) = delete;
  ~rmm_footprint()
  {
    if (pushed_) {
      try {
        (void)statistics_->pop_counters();
      } catch (...) {  // the frame pushed by start() is there: nothing to report
      }
    }
  }

  void start()
  {
    if (pool_ != nullptr) {
      std::uint64_t zero = 0;
      RMM_CUDA_TRY(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &base_));
      RMM_CUDA_TRY(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero));
    } else if (statistics_ != nullptr) {
      auto const before = statistics_->push_counters();
      pushed_           = true;
      base_             = static_cast<std::uint64_t>(std::max<std::int64_t>(before.first.value, 0));
    }
  }

  std::uint64_t peak()
  {
    if (pool_ != nullptr) {
      std::uint64_t high = 0;
      std::uint64_t now  = 0;
      RMM_CUDA_TRY(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high));
      RMM_CUDA_TRY(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &now));
      return std::max({base_, high, now});
    }
    if (statistics_ != nullptr) {
      pushed_           = false;
      auto const popped = statistics_->pop_counters();
      return base_ + static_cast<std::uint64_t>(std::max<std::int64_t>(popped.first.peak, 0));
    }
    return 0;
  }

 private:
  rmm::mr::statistics_resource_adaptor* statistics_{};
  cudaMemPool_t pool_{};
  std::uint64_t base_{};
  bool pushed_{false};
};

/**
 * @brief Replays `t` on `mr` (replay::run), `repeat` times, on the caller's device.
 *
 * Recorded stream `s` is `streams[s]` when `streams` is not empty. Otherwise one non-blocking
 * stream is created per recorded stream, except the handles 0, 1 and 2 in `recorded` (the
 * legacy default stream, cudaStreamLegacy, cudaStreamPerThread), which stay themselves; the
 * created streams are synchronized and destroyed before this returns. `ordered`: every event
 * in the trace's recorded order (see replay::run). `statistics` and `pool`: the footprint
 * meter's layer (see rmm_footprint; both null: none).
 */
inline replay::result replay_trace(rmm::device_async_resource_ref mr,
                                   replay::trace const& t,
                                   std::vector<cudaStream_t> streams,
                                   std::vector<std::uintptr_t> const& recorded,
                                   std::uint64_t repeat,
                                   bool ordered,
                                   rmm::mr::statistics_resource_adaptor* statistics,
                                   cudaMemPool_t pool)
{
  std::vector<cudaStream_t> created;
  struct destroy_created {
    std::vector<cudaStream_t>& created;
    ~destroy_created()
    {
      for (auto s : created) {
        (void)cudaStreamSynchronize(s);
        (void)cudaStreamDestroy(s);
      }
    }
  } guard{created};
  if (streams.empty()) {
    for (auto handle : recorded) {
      if (handle <= 2) {
        streams.push_back(reinterpret_cast<cudaStream_t>(handle));
        continue;
      }
      cudaStream_t s{};
      RMM_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      created.push_back(s);
      streams.push_back(s);
    }
  }
  std::vector<cuda::stream_ref> refs(streams.begin(), streams.end());
  int device = 0;
  RMM_CUDA_TRY(cudaGetDevice(&device));
  replay_resource resource{mr};
  rmm_footprint footprint{statistics, pool};
  return replay::run(
    resource, t, refs, repeat, ordered, [device] { (void)cudaSetDevice(device); }, footprint);
}

}  // namespace rmm_fences::bench
