/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of StreamOrderedPoolMemoryResource (docs/design.md#layers, policy cores): no CUDA
 * calls. The CUDA build plugs in `cuda_pool_platform`; the CPU tests plug in manual fences and host
 * memory. It composes the parts in detail/pool/ (docs/design.md#the-stream-ordered-pools-parts).
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/pool/census.hpp>
#include <rmm_fences/detail/pool/chunk_registry.hpp>
#include <rmm_fences/detail/pool/counters.hpp>
#include <rmm_fences/detail/pool/fence.hpp>
#include <rmm_fences/detail/pool/fencing.hpp>
#include <rmm_fences/detail/pool/graph_holds.hpp>
#include <rmm_fences/detail/pool/growth.hpp>
#include <rmm_fences/detail/pool/live_blocks.hpp>
#include <rmm_fences/detail/pool/orphans.hpp>
#include <rmm_fences/detail/pool/request.hpp>
#include <rmm_fences/detail/pool/shared_list.hpp>
#include <rmm_fences/detail/pool/slot_table.hpp>
#include <rmm_fences/detail/pool/stream_slot.hpp>
#include <rmm_fences/detail/pool/thread_slot_cache.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/**
 * @brief The rules of the stream-ordered pool, over a platform and an upstream.
 *
 * `Platform` provides:
 *
 *   using stream_type; using fence_type; using out_of_memory;   // the upstream's exception
 *   [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t pool_bytes);
 *   std::uint64_t stream_id(stream_type) noexcept;             // identity, never reused
 *   static stream_type default_stream() noexcept;
 *   fence_type acquire_fence(); void release_fence(fence_type) noexcept;
 *   bool record(fence_type, stream_type) noexcept;             // after work queued on stream
 *   bool ready(fence_type) noexcept;    // true only when the last record is known complete
 *   bool device_wait(stream_type waiter, fence_type) noexcept; // device-side wait, no host sync
 *   bool is_capturing(stream_type) noexcept;
 *   bool sync_stream(stream_type) noexcept;    // only the pool's own stream, in capture growth
 *   // Runs fn(ctx) exactly once: once the graph `stream` captures into and every executable
 *   // graph of it are destroyed (true), or at once (false: not captured, or no user object).
 *   bool retain_until_graph_destroyed(stream_type, void (*fn)(void*), void* ctx) noexcept;
 *   bool stream_on_device(stream_type) noexcept;  // false: a stream of another device
 *   stream_type private_stream();  // pool-owned, non-blocking: growth in capture, returns
 *   void destroy_private_stream() noexcept;
 *   void report_rejected_free(char const* line) noexcept;  // one line for the user
 *   auto relax() noexcept;     // scope for calls not allowed in capture (growth)
 *
 * `Upstream`: `void* allocate(stream, bytes, alignment)`, `deallocate(...) noexcept`.
 *
 * Design (docs/stream_ordered_pool.md for users; each part in detail/pool/ states its rules):
 * a block freed on stream S goes to the cache of S's slot (stream_slot.hpp), which only S
 * allocates from; when the fencing rule says so, S records its fence (fence.hpp) and the cache
 * moves to the shared list (shared_list.hpp), where another stream takes a block only once
 * ordered after its fences. The pool records only on a stream it was called with and never
 * synchronizes the device on its own: slots retired for idleness (slot_table.hpp) leave
 * orphans (orphans.hpp) that only `reclaim_after` frees, and a captured stream's frees stay its
 * graph's (graph_holds.hpp). Growth (growth.hpp) is ordered for the requesting stream.
 *
 * Lock rule. What each mutex guards:
 *  - a slot's `mutex` (spin): its cache, last frees, live blocks, waits and counters;
 *  - the slot table's: which slot each identity has, the retiring and the spare slots;
 *  - the graph holds', the orphans' and the shared list's: their lists;
 *  - a fence's: its event and record number; the chunk registry's: the chunks;
 *  - the growth's: one growth at a time (over a page arena, every map and unmap);
 *    `reclaim_mutex_`: one reclaim at a time, held through `synchronize()`.
 * A thread takes them in this order, skipping any: `reclaim_mutex_` or the growth's (never
 * both) -> the slot table's -> one slot's -> the graph holds', the orphans' or the shared
 * list's (one of them) -> one fence's -> the chunk registry's. No thread holds a slot's mutex
 * and the shared list's (nor the orphans' nor the graph holds') at once. A function that
 * expects a lock held is named `..._locked`; a call that uses a slot with its mutex released
 * pins it first (no retirement while pinned).
 */
template <typename Platform, typename Upstream>
class stream_ordered_pool_core {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;

  static constexpr std::size_t max_alignment = pool::max_alignment;
  static constexpr std::size_t max_request   = pool::max_request;
  /// `pool::census`'s owner of orphans (blocks only a device synchronization frees).
  static constexpr std::uint64_t orphan_owner = std::numeric_limits<std::uint64_t>::max();
  /// `pool::census`'s owner of blocks held for graphs of retired captured slots.
  static constexpr std::uint64_t graph_owner = orphan_owner - 1;
  /// `pool::census`'s owner of shared blocks that no single slot's fence guards.
  static constexpr std::uint64_t shared_owner = orphan_owner - 2;

  template <typename... PlatformArgs>
  stream_ordered_pool_core(Upstream upstream,
                           std::size_t initial_pool_size,
                           std::optional<std::size_t> maximum_pool_size,
                           std::optional<std::size_t> maximum_growth_size,
                           PlatformArgs&&... platform_args)
    : platform_(std::forward<PlatformArgs>(platform_args)...),
      slots_{
        platform_.stream_id(Platform::default_stream()), give_up_sink{this}, chunks_, counters_},
      growth_{std::move(upstream),
              {maximum_pool_size, maximum_growth_size},
              platform_,
              chunks_,
              shared_,
              counters_}
  {
    if (initial_pool_size > 0) { growth_.grow_initial(initial_pool_size); }
  }

  stream_ordered_pool_core(stream_ordered_pool_core const&)            = delete;
  stream_ordered_pool_core& operator=(stream_ordered_pool_core const&) = delete;

  /**
   * @brief Tears the pool down (single-threaded: only from the owner's destructor).
   *
   * With `device_alive`, returns the chunks to the upstream on the pool's own stream after a
   * stream wait on every fence that guards a free block, and destroys the fences; a chunk
   * holding a block of a graph that may still replay is left to it (never returned). The
   * owner orders the other free blocks (stream caches, orphans) first when
   * `holds_unfenced_blocks()`. Without `device_alive` (process exit), forgets everything
   * without a call to the device or the upstream.
   */
  void shutdown(bool device_alive) noexcept
  {
    fences_.give_events_back(device_alive);
    if (device_alive) {
      keep_chunks_of_live_graphs();
      growth_.wait_on_shared_fences();
    }
    shared_.clear();  // drops the shared list's references to fences
    orphans_.clear();
    slots_.clear();  // and the slots' fences and graph holds
    graphs_.clear();
    if (device_alive) { growth_.return_all(); }
    chunks_.clear();
  }

  /**
   * @brief The same-stream path alone: a block freed earlier on `stream`, or nullptr.
   *
   * Makes no CUDA call but the stream identity query (for a stream seen first: its device, and
   * fence queries of a sweep of idle slots), never blocks, never grows the pool. A loose fit
   * (more than twice the request) is left to `allocate`, which looks for a tighter shared
   * block first.
   */
  [[nodiscard]] void* try_allocate_cached(stream_type stream,
                                          std::size_t bytes,
                                          std::size_t alignment)
  {
    if (!pool::valid_request(bytes, alignment)) { return nullptr; }  // `allocate` says why
    request const req{stream, bytes, alignment};
    for (bool const refresh : {false, true}) {
      auto const ref = lookup(stream, refresh);
      if (ref.slot == nullptr) { return nullptr; }
      auto const took = from_cache(ref, req, /*pin_on_miss=*/false);
      if (!took.stale) { return took.ptr; }
    }
    return nullptr;
  }

  /**
   * @brief Allocates `bytes` at `alignment` (at least the pool granularity) for use on `stream`.
   *
   * @throws std::invalid_argument for an alignment that is not a power of two or exceeds
   * `max_alignment`, or a stream of another device
   * @throws Platform::out_of_memory when neither the pool nor the upstream has room (at once
   * for requests above `max_request`)
   */
  [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment)
  {
    if (!pool::valid_request(bytes, alignment)) {
      pool::reject_request<Platform>(bytes, alignment, pool_size());
    }
    request req{stream, bytes, alignment};
    for (bool refresh = false;; refresh = true) {
      auto const ref = lookup(stream, refresh);
      if (ref.slot == nullptr) {
        throw std::invalid_argument(
          "StreamOrderedPoolMemoryResource: stream belongs to another device than the pool's");
      }
      auto const took = from_cache(ref, req, /*pin_on_miss=*/true);
      if (took.ptr != nullptr) { return took.ptr; }
      if (!took.stale) {
        req.slot = ref.slot;
        pool::pin_guard<Platform> const pinned{*req.slot};  // from_cache pinned it on the miss
        return allocate_pinned(req, took.loose_fit);
      }
    }
  }

  /**
   * @brief Frees a block on `stream`: it is reusable on `stream` at once, elsewhere after a
   * fence. A free that is not of a live block of this pool with the size it was allocated
   * with changes nothing: it is counted in `rejected_frees` and reported on one line.
   */
  void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t) noexcept
  {
    auto const r = deallocate_checked(stream, ptr, bytes);
    if (r.check != free_check::ok) [[unlikely]] {
      pool::report_rejected_free(platform_, r, ptr, bytes);
    }
  }

  /// `deallocate` that tells what it found instead of reporting it (counted all the same).
  free_result deallocate_checked(stream_type stream, void* ptr, std::size_t bytes) noexcept
  {
    if (ptr == nullptr) { return {}; }  // a null free is a no-op, as for rmm's resources
    for (bool refresh = false;; refresh = true) {
      slot_ref ref;
      try {
        ref = lookup(stream, refresh);
      } catch (...) {  // no host memory for a new slot
        return free_without_slot(ptr, bytes);
      }
      if (ref.slot == nullptr) { return rejected({free_check::foreign_stream, 0}); }
      std::unique_lock<spin_mutex> lock(ref.slot->mutex);
      if (ref.stale_locked()) { continue; }
      ++ref.slot->uses;
      auto const key = pool::live_blocks::key_of(ptr);
      auto const r   = ref.slot->forget_live_locked(
        key, bytes, lock, [&] { return take_live_elsewhere(ref.slot, key, bytes); });
      if (r.check != free_check::ok) { return rejected(r); }
      // Without host memory to cache it, the block stays allocated (never reused early).
      if (ref.slot->cache_free_locked(static_cast<char*>(ptr), round_to_granule(bytes))) {
        switch (ref.slot->fencing_locked()) {
          case pool::fencing::none: break;
          case pool::fencing::cover: fencing_.cover_locked(*ref.slot, stream); break;
          case pool::fencing::share:
            fencing_.fence_and_share_locked(*ref.slot, stream, lock);
            break;
        }
      }
      return {};
    }
  }

  /**
   * @brief Fences `stream` and hands its cached blocks to every stream; forgets the stream.
   *
   * Call before destroying a stream that freed blocks into the pool. Blocks freed on it later
   * are cached again under a new slot.
   */
  void retire_stream(stream_type stream)
  {
    auto* slot = slots_.start_retiring(platform_.stream_id(stream));  // pinned
    if (slot == nullptr) { return; }
    {
      std::unique_lock<spin_mutex> lock(slot->mutex);
      slot->settle_locked();  // a retired slot's balance would otherwise skew the totals
      fencing_.fence_and_share_locked(*slot, stream, lock);
    }
    slot->unpin();
    pool::pool_counters::bump(counters_.retired_streams);
    slots_.finish_retiring(*slot);
  }

  /**
   * @brief Returns upstream every chunk that the shared list holds whole, on the pool's own
   * stream after a stream wait on each fence that guards it: no host or device sync. Caches
   * that a fence record covers are shared first; blocks still cached by a stream without one,
   * held for a graph or orphaned stay.
   * @return bytes returned to the upstream
   */
  std::size_t release()
  {
    collect_released_graphs();
    slots_.share_covered_caches(fencing_.share_covered_fn());
    return growth_.release_whole_chunks();
  }

  /**
   * @brief The named reclaim: detaches every cache (but captured streams', which belong to
   * graphs), every orphan and every fenced shared block, calls `synchronize()` (which must
   * order all work of the device before it returns, e.g. a device synchronization), then lists
   * only the detached blocks, untagged. A block freed (and fenced) by another thread after the
   * detach keeps its cache or fence. When `synchronize()` returns false, everything goes back
   * as it was. The pool calls this on no path of its own.
   * @return whether `synchronize()` succeeded
   */
  template <typename Synchronize>
  bool reclaim_after(Synchronize&& synchronize)
  {
    // One reclaim at a time: a second one would find everything detached by the first and
    // raise out-of-memory while the first still holds the blocks. It waits, then syncs again.
    std::lock_guard<std::mutex> reclaim_lock(reclaim_mutex_);
    auto caches       = slots_.detach_caches();
    auto orphaned     = orphans_.take_all();
    auto fenced       = shared_.take_fenced();
    bool const synced = synchronize();  // failing, it changes nothing
    shared_.relist(fenced, /*ordered=*/synced);
    if (!synced) {
      auto const homeless = slots_.give_back(caches);  // of slots retired meanwhile
      orphans_.add(orphaned);
      orphans_.add(homeless);
      return false;
    }
    pool::pool_counters::bump(counters_.reclaim_syncs);
    for (auto const& d : caches) {
      shared_.insert_all(d.blocks, tag_type{});
    }
    shared_.insert_all(orphaned, tag_type{});
    return true;
  }

  /// True when the pool holds free blocks whose last use no fence covers: cached by a stream
  /// (not a captured one) or orphaned. Only a device-wide order makes their chunks safe to
  /// return upstream. Caches that a record covers are shared first (their record orders them).
  [[nodiscard]] bool holds_unfenced_blocks()
  {
    slots_.share_covered_caches(fencing_.share_covered_fn());
    return slots_.holds_uncaptured_caches() || orphans_.bytes() > 0;
  }

  /// Bytes held from the upstream.
  [[nodiscard]] std::size_t pool_size() const noexcept { return chunks_.bytes(); }

  /// Bytes of memory held: `pool_size()`, or over a page arena its pages, mapped and spare.
  [[nodiscard]] std::size_t physical_bytes() const noexcept { return growth_.physical_bytes(); }

  [[nodiscard]] std::optional<std::size_t> maximum_pool_size() const noexcept
  { return growth_.bounds().maximum_pool_size; }

  /// The bound on a growth's chunk beyond the request (empty: chunks double the pool).
  [[nodiscard]] std::optional<std::size_t> maximum_growth_size() const noexcept
  { return growth_.bounds().maximum_growth_size; }

  /**
   * @brief A snapshot of the counters.
   *
   * `current_bytes` is exact; `peak_bytes` is sampled whenever a stream's balance is settled
   * (every `accounting_batch` bytes, on every slower path and here), so it may miss a short
   * peak by up to `accounting_batch` per stream. The blocks of graphs that are gone are
   * handed back first (as the next miss would), so `graph_bytes` counts only live graphs'.
   */
  [[nodiscard]] rmm_fences::mr::stream_ordered_pool_stats stats()
  {
    collect_released_graphs();
    rmm_fences::mr::stream_ordered_pool_stats s;
    std::uint64_t captured = 0;  // free bytes of captured streams' caches (their graphs')
    slots_.for_each([&](slot_type& slot) {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      slot.settle_locked();
      s.same_stream_reuse += slot.same_stream_hits;
      ++s.stream_slots;
      if (slot.graph) { captured += slot.cached_bytes_locked(); }
    });
    counters_.fill(s);
    s.same_stream_reuse += counters_.retired_hits.load(std::memory_order_relaxed);
    s.pool_bytes                           = pool_size();
    s.physical_bytes                       = physical_bytes();
    s.peak_physical_bytes                  = growth_.peak_physical_bytes();
    std::tie(s.remapped_bytes, s.remap_ns) = growth_.remapped();
    s.cross_stream_reuse                   = shared_.cross_stream_takes();
    s.fences                               = fences_.records();
    s.stream_waits                         = fences_.waits();
    s.fence_events                         = static_cast<std::uint64_t>(fences_.events());
    s.graph_bytes                          = captured + graphs_.bytes();
    s.orphan_bytes                         = orphans_.bytes();
    return s;
  }

  // The census of every block, for tests and tools: `pool::census` (pool/census.hpp).
  template <typename Core, typename F>
  friend void pool::census(Core& core, F&& f);

  /// Upstream chunks, for tests: (address, size) in address order.
  [[nodiscard]] std::vector<std::pair<char*, std::size_t>> chunks() const
  { return chunks_.snapshot(); }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] Upstream& upstream() noexcept { return growth_.upstream(); }
  [[nodiscard]] Upstream const& upstream() const noexcept { return growth_.upstream(); }

 private:
  using slot_type = pool::stream_slot<Platform>;
  using slot_ref  = pool::slot_ref<Platform>;
  using tag_type  = pool::fence_tag<Platform>;
  using request   = pool::alloc_request<Platform>;

  /// What the same-stream path found.
  struct cache_take {
    void* ptr{};
    bool stale{};             // the slot was retired since it was looked up: nothing done
    std::size_t loose_fit{};  // the cache's best fit, left in place because it was loose
  };

  /// The slot table's hand-off of a given-up slot's leftovers.
  struct give_up_sink {
    stream_ordered_pool_core* core;
    void operator()(pool::leftovers<Platform>& out) const noexcept
    { core->adopt_leftovers_locked(out); }
  };

  /**
   * @brief The slot of `stream`'s identity (created on first use), or a null slot for a
   * stream of another device (checked once, when the slot is created). Hot path: a
   * thread-local cache, whose entry is checked by the caller under the slot's mutex
   * (`incarnation`); `refresh` skips it after a stale entry.
   */
  [[gnu::always_inline]] slot_ref lookup(stream_type stream, bool refresh = false)
  {
    auto const id = platform_.stream_id(stream);
    if (!refresh) {
      if (auto const ref = lookups_.find(id)) [[likely]] { return *ref; }
    }
    return lookup_slow(stream, id);
  }

  /// `lookup` past the thread's cache: the slot table, or a new slot (out of line: the hot
  /// path stays small enough to inline).
  [[gnu::noinline]] slot_ref lookup_slow(stream_type stream, std::uint64_t id)
  {
    auto ref = slots_.find(id);
    if (ref.slot == nullptr) {
      if (!platform_.stream_on_device(stream)) { return {}; }
      // A captured stream's slot: its frees belong to the capture's graph (made before the
      // table's lock: it calls CUDA; unused when another thread created the slot first).
      auto hold    = platform_.is_capturing(stream) ? graphs_.hold(platform_, stream) : nullptr;
      auto const c = slots_.create(id, std::move(hold), fences_);
      if (c.swept) { shared_.drop_complete_needs(); }
      ref = c.ref;
    }
    lookups_.remember(id, ref);
    return ref;
  }

  /// Routes what a given-up slot leaves (the slot table's mutex is held): its cached blocks
  /// to its graph (shared once the graph is gone), to the shared list tagged with the record
  /// that covers them, or to the orphans; its live blocks to the orphans' (where a free that
  /// no longer finds them in the slot looks next).
  void adopt_leftovers_locked(pool::leftovers<Platform>& out) noexcept
  {
    counters_.add_current(out.balance);
    pool::pool_counters::bump(counters_.retired_hits, out.same_stream_hits);
    orphans_.adopt_live(out.live);
    if (out.graph) {
      if (!graphs_.keep(out.graph, out.blocks)) { shared_.list_untagged(out.blocks); }
    } else if (out.cover.cell) {
      fencing_.share_covered(out.blocks, out.cover);
    } else {
      orphans_.add(out.blocks);
    }
  }

  /// Hands back what graphs that are gone held: the blocks of their retired slots, and the
  /// slots of their captures still mapped (given up now). Cheap when no graph went since the
  /// last call (one atomic exchange).
  void collect_released_graphs()
  {
    if (!graphs_.take_signal()) { return; }
    shared_.list_untagged(graphs_.take_gone());
    if (!slots_.give_up_gone_graphs()) { graphs_.signal_again(); }  // pinned: next time
  }

  /// The same-stream path: the stream's last frees, then its free list; a loose fit is left
  /// to the caller, who first looks for a tighter shared block that needs no wait. On a
  /// miss, pins the slot when asked (the caller's slower path then holds it).
  [[gnu::always_inline]] cache_take from_cache(slot_ref ref, request const& req, bool pin_on_miss)
  {
    auto& slot = *ref.slot;
    std::lock_guard<spin_mutex> lock(slot.mutex);
    if (ref.stale_locked()) { return {nullptr, true, 0}; }
    ++slot.uses;
    auto const fit = slot.take_tight_fit_locked(req.size, req.align);
    if (fit.ptr != nullptr) {
      return {slot.hand_out_locked(fit.ptr, req.bytes, req.size), false, 0};
    }
    if (pin_on_miss) { ++slot.pins; }
    return {nullptr, false, fit.loose};
  }

  /// The slower paths of `allocate`, for the pinned `req.slot`.
  void* allocate_pinned(request const& req, std::size_t loose_fit)
  {
    collect_released_graphs();
    if (loose_fit != 0) {
      // The cache holds only a loose fit: a tighter shared block keeps the big one whole.
      if (void* ptr = take_shared(req, loose_fit); ptr != nullptr) { return ptr; }
      if (void* ptr = take_cached_best_fit(req); ptr != nullptr) { return ptr; }
    }
    if (void* ptr = take_shared(req); ptr != nullptr) { return ptr; }
    // Other streams' covered caches are shared now (their streams may be gone); the stream's
    // own free blocks coalesce with the shared list's before the pool grows (a block split
    // between the two lists would otherwise be missed).
    bool const others = slots_.request_fences(*req.slot, fencing_.share_covered_fn());
    if (fencing_.share_own_cache(*req.slot, req.stream) || others) {
      if (void* ptr = take_shared(req); ptr != nullptr) { return ptr; }
    }
    if (void* ptr = grow(req); ptr != nullptr) { return ptr; }
    Platform::throw_out_of_memory(req.bytes, pool_size());
  }

  /// Takes the best fit of the pinned slot's cache, whatever its size.
  void* take_cached_best_fit(request const& req)
  {
    std::lock_guard<spin_mutex> lock(req.slot->mutex);
    char* ptr = req.slot->take_best_fit_locked(req.size, req.align);
    return ptr == nullptr ? nullptr : req.slot->hand_out_locked(ptr, req.bytes, req.size);
  }

  /// Takes a block from the shared list for the pinned `req.slot` (`shared_list::take_for`,
  /// `below` included).
  void* take_shared(request const& req, std::size_t below = SIZE_MAX)
  {
    void* ptr = shared_.take_for(req, below);
    return ptr == nullptr ? nullptr : counters_.account(ptr, req.size);
  }

  /// Finds the live block `key` in a slot other than `self` or among retired slots' live
  /// blocks and, when `bytes` matches, forgets it there.
  free_result take_live_elsewhere(slot_type const* self, std::uintptr_t key, std::size_t bytes)
  {
    return slots_.forget_live(self, key, bytes, [&] { return orphans_.forget_live(key, bytes); });
  }

  /// A free with no slot to cache it in (no host memory for one): the block becomes an
  /// orphan, which only a device synchronization frees.
  free_result free_without_slot(void* ptr, std::size_t bytes) noexcept
  {
    auto const r = take_live_elsewhere(nullptr, pool::live_blocks::key_of(ptr), bytes);
    if (r.check != free_check::ok) { return rejected(r); }
    auto const size = round_to_granule(bytes);
    counters_.add_current(-static_cast<std::int64_t>(size));
    orphans_.add(std::array<pool::untagged_block, 1>{{{static_cast<char*>(ptr), size}}});
    return {};
  }

  /// Counts a refused free.
  free_result rejected(free_result r) noexcept
  {
    pool::pool_counters::bump(counters_.rejected_frees);
    return r;
  }

  /// Grows the pool for the pinned `req.slot` (`upstream_growth::grow_locked`), unless
  /// another thread grew it while this one waited.
  void* grow(request const& req)
  {
    auto const growth_lock = growth_.lock();
    if (void* ptr = take_shared(req); ptr != nullptr) { return ptr; }
    return growth_.grow_locked(req);
  }

  /// At shutdown: forgets the chunks that hold blocks of graphs that may still replay.
  void keep_chunks_of_live_graphs() noexcept
  {
    graphs_.for_each_block([&](pool::untagged_block const& b) { chunks_.forget_containing(b.ptr); },
                           /*only_live=*/true);
    slots_.for_each_object([&](slot_type& slot) {  // single-threaded: no lock needed
      if (!slot.graph || slot.graph->gone()) { return; }
      slot.for_each_cached_locked([&](char* p, std::size_t) { chunks_.forget_containing(p); });
    });
  }

  // Declaration order is construction order: the fence registry before every holder of a
  // fence, the chunk registry and the counters before the parts that use them.
  Platform platform_;
  pool::fence_registry<Platform> fences_{platform_};
  pool::chunk_registry chunks_;
  pool::pool_counters counters_;
  pool::shared_list<Platform> shared_{platform_, chunks_};
  pool::orphans orphans_{chunks_};
  pool::fencing_actions<Platform> fencing_{platform_, shared_, orphans_};
  pool::graph_holds graphs_;
  pool::slot_table<Platform, give_up_sink> slots_;
  pool::thread_slot_cache<Platform> lookups_;
  pool::upstream_growth<Platform, Upstream> growth_;
  std::mutex reclaim_mutex_;
};

}  // namespace rmm_fences::mr::detail
