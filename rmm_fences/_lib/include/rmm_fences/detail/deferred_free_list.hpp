/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of the deferred free (DESIGN.md layer 1): no CUDA calls.
 */
#pragma once

#include <rmm_fences/detail/inline_vector.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace rmm_fences::detail {

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
 *   bool ready(fence_type const&);             // non-blocking test
 *   void wait(fence_type const&);              // block until signalled (used by `wait_all`)
 *
 * The CUDA build uses events recorded on the freeing stream; the CPU tests use fences they
 * signal by hand. The list holds no lock and never blocks: its owner serializes every call and
 * waits on the fences of entries it took out (`take_*`) outside its lock.
 *
 * Invariants:
 *  - one FIFO per stream key; an entry is appended when its block is freed;
 *  - an entry with a fence leaves the list only once the fence reported ready, or through
 *    `take_*`, whose caller waits on the fence before releasing the block;
 *  - an entry without a fence is *parked* (freed during stream capture, where fences cannot be
 *    queried); it leaves only after `arm()` gave it a fence, or through `take_parked()` once
 *    the owner proved the device idle;
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

  /// One listed block and its fence; `seq` orders entries across streams (oldest first).
  struct entry {
    deferred_block block;
    std::optional<fence_type> fence;
    std::uint64_t seq{};
  };

  /// Scratch space for entries taken out of the list (no heap use for a few entries).
  using entry_buffer = inline_vector<entry, 4>;

  static constexpr std::size_t max_idle_queues = 16;

  /// Appends a block freed on `stream` whose release waits for `fence`.
  void push(stream_key stream, deferred_block block, fence_type fence)
  {
    append(stream, entry{block, std::move(fence), next_seq_++});
  }

  /// Appends a block freed on `stream` during stream capture: no fence yet.
  void park(stream_key stream, deferred_block block)
  {
    append(stream, entry{block, std::nullopt, next_seq_++});
    ++parked_count_;
  }

  /// Number of parked entries (no fence yet) over all streams.
  [[nodiscard]] std::size_t parked_count() const noexcept { return parked_count_; }

  /// True when `stream` has parked entries.
  [[nodiscard]] bool has_parked(stream_key stream) const
  {
    if (parked_count_ == 0) { return false; }
    auto const* q = find(stream);
    if (q == nullptr) { return false; }
    for (auto const& e : *q) {
      if (!e.fence.has_value()) { return true; }
    }
    return false;
  }

  /**
   * @brief Gives every parked entry of `stream` a fence made by `make_fence()`.
   *
   * Called once capture on `stream` has ended, on a call that uses `stream`.
   */
  template <typename MakeFence>
  void arm(stream_key stream, MakeFence&& make_fence)
  {
    auto* q = find(stream);
    if (q == nullptr) { return; }
    for (auto& e : *q) {
      if (!e.fence.has_value()) {
        e.fence = make_fence();
        --parked_count_;
      }
    }
  }

  /**
   * @brief Moves every entry whose fence is ready into `out` without blocking.
   *
   * Tests at most one not-ready fence per stream.
   * @return the number of entries moved
   */
  template <typename Out>
  std::size_t release_ready(FenceOps& ops, Out& out)
  {
    if (pending_count_ == 0) { return 0; }
    std::size_t moved = 0;
    for (auto& [key, q] : queues_) {
      while (!q.empty() && q.front().fence.has_value() && ops.ready(*q.front().fence)) {
        take_front(q, out);
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
      auto* q = oldest_fenced_queue();
      if (q == nullptr) { break; }
      take_front(*q, out);
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
   * Only for an owner that has proved no device work can still use them (the device is idle).
   */
  template <typename Out>
  void take_parked(Out& out)
  {
    take_if(out, [](entry const& e) { return !e.fence.has_value(); });
    parked_count_ = 0;
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
  {
    return const_cast<queue*>(static_cast<deferred_free_list const*>(this)->find(stream));
  }

  void append(stream_key stream, entry e)
  {
    auto* q = find(stream);
    if (q == nullptr) { q = &queues_.emplace_back(stream, queue{}).second; }
    q->push_back(std::move(e));
    pending_bytes_ += q->back().block.bytes;
    ++pending_count_;
  }

  template <typename Out>
  void take_front(queue& q, Out& out)
  {
    pending_bytes_ -= q.front().block.bytes;
    --pending_count_;
    out.push_back(std::move(q.front()));
    q.pop_front();
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

  /// The queue whose front is the oldest fenced entry, or nullptr.
  queue* oldest_fenced_queue()
  {
    queue* best = nullptr;
    for (auto& [key, q] : queues_) {
      if (q.empty() || !q.front().fence.has_value()) { continue; }
      if (best == nullptr || q.front().seq < best->front().seq) { best = &q; }
    }
    return best;
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
 * @brief Waits on the fence of every entry that is not ready yet.
 * @return the number of fences waited on
 */
template <typename FenceOps, typename Entries>
std::size_t wait_all(FenceOps& ops, Entries const& entries)
{
  std::size_t waits = 0;
  for (auto const& e : entries) {
    if (e.fence.has_value() && !ops.ready(*e.fence)) {
      ops.wait(*e.fence);
      ++waits;
    }
  }
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

}  // namespace rmm_fences::detail
