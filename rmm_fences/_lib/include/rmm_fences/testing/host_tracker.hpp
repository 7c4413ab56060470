/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazard tracker's policy core on a simulated device (CPU tests only): streams are queues
 * of work items that the test completes by hand, fences complete when the stream reaches them,
 * and waits hold a stream until their fence completes, as on a GPU.
 */
#pragma once

#include <rmm_fences/detail/hazard_tracker_core.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

namespace rmm_fences::testing {

/**
 * @brief A device with in-order streams whose work the test completes step by step.
 *
 * Each record of a fence is its own completion point (a fence recorded again no longer
 * follows its earlier record, and a wait follows the record current when it was enqueued), as
 * with CUDA events.
 */
struct sim_device {
  struct item {
    enum class kind { work, wait, mark } what{};
    std::size_t record{};  ///< index into `records` (wait, mark)
  };

  std::map<std::uintptr_t, std::deque<item>> streams;
  std::vector<bool> records;             ///< completion of every record ever made
  std::vector<std::ptrdiff_t> current;   ///< fence -> its current record (-1: never recorded)
  std::vector<std::size_t> free_fences;
  std::set<std::uintptr_t> capturing;
  std::size_t fences_in_use{};

  std::size_t acquire()
  {
    ++fences_in_use;
    if (!free_fences.empty()) {
      auto const id = free_fences.back();
      free_fences.pop_back();
      current[id] = -1;
      return id;
    }
    current.push_back(-1);
    return current.size() - 1;
  }

  void release(std::size_t id)
  {
    if (fences_in_use == 0) { throw std::logic_error("fence released twice"); }
    --fences_in_use;
    free_fences.push_back(id);
  }

  /// Enqueues work that keeps `stream` busy until completed with `step`.
  void launch(std::uintptr_t stream) { streams[stream].push_back({item::kind::work, 0}); }

  [[nodiscard]] bool idle(std::uintptr_t stream) const
  {
    auto const it = streams.find(stream);
    return it == streams.end() || it->second.empty();
  }

  /// Completes the oldest work item of `stream` if nothing holds it; false if none ran.
  bool step(std::uintptr_t stream)
  {
    settle();
    auto& queue = streams[stream];
    if (queue.empty() || queue.front().what != item::kind::work) { return false; }
    queue.pop_front();
    settle();
    return true;
  }

  void record(std::size_t id, std::uintptr_t stream)
  {
    records.push_back(false);
    current.at(id) = static_cast<std::ptrdiff_t>(records.size() - 1);
    streams[stream].push_back({item::kind::mark, records.size() - 1});
    settle();
  }

  /// An unrecorded fence counts as complete (as `cudaEventQuery` reports it).
  [[nodiscard]] bool ready(std::size_t id) const
  {
    auto const r = current.at(id);
    return r < 0 || records[static_cast<std::size_t>(r)];
  }

  void wait(std::uintptr_t stream, std::size_t id)
  {
    if (!ready(id)) {
      streams[stream].push_back({item::kind::wait, static_cast<std::size_t>(current[id])});
    }
  }

  /// Retires marks and satisfied waits at the head of every stream, until nothing changes.
  void settle()
  {
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

/// The tracker core's platform on a `sim_device`; NVTX annotations are counted.
class sim_platform {
 public:
  using stream_type = std::uintptr_t;
  using fence_type  = std::size_t;

  explicit sim_platform(std::shared_ptr<sim_device> device) : device_{std::move(device)} {}

  static std::uintptr_t key(stream_type stream) noexcept { return stream; }
  static stream_type stream(std::uintptr_t key) noexcept { return key; }
  fence_type acquire_fence() { return device_->acquire(); }
  void release_fence(fence_type f) { device_->release(f); }
  bool record(fence_type f, stream_type s)
  {
    device_->record(f, s);
    return true;
  }
  [[nodiscard]] bool ready(fence_type f) const { return device_->ready(f); }
  bool wait(stream_type s, fence_type f)
  {
    device_->wait(s, f);
    return true;
  }
  [[nodiscard]] bool is_capturing(stream_type s) const { return device_->capturing.count(s) != 0; }
  void annotate_allocation(void*, std::size_t) { ++annotations; }
  void annotate_free(void*) { --annotations; }

  std::int64_t annotations{};

 private:
  std::shared_ptr<sim_device> device_;
};

/**
 * @brief A host upstream on fake addresses: either a naive cache (a freed block is handed to
 * the next request of its size on any stream at once, like `NaiveCachingMemoryResource`) or
 * stream-ordered (reused only by the stream that freed it).
 */
class sim_upstream {
 public:
  struct state {
    bool stream_ordered{};
    std::uintptr_t next{1U << 20U};
    std::map<std::pair<std::uintptr_t, std::size_t>, std::vector<std::uintptr_t>> cache;
    std::map<std::uintptr_t, std::size_t> out;  // live blocks it handed out
    std::uint64_t allocations{};
    std::uint64_t deallocations{};
    std::uint64_t bad_deallocations{};
  };

  explicit sim_upstream(bool stream_ordered) : state_{std::make_shared<state>()}
  {
    state_->stream_ordered = stream_ordered;
  }

  void* allocate(std::uintptr_t stream, std::size_t bytes, std::size_t)
  {
    auto& s          = *state_;
    auto const where = std::make_pair(s.stream_ordered ? stream : 0, bytes);
    std::uintptr_t ptr{};
    if (auto it = s.cache.find(where); it != s.cache.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
    } else {
      ptr = s.next;
      s.next += (bytes + 255) / 256 * 256 + 256;
    }
    s.out[ptr] = bytes;
    ++s.allocations;
    return reinterpret_cast<void*>(ptr);
  }

  void deallocate(std::uintptr_t stream, void* p, std::size_t bytes, std::size_t)
  {
    auto& s        = *state_;
    auto const ptr = reinterpret_cast<std::uintptr_t>(p);
    auto const it  = s.out.find(ptr);
    if (it == s.out.end() || it->second != bytes) {
      ++s.bad_deallocations;
      return;
    }
    s.out.erase(it);
    ++s.deallocations;
    s.cache[std::make_pair(s.stream_ordered ? stream : 0, bytes)].push_back(ptr);
  }

  [[nodiscard]] state const& get() const { return *state_; }

 private:
  std::shared_ptr<state> state_;
};

using sim_tracker_core = rmm_fences::detail::hazard_tracker_core<sim_platform, sim_upstream>;

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
  sim_upstream::state const& upstream() const { return core_.upstream().get(); }
  std::int64_t annotations() { return core_.platform().annotations; }

 private:
  std::shared_ptr<sim_device> device_;
  sim_tracker_core core_;
};

}  // namespace rmm_fences::testing
