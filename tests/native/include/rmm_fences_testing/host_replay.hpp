/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The replay engine of rmm_fences.bench.replay (rmm_fences/_lib/_replay.hpp) over a host
 * resource (CPU tests only): malloc-backed, every call recorded in one global order, with an
 * injectable failure (allocations of one size throw) and an injectable delay (allocations of
 * one size sleep first, so that a free on another thread has to wait for them).
 */
#pragma once

#include <_replay.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace rmm_fences::testing {

/// A malloc-backed resource that records its calls; streams are handles (integers).
struct recording_host_resource {
  struct call {
    std::uint64_t seq{};      ///< position in the global order of calls
    bool is_free{};           ///< deallocate (else allocate)
    std::uintptr_t ptr{};     ///< the block
    std::size_t size{};       ///< bytes asked for or given back
    std::uintptr_t stream{};  ///< the stream handle
  };

  std::size_t fail_size{0};  ///< allocations of this size throw std::bad_alloc (0: none)
  std::size_t slow_size{0};  ///< allocations of this size sleep `slow_us` first (0: none)
  std::uint64_t slow_us{0};
  std::atomic<std::uint64_t> seq{0};
  std::mutex mutex;
  std::vector<call> calls;

  void* allocate(std::uintptr_t stream, std::size_t bytes)
  {
    if (slow_size != 0 && bytes == slow_size) {
      std::this_thread::sleep_for(std::chrono::microseconds(slow_us));
    }
    if (fail_size != 0 && bytes == fail_size) { throw std::bad_alloc{}; }
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) { throw std::bad_alloc{}; }
    std::lock_guard<std::mutex> lock(mutex);  // seq under the lock: calls in seq order
    calls.push_back(call{seq++, false, reinterpret_cast<std::uintptr_t>(p), bytes, stream});
    return p;
  }

  void deallocate(std::uintptr_t stream, void* p, std::size_t bytes) noexcept
  {
    {
      std::lock_guard<std::mutex> lock(mutex);
      calls.push_back(call{seq++, true, reinterpret_cast<std::uintptr_t>(p), bytes, stream});
    }
    std::free(p);
  }
};

/// One replay of a trace's columns on a fresh recording host resource.
struct host_replay_run {
  rmm_fences::bench::replay::result result;
  std::vector<recording_host_resource::call> calls;
  std::uint64_t thread_starts{};  ///< times the per-thread set-up ran
};

inline host_replay_run host_replay(std::vector<std::uint32_t> const& thread,
                                   std::vector<std::uint8_t> const& is_free,
                                   std::vector<std::uint64_t> const& id,
                                   std::vector<std::uint64_t> const& size,
                                   std::vector<std::uint32_t> const& stream,
                                   std::size_t threads,
                                   std::vector<std::uintptr_t> const& streams,
                                   std::uint64_t repeat,
                                   std::size_t fail_size,
                                   std::size_t slow_size,
                                   std::uint64_t slow_us)
{
  auto const t = rmm_fences::bench::replay::make_trace(thread.size(),
                                                       thread.data(),
                                                       is_free.data(),
                                                       id.data(),
                                                       size.data(),
                                                       stream.data(),
                                                       threads,
                                                       streams.size());
  recording_host_resource mr;
  mr.fail_size = fail_size;
  mr.slow_size = slow_size;
  mr.slow_us   = slow_us;
  std::atomic<std::uint64_t> starts{0};
  host_replay_run run;
  run.result        = rmm_fences::bench::replay::run(mr, t, streams, repeat, [&] { ++starts; });
  run.calls         = mr.calls;
  run.thread_starts = starts.load();
  return run;
}

}  // namespace rmm_fences::testing
