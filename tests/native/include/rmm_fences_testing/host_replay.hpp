/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The replay engine of rmm_fences_bench.replay (benchmarks/rmm_fences_bench/_replay.hpp) over a
 * host resource (CPU tests only): malloc-backed, every call recorded in one global order, the
 * bytes it holds counted (current and peak), with an injectable failure (allocations of one size
 * throw) and an injectable delay (allocations of one size sleep first, so that a free on
 * another thread has to wait for them). Optionally a host pool that grows in chunks sits over
 * it, and the replay's footprint meter counts what the pool drew from it.
 */
#pragma once

#include <rmm_fences_bench/_replay.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <utility>
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
  std::uint64_t current_bytes{0};  ///< bytes allocated and not yet freed (under `mutex`)
  std::uint64_t peak_bytes{0};     ///< most of `current_bytes` since `reset_peak` (under `mutex`)

  void reset_peak()
  {
    std::lock_guard<std::mutex> lock(mutex);
    peak_bytes = current_bytes;
  }

  std::uint64_t peak()
  {
    std::lock_guard<std::mutex> lock(mutex);
    return peak_bytes;
  }

  void* allocate(std::uintptr_t stream, std::size_t bytes)
  {
    if (slow_size != 0 && bytes == slow_size) {
      std::this_thread::sleep_for(std::chrono::microseconds(slow_us));
    }
    if (fail_size != 0 && bytes == fail_size) { throw std::bad_alloc{}; }
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) { throw std::bad_alloc{}; }
    std::lock_guard<std::mutex> lock(mutex);  // seq under the lock: calls in seq order
    try {
      calls.push_back(call{seq++, false, reinterpret_cast<std::uintptr_t>(p), bytes, stream});
    } catch (...) {
      std::free(p);
      throw;
    }
    current_bytes += bytes;
    peak_bytes = std::max(peak_bytes, current_bytes);
    return p;
  }

  void deallocate(std::uintptr_t stream, void* p, std::size_t bytes) noexcept
  {
    {
      std::lock_guard<std::mutex> lock(mutex);
      current_bytes -= bytes;
      calls.push_back(call{seq++, true, reinterpret_cast<std::uintptr_t>(p), bytes, stream});
    }
    std::free(p);
  }
};

/// The replay's footprint meter (see replay::no_footprint) over a recording host resource: the
/// peak of the bytes it holds, reset to what it holds at `start()`.
struct host_footprint {
  recording_host_resource& upstream;
  void start() { upstream.reset_peak(); }
  std::uint64_t peak() { return upstream.peak(); }
};

/**
 * @brief A host pool that grows in chunks, as device pools do: a chunk of `chunk_bytes` (or of
 * the request, if larger) from the upstream when the current chunk lacks room (the rest of that
 * chunk is left unused), blocks carved from it in order (sizes rounded up to 256 bytes), a freed
 * block kept for a later allocation of exactly its rounded size. Chunks go back to the upstream
 * only at destruction. `initial_bytes`: one chunk of that size at construction (0: none).
 */
struct chunked_host_pool {
  static constexpr std::size_t alignment = 256;

  recording_host_resource& upstream;
  std::size_t chunk_bytes;
  std::mutex mutex;
  std::vector<std::pair<void*, std::size_t>> chunks;
  std::byte* cursor{};
  std::size_t left{};
  std::unordered_map<std::size_t, void*> free_heads;  ///< rounded size -> freed blocks, linked
                                                      ///< through their first word

  chunked_host_pool(recording_host_resource& up, std::size_t chunk, std::size_t initial_bytes)
    : upstream{up}, chunk_bytes{chunk}
  {
    if (initial_bytes > 0) { grow(0, initial_bytes); }
  }
  chunked_host_pool(chunked_host_pool const&)            = delete;
  chunked_host_pool& operator=(chunked_host_pool const&) = delete;
  ~chunked_host_pool()
  {
    for (auto const& [chunk, size] : chunks) {
      upstream.deallocate(0, chunk, size);
    }
  }

  static std::size_t rounded(std::size_t bytes)
  { return (std::max<std::size_t>(bytes, 1) + alignment - 1) / alignment * alignment; }

  void* allocate(std::uintptr_t stream, std::size_t bytes)
  {
    auto const need = rounded(bytes);
    std::lock_guard<std::mutex> lock(mutex);
    auto& head = free_heads[need];  // inserted here, so a free never allocates
    if (head != nullptr) {
      void* p = head;
      head    = *static_cast<void**>(p);
      return p;
    }
    if (need > left) { grow(stream, std::max(chunk_bytes, need)); }
    void* p = cursor;
    cursor += need;
    left -= need;
    return p;
  }

  void deallocate(std::uintptr_t, void* p, std::size_t bytes) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& head              = free_heads.find(rounded(bytes))->second;
    *static_cast<void**>(p) = head;
    head                    = p;
  }

 private:
  void grow(std::uintptr_t stream, std::size_t size)
  {
    chunks.reserve(chunks.size() + 1);  // may throw before the upstream call, not after
    void* chunk = upstream.allocate(stream, size);
    chunks.emplace_back(chunk, size);
    cursor = static_cast<std::byte*>(chunk);
    left   = size;
  }
};

/// One replay of a trace's columns on a fresh recording host resource (or a chunked pool over
/// one).
struct host_replay_run {
  rmm_fences::bench::replay::result result;
  std::vector<recording_host_resource::call> calls;  ///< the recording resource's calls (with a
                                                     ///< pool: its chunks)
  std::uint64_t thread_starts{};                     ///< times the per-thread set-up ran
};

/// How host_replay builds its chain and measures it.
struct host_replay_options {
  std::size_t fail_size{0};  ///< see recording_host_resource
  std::size_t slow_size{0};
  std::uint64_t slow_us{0};
  std::size_t pool_chunk_bytes{0};    ///< >0: replay on a chunked_host_pool of these chunks
  std::size_t pool_initial_bytes{0};  ///< the pool's chunk made at construction (0: none)
  bool measure_footprint{false};      ///< the replay's footprint meter: host_footprint on the
                                      ///< recording resource (else none)
  std::size_t spike_bytes{0};         ///< allocated and freed on the recording resource before the
                                      ///< replay: a peak the footprint must not count
  bool ordered{false};                ///< every event in the trace's recorded order (replay::run)
};

inline host_replay_run host_replay(std::vector<std::uint32_t> const& thread,
                                   std::vector<std::uint8_t> const& is_free,
                                   std::vector<std::uint64_t> const& id,
                                   std::vector<std::uint64_t> const& size,
                                   std::vector<std::uint32_t> const& stream,
                                   std::size_t threads,
                                   std::vector<std::uintptr_t> const& streams,
                                   std::uint64_t repeat,
                                   host_replay_options const& options)
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
  mr.fail_size = options.fail_size;
  mr.slow_size = options.slow_size;
  mr.slow_us   = options.slow_us;
  std::atomic<std::uint64_t> starts{0};
  host_replay_run run;
  auto const on_thread = [&] { ++starts; };
  auto const replay    = [&](auto& resource) {
    if (options.measure_footprint) {
      return rmm_fences::bench::replay::run(
        resource, t, streams, repeat, options.ordered, on_thread, host_footprint{mr});
    }
    return rmm_fences::bench::replay::run(resource, t, streams, repeat, options.ordered, on_thread);
  };
  if (options.spike_bytes > 0) {
    mr.deallocate(0, mr.allocate(0, options.spike_bytes), options.spike_bytes);
  }
  if (options.pool_chunk_bytes > 0) {
    chunked_host_pool pool{mr, options.pool_chunk_bytes, options.pool_initial_bytes};
    run.result = replay(pool);
  } else {
    run.result = replay(mr);
  }
  run.calls         = mr.calls;
  run.thread_starts = starts.load();
  return run;
}

}  // namespace rmm_fences::testing
