/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the slots of the stream identities in use, and their retirement.
 *
 * Slots of streams that went away are retired: when the slots reach the sweep bound
 * (`slot_sweep_minimum`, then the slots kept plus the larger of `slot_sweep_minimum` and half
 * of them), every slot unused since the previous sweep is given up (the default stream's
 * excepted). A slot's fence lives on with the blocks it tags: a new stream, even on a reused
 * handle or identity, gets another fence and waits on the old one. Callers never hold a slot
 * across a retirement: a thread's cached slot carries an incarnation, checked under the slot's
 * mutex (retirement changes it), and a call that must release that mutex first pins the slot
 * (no retirement while pinned).
 */
#pragma once

#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/pool/chunk_registry.hpp>
#include <rmm_fences/detail/pool/counters.hpp>
#include <rmm_fences/detail/pool/fence.hpp>
#include <rmm_fences/detail/pool/graph_holds.hpp>
#include <rmm_fences/detail/pool/live_blocks.hpp>
#include <rmm_fences/detail/pool/stream_slot.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/// Slots held before the first sweep retires idle ones (and the least bound of later ones).
inline constexpr std::size_t slot_sweep_minimum = 64;

/// A cache detached for a device synchronization, with the slot it goes back to if the
/// synchronization fails (while that slot still has `incarnation`).
template <typename Platform>
struct detached_cache {
  stream_slot<Platform>* slot{};
  std::uint64_t incarnation{};
  block_list blocks;
};

/**
 * @brief The slot map (identity -> slot), the slots being retired and the spare slot objects.
 *
 * `GiveUp` is called as `give_up(leftovers&)` (noexcept) with what each given-up slot leaves,
 * under the table's mutex held exclusively: a free that no longer finds a block in the slot
 * finds it where `give_up` put it. The table's mutex comes before any slot's mutex.
 */
template <typename Platform, typename GiveUp>
class slot_table {
 public:
  using slot_type = stream_slot<Platform>;
  using ref_type  = slot_ref<Platform>;

  /// `default_id`: the default stream's identity (never swept); `chunks` and `counters`: the
  /// pool's, given to every slot.
  slot_table(std::uint64_t default_id,
             GiveUp give_up,
             chunk_registry const& chunks,
             pool_counters& counters) noexcept
    : default_id_{default_id}, give_up_{give_up}, chunks_{chunks}, counters_{counters}
  {
  }
  slot_table(slot_table const&)            = delete;
  slot_table& operator=(slot_table const&) = delete;

  /// The slot mapped to `id`, or a null reference.
  [[nodiscard]] ref_type find(std::uint64_t id) const
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return find_locked(id);
  }

  /// A new slot's reference, and whether idle slots were swept to make it.
  struct created {
    ref_type ref;
    bool swept{};
  };

  /**
   * @brief The slot of `id`, made when there is none: a spare object when one is left, else
   * a new one, after a sweep when the slots reached the sweep bound. Its stream's frees belong
   * to `hold`'s graph when given. A fence that still tags blocks stays with them: the slot then
   * gets a new one from `fences` (a new stream waits on the old fence, even with the same
   * identity).
   */
  created create(std::uint64_t id,
                 std::shared_ptr<graph_hold> hold,
                 fence_registry<Platform>& fences)
  {
    cell_ptr<Platform> dropped;  // an old fence, let go after the locks
    std::unique_lock<std::shared_mutex> lock(mutex_);
    if (auto const ref = find_locked(id); ref.slot != nullptr) { return {ref, false}; }
    bool const swept = slots_.size() + retiring_.size() >= sweep_bound_;
    if (swept) { sweep_locked(); }
    slot_type& slot = spare_slot_locked();
    cell_ptr<Platform> fresh;
    if (!slot.cell || slot.cell.use_count() > 1) {
      fresh = std::make_shared<fence_cell<Platform>>(fences, next_serial_++);
    }
    slots_.emplace(id, &slot);
    spare_.pop_back();
    std::lock_guard<spin_mutex> slot_lock(slot.mutex);
    slot.graph         = std::move(hold);
    slot.id            = id;
    slot.incarnation   = ++incarnations_;
    slot.retiring      = false;
    slot.uses          = 1;  // not idle at the next sweep
    slot.uses_at_sweep = 0;
    slot.frees         = 0;
    if (fresh) { dropped = std::exchange(slot.cell, std::move(fresh)); }
    return {{&slot, slot.incarnation}, swept};
  }

  /// Takes the slot of `id` out of the map for `retire_stream`, pinned and marked retiring
  /// (callers that cached it go to a new slot); nullptr when there is none.
  slot_type* start_retiring(std::uint64_t id)
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = slots_.find(id);
    if (it == slots_.end()) { return nullptr; }
    slot_type* slot = it->second;
    retiring_.push_back(slot);
    slots_.erase(it);
    std::lock_guard<spin_mutex> slot_lock(slot->mutex);
    slot->retiring = true;
    ++slot->pins;  // no sweep takes it before it is fenced
    return slot;
  }

  /// Gives up a slot `start_retiring` took, unless another call still holds it (a later
  /// sweep does it then).
  void finish_retiring(slot_type& slot)
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = std::find(retiring_.begin(), retiring_.end(), &slot);
    if (it != retiring_.end() && give_up_locked(slot, /*only_if_idle=*/false)) {
      retiring_.erase(it);
    }
  }

  /// Gives up the slots of captures whose graphs are gone; false when a pinned one is left
  /// for a later call.
  bool give_up_gone_graphs()
  {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    bool all = true;
    for (auto it = slots_.begin(); it != slots_.end();) {
      auto* slot = it->second;
      if (slot->graph && slot->graph->gone()) {
        if (give_up_locked(*slot, /*only_if_idle=*/false)) {
          it = slots_.erase(it);
          continue;
        }
        all = false;
      }
      ++it;
    }
    return all;
  }

  /// Calls `f(slot)` for every slot held by a stream or being retired (under the table's
  /// mutex, shared: `f` takes the slot's mutex itself).
  template <typename F>
  void for_each(F&& f) const
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    for_each_locked(f);
  }

  /// True when a slot that is not a captured stream's caches free blocks.
  [[nodiscard]] bool holds_uncaptured_caches() const
  {
    bool any = false;
    for_each([&](slot_type& slot) {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      if (!slot.graph && slot.holds_free_blocks_locked()) { any = true; }
    });
    return any;
  }

  /**
   * @brief Asks every other slot held by a stream to fence its cache at its next call, and, when
   * it holds free blocks, to fence its big frees from now on (`self` ran short). A cache that a
   * record covers is shared now (`share_covered_locked`): its stream may be gone. True when
   * any was.
   */
  template <typename Share>
  bool request_fences(slot_type const& self, Share&& share) const
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    bool moved = false;
    for (auto& [id, slot] : slots_) {
      if (slot == &self) { continue; }
      slot->fence_requested.store(true, std::memory_order_relaxed);
      moved = share_covered_locked(*slot, share) || moved;
      std::lock_guard<spin_mutex> slot_lock(slot->mutex);
      if (slot->holds_free_blocks_locked()) {
        slot->demanded.store(true, std::memory_order_relaxed);
        slot->own_takes.store(0, std::memory_order_relaxed);
      }
    }
    return moved;
  }

  /// Shares every cache that a record covers (`share_covered_locked`), for `release`.
  template <typename Share>
  void share_covered_caches(Share&& share) const
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    for_each_locked([&](slot_type& slot) { share_covered_locked(slot, share); });
  }

  /**
   * @brief Finds the live block `key` in a slot other than `self` (one slot's mutex at a
   * time) and, when `bytes` matches, forgets it there; else returns `elsewhere()`, called
   * still under the table's mutex (where given-up slots' live blocks went).
   */
  template <typename Elsewhere>
  free_result forget_live(slot_type const* self,
                          std::uintptr_t key,
                          std::size_t bytes,
                          Elsewhere&& elsewhere) const
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    std::optional<free_result> found;
    for_each_locked([&](slot_type& slot) {
      if (found || &slot == self) { return; }
      std::lock_guard<spin_mutex> slot_lock(slot.mutex);
      found = slot.live.forget(key, bytes);
    });
    return found ? *found : elsewhere();
  }

  /// Detaches every cache but captured streams' (a graph's: no synchronization orders its
  /// later launches), for a device synchronization.
  std::vector<detached_cache<Platform>> detach_caches() const
  {
    std::vector<detached_cache<Platform>> caches;
    std::shared_lock<std::shared_mutex> lock(mutex_);
    caches.reserve(slots_.size() + retiring_.size());
    for_each_locked([&](slot_type& slot) {
      detached_cache<Platform> d{&slot, 0, {}};
      std::lock_guard<spin_mutex> slot_lock(slot.mutex);
      if (slot.graph) { return; }
      d.incarnation = slot.incarnation;
      slot.take_cached_locked(d.blocks);
      if (!d.blocks.empty()) { caches.push_back(std::move(d)); }
    });
    return caches;
  }

  /// Gives detached caches back to their slots; returns the blocks of slots retired since
  /// (takes each slot's mutex, not the table's: the incarnation tells).
  static block_list give_back(std::vector<detached_cache<Platform>> const& caches)
  {
    block_list homeless;
    for (auto const& d : caches) {
      std::lock_guard<spin_mutex> lock(d.slot->mutex);
      if (d.slot->incarnation != d.incarnation) {
        homeless.insert(homeless.end(), d.blocks.begin(), d.blocks.end());
        continue;
      }
      d.slot->list_cached_locked(d.blocks);
    }
    return homeless;
  }

  /// Calls `f(slot)` for every slot object, held or spare (single-threaded: at shutdown).
  template <typename F>
  void for_each_object(F&& f)
  {
    for (auto& slot : all_slots_) {
      f(*slot);
    }
  }

  /// Forgets every slot (single-threaded: at shutdown).
  void clear() noexcept
  {
    slots_.clear();
    retiring_.clear();
    spare_.clear();
    all_slots_.clear();
  }

 private:
  [[nodiscard]] ref_type find_locked(std::uint64_t id) const noexcept
  {
    auto it = slots_.find(id);
    return it == slots_.end() ? ref_type{} : ref_type{it->second, it->second->incarnation};
  }

  template <typename F>
  void for_each_locked(F&& f) const
  {
    for (auto& [id, slot] : slots_) {
      f(*slot);
    }
    for (auto* slot : retiring_) {
      f(*slot);
    }
  }

  /// Takes `slot`'s cache out when a record covers it and hands it to `share(blocks, cover)`
  /// (`cover`: that record), called with the table's mutex held and the slot's released. True
  /// when it did.
  template <typename Share>
  static bool share_covered_locked(slot_type& slot, Share&& share)
  {
    block_list covered;
    fence_need<Platform> cover;
    {
      std::lock_guard<spin_mutex> slot_lock(slot.mutex);
      try {
        cover = slot.take_covered_locked(covered);
      } catch (...) {  // no host memory to list them: they stay, fenced at its next free
        return false;
      }
    }
    if (!cover.cell) { return false; }
    share(covered, cover);
    return true;
  }

  /// A spare slot object, made when none is left (it stays last in `spare_` until taken).
  slot_type& spare_slot_locked()
  {
    if (spare_.empty()) {
      all_slots_.push_back(std::make_unique<slot_type>(chunks_, counters_));
      spare_.reserve(all_slots_.size());  // retirement then never allocates here
      spare_.push_back(all_slots_.back().get());
    }
    return *spare_.back();
  }

  /// Gives up every slot unused since the previous sweep and not pinned (the default
  /// stream's excepted: its handle means the current device's, checked once), and the slots
  /// being retired that no call holds any more; then sets the next sweep bound.
  void sweep_locked() noexcept
  {
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (give_up_locked(*it->second, /*only_if_idle=*/true)) {
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
    retiring_.erase(std::remove_if(retiring_.begin(),
                                   retiring_.end(),
                                   [&](slot_type* slot) {
                                     return give_up_locked(*slot, /*only_if_idle=*/false);
                                   }),
                    retiring_.end());
    // The next sweep after max(64, half the kept) new slots: amortized O(1) per new slot, and
    // the kept slots converge (those created since the last sweep, plus the busy ones).
    auto const kept = slots_.size() + retiring_.size();
    sweep_bound_    = kept + std::max(slot_sweep_minimum, kept / 2);
  }

  /**
   * @brief Gives up `slot` unless a call holds it (or, `only_if_idle`, it was used since the
   * last sweep, or is the default stream's): hands what it holds to `give_up_` and makes the
   * object spare. The caller removes it from `slots_` or `retiring_` when this returns true.
   */
  bool give_up_locked(slot_type& slot, bool only_if_idle) noexcept
  {
    leftovers<Platform> out;
    {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      if (slot.pins != 0) { return false; }
      if (only_if_idle && (slot.uses != slot.uses_at_sweep || slot.id == default_id_)) {
        slot.uses_at_sweep = slot.uses;
        return false;
      }
      if (!slot.hand_over_locked(out)) { return false; }  // no host memory: a later sweep
      slot.incarnation = ++incarnations_;  // a caller's cached reference is now stale
    }
    spare_.push_back(&slot);  // reserved: never allocates
    give_up_(out);
    return true;
  }

  std::uint64_t const default_id_;  // the default stream's identity (never swept)
  GiveUp give_up_;
  chunk_registry const& chunks_;
  pool_counters& counters_;

  // `slots_` maps the identities in use; `retiring_` holds slots that retire_stream took out
  // while a call still held them; `spare_` retired objects for new streams; `all_slots_` owns
  // every object (for the pool's life: a stale reference may still lock one).
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::uint64_t, slot_type*> slots_;
  std::vector<slot_type*> retiring_;
  std::vector<slot_type*> spare_;
  std::vector<std::unique_ptr<slot_type>> all_slots_;
  std::size_t sweep_bound_{slot_sweep_minimum};
  std::uint64_t incarnations_{};
  std::uint64_t next_serial_{1};
};

}  // namespace rmm_fences::mr::detail::pool
