/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of the deferred free (docs/design.md#layers, policy cores): no CUDA calls.
 */
#pragma once

#include <rmm_fences/detail/inline_vector.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/**
 * @brief A block whose release to the upstream waits for a fence.
 */
struct deferred_block {
  void* ptr{};
  std::size_t bytes{};
  std::size_t alignment{};
};

/**
 * @brief Blocks freed while device work may still use them, each waiting for its fence.
 *
 * `FenceOps` supplies the fence type and how to test it:
 *
 *   using fence_type = ...;                    // copyable handle
 *   bool ready(fence_type const&);             // non-blocking test: true only when known done
 *   bool host_wait(fence_type const&);         // block until signalled; false: the wait failed
 *
 * The CUDA build uses events recorded on the freeing stream; the CPU tests use fences they
 * signal by hand. The list holds no lock and never blocks: its owner serializes every call and
 * waits on the fences of entries it took out (`take_*`) outside its lock; entries whose wait
 * failed go back with `restore`.
 *
 * Invariants:
 *  - one FIFO per stream key; an entry is appended when its block is freed;
 *  - an entry with a fence leaves the list only once the fence reported ready, or through
 *    `take_*`, whose caller waits on the fence (or synchronizes the device) before releasing
 *    the block, and puts it back with `restore` when that failed;
 *  - an entry without a fence is *parked* (freed during stream capture, where fences cannot be
 *    queried, or when no fence could be recorded); it leaves only after `arm()` gave it a fence
 *    on the very stream that freed it (same key and same stream identity), or through
 *    `take_parked()` once the owner proved the device idle;
 *  - `pending_bytes()` and `pending_count()` are the sums over every entry still listed.
 *
 * FIFO per stream is an optimisation, not a correctness rule: fences recorded on one stream
 * complete in recording order, so `release_ready` stops at the first entry of a stream that is
 * not ready and does not test the entries behind it. Every released entry had its own fence
 * tested, so a key shared by two streams only delays releases.
 *
 * Streams are few, so queues live in a small vector searched linearly; an emptied queue is
 * kept (its storage is reused by the next free on that stream) until more than
 * `max_idle_queues` are empty.
 */
template <typename FenceOps>
class deferred_free_list {
 public:
  using fence_type = typename FenceOps::fence_type;
  using stream_key = std::uintptr_t;

  /// Identity of a stream that cannot be verified: its parked entries are never armed.
  static constexpr std::uint64_t unknown_stream = 0;

  /// One listed block and its fence; `seq` orders entries across streams (oldest first).
  struct entry {
    deferred_block block;
    std::optional<fence_type> fence;
    std::uint64_t seq{};
    stream_key key{};
    std::uint64_t stream_id{};  ///< parked entries: the freeing stream's identity, or unknown
  };

  /// Scratch space for entries taken out of the list (no heap use for a few entries).
  using entry_buffer = inline_vector<entry, 4>;

  static constexpr std::size_t max_idle_queues = 16;

  /// Appends a block freed on `stream` whose release waits for `fence`.
  void push(stream_key stream, deferred_block block, fence_type fence)
  { append(entry{block, std::move(fence), next_seq_++, stream, unknown_stream}); }

  /**
   * @brief Appends a block freed on `stream` without a fence.
   *
   * `stream_id` is the process-unique identity of the freeing stream when known, else
   * `unknown_stream`: such an entry leaves only through `take_parked`.
   */
  void park(stream_key stream, std::uint64_t stream_id, deferred_block block)
  {
    append(entry{block, std::nullopt, next_seq_++, stream, stream_id});
    ++parked_count_;
  }

  /// Number of parked entries (no fence yet) over all streams.
  [[nodiscard]] std::size_t parked_count() const noexcept { return parked_count_; }

  /// True when `stream` has parked entries that a fence on it could arm (identity known).
  [[nodiscard]] bool has_armable(stream_key stream) const
  {
    if (parked_count_ == 0) { return false; }
    auto const* q = find(stream);
    if (q == nullptr) { return false; }
    for (auto const& e : *q) {
      if (!e.fence.has_value() && e.stream_id != unknown_stream) { return true; }
    }
    return false;
  }

  /**
   * @brief Gives a fence made by `make_fence()` to every parked entry of `stream` freed on the
   * stream whose identity is `stream_id` (known, and equal to the one noted at the free).
   *
   * Called outside capture, on a call that uses `stream`. Entries of another identity (a
   * destroyed stream whose handle was reused) stay parked.
   * @return the number of entries armed
   */
  template <typename MakeFence>
  std::size_t arm(stream_key stream, std::uint64_t stream_id, MakeFence&& make_fence)
  {
    if (stream_id == unknown_stream) { return 0; }
    auto* q = find(stream);
    if (q == nullptr) { return 0; }
    std::size_t armed = 0;
    for (auto& e : *q) {
      if (!e.fence.has_value() && e.stream_id == stream_id) {
        e.fence = make_fence();
        --parked_count_;
        ++armed;
      }
    }
    return armed;
  }

  /**
   * @brief Moves every entry whose fence is ready into `out` without blocking.
   *
   * Tests at most one not-ready fence per stream (a failed test counts as not ready); parked
   * entries are stepped over.
   * @return the number of entries moved
   */
  template <typename Out>
  std::size_t release_ready(FenceOps& ops, Out& out)
  {
    if (pending_count_ == 0) { return 0; }
    std::size_t moved = 0;
    for (auto& [key, q] : queues_) {
      // Parked entries (no fence) are stepped over: they must not hold back later frees.
      for (auto it = q.begin(); it != q.end();) {
        if (!it->fence.has_value()) {
          ++it;
          continue;
        }
        if (!ops.ready(*it->fence)) { break; }
        pending_bytes_ -= it->block.bytes;
        --pending_count_;
        out.push_back(std::move(*it));
        it = q.erase(it);
        ++moved;
      }
    }
    if (moved > 0) { prune(); }
    return moved;
  }

  /**
   * @brief Moves the oldest fenced entries into `out` until at most `max_bytes` stay listed.
   *
   * The caller must wait on each moved fence before releasing its block. Parked entries cannot
   * be waited on and stay; they may keep the total above the cap.
   */
  template <typename Out>
  void take_oldest_until(std::size_t max_bytes, Out& out)
  {
    while (pending_bytes_ > max_bytes) {
      auto [q, it] = oldest_fenced();
      if (q == nullptr) { break; }
      pending_bytes_ -= it->block.bytes;
      --pending_count_;
      out.push_back(std::move(*it));
      q->erase(it);
    }
    prune();
  }

  /// Moves every fenced entry into `out`; the caller waits on each fence before the release.
  template <typename Out>
  void take_all_fenced(Out& out)
  {
    take_if(out, [](entry const& e) { return e.fence.has_value(); });
  }

  /**
   * @brief Moves every parked entry into `out`.
   *
   * Only for an owner that then proves no device work can still use them (a device
   * synchronization that succeeded after this call); otherwise it puts them back (`restore`).
   */
  template <typename Out>
  void take_parked(Out& out)
  {
    take_if(out, [](entry const& e) { return !e.fence.has_value(); });
    parked_count_ = 0;
  }

  /**
   * @brief Lists again entries taken out whose wait failed, in their original order.
   *
   * May throw `std::bad_alloc`; entries not restored then are the caller's to keep (leak).
   */
  template <typename Entries>
  void restore(Entries& entries)
  {
    for (auto& e : entries) {
      auto* q = find(e.key);
      if (q == nullptr) { q = &queues_.emplace_back(e.key, queue{}).second; }
      auto it = q->begin();
      while (it != q->end() && it->seq < e.seq) {
        ++it;
      }
      bool const parked = !e.fence.has_value();
      auto const bytes  = e.block.bytes;
      q->insert(it, std::move(e));
      pending_bytes_ += bytes;
      ++pending_count_;
      parked_count_ += parked;
    }
  }

  /// True when a block starting at `ptr` is listed (its free is pending).
  [[nodiscard]] bool contains(void const* ptr) const noexcept
  {
    for (auto const& [key, q] : queues_) {
      for (auto const& e : q) {
        if (e.block.ptr == ptr) { return true; }
      }
    }
    return false;
  }

  /// Bytes of every listed block.
  [[nodiscard]] std::size_t pending_bytes() const noexcept { return pending_bytes_; }

  /// Number of listed blocks.
  [[nodiscard]] std::size_t pending_count() const noexcept { return pending_count_; }

 private:
  using queue = std::deque<entry>;

  [[nodiscard]] queue const* find(stream_key stream) const
  {
    for (auto const& [key, q] : queues_) {
      if (key == stream) { return &q; }
    }
    return nullptr;
  }

  [[nodiscard]] queue* find(stream_key stream)
  { return const_cast<queue*>(static_cast<deferred_free_list const*>(this)->find(stream)); }

  void append(entry e)
  {
    auto* q = find(e.key);
    if (q == nullptr) { q = &queues_.emplace_back(e.key, queue{}).second; }
    q->push_back(std::move(e));
    pending_bytes_ += q->back().block.bytes;
    ++pending_count_;
  }

  template <typename Out, typename Pred>
  void take_if(Out& out, Pred&& pred)
  {
    for (auto& [key, q] : queues_) {
      queue kept;
      for (auto& e : q) {
        if (pred(e)) {
          pending_bytes_ -= e.block.bytes;
          --pending_count_;
          out.push_back(std::move(e));
        } else {
          kept.push_back(std::move(e));
        }
      }
      q.swap(kept);
    }
    prune();
  }

  /// The queue holding the oldest fenced entry and that entry, or {nullptr, {}}.
  std::pair<queue*, typename queue::iterator> oldest_fenced()
  {
    queue* best = nullptr;
    typename queue::iterator best_it{};
    for (auto& [key, q] : queues_) {
      for (auto it = q.begin(); it != q.end(); ++it) {
        if (!it->fence.has_value()) { continue; }
        if (best == nullptr || it->seq < best_it->seq) {
          best    = &q;
          best_it = it;
        }
        break;  // the first fenced entry of a queue is its oldest
      }
    }
    return {best, best_it};
  }

  /// Drops empty queues once too many are idle (streams come and go).
  void prune()
  {
    std::size_t idle = 0;
    for (auto const& [key, q] : queues_) {
      idle += q.empty();
    }
    if (idle <= max_idle_queues) { return; }
    std::vector<std::pair<stream_key, queue>> kept;
    for (auto& kq : queues_) {
      if (!kq.second.empty()) { kept.push_back(std::move(kq)); }
    }
    queues_.swap(kept);
  }

  std::vector<std::pair<stream_key, queue>> queues_;
  std::size_t pending_bytes_{};
  std::size_t pending_count_{};
  std::size_t parked_count_{};
  std::uint64_t next_seq_{};
};

/**
 * @brief Waits on the fence of every entry of `taken` that is not ready yet.
 *
 * Entries whose fence completed or was waited on go to `done`; entries whose wait failed (no
 * information: never read as complete) and parked entries go to `failed`. `taken` is cleared.
 * @return the number of successful waits
 */
template <typename FenceOps, typename Entries>
std::size_t wait_all(FenceOps& ops, Entries& taken, Entries& done, Entries& failed)
{
  std::size_t waits = 0;
  for (auto& e : taken) {
    if (!e.fence.has_value()) {
      failed.push_back(std::move(e));
    } else if (ops.ready(*e.fence)) {
      done.push_back(std::move(e));
    } else if (ops.host_wait(*e.fence)) {
      ++waits;
      done.push_back(std::move(e));
    } else {
      failed.push_back(std::move(e));
    }
  }
  taken.clear();
  return waits;
}

/**
 * @brief Allocation with one drain-and-retry on out-of-memory.
 *
 * Calls `try_allocate()`; if it throws `OutOfMemory` and `drain()` freed something (returns
 * true), calls `try_allocate()` once more. Any second failure propagates.
 *
 * @return the pointer and whether a retry happened
 */
template <typename OutOfMemory, typename TryAllocate, typename Drain>
std::pair<void*, bool> allocate_with_drain(TryAllocate&& try_allocate, Drain&& drain)
{
  try {
    return {try_allocate(), false};
  } catch (OutOfMemory const&) {
    if (!drain()) { throw; }
  }
  return {try_allocate(), true};
}

}  // namespace rmm_fences::mr::detail
