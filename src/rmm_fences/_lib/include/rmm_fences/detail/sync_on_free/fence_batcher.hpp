/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * SyncOnFree's fence batching: how a deferred free gets its fence (one per batch of frees on a
 * stream), and how pending blocks are waited on and handed to the upstream.
 */
#pragma once

#include <rmm_fences/detail/deferred_free_list.hpp>
#include <rmm_fences/detail/sync_on_free/batch_limits.hpp>
#include <rmm_fences/detail/sync_on_free/counters.hpp>
#include <rmm_fences/detail/sync_on_free/pending_list.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace rmm_fences::mr::detail::sync_on_free {

/// What `fence_batcher::defer` does when no fence can be recorded.
enum class no_fence_rule {
  keep,         ///< leave the blocks as they are (a later call retries)
  park,         ///< park the batch: a device synchronization releases it
  sync_stream,  ///< synchronize the stream and free the batch; if that fails, park it
};

/**
 * @brief Records the fences of batches of deferred frees and hands fenced-off blocks to the
 * upstream, by the rules stated in sync_on_free_core.hpp.
 *
 * Lock rule: no lock of its own. Each step takes the `pending_list`'s lock through one call to
 * it; fence records, waits, synchronizations and upstream calls run with no lock held.
 */
template <typename Platform, typename Upstream>
class fence_batcher {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;
  using list_type   = pending_list<Platform>;
  using buffer      = typename list_type::buffer;
  using covered     = typename list_type::covered;

  fence_batcher(Platform& platform,
                Upstream& upstream,
                counters& counts,
                std::optional<std::size_t> max_pending_bytes,
                batch_limits batch,
                std::size_t poll_every)
    : platform_{platform},
      upstream_{upstream},
      counts_{counts},
      list_{platform, max_pending_bytes, batch, poll_every},
      spill_{kept_entries(batch)}
  {
  }

  [[nodiscard]] list_type& list() noexcept { return list_; }
  [[nodiscard]] list_type const& list() const noexcept { return list_; }

  /**
   * @brief Lists the block in its stream's batch; records the batch's fence when the list says
   * it is due, or `fence_now`.
   *
   * When no fence can be recorded, `rule` says what becomes of the batch. With no host memory
   * to list the block, it is fenced alone and waited on (or its stream synchronized); if that
   * fails too, it is leaked, never reused early.
   */
  void defer(stream_type stream, deferred_block block, bool fence_now, no_fence_rule rule) noexcept
  {
    auto const key = platform_.key(stream);
    buffer ready{&spill_};
    auto const listed = list_.push(key, block, fence_now, ready);
    if (!listed.listed) {
      settle_unlisted(stream, block);
      return;
    }
    if (listed.record) {
      buffer oldest{&spill_};
      fence_listed(
        stream, covered{key, 0, listed.own, listed.before}, listed.verify, rule, ready, &oldest);
      settle_oldest(oldest);
      release(oldest, stream);
    }
    release(ready, stream);
  }

  /// Lists a block without a fence (see `pending_list::park`).
  void park(stream_type stream, deferred_block block, bool verifiable) noexcept
  { list_.park(platform_.key(stream), block, verifiable); }

  /// Returns every block whose fence completed, and arms the parked blocks of this very
  /// stream; never blocks.
  void poll(stream_type stream) noexcept
  {
    auto const key = platform_.key(stream);
    buffer ready{&spill_};
    if (auto const before = list_.take_ready(key, ready); before.has_value()) {
      fence_before(stream, key, *before);
    }
    release(ready, stream);
  }

  /// Records the fence of the batch (and of the armable parked blocks) of `stream`, if any.
  void fence_stream(stream_type stream) noexcept
  {
    auto const key = platform_.key(stream);
    if (auto const before = list_.batch_to_fence(key); before.has_value()) {
      fence_before(stream, key, *before);
    }
  }

  /**
   * @brief Waits for every fenced block and returns it upstream on `stream` (see
   * `sync_on_free_core::drain`).
   * @return the number of blocks returned
   */
  std::size_t drain(bool include_parked, stream_type stream)
  {
    if (!platform_.is_capturing(stream)) { fence_stream(stream); }
    buffer taken{&spill_};
    buffer done{&spill_};
    buffer failed{&spill_};
    // Detached before the sync: a block listed by another thread once the sync began is not
    // covered by it and stays listed.
    list_.take_all(include_parked, taken);
    auto const waits = wait_all(platform_, taken, done, failed);
    counts_.count_syncs(waits.succeeded);
    counts_.count_failures(waits.failed);
    if (!failed.empty() && include_parked) {
      if (platform_.sync_device()) {
        counts_.count_syncs(1);
        for (auto& e : failed) {
          done.push_back(e);
        }
        failed.clear();
      } else {
        counts_.count_failures(1);
      }
    }
    list_.relist(failed);
    auto const n = done.size();
    release(done, stream);
    return n;
  }

  /**
   * @brief Remembers the identity of `stream` (not capturing) the first time its key is seen.
   *
   * One identity query per stream key, never per free. A stale identity (the handle reused
   * since) only keeps blocks unfenced longer: identities are never reused, so it can never
   * match another stream; the next record on the stream refreshes it.
   */
  void remember_stream(stream_type stream) noexcept
  {
    auto const key = platform_.key(stream);
    try {
      if (list_.knows_id(key)) { return; }
      list_.note_id(key, platform_.stream_id(stream));
    } catch (...) {
    }
  }

 private:
  using batch_outcome = typename list_type::batch_outcome;

  /// A fence for the blocks of `key` listed before `before` that were freed on this very
  /// `stream` (its identity asked first); nothing changes when none can be recorded.
  void fence_before(stream_type stream, std::uintptr_t key, std::uint64_t before) noexcept
  {
    buffer none{&spill_};
    fence_listed(stream,
                 covered{key, 0, list_type::no_entry, before},
                 /*verify=*/true,
                 no_fence_rule::keep,
                 none,
                 nullptr);
  }

  /**
   * @brief Records one fence on `stream` (not capturing) for the blocks `c` names: the block
   * `c.own_seq` freed in this call and, when `verify` (the stream's identity is asked first),
   * every block freed on this very stream. When no fence can be recorded, `rule` applies.
   *
   * With `oldest`, blocks over the cap are taken out (oldest fences first) for the caller to
   * wait on. No fence is tested here: the caller tests those of earlier calls before the
   * record, and the fence just recorded would be pending (a device processes a record after
   * the call that made it; a later call tests it).
   */
  void fence_listed(stream_type stream,
                    covered c,
                    bool verify,
                    no_fence_rule rule,
                    buffer& synced,
                    buffer* oldest) noexcept
  {
    c.id           = verify ? platform_.stream_id(stream) : list_type::unknown_stream;
    auto fence     = record_fence(stream);
    bool synced_ok = false;
    if (!fence.has_value() && rule == no_fence_rule::sync_stream) {
      synced_ok = platform_.sync_stream(stream);
      if (synced_ok) {
        counts_.count_syncs(1);
      } else {
        counts_.count_failures(1);
      }
    }
    auto const outcome = fence.has_value()             ? batch_outcome::fenced
                         : synced_ok                   ? batch_outcome::synced
                         : rule != no_fence_rule::keep ? batch_outcome::park
                                                       : batch_outcome::keep;
    list_.close_batch(c, outcome, fence, synced, oldest);
  }

  /// A fence recorded on `stream` now, or empty when none could be had or recorded.
  std::optional<fence_type> record_fence(stream_type stream) noexcept
  {
    std::optional<fence_type> fence;
    try {
      fence = platform_.acquire_fence();
    } catch (...) {
      return std::nullopt;
    }
    if (!platform_.record(*fence, stream)) {
      platform_.release_fence(*fence);
      return std::nullopt;
    }
    counters::add(counts_.fences, 1);
    return fence;
  }

  /// No host memory to list `block`: waits on a fence of its own (or synchronizes its stream)
  /// and frees it; if that fails, leaking the block is the only safe choice.
  void settle_unlisted(stream_type stream, deferred_block block) noexcept
  {
    bool done = false;
    if (auto fence = record_fence(stream); fence.has_value()) {
      done = platform_.host_wait(*fence);
      platform_.release_fence(*fence);
    } else {
      done = platform_.sync_stream(stream);
    }
    if (!done) {
      counts_.count_failures(1);
      return;
    }
    counts_.count_syncs(1);
    upstream_.deallocate(stream, block.ptr, block.bytes, block.alignment);
    counters::add(counts_.released, 1);
  }

  /// Waits on the fences of blocks taken above the cap; those whose wait failed are relisted.
  void settle_oldest(buffer& oldest) noexcept
  {
    if (oldest.empty()) { return; }
    buffer taken{&spill_};
    for (auto& e : oldest) {
      taken.push_back(e);
    }
    oldest.clear();
    buffer failed{&spill_};
    auto const waits = wait_all(platform_, taken, oldest, failed);
    counts_.count_syncs(waits.succeeded);
    counts_.count_failures(waits.failed);
    list_.relist(failed);
  }

  /**
   * @brief Hands fenced-off blocks to the upstream on `stream`; blocks taken out with their
   * fence (not through `release_ready`) give their reference to it back.
   */
  void release(buffer& blocks, stream_type stream) noexcept
  {
    if (blocks.empty()) { return; }
    bool holds_fences = false;
    for (auto& e : blocks) {
      upstream_.deallocate(stream, e.block.ptr, e.block.bytes, e.block.alignment);
      holds_fences = holds_fences || e.slot != deferred::no_slot;
    }
    counters::add(counts_.released, blocks.size());
    if (holds_fences) { list_.settle(blocks); }
    blocks.clear();
  }

  Platform& platform_;
  Upstream& upstream_;
  counters& counts_;
  list_type list_;
  typename deferred_free_list<Platform>::entry_spill_cache
    spill_;  // the buffers' storage (own lock)
};

}  // namespace rmm_fences::mr::detail::sync_on_free
