/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazard tracker's policy core on a simulated device (CPU tests only): streams are queues
 * of work items that the test completes by hand, fences complete when the stream reaches them,
 * and waits hold a stream until their fence completes, as on a GPU. Faults can be injected
 * (records, queries and stream waits that fail), the per-thread default stream names another
 * stream on each thread (simulated or real threads), and the upstream can hand out an address
 * that is still live. Every part is thread-safe, for tests with real threads.
 */
#pragma once

#include <rmm_fences/detail/hazard_tracker_core.hpp>
#include <rmm_fences/detail/stream_identity.hpp>
#include <rmm_fences/mr/hazards.hpp>

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rmm_fences::testing {

using keys = rmm_fences::mr::detail::per_thread_stream_keys;

/// What a query of a simulated fence found (the tracker platform's `fence_state`).
enum class sim_fence_state : int { complete = 0, pending = 1, failed = 2 };

/// The simulated thread of the calling (real) thread: 0 means its own token.
inline std::uint64_t& simulated_thread() noexcept
{
  thread_local std::uint64_t thread = 0;
  return thread;
}

/// The token of the calling thread as the simulated platform sees it.
inline std::uint64_t sim_thread_token() noexcept
{
  auto const simulated = simulated_thread();
  return simulated != 0 ? simulated : keys::this_thread_token();
}

/**
 * @brief A device with in-order streams whose work the test completes step by step.
 *
 * Streams are named by their key (a per-thread default stream by its thread's key). Each
 * record of a fence is its own completion point (a fence recorded again no longer follows its
 * earlier record, and a wait follows the record current when it was enqueued), as with CUDA
 * events. Faults: a record on a stream in `failing_records` fails (nothing is enqueued), a
 * query of a fence last recorded on a stream in `failing_queries` fails, a wait enqueued on a
 * stream in `failing_waits` fails (nothing is enqueued); `fail_next_*` fail the next n calls
 * of that kind on any stream.
 */
struct sim_device {
  struct item {
    enum class kind { work, wait, mark } what{};
    std::size_t record{};  ///< index into `records` (wait, mark)
  };

  mutable std::recursive_mutex mutex;
  std::map<std::uintptr_t, std::deque<item>> streams;
  std::vector<bool> records;              ///< completion of every record ever made
  std::vector<std::uintptr_t> record_on;  ///< the stream of every record
  std::vector<std::ptrdiff_t> current;    ///< fence -> its current record (-1: never recorded)
  std::vector<bool> in_use;               ///< fence -> acquired and not released
  std::vector<std::size_t> free_fences;
  std::set<std::uintptr_t> capturing;
  std::set<std::uintptr_t> failing_records;
  std::set<std::uintptr_t> failing_queries;
  std::set<std::uintptr_t> failing_waits;
  std::size_t fail_next_records{};
  std::size_t fail_next_queries{};
  std::size_t fail_next_waits{};
  std::size_t fences_in_use{};
  std::uint64_t fences_acquired{};
  std::uint64_t fences_released{};

  std::size_t acquire()
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    ++fences_in_use;
    ++fences_acquired;
    if (!free_fences.empty()) {
      auto const id = free_fences.back();
      free_fences.pop_back();
      current[id] = -1;
      in_use[id]  = true;
      return id;
    }
    current.push_back(-1);
    in_use.push_back(true);
    return current.size() - 1;
  }

  void release(std::size_t id)
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    if (id >= in_use.size() || !in_use[id]) { throw std::logic_error("fence released twice"); }
    in_use[id] = false;
    --fences_in_use;
    ++fences_released;
    free_fences.push_back(id);
  }

  /// Enqueues work that keeps `stream` busy until completed with `step`.
  void launch(std::uintptr_t stream)
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    streams[stream].push_back({item::kind::work, 0});
  }

  [[nodiscard]] bool idle(std::uintptr_t stream) const
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    auto const it = streams.find(stream);
    return it == streams.end() || it->second.empty();
  }

  /// Completes the oldest work item of `stream` if nothing holds it; false if none ran.
  bool step(std::uintptr_t stream)
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    settle();
    auto& queue = streams[stream];
    if (queue.empty() || queue.front().what != item::kind::work) { return false; }
    queue.pop_front();
    settle();
    return true;
  }

  /// Records `id` on `stream`; false (nothing enqueued) when a record fault hits (`faults`:
  /// the tracker's calls; a test's own records and waits take none).
  bool record(std::size_t id, std::uintptr_t stream, bool faults = true)
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    if (faults && fail_next_records > 0) {
      --fail_next_records;
      return false;
    }
    if (faults && failing_records.count(stream) != 0) { return false; }
    records.push_back(false);
    record_on.push_back(stream);
    current.at(id) = static_cast<std::ptrdiff_t>(records.size() - 1);
    streams[stream].push_back({item::kind::mark, records.size() - 1});
    settle();
    return true;
  }

  /// An unrecorded fence counts as complete (as `cudaEventQuery` reports it). No fault.
  [[nodiscard]] bool ready(std::size_t id) const
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    auto const r = current.at(id);
    return r < 0 || records[static_cast<std::size_t>(r)];
  }

  /// The platform's query: `ready` unless a query fault hits.
  sim_fence_state query(std::size_t id)
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    if (fail_next_queries > 0) {
      --fail_next_queries;
      return sim_fence_state::failed;
    }
    auto const r = current.at(id);
    if (r >= 0 && failing_queries.count(record_on[static_cast<std::size_t>(r)]) != 0) {
      return sim_fence_state::failed;
    }
    return ready(id) ? sim_fence_state::complete : sim_fence_state::pending;
  }

  /// Enqueues on `stream` a wait for `id`'s current record; false when a wait fault hits.
  bool wait(std::uintptr_t stream, std::size_t id, bool faults = true)
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    if (faults && fail_next_waits > 0) {
      --fail_next_waits;
      return false;
    }
    if (faults && failing_waits.count(stream) != 0) { return false; }
    if (!ready(id)) {
      streams[stream].push_back({item::kind::wait, static_cast<std::size_t>(current[id])});
    }
    return true;
  }

  [[nodiscard]] bool is_capturing(std::uintptr_t stream) const
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    return capturing.count(stream) != 0;
  }

  /// Retires marks and satisfied waits at the head of every stream, until nothing changes.
  void settle()
  {
    std::lock_guard<std::recursive_mutex> lock(mutex);
    bool changed = true;
    while (changed) {
      changed = false;
      for (auto& [stream, queue] : streams) {
        while (!queue.empty()) {
          auto const& head = queue.front();
          if (head.what == item::kind::mark) {
            records[head.record] = true;
          } else if (head.what != item::kind::wait || !records[head.record]) {
            break;
          }
          queue.pop_front();
          changed = true;
        }
      }
    }
  }
};

/**
 * @brief The tracker core's platform on a `sim_device`; NVTX annotations are counted.
 *
 * Stream handles are integers; the handle `per_thread_handle` (2, as `cudaStreamPerThread`)
 * is the calling thread's per-thread default stream, keyed by the thread (its simulated
 * thread, see `simulated_thread`, or its real one).
 */
class sim_platform {
 public:
  using stream_type = std::uintptr_t;
  using fence_type  = std::size_t;
  using fence_state = sim_fence_state;

  static constexpr std::uintptr_t per_thread_handle = keys::tag;

  explicit sim_platform(std::shared_ptr<sim_device> device) : device_{std::move(device)} {}

  static std::uintptr_t key(stream_type stream) noexcept
  { return stream == per_thread_handle ? keys::key(sim_thread_token()) : stream; }

  /// The handle of `key`'s stream; nullopt for another thread's per-thread default stream.
  static std::optional<stream_type> stream(std::uintptr_t key) noexcept
  {
    if (!keys::is_per_thread(key)) { return key; }
    if (key != keys::key(sim_thread_token())) { return std::nullopt; }
    return per_thread_handle;
  }

  fence_type acquire_fence() { return device_->acquire(); }
  void release_fence(fence_type f) { device_->release(f); }
  bool record(fence_type f, stream_type s) { return device_->record(f, key(s)); }
  [[nodiscard]] fence_state query(fence_type f) const { return device_->query(f); }
  bool device_wait(stream_type s, fence_type f) { return device_->wait(key(s), f); }
  [[nodiscard]] bool is_capturing(stream_type s) const { return device_->is_capturing(key(s)); }
  void annotate_allocation(void*, std::size_t) { ++annotations; }
  void annotate_free(void*) { --annotations; }

  std::int64_t annotations{};  ///< changed under the core's lock only

 private:
  std::shared_ptr<sim_device> device_;
};

/**
 * @brief A host upstream on fake addresses: either a naive cache (a freed block is handed to
 * the next request of its size on any stream at once, like `NaiveCachingMemoryResource`) or
 * stream-ordered (reused only by the stream that freed it). `hand_out_next` makes the next
 * allocation return a given address (an upstream that hands out a live block).
 */
class sim_upstream {
 public:
  struct state {
    std::mutex mutex;
    bool stream_ordered{};
    std::uintptr_t next{1U << 20U};
    std::map<std::pair<std::uintptr_t, std::size_t>, std::vector<std::uintptr_t>> cache;
    std::multimap<std::uintptr_t, std::size_t> out;  // live blocks it handed out
    std::vector<std::uintptr_t> hand_out;            // addresses to return next, last first
    std::uint64_t allocations{};
    std::uint64_t deallocations{};
    std::uint64_t bad_deallocations{};
  };

  explicit sim_upstream(bool stream_ordered) : state_{std::make_shared<state>()}
  { state_->stream_ordered = stream_ordered; }

  void* allocate(std::uintptr_t stream, std::size_t bytes, std::size_t)
  {
    auto& s = *state_;
    std::lock_guard<std::mutex> lock(s.mutex);
    auto const where = std::make_pair(s.stream_ordered ? sim_platform::key(stream) : 0, bytes);
    std::uintptr_t ptr{};
    if (!s.hand_out.empty()) {
      ptr = s.hand_out.back();
      s.hand_out.pop_back();
    } else if (auto it = s.cache.find(where); it != s.cache.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
    } else {
      ptr = s.next;
      s.next += (bytes + 255) / 256 * 256 + 256;
    }
    s.out.emplace(ptr, bytes);
    ++s.allocations;
    return reinterpret_cast<void*>(ptr);
  }

  void deallocate(std::uintptr_t stream, void* p, std::size_t bytes, std::size_t)
  {
    auto& s = *state_;
    std::lock_guard<std::mutex> lock(s.mutex);
    auto const ptr = reinterpret_cast<std::uintptr_t>(p);
    auto [lo, hi]  = s.out.equal_range(ptr);
    auto it        = lo;
    while (it != hi && it->second != bytes) {
      ++it;
    }
    if (it == hi) {
      ++s.bad_deallocations;
      return;
    }
    s.out.erase(it);
    ++s.deallocations;
    s.cache[std::make_pair(s.stream_ordered ? sim_platform::key(stream) : 0, bytes)].push_back(ptr);
  }

  void hand_out_next(std::uintptr_t ptr)
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->hand_out.push_back(ptr);
  }

  [[nodiscard]] state& get() const { return *state_; }

 private:
  std::shared_ptr<state> state_;
};

using sim_tracker_core = rmm_fences::mr::detail::hazard_tracker_core<sim_platform, sim_upstream>;

/// What `run_threads` did, and what it found wrong (empty `errors`: nothing).
struct thread_run {
  std::uint64_t allocations{};
  std::uint64_t frees{};
  std::uint64_t handed_over{};  ///< blocks freed on another thread's per-thread stream
  std::uint64_t busy_frees{};   ///< freed on the thread's other stream while in use
  std::uint64_t foreign{};      ///< foreign frees made on purpose
  std::uint64_t checks{};       ///< invariant checks made between phases
  std::vector<std::string> errors;
};

/// The core, its simulated device and upstream, for the Python tests.
class sim_hazard_tracker {
 public:
  explicit sim_hazard_tracker(bool stream_ordered)
    : device_{std::make_shared<sim_device>()},
      core_{sim_upstream{stream_ordered}, stream_ordered, device_}
  {
  }

  ~sim_hazard_tracker() { core_.release_fences(); }

  sim_device& device() { return *device_; }
  sim_tracker_core& core() { return core_; }
  sim_upstream::state& upstream() const { return core_.upstream().get(); }
  std::int64_t annotations() { return core_.platform().annotations; }
  void hand_out_next(std::uintptr_t ptr) { core_.upstream().hand_out_next(ptr); }

  /// The device's name of a stream handle on the calling thread.
  static std::uintptr_t key(std::uintptr_t handle) { return sim_platform::key(handle); }
  static void set_simulated_thread(std::uint64_t thread) { simulated_thread() = thread; }
  static std::uintptr_t per_thread_key(std::uint64_t thread) { return keys::key(thread); }

  /**
   * @brief Real threads on one tracker, each on its own stream and its per-thread default
   * stream: allocate, launch and complete work, free on the allocation stream after its work
   * completed or on their other stream (with the allocation stream's work completed or not:
   * a hazard the tracker must report), make foreign frees, and hand blocks allocated on their
   * per-thread stream to the next thread, which frees them on its own per-thread stream (a free
   * that cannot be ordered: reported, counted as unchecked). In phases: between two, with every
   * thread stopped, the stats are checked against the live records and the hazards against what was
   * done. Blocks nothing else; call it without the GIL.
   */
  thread_run run_threads(unsigned threads,
                         unsigned phases,
                         unsigned steps,
                         std::uint64_t random_state)
  {
    struct handed {
      std::uintptr_t ptr;
      std::size_t size;
    };
    std::mutex run_mutex;  // guards `run` and the inboxes
    thread_run run;
    std::vector<std::vector<handed>> inbox(threads);
    std::vector<std::vector<std::pair<std::uintptr_t, std::size_t>>> live(threads);
    auto fail = [&](std::string what) {
      std::lock_guard<std::mutex> lock(run_mutex);
      run.errors.push_back(std::move(what));
    };
    auto check = [&]() noexcept {
      try {
        auto const stats = core_.stats();
        auto const out   = core_.outstanding();
        std::size_t bytes{};
        for (auto const& a : out) {
          bytes += a.size;
        }
        std::size_t expected_live{};
        for (auto const& l : live) {
          expected_live += l.size();
        }
        for (auto const& box : inbox) {
          expected_live += box.size();
        }
        std::uint64_t cross{};
        std::uint64_t foreign{};
        std::uint64_t in_flight{};
        std::uint64_t other{};
        for (auto const& h : core_.hazards()) {
          if (h.kind == mr::hazard_kind::cross_stream_free) {
            ++cross;
          } else if (h.kind == mr::hazard_kind::foreign_free) {
            ++foreign;
          } else if (h.kind == mr::hazard_kind::freed_in_flight) {
            ++in_flight;
          } else {
            ++other;
          }
        }
        // a busy free: over a stream-ordered upstream the free's fence (on an idle stream)
        // overtakes the work at once (cross_stream_free); otherwise it is in flight
        auto const ordered = core_.upstream_stream_ordered();
        if (cross != run.handed_over + (ordered ? run.busy_frees : 0) ||
            in_flight != (ordered ? 0 : run.busy_frees)) {
          run.errors.push_back("busy frees misreported: cross " + std::to_string(cross) +
                               ", in flight " + std::to_string(in_flight) + ", busy " +
                               std::to_string(run.busy_frees));
        }
        run.checks += 1;
        if (stats.allocations - stats.deallocations != out.size()) {
          run.errors.push_back("allocations - deallocations != live records");
        }
        if (out.size() != expected_live) { run.errors.push_back("live records lost or extra"); }
        if (stats.allocated_bytes != bytes) { run.errors.push_back("allocated_bytes != live"); }
        if (stats.allocations != run.allocations || stats.deallocations != run.frees) {
          run.errors.push_back("allocation or free counts differ from the calls made");
        }
        if (foreign != run.foreign || stats.rejected_frees != run.foreign) {
          run.errors.push_back("foreign frees miscounted");
        }
        if (other != 0) { run.errors.push_back("a hazard nobody made"); }
        if (stats.unchecked != run.handed_over) {
          run.errors.push_back("unchecked " + std::to_string(stats.unchecked) + " != handed over " +
                               std::to_string(run.handed_over));
        }
        if (stats.hazards != cross + foreign + in_flight) { run.errors.push_back("hazard count"); }
      } catch (std::exception const& e) {
        run.errors.push_back(std::string{"check threw: "} + e.what());
      }
    };
    std::barrier sync{static_cast<std::ptrdiff_t>(threads), check};

    auto body = [&](unsigned me) {
      simulated_thread() = 0;  // a real thread: its own per-thread default stream
      std::mt19937_64 rng{random_state * 1000003U + me};
      auto const own  = static_cast<std::uintptr_t>(4096 + 8 * me);  // a plain stream
      auto const ptds = sim_platform::per_thread_handle;
      auto& mine      = live[me];
      std::vector<std::pair<std::uintptr_t, std::size_t>> to_give;  // on my per-thread stream
      auto drain = [&](std::uintptr_t s) {
        while (device_->step(sim_platform::key(s))) {}
      };
      for (unsigned phase = 0; phase < phases; ++phase) {
        try {
          for (unsigned i = 0; i < steps; ++i) {
            switch (rng() % 8) {
              case 0:
              case 1: {
                std::size_t const size = 256U << (rng() % 3);
                bool const on_ptds     = rng() % 2 == 0;
                auto* p                = core_.allocate(on_ptds ? ptds : own, size, 256);
                {
                  std::lock_guard<std::mutex> lock(run_mutex);
                  run.allocations += 1;
                }
                auto const ptr = reinterpret_cast<std::uintptr_t>(p);
                if (on_ptds && rng() % 2 == 0) {
                  device_->launch(sim_platform::key(ptds));  // still read when handed over
                  to_give.emplace_back(ptr, size);
                } else {
                  std::lock_guard<std::mutex> lock(run_mutex);
                  mine.emplace_back(ptr, size | (on_ptds ? 1U : 0U));
                }
                break;
              }
              case 2: device_->launch(sim_platform::key(rng() % 2 ? own : ptds)); break;
              case 3:
                drain(own);
                drain(ptds);
                break;
              case 4:
              case 5: {
                std::pair<std::uintptr_t, std::size_t> block{};
                {
                  std::lock_guard<std::mutex> lock(run_mutex);
                  if (mine.empty()) { break; }
                  auto const at = rng() % mine.size();
                  block         = mine[at];
                  mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(at));
                }
                auto const s     = (block.second & 1U) != 0 ? ptds : own;
                auto const other = s == own ? ptds : own;
                bool const cross = rng() % 2 == 0;  // freed on the other stream of mine
                if (cross) {
                  drain(other);
                  if (rng() % 2 == 0) { drain(s); }
                } else {
                  drain(s);  // the work that used it ran: a clean free
                }
                bool const busy = cross && !device_->idle(sim_platform::key(s));
                (void)core_.deallocate(cross ? other : s,
                                       reinterpret_cast<void*>(block.first),
                                       block.second & ~std::size_t{1},
                                       256);
                std::lock_guard<std::mutex> lock(run_mutex);
                run.frees += 1;
                run.busy_frees += busy ? 1 : 0;
                break;
              }
              case 6: {
                std::uintptr_t const bogus = (rng() | 1U) & ((std::uintptr_t{1} << 40) - 1);
                {
                  std::lock_guard<std::mutex> lock(run_mutex);
                  run.foreign += 1;  // counted first: a check never runs mid-phase anyway
                }
                (void)core_.deallocate(own, reinterpret_cast<void*>(bogus), 256, 256);
                break;
              }
              default: {
                std::vector<handed> got;
                {
                  std::lock_guard<std::mutex> lock(run_mutex);
                  got.swap(inbox[me]);
                }
                drain(ptds);
                for (auto const& h : got) {  // freed on my per-thread stream
                  (void)core_.deallocate(ptds, reinterpret_cast<void*>(h.ptr), h.size, 256);
                  std::lock_guard<std::mutex> lock(run_mutex);
                  run.frees += 1;
                  run.handed_over += 1;
                }
                break;
              }
            }
            if (!to_give.empty() && rng() % 4 == 0) {
              std::lock_guard<std::mutex> lock(run_mutex);
              for (auto const& [ptr, size] : to_give) {
                inbox[(me + 1) % threads].push_back(handed{ptr, size});
              }
              to_give.clear();
            }
          }
          if (!to_give.empty()) {
            std::lock_guard<std::mutex> lock(run_mutex);
            for (auto const& [ptr, size] : to_give) {
              inbox[(me + 1) % threads].push_back(handed{ptr, size});
            }
            to_give.clear();
          }
        } catch (std::exception const& e) {
          fail(std::string{"thread threw: "} + e.what());
        }
        sync.arrive_and_wait();
      }
      // Free what is left, then drain every stream this thread used.
      try {
        drain(own);
        drain(ptds);
        for (auto const& block : mine) {
          auto const s = (block.second & 1U) != 0 ? ptds : own;
          (void)core_.deallocate(
            s, reinterpret_cast<void*>(block.first), block.second & ~std::size_t{1}, 256);
          std::lock_guard<std::mutex> lock(run_mutex);
          run.frees += 1;
        }
        mine.clear();
      } catch (std::exception const& e) {
        fail(std::string{"thread threw: "} + e.what());
      }
      sync.arrive_and_wait();
      try {
        std::vector<handed> got;
        {
          std::lock_guard<std::mutex> lock(run_mutex);
          got.swap(inbox[me]);
        }
        for (auto const& h : got) {
          (void)core_.deallocate(ptds, reinterpret_cast<void*>(h.ptr), h.size, 256);
          std::lock_guard<std::mutex> lock(run_mutex);
          run.frees += 1;
          run.handed_over += 1;
        }
        drain(own);
        drain(ptds);
      } catch (std::exception const& e) {
        fail(std::string{"thread threw: "} + e.what());
      }
      sync.arrive_and_wait();
    };
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back(body, t);
    }
    for (auto& t : pool) {
      t.join();
    }
    return run;
  }

 private:
  std::shared_ptr<sim_device> device_;
  sim_tracker_core core_;
};

}  // namespace rmm_fences::testing
