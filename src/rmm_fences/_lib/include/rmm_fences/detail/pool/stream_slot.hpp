/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: one stream identity's slot. A block freed on the slot's stream
 * goes to its cache, which only that stream allocates from: stream order makes that reuse safe
 * at once, with no CUDA call. The fencing rule says when the cache is fenced and shared.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/pool/chunk_registry.hpp>
#include <rmm_fences/detail/pool/counters.hpp>
#include <rmm_fences/detail/pool/fence.hpp>
#include <rmm_fences/detail/pool/graph_holds.hpp>
#include <rmm_fences/detail/pool/live_blocks.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/// Cached blocks after which a stream's cache is fenced and shared.
inline constexpr std::size_t fence_batch = 32;
/// Frees of a new stream that are each covered by a fence record (the blocks stay in its
/// cache): a stream that goes away after a few calls (a stream per task) leaves no block that
/// only a device synchronization would free.
inline constexpr std::uint32_t young_frees = 16;
/// Cached bytes (as a fraction of the pool) after which a stream's cache is fenced, once
/// another stream ran short while this one held free blocks.
inline constexpr std::size_t fence_fraction = 16;
/// Blocks a stream takes back in a row that it fenced and nobody else took before it stops
/// fencing its cache by `fence_fraction`: in a pipeline a stream whose bytes others wanted in
/// one phase takes its own back at the start of its next phase, and is wanted again later.
inline constexpr std::uint32_t demand_decay = 16;
/// Frees per stream kept for exact-size reuse before they join the stream's free list.
inline constexpr std::size_t recent_capacity = 8;

/// What the fencing rule asks after a free: nothing, a record that covers the cache (the
/// blocks stay), or a record and the cache moved to the shared list.
enum class fencing { none, cover, share };

/// What a given-up slot leaves: its cached blocks (to its graph, to the shared list when a
/// record covers them, else to the orphans), its live blocks, and what it had not yet added to
/// the pool's totals.
template <typename Platform>
struct leftovers {
  block_list blocks;
  fence_need<Platform> cover;  // the record that covers `blocks` (no cell: none does)
  std::vector<std::pair<std::uintptr_t, std::size_t>> live;
  std::shared_ptr<graph_hold> graph;
  std::int64_t balance{};
  std::uint64_t same_stream_hits{};
};

/// The cache's answer to a request: a block, or the size of its best fit left in place
/// because it was loose (more than twice the request; 0: nothing fits).
struct cache_fit {
  char* ptr{};
  std::size_t loose{};
};

/**
 * @brief One stream identity: its cache of freed blocks, its fence and its live blocks (own
 * cache lines: threads on different streams touch different slots). Slot objects live as long
 * as the pool: a retired one is reset and given to the next new stream.
 *
 * The `_locked` members expect `mutex` held.
 */
template <typename Platform>
struct alignas(64) stream_slot {
  /// `chunks`: where the pool's chunks start (the cache never merges across); `counters`:
  /// where the slot's balance is settled.
  stream_slot(chunk_registry const& chunks, pool_counters& counters) noexcept
    : chunks_{chunks}, counters_{counters}
  {
  }
  stream_slot(stream_slot const&)            = delete;
  stream_slot& operator=(stream_slot const&) = delete;

  // Set when the slot is given to a stream; written under the slot table's mutex (exclusive)
  // and `mutex`, read under either, or while the slot is pinned.
  std::uint64_t id{};
  std::uint64_t incarnation{};        // changes when the slot is retired
  cell_ptr<Platform> cell;            // its fence
  std::shared_ptr<graph_hold> graph;  // a captured stream's: the graph its frees belong to

  spin_mutex mutex;               // guards the fields below
  bool retiring{};                // left the stream map (retire_stream): callers go to a new slot
  std::uint32_t pins{};           // calls using the slot with `mutex` released
  std::uint64_t uses{};           // calls that used the slot
  std::uint64_t uses_at_sweep{};  // `uses` at the last sweep (equal: idle since)
  std::uint32_t frees{};          // frees since the slot was given to its stream (to young_frees)
  free_list<no_tag> cache;        // freed on this stream since its last fence
  // The record of `cell` made after the last free cached (0: a cached block was freed after
  // the last record). While set, any thread may share the cache tagged with that record: a
  // covered cache of a stream that is gone is not lost.
  std::uint64_t covered{};
  std::int64_t balance{};  // bytes allocated minus freed, not yet settled
  std::uint64_t same_stream_hits{};
  // The last few frees, kept as they are (no coalescing yet) for exact-size reuse without
  // touching the free list; part of the cache in every other respect (`flush_recent_locked`).
  std::array<untagged_block, recent_capacity> recent{};
  std::size_t recent_count{};
  std::size_t recent_bytes{};
  waited_fences waited;  // the fence records this stream waited on
  live_blocks live;      // blocks handed out on this slot
  std::atomic<bool> fence_requested{};
  // Another stream missed while this one held free blocks: its cached bytes are fenced by
  // the byte rule until it takes back, `demand_decay` times in a row, blocks it fenced that
  // nobody else took (`own_takes` counts them; a new miss elsewhere starts it again).
  std::atomic<bool> demanded{};
  std::atomic<std::uint32_t> own_takes{};

  /// Releases a pin (the slot may be retired once no call holds it).
  void unpin() noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex);
    --pins;
  }

  /// The needs of `tag` this stream is not yet ordered after (takes `mutex`).
  [[nodiscard]] fence_needs<Platform> needed_waits(fence_tag<Platform> const& tag)
  {
    std::lock_guard<spin_mutex> lock(mutex);
    return pool::needed_waits(tag, cell, waited);
  }

  /// A copy of the fence records this stream waited on (takes `mutex`).
  [[nodiscard]] waited_fences waited_copy()
  {
    std::lock_guard<spin_mutex> lock(mutex);
    return waited;
  }

  /// Enqueues on `stream` (this slot's) a wait on each fence's latest record (at least the
  /// needed one) and notes it; false when one cannot be enqueued (takes `mutex` per fence).
  bool enqueue_waits(typename Platform::stream_type stream, fence_needs<Platform> const& needs)
  {
    for (auto const& need : needs) {
      auto const recorded = need.cell->wait(stream);
      if (!recorded) { return false; }
      std::lock_guard<spin_mutex> lock(mutex);
      waited.note(need.cell->serial(), *recorded);
    }
    return true;
  }

  /// A free of the live block `key` with `bytes`: checked in this slot's live blocks, else
  /// by `elsewhere()`, called with `mutex` released (`lock` holds it) and the slot pinned.
  template <typename Elsewhere>
  [[gnu::always_inline]] free_result forget_live_locked(std::uintptr_t key,
                                                        std::size_t bytes,
                                                        std::unique_lock<spin_mutex>& lock,
                                                        Elsewhere&& elsewhere)
  {
    if (auto const r = live.forget(key, bytes)) { return *r; }
    ++pins;  // the slot stays this stream's while its mutex is released
    lock.unlock();
    auto const r = elsewhere();
    lock.lock();
    --pins;
    return r;
  }

  /// The same-stream fit: an exact-size last free, else the free list's best fit when it is
  /// tight (at most twice `size`).
  [[gnu::always_inline]] cache_fit take_tight_fit_locked(std::size_t size, std::size_t align)
  {
    if (char* ptr = take_recent_locked(size, align); ptr != nullptr) { return {ptr, 0}; }
    std::size_t fit = 0;
    char* ptr       = cache.take_best_fit_within(size, align, 2 * size, fit).ptr;
    if (ptr == nullptr && recent_count > 0) {  // none fits, or only loosely
      flush_recent_locked();
      ptr = cache.take_best_fit_within(size, align, 2 * size, fit).ptr;
    }
    return {ptr, ptr == nullptr ? fit : 0};
  }

  /// The cache's best fit, whatever its size, or nullptr.
  char* take_best_fit_locked(std::size_t size, std::size_t align)
  {
    flush_recent_locked();
    return cache.take_best_fit(size, align).ptr;
  }

  /// Hands out `ptr`, taken from the cache for `bytes` (spanning `size`): listed live and
  /// counted. Without host memory to list it, it goes back to the cache and bad_alloc
  /// propagates.
  [[gnu::always_inline]] char* hand_out_locked(char* ptr, std::size_t bytes, std::size_t size)
  {
    try {
      live.track(ptr, bytes);
    } catch (...) {
      try {
        cache.insert(ptr, size, no_tag{}, chunks_.start_test());
      } catch (...) {  // unlisted: lost to the pool, never handed out twice
      }
      throw;
    }
    ++same_stream_hits;
    add_balance_locked(static_cast<std::int64_t>(size));
    return ptr;
  }

  /// Caches a block freed on this stream (spanning `size`); false when no host memory lists
  /// it (it then stays allocated: never reused early).
  [[gnu::always_inline]] bool cache_free_locked(char* ptr, std::size_t size) noexcept
  {
    add_balance_locked(-static_cast<std::int64_t>(size));
    covered = 0;
    if (recent_count < recent_capacity) {
      recent[recent_count++] = {ptr, size};
      recent_bytes += size;
      return true;
    }
    try {
      cache.insert(ptr, size, no_tag{}, chunks_.start_test());
    } catch (...) {
      return false;
    }
    return true;
  }

  /// Lists blocks in the cache (may throw bad_alloc).
  template <typename Blocks>
  void list_cached_locked(Blocks const& blocks)
  {
    covered = 0;  // no record is known to follow their last use on this stream
    for (auto const& b : blocks) {
      cache.insert(b.ptr, b.size, no_tag{}, chunks_.start_test());
    }
  }

  /// Moves the last frees into the free list, coalescing them. A block that cannot be listed
  /// (no host memory) stays in `recent`.
  void flush_recent_locked() noexcept
  {
    while (recent_count > 0) {
      auto const b = recent[recent_count - 1];
      try {
        cache.insert(b.ptr, b.size, no_tag{}, chunks_.start_test());
      } catch (...) {
        return;
      }
      --recent_count;
      recent_bytes -= b.size;
    }
  }

  /**
   * @brief The fencing rule, after a free was cached: any stream fences and shares its cache
   * when asked, and when its cache holds `fence_batch` blocks; while other streams want its
   * bytes (`demanded`, or another stream took a block its fence guarded), when it caches
   * 1/`fence_fraction` of the pool. A young stream's other frees are covered (a record, the
   * blocks stay in its cache).
   */
  [[nodiscard, gnu::always_inline]] fencing fencing_locked() noexcept
  {
    bool const young = frees < young_frees;
    if (young) { ++frees; }
    if (fence_requested.load(std::memory_order_relaxed)) { return fencing::share; }
    // Counted in cached blocks, not frees: a stream that reuses its blocks never fences.
    if (cache.block_count() + recent_count >= fence_batch) { return fencing::share; }
    // A stream that reuses its own big block, and that no other stream waits for, never
    // fences it. (The byte test first: the fence's flag lies on another object's cache line.)
    if (cached_bytes_locked() >= std::max<std::size_t>(chunks_.bytes() / fence_fraction, 1) &&
        (demanded.load(std::memory_order_relaxed) ||
         cell->wanted.load(std::memory_order_relaxed))) {
      return fencing::share;
    }
    return young ? fencing::cover : fencing::none;
  }

  /// Takes the cache out when a record covers it (appended to `out`): that record, else a
  /// need without a cell (nothing moved; may throw bad_alloc before anything moved).
  fence_need<Platform> take_covered_locked(block_list& out)
  {
    if (covered == 0 || !holds_free_blocks_locked()) { return {}; }
    fence_need<Platform> cover{cell, covered};
    take_cached_locked(out);
    return cover;
  }

  /// Adds the balance to the pool's totals.
  void settle_locked() noexcept { counters_.add_current(std::exchange(balance, 0)); }

  [[nodiscard]] bool holds_free_blocks_locked() const noexcept
  { return recent_count > 0 || !cache.empty(); }

  [[nodiscard]] std::size_t cached_bytes_locked() const noexcept
  { return cache.free_bytes() + recent_bytes; }

  /// Calls `f(ptr, size)` for every cached block (the last frees, then the free list).
  template <typename F>
  void for_each_cached_locked(F&& f)
  {
    for (std::size_t i = 0; i < recent_count; ++i) {
      f(recent[i].ptr, recent[i].size);
    }
    cache.for_each([&](char* p, std::size_t n, no_tag&) { f(p, n); });
  }

  /// Takes every cached block out (appended to `out`, reserved first: may throw bad_alloc
  /// before anything moved).
  void take_cached_locked(block_list& out)
  {
    out.reserve(out.size() + recent_count + cache.block_count());
    for_each_cached_locked([&](char* p, std::size_t n) { out.push_back({p, n}); });
    recent_count = 0;
    recent_bytes = 0;
    cache        = free_list<no_tag>{};
    covered      = 0;
  }

  /// Moves all the slot holds for its stream into `out` and resets it for the next stream;
  /// false, changing nothing, when no host memory holds the lists.
  bool hand_over_locked(leftovers<Platform>& out) noexcept
  {
    try {
      out.live.reserve(live.size());
      if (covered != 0 && !graph) { out.cover = {cell, covered}; }
      take_cached_locked(out.blocks);
    } catch (...) {
      return false;
    }
    live.for_each([&](std::uintptr_t p, std::size_t n) { out.live.emplace_back(p, n); });
    live.clear();
    out.graph            = std::move(graph);
    out.balance          = std::exchange(balance, 0);
    out.same_stream_hits = std::exchange(same_stream_hits, 0);
    waited.clear();
    fence_requested.store(false, std::memory_order_relaxed);
    demanded.store(false, std::memory_order_relaxed);
    own_takes.store(0, std::memory_order_relaxed);
    retiring = false;
    return true;
  }

 private:
  /// An exact-size block of the last frees at `align`, or nullptr.
  [[gnu::always_inline]] char* take_recent_locked(std::size_t size, std::size_t align) noexcept
  {
    for (std::size_t i = recent_count; i-- > 0;) {
      auto const b = recent[i];
      if (b.size == size && reinterpret_cast<std::uintptr_t>(b.ptr) % align == 0) {
        recent[i] = recent[--recent_count];
        recent_bytes -= b.size;
        return b.ptr;
      }
    }
    return nullptr;
  }

  /// Adds `delta` to the balance, settled once it drifts `accounting_batch` either way.
  [[gnu::always_inline]] void add_balance_locked(std::int64_t delta) noexcept
  {
    balance += delta;
    if (balance >= accounting_batch || balance <= -accounting_batch) { settle_locked(); }
  }

  chunk_registry const& chunks_;
  pool_counters& counters_;
};

/// A slot as a caller found it: valid while `slot->incarnation` still equals `incarnation`.
template <typename Platform>
struct slot_ref {
  stream_slot<Platform>* slot{};
  std::uint64_t incarnation{};

  /// True when the slot was retired since (caller holds the slot's mutex).
  [[nodiscard]] bool stale_locked() const noexcept
  { return slot->incarnation != incarnation || slot->retiring; }
};

/// Releases a pin when it goes out of scope.
template <typename Platform>
struct pin_guard {
  explicit pin_guard(stream_slot<Platform>& pinned) noexcept : slot{pinned} {}
  pin_guard(pin_guard const&)            = delete;
  pin_guard& operator=(pin_guard const&) = delete;
  ~pin_guard() { slot.unpin(); }
  stream_slot<Platform>& slot;
};

}  // namespace rmm_fences::mr::detail::pool
