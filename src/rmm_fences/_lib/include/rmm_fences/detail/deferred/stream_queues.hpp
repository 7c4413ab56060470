/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The structure of `deferred_free_list`: its entries, kept in one FIFO queue per stream, with
 * the counters of each entry state kept in step. Which entry changes state, and when, is the
 * list's policy (deferred_free_list.hpp).
 */
#pragma once

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

namespace deferred {

using stream_key = std::uintptr_t;

/// Identity of a stream that cannot be verified: its entries are armed only in the call that
/// freed them.
inline constexpr std::uint64_t unknown_stream = 0;
/// No entry (an `own_seq` that matches nothing).
inline constexpr std::uint64_t no_entry = ~std::uint64_t{0};
/// An entry that holds no reference to a shared fence.
inline constexpr std::uint32_t no_slot = ~std::uint32_t{0};

/// One listed block; `seq` orders entries across streams (oldest first).
template <typename Fence>
struct entry {
  deferred_block block;
  std::optional<Fence> fence;
  std::uint64_t seq{};
  stream_key key{};
  std::uint64_t stream_id{};    ///< unfenced entries: the freeing stream's identity, or unknown
  std::uint32_t slot{no_slot};  ///< while fenced: its reference to the shared fence
  bool parked{};                ///< unfenced: parked rather than batched
};

/// The batch of a stream: its batched entries.
struct batch_size {
  std::size_t count{};
  std::size_t bytes{};
};

/// The entries freed on one stream key, oldest first, and the count of each state.
template <typename Fence>
struct queue {
  ring_deque<entry<Fence>> entries;
  std::size_t fenced{};         ///< entries with a fence
  std::size_t batched{};        ///< entries waiting for their batch's fence
  std::size_t batched_bytes{};  ///< their bytes
  std::size_t armable{};        ///< parked entries with a known identity

  [[nodiscard]] batch_size batch() const noexcept { return {batched, batched_bytes}; }
};

/**
 * @brief The per-stream queues of listed entries and the totals over them.
 *
 * No lock: only `deferred_free_list` uses it, and the list's owner serializes every call.
 *
 * Every change of an entry's state goes through a member here (`append`, `insert`, `arm`,
 * `demote`, `remove`), so the per-queue counts and the totals (`pending_bytes`,
 * `pending_count`, `parked_count`, `armable_count`, `fenced_count`) always match the entries.
 *
 * Streams are few, so queues live in a small vector searched linearly; an emptied queue is
 * kept (its storage is reused by the next free on that stream) until more than
 * `max_idle_queues` are empty. A queue is a ring (`ring_deque`) that keeps its storage: a
 * steady state of frees and releases on a stream allocates nothing. A queue's storage above
 * `kept_entries` entries is given back once a quarter of it or less is used.
 */
template <typename Fence>
class stream_queues {
 public:
  using entry_type = entry<Fence>;
  using queue_type = queue<Fence>;
  using iterator   = typename ring_deque<entry_type>::iterator;

  static constexpr std::size_t max_idle_queues = 16;

  explicit stream_queues(std::size_t kept_entries) noexcept : kept_entries_{kept_entries} {}

  /// Appends an unfenced entry (batched, or `parked`) freed on `stream`; returns its queue.
  queue_type& append(stream_key stream, std::uint64_t stream_id, deferred_block block, bool parked)
  {
    auto& q     = queue_of(stream);
    auto& e     = q.entries.push_back_slot();  // every field assigned: the hot path of a free
    e.block     = block;
    e.fence     = std::nullopt;
    e.seq       = next_seq_;
    e.key       = stream;
    e.stream_id = stream_id;
    e.slot      = no_slot;
    e.parked    = parked;
    ++next_seq_;
    if (parked) {
      note_parked(q, stream_id);
    } else {
      ++q.batched;
      q.batched_bytes += block.bytes;
    }
    added(block.bytes);
    return q;
  }

  /// Lists again an entry taken out, at its place by `seq`, in the state it had. May throw
  /// `std::bad_alloc` (nothing changed).
  void insert(entry_type const& e)
  {
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

  /// Makes the unfenced entry `e` of `q` fenced, holding its reference `slot` to `fence`.
  void arm(queue_type& q, entry_type& e, Fence fence, std::uint32_t slot) noexcept
  {
    leave_unfenced(q, e);
    e.fence = fence;
    e.slot  = slot;
    ++q.fenced;
    ++fenced_count_;
  }

  /// Makes an unfenced entry parked with an unknown identity: never armed again.
  void demote(queue_type& q, entry_type& e) noexcept
  {
    if (e.parked && e.stream_id == unknown_stream) { return; }
    leave_unfenced(q, e);
    e.parked    = true;
    e.stream_id = unknown_stream;
    note_parked(q, unknown_stream);
  }

  /// Takes the entry at `it` out of `q` (any state); returns the position that followed it.
  iterator remove(queue_type& q, iterator it) noexcept
  {
    if (it->fence.has_value()) {
      --q.fenced;
      --fenced_count_;
    } else {
      leave_unfenced(q, *it);
    }
    removed(it->block.bytes);
    if (it == q.entries.begin()) {  // the usual case, cheaper than a general erase
      q.entries.pop_front();
      return q.entries.begin();
    }
    return q.entries.erase(it);
  }

  /// The entry at index `k` of `q` (0: the oldest).
  [[nodiscard]] static iterator at(queue_type& q, std::size_t k) noexcept
  { return iterator{&q.entries, k}; }

  [[nodiscard]] queue_type const* find(stream_key stream) const
  {
    for (auto const& [key, q] : queues_) {
      if (key == stream) { return &q; }
    }
    return nullptr;
  }

  [[nodiscard]] queue_type* find(stream_key stream)
  { return const_cast<queue_type*>(static_cast<stream_queues const*>(this)->find(stream)); }

  /// Moves every entry that `pred` holds for into `out` (in queue order, stream by stream).
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
        it = remove(q, it);
      }
    }
    prune();
  }

  /// The listed entry of the block starting at `ptr`, or nullptr.
  [[nodiscard]] entry_type const* lookup(void const* ptr) const noexcept
  {
    for (auto const& [key, q] : queues_) {
      for (auto const& e : q.entries) {
        if (e.block.ptr == ptr) { return &e; }
      }
    }
    return nullptr;
  }

  /// The queue holding the oldest fenced entry and that entry, or {nullptr, {}}.
  std::pair<queue_type*, iterator> oldest_fenced()
  {
    queue_type* best = nullptr;
    iterator best_it{};
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
  /// `kept_entries`); drops empty queues once too many are idle (streams come and go).
  void prune()
  {
    std::size_t idle = 0;
    for (auto& [key, q] : queues_) {
      q.entries.shrink(kept_entries_);
      idle += q.entries.empty();
    }
    if (idle <= max_idle_queues) { return; }
    std::vector<std::pair<stream_key, queue_type>> kept;
    for (auto& kq : queues_) {
      if (!kq.second.entries.empty()) { kept.push_back(std::move(kq)); }
    }
    queues_.swap(kept);
  }

  /// Every queue with its stream key (for walks over all entries).
  [[nodiscard]] std::vector<std::pair<stream_key, queue_type>>& all() noexcept { return queues_; }

  [[nodiscard]] std::uint64_t next_seq() const noexcept { return next_seq_; }
  [[nodiscard]] std::size_t pending_bytes() const noexcept { return pending_bytes_; }
  [[nodiscard]] std::size_t pending_count() const noexcept { return pending_count_; }
  [[nodiscard]] std::size_t parked_count() const noexcept { return parked_count_; }
  [[nodiscard]] std::size_t armable_count() const noexcept { return armable_count_; }
  [[nodiscard]] std::size_t fenced_count() const noexcept { return fenced_count_; }

 private:
  queue_type& queue_of(stream_key stream)
  {
    auto* q = find(stream);
    return q != nullptr ? *q : queues_.emplace_back(stream, queue_type{}).second;
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

  void note_parked(queue_type& q, std::uint64_t stream_id) noexcept
  {
    ++parked_count_;
    if (stream_id != unknown_stream) {
      ++q.armable;
      ++armable_count_;
    }
  }

  /// Takes an unfenced entry out of its state's counters (it stays in the queue).
  void leave_unfenced(queue_type& q, entry_type const& e) noexcept
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

  std::size_t kept_entries_;
  std::vector<std::pair<stream_key, queue_type>> queues_;
  std::size_t pending_bytes_{};
  std::size_t pending_count_{};
  std::size_t parked_count_{};
  std::size_t armable_count_{};
  std::size_t fenced_count_{};
  std::uint64_t next_seq_{};
};

}  // namespace deferred
}  // namespace rmm_fences::mr::detail
