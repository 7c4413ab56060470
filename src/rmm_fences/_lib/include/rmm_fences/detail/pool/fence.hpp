/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: fences. A slot's fence is one event, re-recorded at each fence of
 * the slot's stream and shared with the blocks it tags; a tag names the fences (and record
 * numbers) a user of a shared block must wait for; a stream remembers the records it waited on.
 * Waiting on a later record of a fence is correct (it orders the waiter after more of the
 * fenced stream's work), so one event per slot suffices.
 */
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/// Fences a shared block carries before those known complete are dropped.
inline constexpr std::size_t tag_prune_minimum = 16;
/// Fences a stream remembers having waited on (forgetting costs only a repeated wait).
inline constexpr std::size_t waited_capacity = 64;

/// Where a pool's fences get and give back their events; counts the events held, the records
/// and the stream waits.
template <typename Platform>
class fence_registry {
 public:
  using fence_type = typename Platform::fence_type;

  explicit fence_registry(Platform& platform) noexcept : platform_{platform} {}
  fence_registry(fence_registry const&)            = delete;
  fence_registry& operator=(fence_registry const&) = delete;

  /// A new event (may throw).
  fence_type acquire()
  {
    auto event = platform_.acquire_fence();
    events_.fetch_add(1, std::memory_order_relaxed);
    return event;
  }

  /// Gives back an event whose last fence reference went away (only counted once events are
  /// forgotten: at process exit the driver may be gone).
  void release(fence_type event) noexcept
  {
    if (release_events_) { platform_.release_fence(event); }
    events_.fetch_sub(1, std::memory_order_relaxed);
  }

  /// Whether `release` gives events back to the platform (true until said otherwise).
  void give_events_back(bool release) noexcept { release_events_ = release; }

  void count_record() noexcept { records_.fetch_add(1, std::memory_order_relaxed); }
  void count_wait() noexcept { waits_.fetch_add(1, std::memory_order_relaxed); }

  [[nodiscard]] std::int64_t events() const noexcept
  { return events_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t records() const noexcept
  { return records_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t waits() const noexcept
  { return waits_.load(std::memory_order_relaxed); }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }

 private:
  Platform& platform_;
  std::atomic<std::int64_t> events_{};
  std::atomic<std::uint64_t> records_{};
  std::atomic<std::uint64_t> waits_{};
  bool release_events_{true};
};

/**
 * @brief One slot's fence: an event re-recorded at each fence of the slot, shared with the
 * blocks it tags (it outlives the slot's stream while it guards blocks).
 */
template <typename Platform>
class fence_cell {
 public:
  using stream_type = typename Platform::stream_type;

  fence_cell(fence_registry<Platform>& registry, std::uint64_t serial) noexcept
    : registry_{registry}, serial_{serial}
  {
  }
  ~fence_cell()
  {
    if (event_.has_value()) { registry_.release(*event_); }
  }
  fence_cell(fence_cell const&)            = delete;
  fence_cell& operator=(fence_cell const&) = delete;

  /// Tells fences apart in a stream's `waited_fences`.
  [[nodiscard]] std::uint64_t serial() const noexcept { return serial_; }

  /// Another stream took a block this fence guarded: its slot's big frees are fenced at once
  /// (the byte rule) until the slot takes back a block it fenced that nobody took.
  std::atomic<bool> wanted{};

  /// Records the fence on `stream`, after the work queued there: the record's number, or none
  /// when no event could be made or the record failed.
  std::optional<std::uint64_t> record(stream_type stream) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!event_.has_value()) {
      try {
        event_ = registry_.acquire();
      } catch (...) {
        return std::nullopt;
      }
    }
    if (!registry_.platform().record(*event_, stream)) { return std::nullopt; }
    registry_.count_record();
    return ++number_;
  }

  /// Enqueues on `waiter` a device-side wait on the latest record: that record's number, or
  /// none when the wait could not be enqueued.
  std::optional<std::uint64_t> wait(stream_type waiter) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!event_.has_value() || !registry_.platform().device_wait(waiter, *event_)) {
      return std::nullopt;
    }
    registry_.count_wait();
    return number_;
  }

  /// True when the work before record `at_least` is known complete (a failed query is not).
  bool complete(std::uint64_t at_least) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return event_.has_value() && number_ >= at_least && registry_.platform().ready(*event_);
  }

 private:
  fence_registry<Platform>& registry_;
  std::uint64_t const serial_;
  std::mutex mutex_;  // guards event_ and number_
  std::optional<typename Platform::fence_type> event_;
  std::uint64_t number_{};  // how many times it was recorded
};

template <typename Platform>
using cell_ptr = std::shared_ptr<fence_cell<Platform>>;

/// A fence a user must wait for: the work before record `number` of `cell`.
template <typename Platform>
struct fence_need {
  cell_ptr<Platform> cell;
  std::uint64_t number{};

  [[nodiscard]] bool complete() const noexcept { return cell->complete(number); }
};

template <typename Platform>
using fence_needs = std::vector<fence_need<Platform>>;

/// The fences a user of a shared block must wait for: one need per fenced stream.
template <typename Platform>
struct fence_tag {
  fence_needs<Platform> needs;
  std::size_t prune_at{tag_prune_minimum};  // prune when a merge brings more needs

  /// The tag of blocks fenced by record `number` of `cell`.
  static fence_tag of(cell_ptr<Platform> cell, std::uint64_t number)
  {
    fence_tag tag;
    tag.needs.push_back({std::move(cell), number});
    return tag;
  }

  /// Enqueues on `waiter` a wait on each fence (false when one cannot be enqueued).
  bool wait_all(typename Platform::stream_type waiter) const noexcept
  {
    return std::all_of(
      needs.begin(), needs.end(), [&](auto const& n) { return n.cell->wait(waiter).has_value(); });
  }

  /// Drops the needs `complete(need)` finds complete.
  template <typename Complete>
  void drop_complete(Complete&& complete)
  { needs.erase(std::remove_if(needs.begin(), needs.end(), complete), needs.end()); }

  /// The tag of two coalesced blocks: the later record of each fence. Coalescing gathers the
  /// fences of every stream that freed into a block: once more than `prune_at`, those known
  /// complete are dropped (amortized: the bound doubles over what is left).
  static fence_tag merge(fence_tag a, fence_tag b)
  {
    for (auto& need : b.needs) {
      auto it = std::find_if(
        a.needs.begin(), a.needs.end(), [&](auto const& n) { return n.cell == need.cell; });
      if (it == a.needs.end()) {
        a.needs.push_back(std::move(need));
      } else {
        it->number = std::max(it->number, need.number);
      }
    }
    a.prune_at = std::max(a.prune_at, b.prune_at);
    if (a.needs.size() > a.prune_at) {
      a.drop_complete([](auto const& n) { return n.complete(); });
      a.prune_at = std::max(tag_prune_minimum, 2 * a.needs.size());
    }
    return a;
  }
};

/// The fence records a stream waited on: fence serial -> the latest record waited on.
class waited_fences {
 public:
  /// True when a wait on record `number` or a later one of fence `serial` was enqueued.
  [[nodiscard]] bool covers(std::uint64_t serial, std::uint64_t number) const
  {
    auto it = seen_.find(serial);
    return it != seen_.end() && it->second >= number;
  }

  /// Notes a wait on record `number` of fence `serial` (forgets all others when full).
  void note(std::uint64_t serial, std::uint64_t number)
  {
    if (seen_.size() >= waited_capacity && seen_.count(serial) == 0) { seen_.clear(); }
    auto& seen = seen_[serial];
    seen       = std::max(seen, number);
  }

  void clear() noexcept { seen_.clear(); }

 private:
  std::unordered_map<std::uint64_t, std::uint64_t> seen_;
};

/// True when a stream whose fence is `own` and that waited on `waited` needs no wait for
/// `need`: its own fence, or one it waited on at that record or a later one.
template <typename Platform>
[[nodiscard]] bool ordered_for(cell_ptr<Platform> const& own,
                               waited_fences const& waited,
                               fence_need<Platform> const& need)
{ return !need.cell || need.cell == own || waited.covers(need.cell->serial(), need.number); }

/// The needs of `tag` that a stream (fence `own`, waits `waited`) is not yet ordered after.
template <typename Platform>
[[nodiscard]] fence_needs<Platform> needed_waits(fence_tag<Platform> const& tag,
                                                 cell_ptr<Platform> const& own,
                                                 waited_fences const& waited)
{
  fence_needs<Platform> out;
  for (auto const& need : tag.needs) {
    if (!ordered_for(own, waited, need)) { out.push_back(need); }
  }
  return out;
}

/// True when `tag` names fences and all of them are `own`.
template <typename Platform>
[[nodiscard]] bool only_own_fence(fence_tag<Platform> const& tag,
                                  cell_ptr<Platform> const& own) noexcept
{
  return !tag.needs.empty() && std::all_of(tag.needs.begin(), tag.needs.end(), [&](auto const& n) {
    return n.cell == own;
  });
}

/// True when a query finds every need complete (a failed query is not complete).
template <typename Platform>
[[nodiscard]] bool all_complete(fence_needs<Platform> const& needs) noexcept
{
  return std::all_of(needs.begin(), needs.end(), [](auto const& n) { return n.complete(); });
}

}  // namespace rmm_fences::mr::detail::pool
