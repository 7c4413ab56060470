/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The PyTorch allocator's policy core on host memory with a logging platform (CPU tests only).
 *
 * Every platform and upstream call lands, in order, in one log (acquire, record, wait, release,
 * sync, alloc, free), so a test can check that the allocation stream waited on a fence of each
 * recorded stream before the block went upstream. Faults: the next N fence acquisitions,
 * records, stream waits or stream syncs fail. The upstream also checks each release by itself:
 * every stream that used the block (as the harness told it) must have been ordered before the
 * free on this thread, by a device-side wait of the freeing stream or a host sync; otherwise it
 * counts an unsafe free. Every call is thread-safe, so real threads can drive the core.
 */
#pragma once

#include <rmm_fences/detail/torch_allocator_core.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rmm_fences::testing {

/// Thrown by `torch_host_upstream` when its byte limit would be exceeded.
struct torch_host_out_of_memory : std::bad_alloc {
  [[nodiscard]] char const* what() const noexcept override { return "host upstream: limit"; }
};

/// One platform or upstream call: its kind and up to three arguments.
struct torch_event {
  std::string kind;
  std::uint64_t a{};
  std::uint64_t b{};
  std::uint64_t c{};
};

/**
 * @brief What the core did, and the faults to inject.
 *
 * Events: ("acquire", fence), ("release", fence), ("record", fence, stream), ("record_failed",
 * fence, stream), ("wait", waiter, fence), ("wait_failed", waiter, fence), ("sync", stream),
 * ("sync_failed", stream), ("alloc", ptr, stream, bytes), ("free", ptr, stream, bytes).
 */
struct torch_log {
  std::mutex m;
  std::vector<torch_event> events;           // guarded by m
  bool logging{true};                        // the thread runs turn it off
  std::vector<std::uintptr_t> fence_stream;  // fence -> the stream it was last recorded on
  std::int64_t live_fences{};                // acquired and not released
  int fail_acquire{};
  int fail_record{};
  int fail_wait{};
  int fail_sync{};
  std::uint64_t waits_ok{};
  std::uint64_t syncs_ok{};

  // The streams that used each live block (the allocation stream, the recorded ones), as the
  // harness saw them; guarded by used_m.
  std::mutex used_m;
  std::map<std::uintptr_t, std::set<std::uintptr_t>> used_by;
  std::uint64_t unsafe_frees{};  // guarded by used_m

  void log(char const* kind, std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0)
  {
    if (logging) { events.push_back({kind, a, b, c}); }
  }

  /// Consumes one injected failure of `counter`; true: fail.
  static bool fails(int& counter) noexcept
  {
    if (counter > 0) {
      --counter;
      return true;
    }
    return false;
  }
};

/// What the calling thread's current free was ordered after: (waiter, used stream) pairs of
/// device-side waits and the streams the host synchronized. Cleared by the harness per free.
struct torch_ordering {
  std::set<std::pair<std::uintptr_t, std::uintptr_t>> waits;
  std::set<std::uintptr_t> synced;
};
inline thread_local torch_ordering torch_thread_ordering;

/// `torch_allocator_core`'s platform over a `torch_log`; streams are plain handles.
class torch_host_platform {
 public:
  using fence_type    = std::size_t;
  using stream_type   = std::uintptr_t;
  using out_of_memory = torch_host_out_of_memory;

  explicit torch_host_platform(std::shared_ptr<torch_log> log) : log_{std::move(log)} {}

  fence_type acquire_fence()
  {
    std::lock_guard<std::mutex> lock(log_->m);
    if (torch_log::fails(log_->fail_acquire)) { throw std::bad_alloc{}; }
    log_->fence_stream.push_back(0);
    ++log_->live_fences;
    auto const f = log_->fence_stream.size() - 1;
    log_->log("acquire", f);
    return f;
  }

  void release_fence(fence_type f) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->m);
    --log_->live_fences;
    log_->log("release", f);
  }

  bool record(fence_type f, stream_type stream) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->m);
    if (torch_log::fails(log_->fail_record)) {
      log_->log("record_failed", f, stream);
      return false;
    }
    log_->fence_stream.at(f) = stream;
    log_->log("record", f, stream);
    return true;
  }

  bool device_wait(stream_type waiter, fence_type f) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->m);
    if (torch_log::fails(log_->fail_wait)) {
      log_->log("wait_failed", waiter, f);
      return false;
    }
    torch_thread_ordering.waits.emplace(waiter, log_->fence_stream.at(f));
    ++log_->waits_ok;
    log_->log("wait", waiter, f);
    return true;
  }

  bool sync_stream(stream_type stream) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->m);
    if (torch_log::fails(log_->fail_sync)) {
      log_->log("sync_failed", stream);
      return false;
    }
    torch_thread_ordering.synced.insert(stream);
    ++log_->syncs_ok;
    log_->log("sync", stream);
    return true;
  }

 private:
  std::shared_ptr<torch_log> log_;
};

/**
 * @brief Host memory with a byte limit; logs every call and checks each release against the
 * streams that used the block (`torch_log::used_by`).
 */
class torch_host_upstream {
 public:
  torch_host_upstream(std::size_t limit, std::shared_ptr<torch_log> log)
    : limit_{limit}, log_{std::move(log)}, state_{std::make_unique<state>()}
  {
  }

  void* allocate(std::uintptr_t stream, std::size_t bytes, std::size_t alignment)
  {
    std::lock_guard<std::mutex> lock(state_->m);
    if (state_->used + bytes > limit_) { throw torch_host_out_of_memory{}; }
    auto const size = ((bytes == 0 ? 1 : bytes) + alignment - 1) / alignment * alignment;
    void* ptr       = std::aligned_alloc(alignment, size);
    if (ptr == nullptr) { throw std::bad_alloc{}; }
    auto const p = reinterpret_cast<std::uintptr_t>(ptr);
    state_->used += bytes;
    state_->live[p] = bytes;
    {
      std::lock_guard<std::mutex> used_lock(log_->used_m);
      log_->used_by[p] = {stream};
    }
    std::lock_guard<std::mutex> log_lock(log_->m);
    log_->log("alloc", p, stream, bytes);
    return ptr;
  }

  void deallocate(std::uintptr_t stream, void* ptr, std::size_t bytes, std::size_t) noexcept
  {
    auto const p = reinterpret_cast<std::uintptr_t>(ptr);
    {
      std::lock_guard<std::mutex> used_lock(log_->used_m);
      auto const& ordering = torch_thread_ordering;
      for (auto const s : log_->used_by[p]) {
        if (s != stream && ordering.waits.count({stream, s}) == 0 &&
            ordering.synced.count(s) == 0) {
          ++log_->unsafe_frees;
        }
      }
      log_->used_by.erase(p);
    }
    {
      std::lock_guard<std::mutex> log_lock(log_->m);
      log_->log("free", p, stream, bytes);
    }
    std::lock_guard<std::mutex> lock(state_->m);
    auto live = state_->live.find(p);
    if (live == state_->live.end() || live->second != bytes) {
      ++state_->bad_frees;
      return;
    }
    state_->used -= bytes;
    state_->live.erase(live);
    std::free(ptr);
  }

  ~torch_host_upstream()
  {
    if (!state_) { return; }
    for (auto const& [p, bytes] : state_->live) {
      std::free(reinterpret_cast<void*>(p));
    }
  }

  torch_host_upstream(torch_host_upstream&&) noexcept = default;

  [[nodiscard]] std::size_t used() const
  {
    std::lock_guard<std::mutex> lock(state_->m);
    return state_->used;
  }

  [[nodiscard]] std::uint64_t bad_frees() const
  {
    std::lock_guard<std::mutex> lock(state_->m);
    return state_->bad_frees;
  }

 private:
  struct state {
    std::mutex m;
    std::size_t used{};
    std::map<std::uintptr_t, std::size_t> live;
    std::uint64_t bad_frees{};  ///< frees of blocks it did not hand out (or of another size)
  };

  std::size_t limit_;
  std::shared_ptr<torch_log> log_;
  std::unique_ptr<state> state_;
};

/// Outcome of `host_torch_allocator::run_threads`.
struct torch_thread_result {
  std::uint64_t allocations{};  ///< successful allocations made by the workers
  std::uint64_t frees{};        ///< frees made by the workers
  std::uint64_t records{};      ///< record_stream calls that found a live block
  std::uint64_t unknown_records{};
  std::uint64_t ooms{};
  std::uint64_t unsafe_frees{};
  std::uint64_t upstream_bad_frees{};
  std::uint64_t upstream_used{};  ///< bytes still held upstream at the end (leaked blocks)
  std::uint64_t waits_ok{};
  std::uint64_t syncs_ok{};
  std::int64_t live_fences{};
  std::uint64_t live_count{};
};

/// The PyTorch allocator's core driven by a test: host memory, a logging platform.
class host_torch_allocator {
  using core_type =
    rmm_fences::mr::detail::torch_allocator_core<torch_host_platform, torch_host_upstream>;

 public:
  explicit host_torch_allocator(std::size_t upstream_limit)
    : log_{std::make_shared<torch_log>()}, core_{torch_host_upstream{upstream_limit, log_}, log_}
  {
  }

  void* allocate(std::uintptr_t stream, std::size_t bytes) { return core_.allocate(stream, bytes); }

  void* try_allocate(std::uintptr_t stream, std::size_t bytes)
  { return core_.try_allocate(stream, bytes); }

  /// `record_stream`, and the harness notes that `stream` uses the block (when it is live).
  bool record_stream(void* ptr, std::uintptr_t stream)
  {
    std::lock_guard<std::mutex> lock(log_->used_m);
    bool const live = core_.record_stream(ptr, stream);
    if (live) { log_->used_by[reinterpret_cast<std::uintptr_t>(ptr)].insert(stream); }
    return live;
  }

  void deallocate(void* ptr, std::size_t bytes, std::uintptr_t stream)
  {
    torch_thread_ordering = {};
    core_.deallocate(ptr, bytes, stream);
  }

  /**
   * @brief Real threads racing: `workers` threads allocate on their own stream, record
   * streams on their own blocks and on blocks other threads published (which may be freed
   * meanwhile), and free; one thread injects acquire, record, wait and sync failures.
   */
  torch_thread_result run_threads(int workers, int iterations, std::uint64_t random_state)
  {
    {
      std::lock_guard<std::mutex> lock(log_->m);
      log_->logging = false;
    }
    std::vector<std::atomic<std::uintptr_t>> published(64);
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> allocations{0}, frees{0}, records{0}, unknown{0}, ooms{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < workers; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(random_state * 7919 + static_cast<std::uint64_t>(t));
        std::uintptr_t const own = 1000 + static_cast<std::uintptr_t>(t);
        auto const any_stream    = [&] {
          return static_cast<std::uintptr_t>(1000 + rng() % static_cast<unsigned>(workers + 2));
        };
        std::vector<std::pair<void*, std::size_t>> live;
        for (int i = 0; i < iterations; ++i) {
          auto const r = rng() % 100;
          if (r < 40 || live.empty()) {
            std::size_t const bytes = 1 + rng() % 4096;
            try {
              void* p = core_.allocate(own, bytes);
              live.emplace_back(p, bytes);
              allocations.fetch_add(1);
              published[rng() % published.size()].store(reinterpret_cast<std::uintptr_t>(p));
            } catch (torch_host_out_of_memory const&) {
              ooms.fetch_add(1);
            }
          } else if (r < 60) {
            auto const& [p, bytes] = live[rng() % live.size()];
            (record_stream(p, any_stream()) ? records : unknown).fetch_add(1);
          } else if (r < 70) {
            // someone else's block, maybe freed (or reallocated) by now
            auto const p = published[rng() % published.size()].load();
            (record_stream(reinterpret_cast<void*>(p), any_stream()) ? records : unknown)
              .fetch_add(1);
          } else {
            auto const k    = rng() % live.size();
            auto [p, bytes] = live[k];
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            deallocate(p, bytes, own);
            frees.fetch_add(1);
          }
        }
        for (auto [p, bytes] : live) {
          deallocate(p, bytes, own);
          frees.fetch_add(1);
        }
      });
    }
    std::thread chaos([&] {
      std::mt19937_64 rng(random_state);
      while (!stop.load()) {
        {
          std::lock_guard<std::mutex> lock(log_->m);
          switch (rng() % 8) {
            case 0: log_->fail_acquire = 1; break;
            case 1: log_->fail_record = 1; break;
            case 2: log_->fail_wait = 1; break;
            case 3: log_->fail_sync = 1; break;
            default: break;
          }
        }
        std::this_thread::yield();
      }
    });
    for (auto& th : threads) {
      th.join();
    }
    stop.store(true);
    chaos.join();
    torch_thread_result out;
    out.allocations        = allocations.load();
    out.frees              = frees.load();
    out.records            = records.load();
    out.unknown_records    = unknown.load();
    out.ooms               = ooms.load();
    out.upstream_bad_frees = core_.upstream().bad_frees();
    out.upstream_used      = core_.upstream().used();
    out.live_count         = core_.live_count();
    {
      std::lock_guard<std::mutex> lock(log_->used_m);
      out.unsafe_frees = log_->unsafe_frees;
    }
    std::lock_guard<std::mutex> lock(log_->m);
    out.waits_ok       = log_->waits_ok;
    out.syncs_ok       = log_->syncs_ok;
    out.live_fences    = log_->live_fences;
    log_->fail_acquire = log_->fail_record = log_->fail_wait = log_->fail_sync = 0;
    log_->logging                                                              = true;
    return out;
  }

  std::vector<torch_event> events()
  {
    std::lock_guard<std::mutex> lock(log_->m);
    return log_->events;
  }

  void clear_events()
  {
    std::lock_guard<std::mutex> lock(log_->m);
    log_->events.clear();
  }

  core_type& core() noexcept { return core_; }
  torch_log& log() noexcept { return *log_; }
  torch_host_upstream& upstream() noexcept { return core_.upstream(); }

 private:
  std::shared_ptr<torch_log> log_;
  core_type core_;
};

}  // namespace rmm_fences::testing
