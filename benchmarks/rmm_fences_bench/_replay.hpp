/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// The replay engine of rmm_fences_bench.replay (rmm allocation logs replayed by one thread per
// recorded thread): benchmark code, never installed with the package. It knows no CUDA: it is
// templated on a resource and a stream type, so that the host test harness (tests/native) runs
// it over a host resource; _loops.hpp runs it over an rmm resource.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rmm_fences::bench {

/**
 * @brief Runs `body(i)` on `count` new threads, after each ran `prepare(i)`, all released
 * together (a ready counter and a go flag). Returns the seconds from the release until the last
 * thread ended. Exceptions must not leave `prepare` or `body`.
 */
template <typename Prepare, typename Body>
double start_together(std::size_t count, Prepare prepare, Body body)
{
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  threads.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      prepare(i);
      ready.fetch_add(1);
      while (!go.load()) {}
      body(i);
    });
  }
  while (ready.load() < count) {}
  auto const start = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& t : threads) {
    t.join();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

namespace replay {

/// One event of a thread: allocate (or free) allocation `id` of `size` bytes on recorded
/// stream `stream`; `index` is its position in the trace's recorded order (all threads).
struct event {
  std::uint64_t id{};
  std::uint64_t size{};
  std::uint64_t index{};
  std::uint32_t stream{};
  bool is_free{};
};

/// A trace as the threads replay it: each recorded thread's events in recorded order.
struct trace {
  std::vector<std::vector<event>> threads;
  std::size_t ids{};                ///< allocation ids are 0 .. ids - 1
  std::size_t streams{};            ///< recorded streams are 0 .. streams - 1
  std::uint64_t peak_live_bytes{};  ///< most bytes live at once in recorded order (a free
                                    ///< gives back its allocation's size)
};

/**
 * @brief Builds a `trace` from the columns of a recorded trace (event `i`: thread `thread[i]`,
 * free if `is_free[i]`, allocation `id[i]`, `size[i]` bytes, stream `stream[i]`).
 *
 * Throws std::invalid_argument unless the log is one a replay can finish: every id is
 * allocated once, freed at most once and only after its allocation (in recorded order), and
 * every thread and stream index is below `threads` and `streams`. Also sums the live bytes in
 * recorded order: `peak_live_bytes`, the trace's own peak, whatever a replay interleaves.
 */
inline trace make_trace(std::size_t events,
                        std::uint32_t const* thread,
                        std::uint8_t const* is_free,
                        std::uint64_t const* id,
                        std::uint64_t const* size,
                        std::uint32_t const* stream,
                        std::size_t threads,
                        std::size_t streams)
{
  trace t;
  t.threads.resize(threads);
  t.streams = streams;
  for (std::size_t i = 0; i < events; ++i) {
    t.ids = std::max<std::size_t>(t.ids, id[i] + 1);
  }
  std::vector<std::uint8_t> seen(t.ids, 0);  // 1: allocated, 2: freed
  auto const fail = [](std::size_t i, std::string const& what) {
    throw std::invalid_argument("event " + std::to_string(i) + ": " + what);
  };
  std::vector<std::uint64_t> sizes(t.ids, 0);  // of each allocation, for its free
  std::uint64_t live = 0;
  for (std::size_t i = 0; i < events; ++i) {
    if (thread[i] >= threads) { fail(i, "thread index out of range"); }
    if (stream[i] >= streams) { fail(i, "stream index out of range"); }
    auto& state = seen[id[i]];
    if (is_free[i] != 0) {
      if (state != 1) { fail(i, "free of an allocation that is not live"); }
      state = 2;
      live -= sizes[id[i]];
    } else {
      if (state != 0) { fail(i, "allocation id allocated twice"); }
      state        = 1;
      sizes[id[i]] = size[i];
      live += size[i];
      t.peak_live_bytes = std::max(t.peak_live_bytes, live);
    }
    t.threads[thread[i]].push_back(event{id[i], size[i], i, stream[i], is_free[i] != 0});
  }
  return t;
}

/// What a replay did (sums over the repetitions).
struct result {
  double seconds{};                 ///< timed seconds (from the release of the threads until the
                                    ///< last one ended), summed over the repetitions
  std::uint64_t allocations{};      ///< allocations attempted
  std::uint64_t frees{};            ///< frees made in the timed region
  std::uint64_t errors{};           ///< allocations that threw
  std::uint64_t skipped_frees{};    ///< frees of allocations that threw (not made)
  std::uint64_t leftovers{};        ///< allocations never freed in the log, freed after the timing
  std::uint64_t peak_live_bytes{};  ///< most bytes live at once as replayed (largest repetition;
                                    ///< ordered: the trace's, unless an allocation threw)
  std::uint64_t trace_peak_live_bytes{};  ///< most bytes live at once in the trace's recorded
                                          ///< order (trace::peak_live_bytes)
  std::uint64_t footprint_bytes{};        ///< most bytes the footprint meter's layer held at once
                                          ///< during the replay, all repetitions, what it held
                                          ///< before included (0: no meter)
  double fragmentation{};  ///< footprint_bytes / trace_peak_live_bytes (0: no meter, or a
                           ///< trace with nothing live)
};

/**
 * @brief The meter of no footprint: `run` without one reports `footprint_bytes` 0.
 *
 * A footprint meter watches the layer a chain takes its memory from (the bottom of the chain):
 * `start()` runs once before the first repetition, `peak()` once after the last (the leftovers
 * freed), and returns the most bytes that layer held at once in between, what it held at
 * `start()` included. Neither runs if the replay's checks throw first.
 */
struct no_footprint {
  void start() {}
  std::uint64_t peak() { return 0; }
};

/**
 * @brief Waits until `sequence` reaches `index`: spins a while (the turn usually comes within a
 * call), then yields (more threads than cores).
 */
inline void wait_for_turn(std::atomic<std::uint64_t> const& sequence, std::uint64_t index)
{
  for (int spin = 0; spin < 256; ++spin) {
    if (sequence.load(std::memory_order_acquire) == index) { return; }
  }
  while (sequence.load(std::memory_order_acquire) != index) {
    std::this_thread::yield();
  }
}

/**
 * @brief Replays `t` on `mr`, `repeat` times from scratch.
 *
 * One thread per recorded thread replays its events in recorded order. Free-running (`ordered`
 * false), nothing else orders the threads: a free of an allocation made by another thread spins
 * (yielding) until that allocation happened. `ordered`: every event also waits for its turn in
 * the trace's one recorded order (all threads): a shared sequence counter, which each thread
 * waits to reach its event's index (spinning, then yielding) and advances past it after the
 * call, so that the calls reach `mr` in recorded order and the replayed peak of live bytes is the
 * trace's (an allocation that throws lowers it). Recorded stream `s` is `streams[s]`. Each
 * thread first runs `on_thread()` (the CUDA device, for instance). An allocation that throws is
 * counted, the replay goes on and its free is skipped. Allocations the log never frees are freed
 * after each repetition, outside the timing, on their stream.
 *
 * `footprint` (see no_footprint) measures what the chain drew from its bottom layer:
 * `footprint_bytes`, and `fragmentation` = `footprint_bytes` / the trace's own peak of live bytes.
 *
 * `Resource` has `void* allocate(Stream, std::size_t)` and
 * `void deallocate(Stream, void*, std::size_t)` (the latter must not throw), both thread-safe.
 */
template <typename Resource, typename Stream, typename OnThread, typename Footprint = no_footprint>
result run(Resource& mr,
           trace const& t,
           std::vector<Stream> const& streams,
           std::uint64_t repeat,
           bool ordered,
           OnThread on_thread,
           Footprint&& footprint = Footprint{})
{
  if (streams.size() < t.streams) {
    throw std::invalid_argument("replay: fewer streams than the trace records");
  }
  enum : std::uint8_t { pending = 0, live = 1, failed = 2, freed = 3 };
  struct slot {
    std::atomic<std::uint8_t> state{pending};
    void* ptr{};
    std::uint64_t size{};
    std::uint32_t stream{};
  };
  struct counters {  // per thread, summed after the join (no shared counter in the loop but one)
    std::uint64_t allocations{}, frees{}, errors{}, skipped{};
  };
  std::vector<slot> slots(t.ids);
  std::vector<counters> per_thread(t.threads.size());
  std::atomic<std::uint64_t> live_bytes{0};
  std::atomic<std::uint64_t> peak{0};
  std::atomic<std::uint64_t> sequence{0};  // ordered: the index of the event whose turn it is
  result r;
  r.trace_peak_live_bytes = t.peak_live_bytes;
  // One event, its counters in `c`.
  auto const play = [&](event const& e, counters& c) {
    auto& s = slots[e.id];
    if (e.is_free) {
      auto state = s.state.load(std::memory_order_acquire);
      while (state == pending) {  // allocated by another thread, not yet
        std::this_thread::yield();
        state = s.state.load(std::memory_order_acquire);
      }
      if (state == failed) {
        ++c.skipped;
        return;
      }
      mr.deallocate(streams[s.stream], s.ptr, s.size);
      live_bytes.fetch_sub(s.size, std::memory_order_relaxed);
      s.state.store(freed, std::memory_order_relaxed);
      ++c.frees;
      return;
    }
    ++c.allocations;
    s.size   = e.size;
    s.stream = e.stream;
    try {
      s.ptr = mr.allocate(streams[e.stream], e.size);
    } catch (...) {
      ++c.errors;
      s.state.store(failed, std::memory_order_release);
      return;
    }
    auto const now = live_bytes.fetch_add(e.size, std::memory_order_relaxed) + e.size;
    auto seen      = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {}
    s.state.store(live, std::memory_order_release);
  };
  footprint.start();
  for (std::uint64_t rep = 0; rep < repeat; ++rep) {
    for (auto& s : slots) {
      s.state.store(pending, std::memory_order_relaxed);
      s.ptr = nullptr;
    }
    live_bytes.store(0);
    peak.store(0);
    sequence.store(0);
    std::fill(per_thread.begin(), per_thread.end(), counters{});
    r.seconds += start_together(
      t.threads.size(),
      [&](std::size_t) { on_thread(); },
      [&](std::size_t thread) {
        auto& c = per_thread[thread];
        if (!ordered) {
          for (auto const& e : t.threads[thread]) {
            play(e, c);
          }
          return;
        }
        for (auto const& e : t.threads[thread]) {
          wait_for_turn(sequence, e.index);
          play(e, c);
          sequence.store(e.index + 1, std::memory_order_release);
        }
      });
    for (auto& s : slots) {  // untimed: what the log never freed
      if (s.state.load() == live) {
        mr.deallocate(streams[s.stream], s.ptr, s.size);
        s.state.store(freed);
        ++r.leftovers;
      }
    }
    for (auto const& c : per_thread) {
      r.allocations += c.allocations;
      r.frees += c.frees;
      r.errors += c.errors;
      r.skipped_frees += c.skipped;
    }
    r.peak_live_bytes = std::max(r.peak_live_bytes, peak.load());
  }
  r.footprint_bytes = footprint.peak();
  if (t.peak_live_bytes > 0) {
    r.fragmentation =
      static_cast<double>(r.footprint_bytes) / static_cast<double>(t.peak_live_bytes);
  }
  return r;
}

}  // namespace replay
}  // namespace rmm_fences::bench
