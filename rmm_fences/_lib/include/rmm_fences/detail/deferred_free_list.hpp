/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of the deferred free (DESIGN.md layer 1): no CUDA calls.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
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
 *  - an entry with a fence leaves the list only once the fence reported ready (or was waited on);
 *  - an entry without a fence is *parked* (freed during stream capture, where fences cannot be
 *    queried); it leaves only after `arm()` gave it a fence, or through `take_parked()` once
 *    the owner proved the device idle;
 *  - `pending_bytes()` and `pending_count()` are the sums over every entry still listed.
 *
 * FIFO per stream is an optimisation, not a correctness rule: fences recorded on one stream
 * complete in recording order, so `release_ready` stops at the first entry of a stream that is
 * not ready and does not test the entries behind it. Every released entry had its own fence
 * tested, so a key shared by two streams only delays releases.
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
    auto it = queues_.find(stream);
    if (it == queues_.end()) { return false; }
    return std::any_of(
      it->second.begin(), it->second.end(), [](entry const& e) { return !e.fence.has_value(); });
  }

  /**
   * @brief Gives every parked entry of `stream` a fence made by `make_fence()`.
   *
   * Called once capture on `stream` has ended, on a call that uses `stream`.
   */
  template <typename MakeFence>
  void arm(stream_key stream, MakeFence&& make_fence)
  {
    auto it = queues_.find(stream);
    if (it == queues_.end()) { return; }
    for (auto& e : it->second) {
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
  std::size_t release_ready(FenceOps& ops, std::vector<entry>& out)
  {
    std::size_t moved = 0;
    for (auto it = queues_.begin(); it != queues_.end();) {
      auto& q = it->second;
      while (!q.empty() && q.front().fence.has_value() && ops.ready(*q.front().fence)) {
        take_front(q, out);
        ++moved;
      }
      it = q.empty() ? queues_.erase(it) : std::next(it);
    }
    return moved;
  }

  /**
   * @brief Moves the oldest fenced entries into `out` until at most `max_bytes` stay listed.
   *
   * The caller must wait on each moved fence before releasing its block. Parked entries cannot
   * be waited on and stay; they may keep the total above the cap.
   */
  void take_oldest_until(std::size_t max_bytes, std::vector<entry>& out)
  {
    while (pending_bytes_ > max_bytes) {
      auto* q = oldest_fenced_queue();
      if (q == nullptr) { break; }
      take_front(*q, out);
    }
    erase_empty();
  }

  /// Moves every fenced entry into `out`; the caller waits on each fence before the release.
  void take_all_fenced(std::vector<entry>& out)
  {
    take_if(out, [](entry const& e) { return e.fence.has_value(); });
  }

  /**
   * @brief Moves every parked entry into `out`.
   *
   * Only for an owner that has proved no device work can still use them (the device is idle).
   */
  void take_parked(std::vector<entry>& out)
  {
    take_if(out, [](entry const& e) { return !e.fence.has_value(); });
    parked_count_ = 0;
  }

  /// Bytes of every listed block.
  [[nodiscard]] std::size_t pending_bytes() const noexcept { return pending_bytes_; }

  /// Number of listed blocks.
  [[nodiscard]] std::size_t pending_count() const noexcept { return pending_count_; }

  /// Number of stream keys with listed blocks.
  [[nodiscard]] std::size_t stream_count() const noexcept { return queues_.size(); }

 private:
  void append(stream_key stream, entry e)
  {
    pending_bytes_ += e.block.bytes;
    ++pending_count_;
    queues_[stream].push_back(std::move(e));
  }

  void take_front(std::deque<entry>& q, std::vector<entry>& out)
  {
    pending_bytes_ -= q.front().block.bytes;
    --pending_count_;
    out.push_back(std::move(q.front()));
    q.pop_front();
  }

  /// The queue whose front is the oldest fenced entry, or nullptr.
  std::deque<entry>* oldest_fenced_queue()
  {
    std::deque<entry>* best = nullptr;
    for (auto& [key, q] : queues_) {
      if (q.empty() || !q.front().fence.has_value()) { continue; }
      if (best == nullptr || q.front().seq < best->front().seq) { best = &q; }
    }
    return best;
  }

  template <typename Pred>
  void take_if(std::vector<entry>& out, Pred&& pred)
  {
    for (auto& [key, q] : queues_) {
      std::deque<entry> kept;
      for (auto& e : q) {
        if (pred(e)) {
          pending_bytes_ -= e.block.bytes;
          out.push_back(std::move(e));
        } else {
          kept.push_back(std::move(e));
        }
      }
      q.swap(kept);
    }
    erase_empty();
  }

  void erase_empty()
  {
    pending_count_ = 0;
    for (auto it = queues_.begin(); it != queues_.end();) {
      pending_count_ += it->second.size();
      it = it->second.empty() ? queues_.erase(it) : std::next(it);
    }
  }

  std::unordered_map<stream_key, std::deque<entry>> queues_;
  std::size_t pending_bytes_{};
  std::size_t pending_count_{};
  std::size_t parked_count_{};
  std::uint64_t next_seq_{};
};

/**
 * @brief Waits on the fence of every entry that is not ready yet.
 * @return the number of fences waited on
 */
template <typename FenceOps, typename Entry>
std::size_t wait_all(FenceOps& ops, std::vector<Entry> const& entries)
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
