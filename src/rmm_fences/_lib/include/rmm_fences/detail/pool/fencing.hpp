/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: what the fencing rule's answers do to a slot's cache. A record
 * that covers it (the blocks stay the stream's), a record and the cache moved to the shared
 * list, and the sharing of a cache a record already covers, which any thread may do: the
 * tag is that record, not a new one on a stream that may be gone.
 */
#pragma once

#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/pool/fence.hpp>
#include <rmm_fences/detail/pool/orphans.hpp>
#include <rmm_fences/detail/pool/shared_list.hpp>
#include <rmm_fences/detail/pool/stream_slot.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace rmm_fences::mr::detail::pool {

/// The fencing actions on slots, over the pool's shared list and orphans (taken after a slot's
/// mutex is released, per the pool's lock rule).
template <typename Platform>
class fencing_actions {
 public:
  using stream_type = typename Platform::stream_type;
  using slot_type   = stream_slot<Platform>;
  using tag_type    = fence_tag<Platform>;

  fencing_actions(Platform& platform, shared_list<Platform>& shared, orphans& orphaned) noexcept
    : platform_{platform}, shared_{shared}, orphans_{orphaned}
  {
  }

  /// Records `slot`'s fence on `stream` after a free: the cache stays the stream's, covered
  /// by the record (shared with it when another stream runs short, on release or when the
  /// slot is retired). Skipped during capture (the cache then stays uncovered).
  void cover_locked(slot_type& slot, stream_type stream) noexcept
  {
    if (slot.graph || platform_.is_capturing(stream)) { return; }
    if (auto const number = slot.cell->record(stream)) { slot.covered = *number; }
  }

  /// Records `slot`'s fence on `stream` and moves its cache to the shared list (`lock` holds
  /// `slot.mutex`; released once the blocks moved). Skipped during capture; without a fence
  /// the blocks stay in the cache, usable by this stream.
  void fence_and_share_locked(slot_type& slot,
                              stream_type stream,
                              std::unique_lock<spin_mutex>& lock)
  {
    slot.flush_recent_locked();
    if (slot.cache.empty() || platform_.is_capturing(stream)) { return; }
    auto const number = slot.cell->record(stream);
    if (!number) { return; }
    slot.covered = *number;
    slot.fence_requested.store(false, std::memory_order_relaxed);
    auto const blocks = slot.cache.take_all();
    auto const tag    = tag_type::of(slot.cell, *number);
    lock.unlock();
    shared_.insert_all(blocks, tag);
  }

  /// Fences `slot`'s cache (blocks freed on `stream`) into the shared list, where the stream
  /// takes them back without a wait; true when it moved any (not in capture).
  bool share_own_cache(slot_type& slot, stream_type stream)
  {
    std::unique_lock<spin_mutex> lock(slot.mutex);
    if (!slot.holds_free_blocks_locked()) { return false; }
    fence_and_share_locked(slot, stream, lock);
    return !lock.owns_lock();  // fence_and_share_locked unlocks once it moved the blocks
  }

  /// Lists blocks that the record `cover` covers in the shared list, tagged with it.
  void share_covered(block_list const& blocks, fence_need<Platform> const& cover) noexcept
  {
    try {
      shared_.list_tagged(blocks, tag_type::of(cover.cell, cover.number));
    } catch (...) {  // no host memory for the tag: only a device synchronization frees them
      orphans_.add(blocks);
    }
  }

  /// `share_covered` as a function object, for the slot table.
  auto share_covered_fn() noexcept
  {
    return [this](block_list const& blocks, fence_need<Platform> const& cover) noexcept {
      share_covered(blocks, cover);
    };
  }

 private:
  Platform& platform_;
  shared_list<Platform>& shared_;
  orphans& orphans_;
};

}  // namespace rmm_fences::mr::detail::pool
