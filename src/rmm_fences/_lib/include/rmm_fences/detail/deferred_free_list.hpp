/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of the deferred free (docs/design.md#layers, policy cores): no CUDA calls.
 * The list's rules; its parts are
 *   deferred/stream_queues.hpp  the entries, one FIFO queue per stream, and their counters
 *   deferred/fence_slots.hpp    the reference counts of fences shared by a batch
 *   deferred/wait_all.hpp       the owner's waits on the fences of entries taken out
 */
#pragma once

#include <rmm_fences/detail/deferred/fence_slots.hpp>
#include <rmm_fences/detail/deferred/stream_queues.hpp>
#include <rmm_fences/detail/deferred/wait_all.hpp>
#include <rmm_fences/detail/inline_vector.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

namespace rmm_fences::mr::detail {

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
 * signal by hand.
 *
 * Lock rule: the list holds no lock and never blocks. Its owner serializes every call and
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
 *  - entries sharing a fence hold one reference each to it (`deferred::fence_slots`): the fence
 *    goes back to `FenceOps` only when the last of them left the list and was settled;
 *  - `pending_bytes()` and `pending_count()` are the sums over every entry still listed.
 *
 * FIFO per stream is an optimisation, not a correctness rule: fences recorded on one stream
 * complete in recording order, so `release_ready` stops at the first entry of a stream that is
 * not ready and does not test the entries behind it; entries sharing a fence are tested once.
 * Every released entry had its own fence tested, so a key shared by two streams only delays
 * releases.
 */
template <typename FenceOps>
class deferred_free_list {
 public:
  using fence_type = typename FenceOps::fence_type;
  using stream_key = deferred::stream_key;
  using entry      = deferred::entry<fence_type>;
  using batch_size = deferred::batch_size;

  static constexpr std::uint64_t unknown_stream = deferred::unknown_stream;
  static constexpr std::uint64_t no_entry       = deferred::no_entry;
  static constexpr std::uint32_t no_slot        = deferred::no_slot;

  /// Heap storage of `entry_buffer`s kept for the next ones (their owner holds one).
  using entry_spill_cache = spill_cache<entry, 8>;

  /// Scratch space for entries taken out of the list: a few entries inline, more in storage of
  /// an `entry_spill_cache` (no heap use in a steady state).
  using entry_buffer = inline_vector<entry, 4, entry_spill_cache>;

  /// `kept_entries`: the storage a stream's queue keeps for reuse however few entries it
  /// holds (its owner passes what its batches need).
  explicit deferred_free_list(std::size_t kept_entries = 256) noexcept : queues_{kept_entries} {}

  /// What `push` did: the entry's sequence number and its stream's batch with it.
  struct pushed {
    std::uint64_t seq{};
    batch_size batch;
    bool armable{};  ///< the stream has parked entries a fence on it could arm
  };

  /// Appends a block freed on `stream` (identity `stream_id`, or unknown) to its batch.
  pushed push(stream_key stream, std::uint64_t stream_id, deferred_block block)
  {
    auto const seq = queues_.next_seq();
    auto const& q  = queues_.append(stream, stream_id, block, /*parked=*/false);
    return {seq, q.batch(), q.armable > 0};
  }

  /**
   * @brief Appends a block freed on `stream` without a fence and outside any batch.
   *
   * `stream_id` is the process-unique identity of the freeing stream when known, else
   * `unknown_stream`: such an entry leaves only through `take_unfenced`.
   */
  void park(stream_key stream, std::uint64_t stream_id, deferred_block block)
  { (void)queues_.append(stream, stream_id, block, /*parked=*/true); }

  /// The sequence number the next entry will get: entries listed so far are below it.
  [[nodiscard]] std::uint64_t next_seq() const noexcept { return queues_.next_seq(); }

  /// The batched entries of `stream`.
  [[nodiscard]] batch_size batch(stream_key stream) const
  {
    auto const* q = queues_.find(stream);
    return q == nullptr ? batch_size{} : q->batch();
  }

  /// Number of parked entries over all streams.
  [[nodiscard]] std::size_t parked_count() const noexcept { return queues_.parked_count(); }

  /// Number of parked entries that a fence on their stream could arm (identity known).
  [[nodiscard]] std::size_t armable_count() const noexcept { return queues_.armable_count(); }

  /// Number of fenced entries over all streams.
  [[nodiscard]] std::size_t fenced_count() const noexcept { return queues_.fenced_count(); }

  /// True when `stream` has parked entries that a fence on it could arm (identity known).
  [[nodiscard]] bool has_armable(stream_key stream) const
  {
    if (queues_.armable_count() == 0) { return false; }
    auto const* q = queues_.find(stream);
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
    auto* q = queues_.find(stream);
    if (q == nullptr) { return 0; }
    auto const slot   = slots_.add(fence);
    std::size_t armed = 0;
    for_unfenced(*q, stream_id, own_seq, before, [&](entry& e, bool eligible) {
      if (!eligible) {
        queues_.demote(*q, e);
        return false;
      }
      queues_.arm(*q, e, fence, slot);
      ++armed;
      return false;
    });
    if (armed == 0) {
      slots_.discard(slot);
    } else {
      slots_.set_refs(slot, armed);
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
    auto* q = queues_.find(stream);
    if (q == nullptr) { return false; }
    bool own = false;
    for_unfenced(*q, stream_id, own_seq, before, [&](entry& e, bool eligible) {
      if (!eligible) {
        queues_.demote(*q, e);
        return false;
      }
      out.push_back(e);
      own = own || e.seq == own_seq;
      return true;
    });
    queues_.prune();
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
    auto* q = queues_.find(stream);
    if (q == nullptr) { return {0, false}; }
    std::size_t parked = 0;
    bool own           = false;
    for_unfenced(*q, stream_id, own_seq, before, [&](entry& e, bool eligible) {
      if (e.parked && eligible) { return false; }  // parked ones stay armable by a later call
      if (!e.parked) {
        ++parked;
        own = own || e.seq == own_seq;
      }
      queues_.demote(*q, e);
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
    if (queues_.fenced_count() == 0) { return 0; }
    std::size_t moved = 0;
    for (auto& [key, q] : queues_.all()) {
      moved += release_ready_from(ops, q, out);
    }
    if (moved > 0) { queues_.prune(); }
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
    while (queues_.pending_bytes() > max_bytes) {
      auto [q, it] = queues_.oldest_fenced();
      if (q == nullptr) { break; }
      out.push_back(*it);
      (void)queues_.remove(*q, it);
    }
    queues_.prune();
  }

  /// Moves every fenced entry into `out`; the caller waits on each fence before the release.
  template <typename Out>
  void take_all_fenced(Out& out)
  {
    queues_.take_if(out, [](entry const& e) { return e.fence.has_value(); });
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
    queues_.take_if(out, [](entry const& e) { return !e.fence.has_value(); });
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
      queues_.insert(e);
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
      slots_.drop(ops, e.slot);
      e.slot = no_slot;
    }
  }

  /// How many of a stream's latest entries an allocation on it looks at (`take_freed`).
  static constexpr std::size_t reuse_window = 16;

  /**
   * @brief The identity noted with the latest of the last `reuse_window` entries of `stream`
   * that `take_freed` may take for `bytes` at `alignment`; else `unknown_stream`.
   */
  [[nodiscard]] std::uint64_t freed_id(stream_key stream,
                                       std::size_t bytes,
                                       std::size_t alignment) const noexcept
  {
    auto const* q = queues_.find(stream);
    if (q == nullptr) { return unknown_stream; }
    auto const k = latest_fit(*q, bytes, alignment, unknown_stream);
    return k == q->entries.size() ? unknown_stream : q->entries.at(k).stream_id;
  }

  /**
   * @brief Takes the latest of the last `reuse_window` entries of `stream` that is a block of
   * `bytes` at `alignment`, batched or fenced (not parked), noted with the identity
   * `stream_id` (known, asked of the stream outside capture by the caller): an allocation on
   * that very stream may use it at once, the stream ordering its new work after the work that
   * used the block. Its reference to a shared fence is dropped.
   */
  std::optional<deferred_block> take_freed(FenceOps& ops,
                                           stream_key stream,
                                           std::uint64_t stream_id,
                                           std::size_t bytes,
                                           std::size_t alignment) noexcept
  {
    auto* q = queues_.find(stream);
    if (stream_id == unknown_stream || q == nullptr) { return std::nullopt; }
    auto const k = latest_fit(*q, bytes, alignment, stream_id);
    if (k == q->entries.size()) { return std::nullopt; }
    auto const it    = queues_.at(*q, k);
    auto const taken = *it;
    queues_.remove(*q, it);
    slots_.drop(ops, taken.slot);
    return taken.block;
  }

  /// True when a block starting at `ptr` is listed (its free is pending).
  [[nodiscard]] bool contains(void const* ptr) const noexcept
  { return queues_.lookup(ptr) != nullptr; }

  /// The fence the listed block at `ptr` waits for; empty when it is not listed or unfenced.
  [[nodiscard]] std::optional<fence_type> fence_of(void const* ptr) const noexcept
  {
    auto const* e = queues_.lookup(ptr);
    return e == nullptr ? std::nullopt : e->fence;
  }

  /// Bytes of every listed block.
  [[nodiscard]] std::size_t pending_bytes() const noexcept { return queues_.pending_bytes(); }

  /// Number of listed blocks.
  [[nodiscard]] std::size_t pending_count() const noexcept { return queues_.pending_count(); }

 private:
  /// The index of the latest of the last `reuse_window` entries of `q` that is a batched or
  /// fenced block of `bytes` at `alignment` with a known identity (`stream_id`, when known);
  /// `q.entries.size()` when none is.
  [[nodiscard]] static std::size_t latest_fit(typename deferred::queue<fence_type> const& q,
                                              std::size_t bytes,
                                              std::size_t alignment,
                                              std::uint64_t stream_id) noexcept
  {
    auto const n = q.entries.size();
    for (std::size_t k = n; k-- > 0 && n - k <= reuse_window;) {
      auto const& e = q.entries.at(k);
      if (!e.parked && e.block.bytes == bytes && e.block.alignment == alignment &&
          e.stream_id != unknown_stream &&
          (stream_id == unknown_stream || e.stream_id == stream_id)) {
        return k;
      }
    }
    return n;
  }

  using queue = typename deferred::stream_queues<fence_type>::queue_type;

  /// `release_ready` on one queue: its leading ready fenced entries, unfenced ones skipped.
  template <typename Out>
  std::size_t release_ready_from(FenceOps& ops, queue& q, Out& out)
  {
    std::size_t moved = 0;
    std::size_t left  = q.fenced;
    auto ready_slot   = no_slot;
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
      slots_.drop(ops, it->slot);
      out[out.size() - 1].slot = no_slot;
      it                       = queues_.remove(q, it);
      ++moved;
    }
    return moved;
  }

  /**
   * @brief Calls `visit(entry, eligible)` on the unfenced entries of `q` listed before
   * `before` that an arm with (`stream_id`, `own_seq`) concerns: eligible ones (the entry
   * `own_seq`; with a known `stream_id`, those noted with it) and, with a known `stream_id`,
   * the others (freed on a stream that is gone). Entries of another identity are left alone
   * when `stream_id` is unknown. `visit` returns true to take the entry out of the list.
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
        it = queues_.remove(q, it);
      } else {
        ++it;
      }
    }
  }

  deferred::stream_queues<fence_type> queues_;
  deferred::fence_slots<fence_type> slots_;
};

}  // namespace rmm_fences::mr::detail
