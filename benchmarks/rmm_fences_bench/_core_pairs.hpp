/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// The policy cores' own share of an allocate + deallocate pair: the stream-ordered pool's and
// SyncOnFree's cores over a platform that makes no CUDA call (a stream's identity is its
// handle, no stream is ever captured, every fence is complete at once) and an upstream of host
// memory. Benchmark code (the _loops extension), never installed.

#include <rmm_fences/detail/hazard_tracker_core.hpp>
#include <rmm_fences/detail/stream_ordered_pool_core.hpp>
#include <rmm_fences/detail/sync_on_free_core.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

namespace rmm_fences::bench {

/// What `core_pair_ns` measured.
struct core_pair_result {
  double ns{};                     ///< mean nanoseconds of one pair
  std::uint64_t fences{};          ///< fences recorded during the timed pairs
  std::uint64_t upstream_calls{};  ///< upstream allocations and frees during the timed pairs
};

namespace cores {

struct out_of_memory : std::bad_alloc {};

/// What every null platform shares: streams are numbers, fences are counted and complete at
/// once, nothing is captured.
struct null_fences {
  using stream_type = std::uint64_t;
  using fence_type  = std::size_t;

  static std::uintptr_t key(stream_type s) noexcept { return s; }
  fence_type acquire_fence() noexcept { return ++fences_made; }
  static void release_fence(fence_type) noexcept {}
  bool record(fence_type, stream_type) noexcept
  {
    ++records;
    return true;
  }
  static bool device_wait(stream_type, fence_type) noexcept { return true; }
  static bool is_capturing(stream_type) noexcept { return false; }

  std::size_t fences_made{};
  std::uint64_t records{};
};

/// The pool's and SyncOnFree's platform, none of its calls reaching CUDA.
struct null_platform : null_fences {
  using out_of_memory = cores::out_of_memory;

  [[noreturn]] static void throw_out_of_memory(std::size_t, std::size_t) { throw out_of_memory{}; }
  static std::uint64_t stream_id(stream_type s) noexcept { return s; }
  static stream_type default_stream() noexcept { return 0; }
  static bool ready(fence_type) noexcept { return true; }
  static bool host_wait(fence_type) noexcept { return true; }
  static bool sync_stream(stream_type) noexcept { return true; }
  static bool sync_device() noexcept { return true; }
  static bool retain_until_graph_destroyed(stream_type, void (*fn)(void*), void* ctx) noexcept
  {
    fn(ctx);
    return false;
  }
  static bool stream_on_device(stream_type) noexcept { return true; }
  static stream_type private_stream() noexcept { return ~stream_type{}; }
  static void destroy_private_stream() noexcept {}
  static void report_rejected_free(char const*) noexcept {}
  struct no_scope {};
  static no_scope relax() noexcept { return {}; }
};

/// The tracker's platform, none of its calls reaching CUDA.
struct null_tracker_platform : null_fences {
  enum class fence_state { complete, pending, failed };

  static std::optional<stream_type> stream(std::uintptr_t key) noexcept { return key; }
  static fence_state query(fence_type) noexcept { return fence_state::complete; }
  static void annotate_allocation(void*, std::size_t) noexcept {}
  static void annotate_free(void*) noexcept {}
};

/// Host memory at 256-byte alignment; counts its calls (shared by copies: the cores hold one).
struct host_upstream {
  std::uint64_t* calls;

  void* allocate(std::uint64_t, std::size_t bytes, std::size_t)
  {
    ++*calls;
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) { throw out_of_memory{}; }
    return p;
  }
  void deallocate(std::uint64_t, void* p, std::size_t, std::size_t) noexcept
  {
    ++*calls;
    std::free(p);
  }
};

using pool_core = rmm_fences::mr::detail::stream_ordered_pool_core<null_platform, host_upstream>;

/// The pool's core as an upstream (the tracker over the pool).
struct pool_core_upstream {
  pool_core* core;

  void* allocate(std::uint64_t stream, std::size_t bytes, std::size_t alignment)
  { return core->allocate(stream, bytes, alignment); }
  void deallocate(std::uint64_t stream, void* p, std::size_t bytes, std::size_t alignment) noexcept
  { core->deallocate(stream, p, bytes, alignment); }
};

/// The stream every timed pair runs on.
inline constexpr std::uint64_t pair_stream = 7;

template <typename Core>
core_pair_result time_pairs(Core& core,
                            std::uint64_t const& upstream_calls,
                            std::size_t bytes,
                            std::uint64_t iterations)
{
  for (int i = 0; i < 100; ++i) {  // the first growth, the slot, the caches
    core.deallocate(pair_stream, core.allocate(pair_stream, bytes, 256), bytes, 256);
  }
  auto const records = core.platform().records;
  auto const calls   = upstream_calls;
  auto const start   = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < iterations; ++i) {
    core.deallocate(pair_stream, core.allocate(pair_stream, bytes, 256), bytes, 256);
  }
  auto const ns =
    std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  return {ns / static_cast<double>(iterations),
          core.platform().records - records,
          upstream_calls - calls};
}

}  // namespace cores

/**
 * @brief Mean host nanoseconds of one allocate + deallocate pair of `bytes` on one stream in
 * the policy core `which` ("pool": the stream-ordered pool's; "sync_on_free": SyncOnFree's in
 * deferred mode, with its defaults; "tracking_pool": the hazard tracker's over the pool's),
 * over platforms that make no CUDA call and an upstream of host memory: the pair's cost
 * without its CUDA calls or rmm's dispatch. Also the fences recorded and the upstream calls
 * made during the timed pairs (the tracker's own records: none on a same-stream pair).
 */
inline core_pair_result core_pair_ns(std::string const& which,
                                     std::size_t bytes,
                                     std::uint64_t iterations)
{
  if (iterations == 0) { throw std::invalid_argument("iterations must be positive, got 0"); }
  std::uint64_t upstream_calls = 0;
  cores::host_upstream upstream{&upstream_calls};
  core_pair_result r;
  if (which == "pool") {
    cores::pool_core core{upstream, 0, std::nullopt, std::nullopt};
    r = cores::time_pairs(core, upstream_calls, bytes, iterations);
    core.shutdown(/*device_alive=*/true);
  } else if (which == "tracking_pool") {
    cores::pool_core pool{upstream, 0, std::nullopt, std::nullopt};
    rmm_fences::mr::detail::hazard_tracker_core<cores::null_tracker_platform,
                                                cores::pool_core_upstream>
      core{cores::pool_core_upstream{&pool}, /*upstream_stream_ordered=*/true};
    r = cores::time_pairs(core, upstream_calls, bytes, iterations);
    core.release_fences();
    pool.shutdown(/*device_alive=*/true);
  } else if (which == "sync_on_free") {
    rmm_fences::mr::detail::sync_on_free_core<cores::null_platform, cores::host_upstream> core{
      upstream, rmm_fences::mr::sync_mode::deferred, std::nullopt, {}, /*reuse_on_stream=*/true};
    r = cores::time_pairs(core, upstream_calls, bytes, iterations);
    core.drain(/*include_parked=*/true, cores::pair_stream);
  } else {
    throw std::invalid_argument("core must be 'pool', 'sync_on_free' or 'tracking_pool', got '" +
                                which + "'");
  }
  return r;
}

}  // namespace rmm_fences::bench
