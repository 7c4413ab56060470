/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of the deferred free (docs/design.md#layers, policy cores): no CUDA calls.
 */
#pragma once

#include <rmm_fences/detail/inline_vector.hpp>
#include <rmm_fences/detail/ring_deque.hpp>

#include <cstddef>
#include <cstdint>
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
 * `FenceOps` supplies the fence type and how to test and recycle it:
 *
 *   using fence_type = ...;                    // copyable handle
 *   bool ready(fence_type const&);             // non-blocking test: true only when known done
 *   bool host_wait(fence_type const&);         // block until signalled; false: the wait failed
 *   void release_fence(fence_type) noexcept;   // the fence is no longer needed (recycled)
 *
 * The CUDA build uses events recorded on the freeing stream; the CPU tests use fences they
 * signal by hand. The list holds no lock and never blocks: its owner serializes every call and
 * waits on the fences of entries it took out (`take_*`) outside its lock; entries whose wait
 * failed go back with `restore`, the others are handed to `settle` once released.
 *
 * An entry is in one of three states:
 *  - *batched*: freed outside capture, waiting for the fence of its batch (`push`). Consecutive
 *    frees on one stream share one fence: a fence recorded on a stream after a free covers that
 *    free and every earlier one on the same stream. The owner records it when the batch is
 *    large enough, or when it needs the blocks back, during a call on that very stream (`arm`);
 *  - *parked*: freed during stream capture, where fences cannot be queried, or whose fence
 *    could not be recorded (`park`);
 *  - *fenced*: armed with a fence recorded on its freeing stream after its free.
 *
 * Invariants:
 *  - one FIFO per stream key; an entry is appended when its block is freed;
 *  - an entry leaves the list only once its fence reported ready, or through `take_*`, whose
 *    caller waits on the fence (or synchronizes the device or the stream) before releasing the
 *    block, and puts it back with `restore` when that failed;
 *  - batched and parked entries get a fence only through `arm()`, on the very stream that freed
 *    them (same key and same stream identity, or the entry freed in the very call that arms);
 *  - entries sharing a fence hold one reference each to it: the fence goes back to `FenceOps`
 *    (`release_fence`) only when the last of them left the list and was settled, so a fence is
 *    never recycled (and recorded again elsewhere) while an entry still relies on it;
 *  - `pending_bytes()` and `pending_count()` are the sums over every entry still listed.
 *
 * FIFO per stream is an optimisation, not a correctness rule: fences recorded on one stream
 * complete in recording order, so `release_ready` stops at the first entry of a stream that is
 * not ready and does not test the entries behind it; entries sharing a fence are tested once.
 * Every released entry had its own fence tested, so a key shared by two streams only delays
 * releases.
 *
 * Streams are few, so queues live in a small vector searched linearly; an emptied queue is
 * kept (its storage is reused by the next free on that stream) until more than
 * `max_idle_queues` are empty. A queue is a ring (`ring_deque`) that keeps its storage: a
 * steady state of frees and releases on a stream allocates nothing. A queue's storage above
 * `kept_entries` entries is given back once a quarter of it or less is used.
 */
template <typename FenceOps>
class deferred_free_list {
 public:
  using fence_type = typename FenceOps::fence_type;
  using stream_key = std::uintptr_t;

  /// Identity of a stream that cannot be verified: its entries are armed only in the call that
  /// freed them.
  static constexpr std::uint64_t unknown_stream = 0;
  /// No entry (an `own_seq` that matches nothing).
  static constexpr std::uint64_t no_entry = ~std::uint64_t{0};
  /// An entry that holds no reference to a shared fence.
  static constexpr std::uint32_t no_slot = ~std::uint32_t{0};

  /// One listed block; `seq` orders entries across streams (oldest first).
  struct entry {
    deferred_block block;
    std::optional<fence_type> fence;
    std::uint64_t seq{};
    stream_key key{};
    std::uint64_t stream_id{};    ///< unfenced entries: the freeing stream's identity, or unknown
    std::uint32_t slot{no_slot};  ///< while fenced: its reference to the shared fence
    bool parked{};                ///< unfenced: parked rather than batched
  };

  /// Heap storage of `entry_buffer`s kept for the next ones (their owner holds one).
  using entry_spill_cache = spill_cache<entry, 8>;

  /// Scratch space for entries taken out of the list: a few entries inline, more in storage of
  /// an `entry_spill_cache` (no heap use in a steady state).
  using entry_buffer = inline_vector<entry, 4, entry_spill_cache>;

  static constexpr std::size_t max_idle_queues = 16;

  /// `kept_entries`: the storage a stream's queue keeps for reuse however few entries it
  /// holds (its owner passes what its batches need).
  explicit deferred_free_list(std::size_t kept_entries = 256) noexcept : kept_entries_{kept_entries}
  {
  }

  /// The batch of a stream: its batched entries.
  struct batch_size {
    std::size_t count{};
    std::size_t bytes{};
  };

  /// What `push` did: the entry's sequence number and its stream's batch with it.
  struct pushed {
    std::uint64_t seq{};
    batch_size batch;
    bool armable{};  ///< the stream has parked entries a fence on it could arm
  };

  /// Appends a block freed on `stream` (identity `stream_id`, or unknown) to its batch.
  pushed push(stream_key stream, std::uint64_t stream_id, deferred_block block)
  {
    auto& q        = queue_of(stream);
    auto const seq = next_seq_;
    q.entries.push_back(entry{block, std::nullopt, seq, stream, stream_id, no_slot, false});
    ++next_seq_;
    ++q.batched;
    q.batched_bytes += block.bytes;
    added(block.bytes);
    return {seq, batch_size{q.batched, q.batched_bytes}, q.armable > 0};
  }

  /**
   * @brief Appends a block freed on `stream` without a fence and outside any batch.
   *
   * `stream_id` is the process-unique identity of the freeing stream when known, else
   * `unknown_stream`: such an entry leaves only through `take_unfenced`.
   */
  void park(stream_key stream, std::uint64_t stream_id, deferred_block block)
  {
    auto& q = queue_of(stream);
    q.entries.push_back(entry{block, std::nullopt, next_seq_, stream, stream_id, no_slot, true});
    ++next_seq_;
    note_parked(q, stream_id);
    added(block.bytes);
  }

  /// The sequence number the next entry will get: entries listed so far are below it.
  [[nodiscard]] std::uint64_t next_seq() const noexcept { return next_seq_; }

  /// The batched entries of `stream`.
  [[nodiscard]] batch_size batch(stream_key stream) const
  {
    auto const* q = find(stream);
    return q == nullptr ? batch_size{} : batch_size{q->batched, q->batched_bytes};
  }

  /// Number of parked entries over all streams.
  [[nodiscard]] std::size_t parked_count() const noexcept { return parked_count_; }

  /// Number of parked entries that a fence on their stream could arm (identity known).
  [[nodiscard]] std::size_t armable_count() const noexcept { return armable_count_; }

  /// Number of fenced entries over all streams.
  [[nodiscard]] std::size_t fenced_count() const noexcept { return fenced_count_; }

  /// True when `stream` has parked entries that a fence on it could arm (identity known).
  [[nodiscard]] bool has_armable(stream_key stream) const
  {
    if (armable_count_ == 0) { return false; }
    auto const* q = find(stream);
    return q != nullptr && q->armable > 0;
  }

  /**
   * @brief Gives `fence`, just recorded on the stream of key `stream`, to every unfenced entry
   * of that stream listed before `before` and freed on it: the entry `own_seq` (freed in the
   * call that recorded the fence), and, when `stream_id` is known (asked of the stream right
   * before the record), every entry noted with that identity.
   *
   * When `stream_id` is known, the other unfenced entries of the key listed before `before`
   * were freed on another stream that had the same handle (destroyed since): no fence on this
   * stream covers them, so they become parked with an unknown identity (a device
   * synchronization releases them).
   *
   * Throws `std::bad_alloc` (no host memory for the fence's reference count) before changing
   * anything.
   * @return the number of entries armed; 0: the caller keeps (releases) the fence
   */
  std::size_t arm(stream_key stream,
                  std::uint64_t stream_id,
                  std::uint64_t own_seq,
                  std::uint64_t before,
                  fence_type fence)
  {
    auto* q = find(stream);
    if (q == nullptr) { return 0; }
    auto const slot   = new_slot(fence);
    std::size_t armed = 0;
    for_unfenced(*q, stream_id, own_seq, before, [&](entry& e, bool eligible) {
      if (!eligible) {
        demote(*q, e);
        return false;
      }
      leave_unfenced(*q, e);
      e.fence = fence;
      e.slot  = slot;
      ++q->fenced;
      ++fenced_count_;
      ++armed;
      return false;
    });
    if (armed == 0) {
      free_slot(slot);
    } else {
      slots_[slot].refs = armed;
    }
    return armed;
  }

  /**
   * @brief Moves into `out` the entries `arm` would have armed (a synchronization of their
   * stream, begun after they were listed, covered them); demotes the others as `arm` does.
   * @return true when the entry `own_seq` was moved
   */
  template <typename Out>
  bool take_synced(stream_key stream,
                   std::uint64_t stream_id,
                   std::uint64_t own_seq,
                   std::uint64_t before,
                   Out& out)
  {
    auto* q = find(stream);
    if (q == nullptr) { return false; }
    bool own = false;
    for_unfenced(*q, stream_id, own_seq, before, [&](entry& e, bool eligible) {
      if (!eligible) {
        demote(*q, e);
        return false;
      }
      out.push_back(e);
      leave_unfenced(*q, e);
      removed(e.block.bytes);
      own = own || e.seq == own_seq;
      return true;
    });
    prune();
    return own;
  }

  /**
   * @brief Parks, with an unknown identity, the batched entries `arm` would have armed (no
   * fence could be recorded for them, nor their stream synchronized): only a device
   * synchronization releases them. Parked entries stay armable; others are demoted as `arm`
   * does.
   * @return the number of entries parked, and whether the entry `own_seq` was one of them
   */
  std::pair<std::size_t, bool> park_unfenceable(stream_key stream,
                                                std::uint64_t stream_id,
                                                std::uint64_t own_seq,
                                                std::uint64_t before)
  {
    auto* q = find(stream);
    if (q == nullptr) { return {0, false}; }
    std::size_t parked = 0;
    bool own           = false;
    for_unfenced(*q, stream_id, own_seq, before, [&](entry& e, bool eligible) {
      if (e.parked && eligible) { return false; }  // parked ones stay armable by a later call
      if (!e.parked) {
        ++parked;
        own = own || e.seq == own_seq;
      }
      demote(*q, e);
      return false;
    });
    return {parked, own};
  }

  /**
   * @brief Moves every entry whose fence is ready into `out` without blocking.
   *
   * Tests at most one not-ready fence per stream (a failed test counts as not ready), and each
   * shared fence once; unfenced entries are stepped over. The moved entries are settled: a
   * fence whose last entry left goes back through `ops.release_fence`. An owner that records
   * fences calls it before its record: a fence recorded in the very call would be found pending
   * (a device processes a record after the call that made it), and the fences found complete
   * are back in the pool for the record.
   * @return the number of entries moved
   */
  template <typename Out>
  std::size_t release_ready(FenceOps& ops, Out& out)
  {
    if (fenced_count_ == 0) { return 0; }
    std::size_t moved = 0;
    for (auto& [key, q] : queues_) {
      std::size_t left = q.fenced;
      auto ready_slot  = no_slot;
      for (auto it = q.entries.begin(); left > 0 && it != q.entries.end();) {
        // Unfenced entries are stepped over: they must not hold back later frees.
        if (!it->fence.has_value()) {
          ++it;
          continue;
        }
        --left;
        if (it->slot != ready_slot) {
          if (!ops.ready(*it->fence)) { break; }
          ready_slot = it->slot;
        }
        out.push_back(*it);
        --q.fenced;
        --fenced_count_;
        removed(it->block.bytes);
        drop_ref(ops, it->slot);
        out[out.size() - 1].slot = no_slot;
        if (it == q.entries.begin()) {  // the usual case, cheaper than a general erase
          q.entries.pop_front();
          it = q.entries.begin();
        } else {
          it = q.entries.erase(it);
        }
        ++moved;
      }
    }
    if (moved > 0) { prune(); }
    return moved;
  }

  /**
   * @brief Moves the oldest fenced entries into `out` until at most `max_bytes` stay listed.
   *
   * The caller must wait on each moved fence before releasing its block. Unfenced entries
   * cannot be waited on and stay; they may keep the total above the cap.
   */
  template <typename Out>
  void take_oldest_until(std::size_t max_bytes, Out& out)
  {
    while (pending_bytes_ > max_bytes) {
      auto [q, it] = oldest_fenced();
      if (q == nullptr) { break; }
      out.push_back(*it);
      --q->fenced;
      --fenced_count_;
      removed(it->block.bytes);
      q->entries.erase(it);
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
   * @brief Moves every unfenced (batched or parked) entry into `out`.
   *
   * Only for an owner that then proves no device work can still use them (a device
   * synchronization that succeeded after this call); otherwise it puts them back (`restore`).
   */
  template <typename Out>
  void take_unfenced(Out& out)
  {
    take_if(out, [](entry const& e) { return !e.fence.has_value(); });
  }

  /**
   * @brief Lists again entries taken out whose wait failed, in their original order; they keep
   * their state and their reference to a shared fence.
   *
   * May throw `std::bad_alloc`; entries not restored then are the caller's to keep (leak).
   */
  template <typename Entries>
  void restore(Entries& entries)
  {
    for (auto& e : entries) {
      auto& q = queue_of(e.key);
      auto it = q.entries.begin();
      while (it != q.entries.end() && it->seq < e.seq) {
        ++it;
      }
      q.entries.insert(it, e);
      if (e.fence.has_value()) {
        ++q.fenced;
        ++fenced_count_;
      } else if (e.parked) {
        note_parked(q, e.stream_id);
      } else {
        ++q.batched;
        q.batched_bytes += e.block.bytes;
      }
      added(e.block.bytes);
    }
  }

  /**
   * @brief Drops the references of entries taken out (`take_*`) and released since: a fence
   * whose last entry is gone goes back through `ops.release_fence`.
   */
  template <typename Entries>
  void settle(FenceOps& ops, Entries& entries) noexcept
  {
    for (auto& e : entries) {
      drop_ref(ops, e.slot);
      e.slot = no_slot;
    }
  }

  /// True when a block starting at `ptr` is listed (its free is pending).
  [[nodiscard]] bool contains(void const* ptr) const noexcept { return lookup(ptr) != nullptr; }

  /// The fence the listed block at `ptr` waits for; empty when it is not listed or unfenced.
  [[nodiscard]] std::optional<fence_type> fence_of(void const* ptr) const noexcept
  {
    auto const* e = lookup(ptr);
    return e == nullptr ? std::nullopt : e->fence;
  }

  /// Bytes of every listed block.
  [[nodiscard]] std::size_t pending_bytes() const noexcept { return pending_bytes_; }

  /// Number of listed blocks.
  [[nodiscard]] std::size_t pending_count() const noexcept { return pending_count_; }

 private:
  struct queue {
    ring_deque<entry> entries;
    std::size_t fenced{};         ///< entries with a fence
    std::size_t batched{};        ///< entries waiting for their batch's fence
    std::size_t batched_bytes{};  ///< their bytes
    std::size_t armable{};        ///< parked entries with a known identity
  };

  struct fence_slot {
    fence_type fence{};
    std::size_t refs{};  ///< entries holding the fence, listed or taken out and not settled
  };

  [[nodiscard]] queue const* find(stream_key stream) const
  {
    for (auto const& [key, q] : queues_) {
      if (key == stream) { return &q; }
    }
    return nullptr;
  }

  [[nodiscard]] queue* find(stream_key stream)
  { return const_cast<queue*>(static_cast<deferred_free_list const*>(this)->find(stream)); }

  queue& queue_of(stream_key stream)
  {
    auto* q = find(stream);
    return q != nullptr ? *q : queues_.emplace_back(stream, queue{}).second;
  }

  [[nodiscard]] entry const* lookup(void const* ptr) const noexcept
  {
    for (auto const& [key, q] : queues_) {
      for (auto const& e : q.entries) {
        if (e.block.ptr == ptr) { return &e; }
      }
    }
    return nullptr;
  }

  void added(std::size_t bytes) noexcept
  {
    pending_bytes_ += bytes;
    ++pending_count_;
  }

  void removed(std::size_t bytes) noexcept
  {
    pending_bytes_ -= bytes;
    --pending_count_;
  }

  void note_parked(queue& q, std::uint64_t stream_id) noexcept
  {
    ++parked_count_;
    if (stream_id != unknown_stream) {
      ++q.armable;
      ++armable_count_;
    }
  }

  /// Takes an unfenced entry out of its state's counters (it stays in the queue).
  void leave_unfenced(queue& q, entry const& e) noexcept
  {
    if (!e.parked) {
      --q.batched;
      q.batched_bytes -= e.block.bytes;
      return;
    }
    --parked_count_;
    if (e.stream_id != unknown_stream) {
      --q.armable;
      --armable_count_;
    }
  }

  /// Makes an unfenced entry parked with an unknown identity: never armed again.
  void demote(queue& q, entry& e) noexcept
  {
    if (e.parked && e.stream_id == unknown_stream) { return; }
    leave_unfenced(q, e);
    e.parked    = true;
    e.stream_id = unknown_stream;
    note_parked(q, unknown_stream);
  }

  /**
   * @brief Calls `visit(entry, eligible)` on the unfenced entries of `q` listed before
   * `before` that an arm with (`stream_id`, `own_seq`) concerns: eligible ones (the entry
   * `own_seq`; with a known `stream_id`, those noted with it) and, with a known `stream_id`,
   * the others (freed on a stream that is gone). Entries of another identity are left alone
   * when `stream_id` is unknown. `visit` returns true when it took the entry out.
   */
  template <typename Visit>
  void for_unfenced(
    queue& q, std::uint64_t stream_id, std::uint64_t own_seq, std::uint64_t before, Visit&& visit)
  {
    for (auto it = q.entries.begin(); it != q.entries.end() && it->seq < before;) {
      if (it->fence.has_value()) {
        ++it;
        continue;
      }
      bool const eligible =
        it->seq == own_seq || (stream_id != unknown_stream && it->stream_id == stream_id);
      if (!eligible && stream_id == unknown_stream) {
        ++it;
        continue;
      }
      if (visit(*it, eligible)) {
        it = q.entries.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::uint32_t new_slot(fence_type fence)
  {
    if (free_slots_.empty()) {
      // so that free_slot never allocates (doubling, as slots_ grows)
      if (free_slots_.capacity() <= slots_.size()) { free_slots_.reserve(2 * slots_.size() + 1); }
      slots_.push_back(fence_slot{fence, 0});
      return static_cast<std::uint32_t>(slots_.size() - 1);
    }
    auto const slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = fence_slot{fence, 0};
    return slot;
  }

  void free_slot(std::uint32_t slot) noexcept { free_slots_.push_back(slot); }

  void drop_ref(FenceOps& ops, std::uint32_t slot) noexcept
  {
    if (slot == no_slot) { return; }
    if (--slots_[slot].refs == 0) {
      ops.release_fence(slots_[slot].fence);
      free_slot(slot);
    }
  }

  template <typename Out, typename Pred>
  void take_if(Out& out, Pred&& pred)
  {
    for (auto& [key, q] : queues_) {
      for (auto it = q.entries.begin(); it != q.entries.end();) {
        if (!pred(*it)) {
          ++it;
          continue;
        }
        out.push_back(*it);  // may throw: the list is unchanged for this entry then
        if (it->fence.has_value()) {
          --q.fenced;
          --fenced_count_;
        } else {
          leave_unfenced(q, *it);
        }
        removed(it->block.bytes);
        it = q.entries.erase(it);
      }
    }
    prune();
  }

  /// The queue holding the oldest fenced entry and that entry, or {nullptr, {}}.
  std::pair<queue*, typename ring_deque<entry>::iterator> oldest_fenced()
  {
    queue* best = nullptr;
    typename ring_deque<entry>::iterator best_it{};
    for (auto& [key, q] : queues_) {
      if (q.fenced == 0) { continue; }
      for (auto it = q.entries.begin(); it != q.entries.end(); ++it) {
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

  /// Gives back the storage of queues that shrank below a quarter of it (above
  /// `kept_entries_`); drops empty queues once too many are idle (streams come and go).
  void prune()
  {
    std::size_t idle = 0;
    for (auto& [key, q] : queues_) {
      q.entries.shrink(kept_entries_);
      idle += q.entries.empty();
    }
    if (idle <= max_idle_queues) { return; }
    std::vector<std::pair<stream_key, queue>> kept;
    for (auto& kq : queues_) {
      if (!kq.second.entries.empty()) { kept.push_back(std::move(kq)); }
    }
    queues_.swap(kept);
  }

  std::size_t kept_entries_;
  std::vector<std::pair<stream_key, queue>> queues_;
  std::vector<fence_slot> slots_;
  std::vector<std::uint32_t> free_slots_;  // capacity >= slots_.size(): pushing never throws
  std::size_t pending_bytes_{};
  std::size_t pending_count_{};
  std::size_t parked_count_{};
  std::size_t armable_count_{};
  std::size_t fenced_count_{};
  std::uint64_t next_seq_{};
};

/// What `wait_all` did: fence waits that succeeded and that failed.
struct wait_counts {
  std::size_t succeeded{};
  std::size_t failed{};
};

/**
 * @brief Waits on the fence of every entry of `taken` that is not ready yet.
 *
 * Entries whose fence completed or was waited on go to `done`; entries whose wait failed (no
 * information: never read as complete) and unfenced entries go to `failed`. Entries sharing a
 * fence (same slot) are tested and waited on once. `taken` is cleared.
 */
template <typename FenceOps, typename Entries>
wait_counts wait_all(FenceOps& ops, Entries& taken, Entries& done, Entries& failed)
{
  constexpr auto no_slot = ~std::uint32_t{0};
  wait_counts counts;
  auto last_slot = no_slot;
  bool last_done = false;
  for (auto& e : taken) {
    if (!e.fence.has_value()) {
      failed.push_back(e);
      continue;
    }
    bool ok = false;
    if (e.slot != no_slot && e.slot == last_slot) {
      ok = last_done;
    } else if (ops.ready(*e.fence)) {
      ok = true;
    } else if (ops.host_wait(*e.fence)) {
      ++counts.succeeded;
      ok = true;
    } else {
      ++counts.failed;
    }
    last_slot = e.slot;
    last_done = ok;
    if (ok) {
      done.push_back(e);
    } else {
      failed.push_back(e);
    }
  }
  taken.clear();
  return counts;
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
