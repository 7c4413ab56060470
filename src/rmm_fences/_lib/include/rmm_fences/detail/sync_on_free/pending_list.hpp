/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * SyncOnFree's pending-free list behind its lock: the `deferred_free_list`, the identities of
 * the freeing streams and the counts kept with them. Each public member is one locked step.
 */
#pragma once

#include <rmm_fences/detail/deferred_free_list.hpp>
#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/detail/sync_on_free/batch_limits.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

namespace rmm_fences::mr::detail::sync_on_free {

/**
 * @brief The blocks freed and not yet handed to the upstream, behind one mutex.
 *
 * Lock rule: `mutex_` guards `list_`, `ids_` and the counts `parked_`, `deferred_`,
 * `reused_`, `peak_pending_bytes_`. Each public member takes it once and returns with it released;
 * members ending in `_locked` expect it held. Under it run only non-blocking fence calls
 * (`ready`, `release_fence`) and pushes into the caller's buffers, whose spill cache takes its
 * own spin lock (order: `mutex_`, then the spill cache's). No fence record, wait,
 * synchronization or upstream call runs under it. `pollable_` and `calls_` are atomics read
 * without it.
 */
template <typename Platform>
class pending_list {
 public:
  using list_type  = deferred_free_list<Platform>;
  using buffer     = typename list_type::entry_buffer;
  using fence_type = typename Platform::fence_type;
  using key_type   = std::uintptr_t;

  static constexpr auto unknown_stream = list_type::unknown_stream;
  static constexpr auto no_entry       = list_type::no_entry;

  /// The unfenced blocks of `key` listed before `before` that a fence recorded on that stream
  /// covers: the block `own_seq` and, with a known identity `id`, every block noted with it.
  struct covered {
    key_type key{};
    std::uint64_t id{};
    std::uint64_t own_seq{no_entry};
    std::uint64_t before{};
  };

  /// What became of the covered blocks' fence (`close_batch`).
  enum class batch_outcome {
    fenced,  ///< a fence was recorded: the blocks get it
    synced,  ///< none, but the stream was synchronized: the blocks go to the caller
    park,    ///< none, nor a synchronization: the blocks are parked
    keep,    ///< none: the blocks stay as they are (a later call retries)
  };

  /// What `push` did; `listed` false: no host memory, nothing listed.
  struct listing {
    bool listed{};
    bool record{};  ///< the batch is due its fence now
    bool verify{};  ///< the fence covers earlier calls' blocks: ask the stream's identity
    std::uint64_t own{no_entry};
    std::uint64_t before{};
  };

  pending_list(Platform& platform,
               std::optional<std::size_t> max_pending_bytes,
               batch_limits batch,
               std::size_t poll_every)
    : platform_{platform},
      max_pending_bytes_{max_pending_bytes},
      batch_{batch},
      poll_every_{poll_every},
      list_{kept_entries(batch)}
  {
  }

  [[nodiscard]] std::optional<std::size_t> max_pending_bytes() const noexcept
  { return max_pending_bytes_; }
  [[nodiscard]] batch_limits const& batch() const noexcept { return batch_; }

  /**
   * @brief Lists `block`, freed on the stream `key` outside capture, in its batch, and says
   * whether the batch is due its fence: `fence_now`, the stream's first free, the pending total
   * over the cap, parked blocks the fence could arm, or a full batch.
   *
   * Fences of earlier calls found complete go to `ready`: on the calls due a poll, and always
   * before a record (the one found complete is the one recorded next, and the record never
   * precedes the test of the stream's previous fence). The fence recorded in this call is not
   * tested in it: a device processes a record after the call that made it.
   */
  listing push(key_type key, deferred_block block, bool fence_now, buffer& ready) noexcept
  {
    listing out;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      auto const* known   = known_id_locked(key);
      auto const pushed   = list_.push(key, known == nullptr ? unknown_stream : *known, block);
      out.own             = pushed.seq;
      out.listed          = true;
      bool const over_cap = over_cap_locked();
      out.record          = fence_now || known == nullptr || over_cap || pushed.armable ||
                            batch_.full(pushed.batch.count, pushed.batch.bytes);
      out.verify          = known == nullptr || pushed.armable || pushed.batch.count > 1;
      out.before          = list_.next_seq();
      if (!out.record) {
        ++deferred_;
        if (poll_due()) { list_.release_ready(platform_, ready); }
      } else {
        list_.release_ready(platform_, ready);
      }
      list_changed_locked(/*peak=*/!over_cap);
    } catch (...) {
      // Out of host memory: not listed (the caller settles it), or listed and not polled.
    }
    return out;
  }

  /**
   * @brief Applies `outcome` to the blocks `c` names: gives them `fence` (its reference goes
   * back when none takes it), moves them to `synced`, or parks them; notes the stream's
   * identity. The block `c.own_seq` counts as deferred unless it was synced or parked. With
   * `oldest`, blocks over the cap are taken out (oldest fences first) for the caller to wait
   * on. No host memory: what was not done stays listed, and `fence` is released.
   */
  void close_batch(covered const& c,
                   batch_outcome outcome,
                   std::optional<fence_type> fence,
                   buffer& synced,
                   buffer* oldest) noexcept
  {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      note_id_locked(c.key, c.id);
      bool const own_blocked = apply_locked(c, outcome, fence, synced);
      if (c.own_seq != no_entry && !own_blocked) { ++deferred_; }
      if (oldest != nullptr && over_cap_locked()) {
        list_.take_oldest_until(*max_pending_bytes_, *oldest);
      }
      list_changed_locked();
    } catch (...) {
      if (fence.has_value()) { platform_.release_fence(*fence); }
    }
  }

  /// The `before` of a fence for the batch (and the armable parked blocks) of `key`; empty
  /// when it has none, or on a failure.
  std::optional<std::uint64_t> batch_to_fence(key_type key) noexcept
  {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (list_.batch(key).count == 0 && !list_.has_armable(key)) { return std::nullopt; }
      return list_.next_seq();
    } catch (...) {
      return std::nullopt;
    }
  }

  /**
   * @brief Moves every block whose fence completed into `ready` (never blocks).
   * @return the `before` of a fence to arm the parked blocks of `key` with, when it has any
   */
  std::optional<std::uint64_t> take_ready(key_type key, buffer& ready) noexcept
  {
    std::optional<std::uint64_t> arm_before;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      bool const arm    = list_.has_armable(key);
      auto const before = list_.next_seq();
      if (arm) { arm_before = before; }
      list_.release_ready(platform_, ready);
      list_changed_locked();
    } catch (...) {
      // No host memory for the released entries: they stay listed for a later call.
    }
    return arm_before;
  }

  /// Moves every fenced block into `taken` and, with `include_parked`, every unfenced one.
  void take_all(bool include_parked, buffer& taken)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    list_.take_all_fenced(taken);
    if (include_parked) { list_.take_unfenced(taken); }
    list_changed_locked();
  }

  /// Lists again blocks whose wait failed (nothing known about them); no host memory: leaked.
  void relist(buffer& failed) noexcept
  {
    if (failed.empty()) { return; }
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      list_.restore(failed);
      list_changed_locked();
    } catch (...) {
      // No host memory to list them again: leaking is the only safe choice.
    }
    failed.clear();
  }

  /**
   * @brief Lists a block freed on the stream `key` without a fence.
   *
   * `verifiable`: freed during capture of that stream; it keeps the stream's identity if known
   * (seen outside capture before), so a later call on that very stream can arm it. Otherwise
   * only a device synchronization releases it. No host memory: leaked.
   */
  void park(key_type key, deferred_block block, bool verifiable) noexcept
  {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      std::uint64_t id = unknown_stream;
      if (verifiable) {
        if (auto const* known = known_id_locked(key); known != nullptr) { id = *known; }
      }
      list_.park(key, id, block);
      ++parked_;
      list_changed_locked();
    } catch (...) {
      // No host memory to list it: leaking the block is the only safe choice.
    }
  }

  /// The identity noted with a block freed lately on the stream `key` that an allocation of
  /// `bytes` at `alignment` on that very stream may take back; empty when there is none.
  [[nodiscard]] std::optional<std::uint64_t> freed_id(key_type key,
                                                      std::size_t bytes,
                                                      std::size_t alignment) const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto const id = list_.freed_id(key, bytes, alignment);
    return id == unknown_stream ? std::nullopt : std::optional<std::uint64_t>{id};
  }

  /// Takes back, for an allocation of `bytes` at `alignment` on the stream `key` of identity
  /// `id` (asked of it outside capture), a block freed lately on it
  /// (`deferred_free_list::take_freed`); empty when there is none any more.
  [[nodiscard]] std::optional<deferred_block> take_freed(key_type key,
                                                         std::uint64_t id,
                                                         std::size_t bytes,
                                                         std::size_t alignment)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto block = list_.take_freed(platform_, key, id, bytes, alignment);
    if (block.has_value()) {
      ++reused_;
      list_changed_locked(/*peak=*/false);
    }
    return block;
  }

  /// Drops the fence references of blocks taken out and released since.
  void settle(buffer& blocks) noexcept
  {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      list_.settle(platform_, blocks);
    } catch (...) {
      // The fences stay referenced: never recycled, which is safe.
    }
  }

  /// True when the identity of the stream `key` is known.
  [[nodiscard]] bool knows_id(key_type key)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return known_id_locked(key) != nullptr;
  }

  void note_id(key_type key, std::uint64_t id)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    note_id_locked(key, id);
  }

  /**
   * @brief True on the calls that test fences, only while fenced or armable blocks are listed:
   * one call in `poll_every` (every call when 1). Lock-free.
   */
  bool poll_due() noexcept
  {
    if (pollable_.load(std::memory_order_relaxed) == 0) { return false; }
    if (poll_every_ == 1) { return true; }
    return calls_.fetch_add(1, std::memory_order_relaxed) % poll_every_ == 0;
  }

  [[nodiscard]] bool contains(void const* ptr) const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.contains(ptr);
  }

  [[nodiscard]] std::size_t pending_bytes() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.pending_bytes();
  }

  [[nodiscard]] std::size_t pending_count() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.pending_count();
  }

  [[nodiscard]] std::optional<fence_type> fence_of(void const* ptr) const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.fence_of(ptr);
  }

  /// Fills the counts kept with the list into `s`.
  void fill(rmm_fences::mr::sync_on_free_stats& s) const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s.deferred           = deferred_;
    s.parked             = parked_;
    s.same_stream_reuse  = reused_;
    s.peak_pending_bytes = peak_pending_bytes_;
  }

 private:
  /// `close_batch`'s change of the list; true when the block `c.own_seq` was synced or parked.
  bool apply_locked(covered const& c,
                    batch_outcome outcome,
                    std::optional<fence_type>& fence,
                    buffer& synced)
  {
    switch (outcome) {
      case batch_outcome::fenced:
        // arm throws (no host memory) before changing anything: the caller releases the fence
        if (list_.arm(c.key, c.id, c.own_seq, c.before, *fence) == 0) {
          platform_.release_fence(*fence);
        }
        fence.reset();
        return false;
      case batch_outcome::synced:
        return list_.take_synced(c.key, c.id, c.own_seq, c.before, synced);
      case batch_outcome::park: {
        auto const [parked, own] = list_.park_unfenceable(c.key, c.id, c.own_seq, c.before);
        parked_ += parked;
        return own;
      }
      case batch_outcome::keep: break;
    }
    return false;
  }

  [[nodiscard]] bool over_cap_locked() const noexcept
  { return max_pending_bytes_.has_value() && list_.pending_bytes() > *max_pending_bytes_; }

  /// Updates the peak and the lock-free hint after the list changed. `peak`: false while the
  /// total is over the cap, before the cap applied.
  void list_changed_locked(bool peak = true) noexcept
  {
    if (peak) {
      peak_pending_bytes_ = std::max<std::uint64_t>(peak_pending_bytes_, list_.pending_bytes());
    }
    pollable_.store(list_.fenced_count() + list_.armable_count(), std::memory_order_relaxed);
  }

  /// The identity last seen for `key`, or nullptr.
  [[nodiscard]] std::uint64_t const* known_id_locked(key_type key) noexcept
  { return ids_.find(key + 1); }

  /// Notes `key`'s identity; no host memory: it stays unknown.
  void note_id_locked(key_type key, std::uint64_t id) noexcept
  {
    if (id == unknown_stream) { return; }
    try {
      ids_.insert_or_assign(key + 1, id);
    } catch (...) {
    }
  }

  Platform& platform_;
  std::optional<std::size_t> const max_pending_bytes_;
  batch_limits const batch_;
  std::size_t const poll_every_;  // calls per fence test (while something is listed)

  mutable std::mutex mutex_;
  list_type list_;
  std::uint64_t parked_{};
  std::uint64_t deferred_{};
  std::uint64_t reused_{};
  std::uint64_t peak_pending_bytes_{};
  pointer_map<std::uint64_t> ids_{64};   // stream key + 1 -> identity
  std::atomic<std::size_t> pollable_{};  // fenced + armable entries, read without the lock
  std::atomic<std::uint64_t> calls_{};   // calls that found something to test
};

}  // namespace rmm_fences::mr::detail::sync_on_free
