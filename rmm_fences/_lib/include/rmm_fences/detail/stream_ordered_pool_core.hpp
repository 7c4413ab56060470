/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of StreamOrderedPoolMemoryResource (docs/design.md#layers, policy cores): no CUDA
 * calls. The CUDA build plugs in `cuda_pool_platform`; the CPU tests plug in manual fences and host
 * memory.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/detail/pool/stream_identity.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/// What a checked free found.
enum class free_status : int {
  done           = 0,  ///< freed
  not_live       = 1,  ///< not a live block of this pool: double free or foreign pointer
  size_mismatch  = 2,  ///< a live block, freed with another size than it was allocated with
  foreign_stream = 3,  ///< the stream belongs to another device
};

struct free_result {
  free_status status{free_status::done};
  std::size_t allocated_bytes{};  ///< with `size_mismatch`: the size it was allocated with
};

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
 * Design (docs/stream_ordered_pool.md says the same for users):
 *
 *  - Every stream identity S in use has a slot. A block freed on S goes to S's *cache*, a
 *    free list that only S allocates from: stream order makes that reuse safe at once, with no
 *    CUDA call.
 *  - Fences are batched: S records one event (its slot's fence, re-recorded each time) when
 *    its cache holds `fence_batch` blocks, when another stream asked for S's blocks, or when S
 *    is retired; and, once another stream ran short while S held free blocks, when its cache
 *    holds `pool_size / fence_fraction` bytes. S stops fencing by bytes when it takes back a
 *    block it fenced that nobody else took: a stream that reuses its own blocks, however big,
 *    records no fence per free. Recording happens on a call that uses S, so S is alive. All of
 *    S's cached blocks then move to the shared list, tagged with (S's fence, fence number).
 *  - A stream T takes a tagged block only after enqueuing `device_wait(T, fence)`, unless T
 *    already waited on an equal or later record of that fence. Waiting on a later record is
 *    correct (it orders T after more of S's work), so one event per slot suffices. A tag drops
 *    a fence once a query found it complete (`ready`): when a merged block carries more than
 *    `tag_prune_minimum` fences (and twice as many as after its last pruning), and at sweeps.
 *  - Slots of streams that went away are retired: when the slots reach `sweep_bound_`
 *    (`slot_sweep_minimum`, then the slots kept plus the larger of `slot_sweep_minimum` and
 *    half of them), every slot unused since the previous sweep is retired. Its cache cannot be
 * fenced (its stream may be gone), so its blocks become *orphans*, which only a device
 * synchronization frees; its live blocks stay findable; the slot object is kept for a new stream.
 * Its fence lives on with the blocks it tags: a new stream, even on a reused handle or identity,
 * gets another fence and waits on the old one. Callers never hold a slot across a sweep: a thread's
 * cached slot carries an incarnation, checked under the slot's lock (retirement changes it), and a
 * call that must release the lock first *pins* the slot (no retirement while pinned).
 *  - The pool never records on a stream it was not called with. `retire_stream(S)` fences S
 *    and hands its blocks to everyone. Before growing, when orphans hold a quarter of the pool
 *    and enough for the request, and right before out-of-memory, the pool synchronizes the
 *    device once and reclaims what that sync covers: the caches, orphans and fenced shared
 *    blocks are detached first, then the device is synchronized, then only the detached blocks
 *    lose their fences (a block freed and fenced by another thread meanwhile keeps its fence).
 *    `release()` does the same and returns whole free chunks that no fence guards upstream.
 *  - Growth allocates from the upstream on the requesting stream S (a stream-ordered
 *    upstream may hand out memory whose previous user's work is ordered only on S): the
 *    carved block is ordered for S, and the rest is listed tagged with a fence of S recorded
 *    after the upstream call. While S is captured, growth uses a pool-owned stream P instead
 *    (never S: that would put an allocation node into the graph; never the legacy stream),
 *    synchronizes P and lists the chunk untagged. Chunks go back upstream on P.
 *  - Every slot keeps the blocks it handed out (address -> requested bytes): a free finds its
 *    block in the freeing stream's slot (the common case), in another slot, one slot lock at a
 *    time, or among the live blocks of retired slots, before touching any list; a double free,
 *    a foreign pointer or a wrong size is refused and counted, and changes nothing.
 *  - Locks: each slot has its own mutex (the common path takes only the calling stream's);
 *    the shared list has one; growth from the upstream holds only `growth_mutex_`, never a
 *    lock another stream needs for its own blocks. Lock order: reclaim -> slots -> slot ->
 *    fence; slots -> orphans -> chunks; shared -> fence; shared -> chunks; slot -> chunks; no
 *    thread holds a slot's mutex and the shared list's or the orphans' at once.
 *  - During capture of the calling stream: no fence is recorded and no stream wait enqueued;
 *    allocation uses the stream's cache, shared blocks that are untagged or whose fences a
 *    query finds complete (when the best fit needs a wait, the first such block among the
 *    next `capture_fit_candidates` that fit, in best-fit order), or upstream growth (by at
 *    most 64 MiB beyond the request).
 */
template <typename Platform, typename Upstream>
class stream_ordered_pool_core {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;

  /// Cached blocks after which a stream's cache is fenced and shared.
  static constexpr std::size_t fence_batch = 32;
  /// Frees of a new stream that are each fenced: a stream that goes away after a few calls
  /// (a stream per task) leaves no block that only a device synchronization would free.
  static constexpr std::uint32_t young_frees = 16;
  /// Cached bytes (as a fraction of the pool) after which a stream's cache is fenced, once
  /// another stream ran short while this one held free blocks.
  static constexpr std::size_t fence_fraction = 16;
  /// Bytes a stream's allocation balance may drift before it is added to the pool's totals
  /// (so streams on different threads do not contend on one counter).
  static constexpr std::int64_t accounting_batch = std::int64_t{4} << 20;
  /// Frees per stream kept for exact-size reuse before they join the stream's free list.
  static constexpr std::size_t recent_capacity = 8;
  /// 64 MiB: a pool below it doubles when it grows; the most a growth adds beyond the request
  /// while the calling stream is captured; the first chunk with `maximum_growth_size`.
  static constexpr std::size_t small_pool_bytes = std::size_t{64} << 20;
  /// Chunks grown without `initial_pool_size`/`maximum_growth_size` are multiples of this.
  static constexpr std::size_t growth_granularity = std::size_t{2} << 20;
  /// A growth adds the larger of the request and 1/this of the pool (the pool grows by half).
  static constexpr std::size_t growth_divisor = 2;
  /// The most a growth adds beyond the request without `maximum_growth_size` (the pool
  /// grows by half up to this): the part of the last growth that may stay unused.
  static constexpr std::size_t default_growth_limit = std::size_t{512} << 20;
  /// A request of at least 1/this of the pool grows it by the request alone.
  static constexpr std::size_t big_request_fraction = 8;
  /// Largest alignment accepted.
  static constexpr std::size_t max_alignment = std::size_t{1} << 30;
  /// Requests above this raise out-of-memory at once (no upstream holds half the address
  /// space; and rounding to the granule cannot overflow below it).
  static constexpr std::size_t max_request = SIZE_MAX / 2;
  static_assert(max_request <= max_granule_size);
  /// Slots held before the first sweep retires idle ones (and the least bound of later ones).
  static constexpr std::size_t slot_sweep_minimum = 64;
  /// Fences a shared block carries before those known complete are dropped.
  static constexpr std::size_t tag_prune_minimum = 16;
  /// Fences a stream remembers having waited on (forgetting costs only a repeated wait).
  static constexpr std::size_t waited_capacity = 64;
  /// Shared blocks that fit a request looked at, in best-fit order, while the calling stream
  /// is captured and the best fit needs a wait, for one that needs none.
  static constexpr std::size_t capture_fit_candidates = 16;
  /// `for_each_free_block`'s owner of orphans (blocks only a device synchronization frees).
  static constexpr std::uint64_t orphan_owner = std::numeric_limits<std::uint64_t>::max();
  /// `for_each_free_block`'s owner of blocks held for graphs of retired captured slots.
  static constexpr std::uint64_t graph_owner = orphan_owner - 1;

  template <typename... PlatformArgs>
  stream_ordered_pool_core(Upstream upstream,
                           std::size_t initial_pool_size,
                           std::optional<std::size_t> maximum_pool_size,
                           std::optional<std::size_t> maximum_growth_size,
                           PlatformArgs&&... platform_args)
    : platform_(std::forward<PlatformArgs>(platform_args)...),
      upstream_{std::move(upstream)},
      maximum_pool_size_{maximum_pool_size},
      maximum_growth_size_{maximum_growth_size},
      pool_key_{next_pool_key()},
      default_id_{platform_.stream_id(Platform::default_stream())}
  {
    if (initial_pool_size > 0) {
      if (initial_pool_size > max_request) { Platform::throw_out_of_memory(initial_pool_size, 0); }
      auto const size = round_to_granule(initial_pool_size);
      // On the pool's own stream, synchronized: the chunk is then free of any earlier work
      // and listed untagged.
      [[maybe_unused]] auto relaxed = platform_.relax();
      auto const stream             = platform_.private_stream();
      void* ptr                     = upstream_.allocate(stream, size, pool_granularity);
      if (!platform_.sync_stream(stream)) {
        upstream_.deallocate(stream, ptr, size, pool_granularity);
        Platform::throw_out_of_memory(initial_pool_size, 0);
      }
      add_chunk(static_cast<char*>(ptr), size, 0, pool_granularity, fence_tag{}, nullptr);
    }
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
    release_events_ = device_alive;
    if (device_alive) {
      collect_graph_chunks_to_keep();
      wait_on_every_fence();
    }
    shared_.take_all();  // drops the shared list's references to fences
    orphans_.take_all();
    orphan_live_.clear();
    for (auto& slot : all_slots_) {
      slot->cache.take_all();
      slot->recent_count = 0;
      slot->cell.reset();
      slot->graph.reset();
    }
    slots_.clear();
    retiring_.clear();
    spare_.clear();
    all_slots_.clear();
    holds_.clear();
    if (device_alive) { return_chunks(); }
    chunks_.clear();
    pool_bytes_.store(0, std::memory_order_relaxed);
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
    if (!valid_request(bytes, alignment)) { return nullptr; }  // `allocate` says why
    auto const size  = round_to_granule(bytes);
    auto const align = std::max(alignment, pool_granularity);
    for (bool const refresh : {false, true}) {
      auto const ref = lookup(stream, refresh);
      if (ref.slot == nullptr) { return nullptr; }
      bool stale            = false;
      std::size_t loose_fit = 0;
      void* ptr = from_cache(ref, bytes, size, align, /*pin_on_miss=*/false, stale, &loose_fit);
      if (!stale) { return ptr; }
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
    if (!valid_request(bytes, alignment)) { reject_request(bytes, alignment); }
    auto const size       = round_to_granule(bytes);
    auto const align      = std::max(alignment, pool_granularity);
    slot_type* slot_ptr   = nullptr;
    std::size_t loose_fit = 0;  // the cache's best fit, when it is loose (and not taken)
    for (bool refresh = false;; refresh = true) {
      auto const ref = lookup(stream, refresh);
      if (ref.slot == nullptr) {
        throw std::invalid_argument(
          "StreamOrderedPoolMemoryResource: stream belongs to another device than the pool's");
      }
      bool stale = false;
      void* ptr  = from_cache(ref, bytes, size, align, /*pin_on_miss=*/true, stale, &loose_fit);
      if (ptr != nullptr) { return ptr; }
      if (!stale) {
        slot_ptr = ref.slot;
        break;
      }
    }
    auto& slot = *slot_ptr;
    pin_guard const pinned{slot};  // from_cache pinned it on the miss
    collect_released_graphs();
    if (loose_fit != 0) {
      // The cache holds only a loose fit: a tighter shared block keeps the big one whole
      // (a stream that carved its small requests out of the big blocks it freed left no
      // room for the next big request, and the pool grew).
      if (void* ptr = take_shared(slot, stream, bytes, size, align, loose_fit); ptr != nullptr) {
        return ptr;
      }
      if (void* ptr = take_cached_best_fit(slot, bytes, size, align); ptr != nullptr) {
        return ptr;
      }
    }
    if (void* ptr = take_shared(slot, stream, bytes, size, align); ptr != nullptr) { return ptr; }
    request_fences(slot);
    // The stream's own free blocks coalesce with the shared list's before the pool grows (a
    // block split between the two lists would otherwise be missed).
    if (share_own_cache(slot, stream)) {
      if (void* ptr = take_shared(slot, stream, bytes, size, align); ptr != nullptr) { return ptr; }
    }
    if (void* ptr = grow(slot, stream, bytes, size, align); ptr != nullptr) { return ptr; }
    Platform::throw_out_of_memory(bytes, pool_bytes_.load(std::memory_order_relaxed));
  }

  /**
   * @brief Frees a block on `stream`: it is reusable on `stream` at once, elsewhere after a
   * fence. A free that is not of a live block of this pool with the size it was allocated
   * with changes nothing: it is counted in `rejected_frees` and reported on one line.
   */
  void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t) noexcept
  {
    auto const r = deallocate_checked(stream, ptr, bytes);
    if (r.status != free_status::done) [[unlikely]] { report_rejected(r, ptr, bytes); }
  }

  /// `deallocate` that tells what it found instead of reporting it (counted all the same).
  free_result deallocate_checked(stream_type stream, void* ptr, std::size_t bytes) noexcept
  {
    if (ptr == nullptr) { return {}; }  // a null free is a no-op, as for rmm's resources
    auto const key = reinterpret_cast<std::uintptr_t>(ptr);
    for (bool refresh = false;; refresh = true) {
      slot_ref ref;
      try {
        ref = lookup(stream, refresh);
      } catch (...) {  // no host memory for a new slot
        return free_without_slot(ptr, key, bytes);
      }
      if (ref.slot == nullptr) {
        rejected_frees_.fetch_add(1, std::memory_order_relaxed);
        return {free_status::foreign_stream, 0};
      }
      auto& slot = *ref.slot;
      std::unique_lock<spin_mutex> lock(slot.mutex);
      if (slot.incarnation != ref.incarnation || slot.retiring) { continue; }  // retired
      ++slot.uses;
      if (auto const i = slot.live.find_index(key); i != slot.live.npos) {
        if (slot.live.value_at(i) != bytes) {
          rejected_frees_.fetch_add(1, std::memory_order_relaxed);
          return {free_status::size_mismatch, slot.live.value_at(i)};
        }
        slot.live.erase_at(i);
      } else {
        ++slot.pins;  // the slot stays this stream's while its lock is released
        lock.unlock();
        auto const r = take_live_elsewhere(&slot, key, bytes);
        lock.lock();
        --slot.pins;
        if (r.status != free_status::done) {
          rejected_frees_.fetch_add(1, std::memory_order_relaxed);
          return r;
        }
      }
      auto const size = round_to_granule(bytes);
      slot.balance -= static_cast<std::int64_t>(size);
      if (slot.balance <= -accounting_batch) { settle(slot); }
      if (slot.recent_count < recent_capacity) {
        slot.recent[slot.recent_count++] = {static_cast<char*>(ptr), size};
        slot.recent_bytes += size;
      } else {
        try {
          slot.cache.insert(static_cast<char*>(ptr), size, no_tag{}, chunk_start_test());
        } catch (...) {
          // No host memory to list the block: it stays allocated (never reused early).
          return {};
        }
      }
      if (should_fence(slot)) { fence_and_share(slot, stream, lock); }
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
    auto const id   = platform_.stream_id(stream);
    slot_type* slot = nullptr;
    {
      std::unique_lock<std::shared_mutex> lock(slots_mutex_);
      auto it = slots_.find(id);
      if (it == slots_.end()) { return; }
      slot = it->second;
      retiring_.push_back(slot);
      slots_.erase(it);
      std::lock_guard<spin_mutex> slot_lock(slot->mutex);
      slot->retiring = true;  // callers that cached it go to a new slot
      ++slot->pins;           // no sweep takes it before it is fenced
    }
    {
      std::unique_lock<spin_mutex> lock(slot->mutex);
      settle(*slot);  // a retired slot's balance would otherwise skew the totals (and the peak)
      fence_and_share(*slot, stream, lock);
    }
    {
      std::lock_guard<spin_mutex> lock(slot->mutex);
      --slot->pins;
    }
    retired_count_.fetch_add(1, std::memory_order_relaxed);
    // Given up now unless another call still holds it (then a later sweep does it).
    std::unique_lock<std::shared_mutex> lock(slots_mutex_);
    auto it = std::find(retiring_.begin(), retiring_.end(), slot);
    if (it != retiring_.end() && give_up_locked(*slot, /*only_if_idle=*/false)) {
      retiring_.erase(it);
    }
  }

  /**
   * @brief Returns upstream every chunk that the shared list holds whole, on the pool's own
   * stream after a stream wait on each fence that guards it: no host or device sync. Blocks
   * still cached by a stream, held for a graph or orphaned stay.
   * @return bytes returned to the upstream
   */
  std::size_t release()
  {
    collect_released_graphs();
    auto whole = take_whole_chunks();
    if (whole.empty()) { return 0; }
    // On the pool's own stream: never the legacy stream, which a capture may forbid.
    [[maybe_unused]] auto relaxed = platform_.relax();
    auto const stream             = platform_.private_stream();
    std::size_t returned          = 0;
    for (auto& b : whole) {
      if (!wait_on_tag(stream, b.tag)) {  // not ordered after its last users: kept
        add_back_chunk(b);
        continue;
      }
      upstream_.deallocate(stream, b.ptr, b.size, pool_granularity);
      returned += b.size;
    }
    return returned;
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
  { return reclaim(std::forward<Synchronize>(synchronize)); }

  /// True when the pool holds free blocks whose last use no fence covers: cached by a stream
  /// (not a captured one) or orphaned. Only a device-wide order makes their chunks safe to
  /// return upstream.
  [[nodiscard]] bool holds_unfenced_blocks()
  {
    bool any = false;
    for_each_slot([&](slot_type& slot) {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      if (!slot.graph && (slot.recent_count > 0 || !slot.cache.empty())) { any = true; }
    });
    return any || orphan_bytes_.load(std::memory_order_relaxed) > 0;
  }

  /// Bytes held from the upstream.
  [[nodiscard]] std::size_t pool_size() const noexcept
  { return pool_bytes_.load(std::memory_order_relaxed); }

  [[nodiscard]] std::optional<std::size_t> maximum_pool_size() const noexcept
  { return maximum_pool_size_; }

  /// The bound on a growth's chunk beyond the request (empty: chunks double the pool).
  [[nodiscard]] std::optional<std::size_t> maximum_growth_size() const noexcept
  { return maximum_growth_size_; }

  /**
   * @brief A snapshot of the counters.
   *
   * `current_bytes` is exact; `peak_bytes` is sampled whenever a stream's balance is settled
   * (every `accounting_batch` bytes, on every slower path and here), so it may miss a short
   * peak by up to `accounting_batch` per stream.
   */
  [[nodiscard]] rmm_fences::mr::stream_ordered_pool_stats stats()
  {
    std::uint64_t same_stream = 0;
    std::uint64_t slots       = 0;
    for_each_slot([&](slot_type& slot) {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      settle(slot);
      same_stream += slot.same_stream_hits;
      ++slots;
    });
    rmm_fences::mr::stream_ordered_pool_stats s;
    s.current_bytes = static_cast<std::uint64_t>(current_bytes_.load(std::memory_order_relaxed));
    s.peak_bytes    = peak_bytes_.load(std::memory_order_relaxed);
    s.pool_bytes    = pool_bytes_.load(std::memory_order_relaxed);
    s.same_stream_reuse  = same_stream + retired_hits_.load(std::memory_order_relaxed);
    s.cross_stream_reuse = cross_stream_reuse_.load(std::memory_order_relaxed);
    s.upstream_growths   = growths_.load(std::memory_order_relaxed);
    s.fences             = fences_.load(std::memory_order_relaxed);
    s.stream_waits       = stream_waits_.load(std::memory_order_relaxed);
    s.reclaim_syncs      = reclaim_syncs_.load(std::memory_order_relaxed);
    s.retired_streams    = retired_count_.load(std::memory_order_relaxed);
    s.rejected_frees     = rejected_frees_.load(std::memory_order_relaxed);
    s.stream_slots       = slots;
    s.fence_events       = events_.load(std::memory_order_relaxed);
    s.graph_bytes        = graph_bytes();
    s.orphan_bytes       = orphan_bytes_.load(std::memory_order_relaxed);
    return s;
  }

  /// Free bytes that graphs that may still replay hold (their captured streams' caches).
  [[nodiscard]] std::uint64_t graph_bytes()
  {
    std::uint64_t bytes = 0;
    for_each_slot([&](slot_type& slot) {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      if (slot.graph) { bytes += slot.cache.free_bytes() + slot.recent_bytes; }
    });
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    for (auto const& hold : holds_) {
      for (auto const& b : hold->blocks) {
        bytes += b.second;
      }
    }
    return bytes;
  }

  /// Free blocks listed (in caches, shared, orphaned, held for graphs), for tests: calls
  /// f(ptr, size, owner) with the owner's stream id, 0 for shared blocks, `orphan_owner` or
  /// `graph_owner`.
  template <typename F>
  void for_each_free_block(F&& f)
  {
    {
      std::lock_guard<std::mutex> lock(graphs_mutex_);
      for (auto const& hold : holds_) {
        for (auto const& [p, n] : hold->blocks) {
          f(p, n, graph_owner);
        }
      }
    }
    for_each_slot([&](slot_type& slot) {
      std::lock_guard<spin_mutex> slot_lock(slot.mutex);
      for (std::size_t i = 0; i < slot.recent_count; ++i) {
        f(slot.recent[i].first, slot.recent[i].second, slot.id);
      }
      slot.cache.for_each([&](char* p, std::size_t n, no_tag&) { f(p, n, slot.id); });
    });
    {
      std::lock_guard<std::mutex> lock(shared_mutex_);
      shared_.for_each([&](char* p, std::size_t n, fence_tag&) { f(p, n, std::uint64_t{0}); });
    }
    std::lock_guard<std::mutex> lock(orphan_mutex_);
    orphans_.for_each([&](char* p, std::size_t n, no_tag&) { f(p, n, orphan_owner); });
  }

  /// Upstream chunks, for tests: (address, size) in address order.
  [[nodiscard]] std::vector<std::pair<char*, std::size_t>> chunks() const
  {
    std::shared_lock<std::shared_mutex> lock(chunks_mutex_);
    return {chunks_.begin(), chunks_.end()};
  }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }

 private:
  struct no_tag {
    static no_tag merge(no_tag, no_tag) noexcept { return {}; }
  };

  /**
   * @brief One slot's fence: an event re-recorded at each fence of the slot, shared with the
   * blocks it tags (it outlives the slot's stream while it guards blocks; a slot given to a
   * new stream gets another one unless nothing else holds it).
   */
  struct fence_cell {
    fence_cell(stream_ordered_pool_core* owner, std::uint64_t serial_no)
      : pool{owner}, serial{serial_no}
    {
    }
    ~fence_cell()
    {
      if (event.has_value()) { pool->release_event(*event); }
    }
    fence_cell(fence_cell const&)            = delete;
    fence_cell& operator=(fence_cell const&) = delete;

    /// True when the work before record `number` is known complete (`ready`: a failed query
    /// is not).
    bool complete(std::uint64_t at_least) noexcept
    {
      std::lock_guard<std::mutex> lock(mutex);
      return event.has_value() && number >= at_least && pool->platform_.ready(*event);
    }

    stream_ordered_pool_core* const pool;
    std::uint64_t const serial;  // tells fences apart in `slot_type::waited`
    std::mutex mutex;            // guards event and number
    std::optional<fence_type> event;
    std::uint64_t number{};  // how many times it was recorded
  };
  using cell_ptr = std::shared_ptr<fence_cell>;

  /// The fences a user of a shared block must wait for: (fence, record number) per stream.
  struct fence_tag {
    std::vector<std::pair<cell_ptr, std::uint64_t>> needs;
    std::size_t prune_at{tag_prune_minimum};  // prune when a merge brings more needs

    static fence_tag merge(fence_tag a, fence_tag b)
    {
      for (auto& need : b.needs) {
        auto it = std::find_if(
          a.needs.begin(), a.needs.end(), [&](auto const& n) { return n.first == need.first; });
        if (it == a.needs.end()) {
          a.needs.push_back(std::move(need));
        } else {
          it->second = std::max(it->second, need.second);
        }
      }
      a.prune_at = std::max(a.prune_at, b.prune_at);
      if (a.needs.size() > a.prune_at) {
        // Coalescing gathers the fences of every stream that freed into a block: drop those
        // known complete (amortized: the bound doubles over what is left).
        a.needs.erase(std::remove_if(a.needs.begin(),
                                     a.needs.end(),
                                     [](auto const& n) { return n.first->complete(n.second); }),
                      a.needs.end());
        a.prune_at = std::max(tag_prune_minimum, 2 * a.needs.size());
      }
      return a;
    }
  };

  /**
   * @brief The graph a captured stream's frees belong to. Every launch of an executable graph
   * instantiated from the capture replays them, so they stay the graph's until the graph and
   * every executable graph of it are destroyed: the user object the pool retains into the
   * capture then runs `on_graph_destroyed` (on a thread of the driver; it may not call CUDA:
   * it only sets `released` and bumps the pool's signal, which the next allocation reads).
   */
  struct graph_hold {
    std::shared_ptr<std::atomic<std::uint64_t>> signal;  // outlives the pool if need be
    std::atomic<bool> released{};                        // the user object's callback ran
    std::atomic<bool> attached{};                        // the graph retains the user object
    std::vector<std::pair<char*, std::size_t>> blocks;   // of its retired slots (graphs_mutex_)

    /// True once the graph and its executables are gone (and their launches complete).
    [[nodiscard]] bool gone() const noexcept
    { return attached.load(std::memory_order_acquire) && released.load(std::memory_order_acquire); }
  };

  static void on_graph_destroyed(void* ctx) noexcept
  {
    auto* hold = static_cast<std::shared_ptr<graph_hold>*>(ctx);
    (*hold)->released.store(true, std::memory_order_release);
    (*hold)->signal->fetch_add(1, std::memory_order_acq_rel);
    delete hold;
  }

  /// One stream identity: its cache of freed blocks and its fence (own cache lines: threads
  /// on different streams touch different slots). Slot objects live as long as the pool: a
  /// retired one is reset and given to the next new stream.
  struct alignas(64) slot_type {
    slot_type()                            = default;
    slot_type(slot_type const&)            = delete;
    slot_type& operator=(slot_type const&) = delete;

    // Set when the slot is given to a stream; written under slots_mutex_ (exclusive) and
    // `mutex`, read under either, or while the slot is pinned.
    std::uint64_t id{};
    std::uint64_t incarnation{};        // changes when the slot is retired
    cell_ptr cell;                      // its fence
    std::shared_ptr<graph_hold> graph;  // a captured stream's: the graph its frees belong to

    spin_mutex mutex;               // guards the fields below
    bool retiring{};                // left the stream map (retire_stream): callers go to a new slot
    std::uint32_t pins{};           // calls using the slot with `mutex` released
    std::uint64_t uses{};           // calls that used the slot
    std::uint64_t uses_at_sweep{};  // `uses` at the last sweep (equal: idle since)
    std::uint32_t frees{};          // frees since the slot was given to its stream (to young_frees)
    free_list<no_tag> cache;        // freed on this stream since its last fence
    std::int64_t balance{};         // bytes allocated minus freed, not yet settled
    std::uint64_t same_stream_hits{};
    // The last few frees, kept as they are (no coalescing yet) for exact-size reuse without
    // touching the free list; part of the cache in every other respect (`flush_recent`).
    std::array<std::pair<char*, std::size_t>, recent_capacity> recent{};
    std::size_t recent_count{};
    std::size_t recent_bytes{};
    std::unordered_map<std::uint64_t, std::uint64_t> waited;  // fence serial -> record waited
    pointer_map<std::size_t> live{64};  // blocks handed out on this slot -> requested bytes
    std::atomic<bool> fence_requested{};
    // Another stream missed while this one held free blocks: its cached bytes are fenced by
    // the byte rule until it takes back a block it fenced that nobody else took.
    std::atomic<bool> demanded{};
  };

  /// A slot as a caller found it: valid while `slot->incarnation` still equals `incarnation`.
  struct slot_ref {
    slot_type* slot{};
    std::uint64_t incarnation{};
  };

  /// Releases a pin (the slot may be retired once no call holds it).
  struct pin_guard {
    explicit pin_guard(slot_type& pinned) noexcept : slot{pinned} {}
    pin_guard(pin_guard const&)            = delete;
    pin_guard& operator=(pin_guard const&) = delete;
    ~pin_guard()
    {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      --slot.pins;
    }
    slot_type& slot;
  };

  /// What a retired slot leaves: its cached blocks (to its graph, or to the orphans) and its
  /// live blocks.
  struct leftovers {
    std::vector<std::pair<char*, std::size_t>> blocks;
    std::vector<std::pair<std::uintptr_t, std::size_t>> live;
    std::shared_ptr<graph_hold> graph;
  };

  /// Calls `f(slot)` for every slot held by a stream or being retired.
  template <typename F>
  void for_each_slot(F&& f)
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    for (auto& [id, slot] : slots_) {
      f(*slot);
    }
    for (auto* slot : retiring_) {
      f(*slot);
    }
  }

  static std::uint64_t next_pool_key() noexcept
  {
    static std::atomic<std::uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }

  /// Gives back an event whose last fence reference went away.
  void release_event(fence_type event) noexcept
  {
    if (release_events_) { platform_.release_fence(event); }
    events_.fetch_sub(1, std::memory_order_relaxed);
  }

  /**
   * @brief The slot of `stream`'s identity (created on first use), or a null slot for a
   * stream of another device (checked once, when the slot is created). Hot path: a
   * thread-local cache, whose entry is checked by the caller under the slot's lock
   * (`incarnation`); `refresh` skips it after a stale entry.
   */
  slot_ref lookup(stream_type stream, bool refresh = false)
  {
    struct tls_entry {
      std::uint64_t pool;
      std::uint64_t id;
      slot_type* slot;
      std::uint64_t incarnation;
    };
    struct tls_cache {
      std::array<tls_entry, 8> entries;
      unsigned next_victim;
    };
    // One thread_local object: one TLS lookup per call. (The initial-exec model would save it,
    // but a module loaded after rmm and CuPy finds no static TLS left: the import fails.)
    // Entries of a destroyed pool never match: pool keys are never reused.
    static thread_local tls_cache cache{};

    auto const id = platform_.stream_id(stream);
    if (!refresh) {
      for (auto const& e : cache.entries) {
        if (e.pool == pool_key_ && e.id == id) { return {e.slot, e.incarnation}; }
      }
    }
    slot_ref ref;
    {
      std::shared_lock<std::shared_mutex> lock(slots_mutex_);
      if (auto it = slots_.find(id); it != slots_.end()) {
        ref = {it->second, it->second->incarnation};
      }
    }
    if (ref.slot == nullptr) {
      if (!platform_.stream_on_device(stream)) { return {}; }
      ref = create_slot(id, stream);
    }
    tls_entry* entry = nullptr;
    for (auto& e : cache.entries) {
      if (e.pool == pool_key_ && e.id == id) { entry = &e; }
    }
    if (entry == nullptr) { entry = &cache.entries[cache.next_victim++ % cache.entries.size()]; }
    *entry = {pool_key_, id, ref.slot, ref.incarnation};
    return ref;
  }

  /// A slot for identity `id`: a retired slot object when one is spare, else a new one; first
  /// retires idle slots when the slots reached `sweep_bound_`.
  slot_ref create_slot(std::uint64_t id, stream_type stream)
  {
    // A captured stream's slot: its frees belong to the capture's graph (made before the
    // locks: it calls CUDA; unused when another thread created the slot first).
    auto hold = platform_.is_capturing(stream) ? hold_graph(stream) : nullptr;
    cell_ptr dropped;  // an old fence, let go after the locks
    slot_ref ref;
    bool swept = false;
    {
      std::unique_lock<std::shared_mutex> lock(slots_mutex_);
      if (auto it = slots_.find(id); it != slots_.end()) {
        return {it->second, it->second->incarnation};
      }
      if (slots_.size() + retiring_.size() >= sweep_bound_) {  // retire idle slots first
        sweep_locked();
        swept = true;
      }
      if (spare_.empty()) {
        all_slots_.push_back(std::make_unique<slot_type>());
        spare_.reserve(all_slots_.size());  // retirement then never allocates here
        spare_.push_back(all_slots_.back().get());
      }
      slot_type* slot = spare_.back();
      cell_ptr fresh;
      // A fence that still tags blocks stays with them: the new stream gets its own (the new
      // stream must wait on the old one, even with the same identity).
      if (!slot->cell || slot->cell.use_count() > 1) {
        fresh = std::make_shared<fence_cell>(this, next_serial_++);
      }
      slots_.emplace(id, slot);
      spare_.pop_back();
      std::lock_guard<spin_mutex> slot_lock(slot->mutex);
      slot->graph         = std::move(hold);
      slot->id            = id;
      slot->incarnation   = ++incarnations_;
      slot->retiring      = false;
      slot->uses          = 1;  // not idle at the next sweep
      slot->uses_at_sweep = 0;
      slot->frees         = 0;
      if (fresh) {
        dropped    = std::move(slot->cell);
        slot->cell = std::move(fresh);
      }
      ref = {slot, slot->incarnation};
    }
    if (swept) { prune_shared_tags(); }
    return ref;
  }

  /**
   * @brief Retires every slot unused since the previous sweep and not pinned (the default
   * stream's excepted: its handle means the current device's, checked once), and the slots
   * left by `retire_stream` that no call holds any more (caller holds slots_mutex_
   * exclusively).
   */
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
   * @brief Retires `slot` unless a call holds it (or, `only_if_idle`, it was used since the
   * last sweep, or is the default stream's): its cached blocks become orphans, its live blocks
   * move to the orphans' map, its fence stays with the blocks it tags, and the object becomes
   * spare (caller holds slots_mutex_ exclusively and removes it from `slots_` or `retiring_`
   * when this returns true).
   */
  bool give_up_locked(slot_type& slot, bool only_if_idle) noexcept
  {
    leftovers out;
    {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      if (slot.pins != 0) { return false; }
      if (only_if_idle && (slot.uses != slot.uses_at_sweep || slot.id == default_id_)) {
        slot.uses_at_sweep = slot.uses;
        return false;
      }
      try {
        out.blocks.reserve(slot.recent_count + slot.cache.block_count());
        out.live.reserve(slot.live.size());
      } catch (...) {
        return false;  // no host memory: kept for a later sweep
      }
      settle(slot);
      retired_hits_.fetch_add(slot.same_stream_hits, std::memory_order_relaxed);
      slot.same_stream_hits = 0;
      for (std::size_t i = 0; i < slot.recent_count; ++i) {
        out.blocks.push_back(slot.recent[i]);
      }
      slot.recent_count = 0;
      slot.recent_bytes = 0;
      slot.cache.for_each([&](char* p, std::size_t n, no_tag&) { out.blocks.emplace_back(p, n); });
      slot.cache = free_list<no_tag>{};
      slot.live.for_each([&](std::uintptr_t p, std::size_t n) { out.live.emplace_back(p, n); });
      slot.live.clear();
      out.graph = std::move(slot.graph);
      slot.waited.clear();
      slot.fence_requested.store(false, std::memory_order_relaxed);
      slot.demanded.store(false, std::memory_order_relaxed);
      slot.retiring    = false;
      slot.incarnation = ++incarnations_;  // a caller's cached reference is now stale
    }
    spare_.push_back(&slot);  // reserved: never allocates
    if (out.graph) { keep_for_graph(out.graph, out.blocks); }
    // Under slots_mutex_: a free that no longer finds the block in the slot finds it here.
    std::lock_guard<std::mutex> lock(orphan_mutex_);
    for (auto const& [p, n] : out.live) {
      try {
        orphan_live_.insert_or_assign(p, n);
      } catch (...) {  // no host memory: its free will be refused (the block is lost)
      }
    }
    if (!out.graph) {
      for (auto const& [p, n] : out.blocks) {
        orphan_locked(p, n);
      }
    }
    return true;
  }

  /**
   * @brief A new graph hold for the capture `stream` is in: the platform retains a user
   * object into the capture's graph, whose callback marks the hold released. When it cannot,
   * the hold is never released: the blocks stay the graph's for the pool's life.
   */
  std::shared_ptr<graph_hold> hold_graph(stream_type stream)
  {
    auto hold    = std::make_shared<graph_hold>();
    hold->signal = graph_signal_;
    auto* ctx    = new std::shared_ptr<graph_hold>(hold);
    // The callback runs exactly once, and deletes `ctx`, whatever the answer.
    if (platform_.retain_until_graph_destroyed(stream, &on_graph_destroyed, ctx)) {
      hold->attached.store(true, std::memory_order_release);
      // Released before it was attached (the graph went at once): let the next call see it.
      if (hold->released.load(std::memory_order_acquire)) {
        graph_signal_->fetch_add(1, std::memory_order_acq_rel);
      }
    }
    return hold;
  }

  /// A retired captured slot's cached blocks: the graph's while it may replay, else shared.
  void keep_for_graph(std::shared_ptr<graph_hold> const& hold,
                      std::vector<std::pair<char*, std::size_t>> const& blocks) noexcept
  {
    if (blocks.empty()) { return; }
    if (hold->gone()) {
      list_shared_untagged(blocks);
      return;
    }
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    try {
      if (hold->blocks.empty()) { holds_.push_back(hold); }
      hold->blocks.insert(hold->blocks.end(), blocks.begin(), blocks.end());
    } catch (...) {  // no host memory: the blocks stay lost to the pool (never handed out)
    }
  }

  /// Lists blocks no fence guards in the shared list.
  void list_shared_untagged(std::vector<std::pair<char*, std::size_t>> const& blocks) noexcept
  {
    std::lock_guard<std::mutex> lock(shared_mutex_);
    for (auto const& [p, n] : blocks) {
      try {
        shared_.insert(p, n, fence_tag{}, chunk_start_test());
      } catch (...) {  // no host memory: lost to the pool, never handed out twice
      }
    }
  }

  /**
   * @brief Hands back what graphs that are gone held: the blocks of their retired slots, and
   * the slots of their captures still mapped (retired now). Cheap when no graph went since
   * the last call (one atomic exchange).
   */
  void collect_released_graphs()
  {
    if (graph_signal_->exchange(0, std::memory_order_acq_rel) == 0) { return; }
    std::vector<std::pair<char*, std::size_t>> blocks;
    {
      std::lock_guard<std::mutex> lock(graphs_mutex_);
      auto const gone = std::stable_partition(
        holds_.begin(), holds_.end(), [](auto const& h) { return !h->gone(); });
      for (auto it = gone; it != holds_.end(); ++it) {
        blocks.insert(blocks.end(), (*it)->blocks.begin(), (*it)->blocks.end());
        (*it)->blocks.clear();
      }
      holds_.erase(gone, holds_.end());
    }
    list_shared_untagged(blocks);
    retire_slots_of_gone_graphs();
  }

  /// Retires the slots of captures whose graphs are gone (a pinned one at a later call).
  void retire_slots_of_gone_graphs()
  {
    std::unique_lock<std::shared_mutex> lock(slots_mutex_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      auto* slot = it->second;
      if (slot->graph && slot->graph->gone()) {
        if (give_up_locked(*slot, /*only_if_idle=*/false)) {
          it = slots_.erase(it);
          continue;
        }
        graph_signal_->fetch_add(1, std::memory_order_relaxed);  // pinned: next time
      }
      ++it;
    }
  }

  /// Lists a block that only a device synchronization frees (caller holds orphan_mutex_).
  void orphan_locked(char* ptr, std::size_t size) noexcept
  {
    try {
      orphans_.insert(ptr, size, no_tag{}, chunk_start_test());
    } catch (...) {  // no host memory: lost to the pool, never handed out twice
    }
    orphan_bytes_.store(orphans_.free_bytes(), std::memory_order_relaxed);
  }

  /// Drops from every shared block's tag the fences known complete (after a sweep).
  void prune_shared_tags() noexcept
  {
    try {
      std::unordered_map<fence_cell const*, bool> known;  // one query per fence
      std::lock_guard<std::mutex> lock(shared_mutex_);
      shared_.for_each([&](char*, std::size_t, fence_tag& tag) {
        tag.needs.erase(std::remove_if(tag.needs.begin(),
                                       tag.needs.end(),
                                       [&](auto const& n) {
                                         auto [it, fresh] = known.try_emplace(n.first.get());
                                         if (fresh) { it->second = n.first->complete(n.second); }
                                         return it->second;
                                       }),
                        tag.needs.end());
      });
    } catch (...) {  // no host memory: the fences stay (waited on, never skipped)
    }
  }

  /// One line for the user about a refused free (off the hot path).
  [[gnu::cold, gnu::noinline]] void report_rejected(free_result r,
                                                    void* ptr,
                                                    std::size_t bytes) noexcept
  {
    char line[256];
    switch (r.status) {
      case free_status::size_mismatch:
        std::snprintf(line,
                      sizeof(line),
                      "StreamOrderedPoolMemoryResource: rejected free of %p: size mismatch: "
                      "allocated %zu bytes, freed with %zu; the pool is unchanged",
                      ptr,
                      r.allocated_bytes,
                      bytes);
        break;
      case free_status::foreign_stream:
        std::snprintf(line,
                      sizeof(line),
                      "StreamOrderedPoolMemoryResource: rejected free of %p (%zu bytes): the "
                      "stream belongs to another device; the pool is unchanged",
                      ptr,
                      bytes);
        break;
      default:
        std::snprintf(line,
                      sizeof(line),
                      "StreamOrderedPoolMemoryResource: rejected free of %p (%zu bytes): double "
                      "free or foreign pointer (not a live block of this pool); the pool is "
                      "unchanged",
                      ptr,
                      bytes);
        break;
    }
    platform_.report_rejected_free(line);
  }

  [[nodiscard]] static bool valid_request(std::size_t bytes, std::size_t alignment) noexcept
  {
    return bytes <= max_request && alignment != 0 && (alignment & (alignment - 1)) == 0 &&
           alignment <= max_alignment;
  }

  [[noreturn]] void reject_request(std::size_t bytes, std::size_t alignment)
  {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > max_alignment) {
      throw std::invalid_argument(
        "StreamOrderedPoolMemoryResource: alignment must be a power of two from 1 to " +
        std::to_string(max_alignment) + " (1 GiB), got " + std::to_string(alignment));
    }
    Platform::throw_out_of_memory(bytes, pool_bytes_.load(std::memory_order_relaxed));
  }

  /// Finds the live block `key` in a slot other than `self` (one slot lock at a time) or
  /// among retired slots' live blocks and, when `bytes` matches, forgets it there.
  free_result take_live_elsewhere(slot_type const* self, std::uintptr_t key, std::size_t bytes)
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    auto try_slot = [&](slot_type& slot, free_result& out) {
      if (&slot == self) { return false; }
      std::lock_guard<spin_mutex> slot_lock(slot.mutex);
      auto const i = slot.live.find_index(key);
      if (i == slot.live.npos) { return false; }
      if (slot.live.value_at(i) != bytes) {
        out = {free_status::size_mismatch, slot.live.value_at(i)};
      } else {
        slot.live.erase_at(i);
        out = {free_status::done, 0};
      }
      return true;
    };
    free_result out{free_status::not_live, 0};
    for (auto& [id, slot] : slots_) {
      if (try_slot(*slot, out)) { return out; }
    }
    for (auto* slot : retiring_) {
      if (try_slot(*slot, out)) { return out; }
    }
    std::lock_guard<std::mutex> orphan_lock(orphan_mutex_);
    if (auto const i = orphan_live_.find_index(key); i != orphan_live_.npos) {
      if (orphan_live_.value_at(i) != bytes) {
        return {free_status::size_mismatch, orphan_live_.value_at(i)};
      }
      orphan_live_.erase_at(i);
      return {free_status::done, 0};
    }
    return out;
  }

  /// A free with no slot to cache it in (no host memory for one): the block becomes an
  /// orphan, which only a device synchronization frees.
  free_result free_without_slot(void* ptr, std::uintptr_t key, std::size_t bytes) noexcept
  {
    auto const r = take_live_elsewhere(nullptr, key, bytes);
    if (r.status != free_status::done) {
      rejected_frees_.fetch_add(1, std::memory_order_relaxed);
      return r;
    }
    auto const size = round_to_granule(bytes);
    add_current(-static_cast<std::int64_t>(size));
    std::lock_guard<std::mutex> lock(orphan_mutex_);
    orphan_locked(static_cast<char*>(ptr), size);
    return {};
  }

  /// Lists `ptr` as handed out on `slot` (caller holds slot.mutex). May throw bad_alloc.
  static void track(slot_type& slot, char* ptr, std::size_t bytes)
  { slot.live.insert_or_assign(reinterpret_cast<std::uintptr_t>(ptr), bytes); }

  /// Counts an allocation made on a slower path straight into the pool's totals.
  void* account(void* ptr, std::size_t size) noexcept
  {
    add_current(static_cast<std::int64_t>(size));
    return ptr;
  }

  void add_current(std::int64_t delta) noexcept
  {
    auto const now = current_bytes_.fetch_add(delta, std::memory_order_relaxed) + delta;
    auto peak      = peak_bytes_.load(std::memory_order_relaxed);
    while (now > 0 && static_cast<std::size_t>(now) > peak &&
           !peak_bytes_.compare_exchange_weak(
             peak, static_cast<std::size_t>(now), std::memory_order_relaxed)) {}
  }

  /// Adds a slot's balance to the pool's totals (caller holds slot.mutex).
  void settle(slot_type& slot) noexcept
  {
    if (slot.balance != 0) {
      add_current(slot.balance);
      slot.balance = 0;
    }
  }

  /**
   * @brief The same-stream path: the stream's last frees, then its free list. `stale` when
   * the slot was retired since `ref` was taken (nothing done); on a miss, pins the slot when
   * asked (the caller's slower path then holds it).
   */
  void* from_cache(slot_ref ref,
                   std::size_t bytes,
                   std::size_t size,
                   std::size_t align,
                   bool pin_on_miss,
                   bool& stale,
                   std::size_t* loose_fit = nullptr)
  {
    auto& slot = *ref.slot;
    std::lock_guard<spin_mutex> lock(slot.mutex);
    if (slot.incarnation != ref.incarnation || slot.retiring) {
      stale = true;
      return nullptr;
    }
    ++slot.uses;
    char* ptr = take_recent(slot, size, align);
    if (ptr == nullptr) {
      // A loose fit (its split would leave more than the request) is left to the caller, who
      // looks for a tighter shared block that needs no wait first, keeping big blocks whole.
      auto const tight = loose_fit == nullptr ? SIZE_MAX : 2 * size;
      std::size_t fit  = 0;
      ptr              = slot.cache.take_best_fit_within(size, align, tight, fit).ptr;
      if (ptr == nullptr && slot.recent_count > 0) {  // none fits, or only loosely
        flush_recent(slot);
        ptr = slot.cache.take_best_fit_within(size, align, tight, fit).ptr;
      }
      if (ptr == nullptr && fit != 0 && loose_fit != nullptr) { *loose_fit = fit; }
    }
    if (ptr == nullptr) {
      if (pin_on_miss) { ++slot.pins; }
      return nullptr;
    }
    return hand_out_cached(slot, ptr, bytes, size);
  }

  /// Takes the best fit of `slot`'s cache (whatever its size) for a caller that holds a pin.
  void* take_cached_best_fit(slot_type& slot,
                             std::size_t bytes,
                             std::size_t size,
                             std::size_t align)
  {
    std::lock_guard<spin_mutex> lock(slot.mutex);
    flush_recent(slot);
    char* ptr = slot.cache.take_best_fit(size, align).ptr;
    return ptr == nullptr ? nullptr : hand_out_cached(slot, ptr, bytes, size);
  }

  /// Hands out `ptr` (`size` bytes taken from `slot`'s cache; caller holds slot.mutex).
  void* hand_out_cached(slot_type& slot, char* ptr, std::size_t bytes, std::size_t size)
  {
    try {
      track(slot, ptr, bytes);
    } catch (...) {
      try {
        slot.cache.insert(ptr, size, no_tag{}, chunk_start_test());
      } catch (...) {  // unlisted: lost to the pool, never handed out twice
      }
      throw;
    }
    ++slot.same_stream_hits;
    slot.balance += static_cast<std::int64_t>(size);
    if (slot.balance >= accounting_batch) { settle(slot); }
    return ptr;
  }

  auto chunk_start_test()
  {
    return [this](char* p) {
      std::shared_lock<std::shared_mutex> lock(chunks_mutex_);
      return chunks_.count(p) > 0;
    };
  }

  /// An exact-size block of the last frees at `align`, or nullptr (caller holds slot.mutex).
  static char* take_recent(slot_type& slot, std::size_t size, std::size_t align) noexcept
  {
    for (std::size_t i = slot.recent_count; i-- > 0;) {
      auto const [ptr, n] = slot.recent[i];
      if (n == size && reinterpret_cast<std::uintptr_t>(ptr) % align == 0) {
        slot.recent[i] = slot.recent[--slot.recent_count];
        slot.recent_bytes -= n;
        return ptr;
      }
    }
    return nullptr;
  }

  /// Moves the last frees into the stream's free list, coalescing them (caller holds
  /// slot.mutex). A block that cannot be listed (no host memory) stays in `recent`.
  void flush_recent(slot_type& slot) noexcept
  {
    while (slot.recent_count > 0) {
      auto const [ptr, n] = slot.recent[slot.recent_count - 1];
      try {
        slot.cache.insert(ptr, n, no_tag{}, chunk_start_test());
      } catch (...) {
        return;
      }
      --slot.recent_count;
      slot.recent_bytes -= n;
    }
  }

  /// True when the free just cached on `slot` fences its cache (caller holds slot.mutex).
  [[nodiscard]] bool should_fence(slot_type& slot) const noexcept
  {
    if (slot.frees < young_frees) {
      ++slot.frees;
      return true;
    }
    if (slot.fence_requested.load(std::memory_order_relaxed)) { return true; }
    // Counted in cached blocks, not frees: a stream that reuses its blocks never fences.
    if (slot.cache.block_count() + slot.recent_count >= fence_batch) { return true; }
    // The byte rule holds only while other streams want this one's bytes (`request_fences`,
    // until it takes back a block it fenced for nobody): a stream that reuses its own big
    // block, and that no other stream waits for, never fences it.
    if (!slot.demanded.load(std::memory_order_relaxed)) { return false; }
    auto const pool   = pool_bytes_.load(std::memory_order_relaxed);
    auto const cached = slot.cache.free_bytes() + slot.recent_bytes;
    return cached >= std::max<std::size_t>(pool / fence_fraction, 1);
  }

  /// Records `slot`'s fence on `stream` and moves its cache to the shared list (called with
  /// `slot.mutex` held through `lock`, which it releases). Skipped during capture.
  void fence_and_share(slot_type& slot, stream_type stream, std::unique_lock<spin_mutex>& lock)
  {
    flush_recent(slot);
    if (slot.cache.empty() || platform_.is_capturing(stream)) { return; }
    // No fence: the blocks stay in the cache, usable by this stream.
    auto const number = record_fence(slot, stream);
    if (!number) { return; }
    slot.fence_requested.store(false, std::memory_order_relaxed);
    auto blocks = slot.cache.take_all();
    auto owner  = slot.cell;
    lock.unlock();
    std::lock_guard<std::mutex> shared_lock(shared_mutex_);
    for (auto& b : blocks) {
      fence_tag tag;
      tag.needs.emplace_back(owner, *number);
      shared_.insert(b.ptr, b.size, std::move(tag), chunk_start_test());
    }
  }

  /// Fences `slot`'s cache (blocks freed on `stream`) into the shared list, where the stream
  /// takes them back without a wait; true when it moved any (not in capture).
  bool share_own_cache(slot_type& slot, stream_type stream)
  {
    std::unique_lock<spin_mutex> lock(slot.mutex);
    if (slot.recent_count == 0 && slot.cache.empty()) { return false; }
    fence_and_share(slot, stream, lock);
    return !lock.owns_lock();  // fence_and_share unlocks once it moved the blocks
  }

  /// Records `slot`'s fence on `stream` (after the work queued there); its number, or none
  /// when no fence could be created or recorded (caller holds slot.mutex or a pin).
  std::optional<std::uint64_t> record_fence(slot_type& slot, stream_type stream) noexcept
  {
    auto& cell = *slot.cell;
    std::lock_guard<std::mutex> fence_lock(cell.mutex);
    if (!cell.event.has_value()) {
      try {
        cell.event = platform_.acquire_fence();
      } catch (...) {
        return std::nullopt;
      }
      events_.fetch_add(1, std::memory_order_relaxed);
    }
    if (!platform_.record(*cell.event, stream)) { return std::nullopt; }
    fences_.fetch_add(1, std::memory_order_relaxed);
    return ++cell.number;
  }

  /// Takes a block from the shared list for `slot`'s stream (pinned), enqueuing the fence
  /// waits it needs. With `below`, only a block smaller than that, and only one that needs no
  /// wait (the caller's alternative is a block of the stream's own cache).
  void* take_shared(slot_type& slot,
                    stream_type stream,
                    std::size_t bytes,
                    std::size_t size,
                    std::size_t align,
                    std::size_t below = SIZE_MAX)
  {
    typename free_list<fence_tag>::block b;
    {
      std::lock_guard<std::mutex> lock(shared_mutex_);
      b = shared_.take_best_fit(size, align, below);
    }
    if (b.ptr == nullptr) { return nullptr; }
    auto waits = needed_waits(slot, b.tag);
    if (!waits.empty() && below != SIZE_MAX) {  // the stream's own loose fit needs no wait
      put_back_shared(b);
      return nullptr;
    }
    if (!waits.empty()) {
      // In capture no wait can be enqueued (it would join the graph); a block whose fences a
      // query finds complete needs none. Without this, a freed block coalesced with tagged
      // neighbours is lost to every capture, and each capture on a new stream grows the pool.
      bool const capturing = platform_.is_capturing(stream);
      bool cross_stream    = true;
      if (capturing ? !all_complete(waits) : !enqueue_waits(slot, stream, waits)) {
        put_back_shared(b);
        if (!capturing) { return nullptr; }
        // The capture cannot wait for the best fit: a block further on may need no wait.
        b = take_shared_needing_no_wait(slot, size, align, cross_stream);
        if (b.ptr == nullptr) { return nullptr; }
      }
      if (cross_stream) { cross_stream_reuse_.fetch_add(1, std::memory_order_relaxed); }
    }
    // Only its own fence guards the block: it takes back bytes it fenced that nobody took.
    bool const own_only = !b.tag.needs.empty() &&
                          std::all_of(b.tag.needs.begin(), b.tag.needs.end(), [&](auto const& n) {
                            return n.first == slot.cell;
                          });
    try {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      track(slot, b.ptr, bytes);
    } catch (...) {
      put_back_shared(b);
      throw;
    }
    // Nobody needed what it fenced: stop fencing its bytes eagerly.
    if (own_only) { slot.demanded.store(false, std::memory_order_relaxed); }
    return account(b.ptr, b.size);
  }

  /// True when a query finds the work before each needed fence record complete (a query is
  /// allowed in capture in relaxed mode; a failed query is not complete).
  bool all_complete(std::vector<std::pair<cell_ptr, std::uint64_t>> const& waits) noexcept
  {
    [[maybe_unused]] auto relaxed = platform_.relax();
    return std::all_of(
      waits.begin(), waits.end(), [](auto const& w) { return w.first->complete(w.second); });
  }

  /// Lists `b`, taken from the shared list and not handed out, there again.
  void put_back_shared(typename free_list<fence_tag>::block& b)
  {
    std::lock_guard<std::mutex> lock(shared_mutex_);
    shared_.insert(b.ptr, b.size, std::move(b.tag), chunk_start_test());
  }

  /**
   * @brief For a capture whose best fit needs a wait: the first shared block, among the
   * `capture_fit_candidates` best fits (that one included), that needs none (each fence it
   * carries is the stream's own, waited on already, or found complete by a query; no wait can
   * be enqueued in capture). `cross_stream` tells whether it needed another stream's fence.
   */
  typename free_list<fence_tag>::block take_shared_needing_no_wait(slot_type& slot,
                                                                   std::size_t size,
                                                                   std::size_t align,
                                                                   bool& cross_stream)
  {
    std::unordered_map<std::uint64_t, std::uint64_t> waited;
    {
      std::lock_guard<spin_mutex> lock(slot.mutex);  // not held with the shared list's
      waited = slot.waited;
    }
    [[maybe_unused]] auto relaxed = platform_.relax();  // queries are allowed in relaxed mode
    std::lock_guard<std::mutex> lock(shared_mutex_);    // shared -> fence
    return shared_.take_best_fit_if(size, align, capture_fit_candidates, [&](fence_tag const& tag) {
      bool queried = false;
      for (auto const& [cell, number] : tag.needs) {
        if (ordered_for(slot, waited, cell, number)) { continue; }
        if (!cell->complete(number)) { return false; }
        queried = true;
      }
      cross_stream = queried;
      return true;
    });
  }

  /// True when `slot`'s stream needs no wait for record `number` of `cell`: its own fence, or
  /// one it waited on at that record or a later one (`waited`: the slot's, or a copy).
  static bool ordered_for(slot_type const& slot,
                          std::unordered_map<std::uint64_t, std::uint64_t> const& waited,
                          cell_ptr const& cell,
                          std::uint64_t number) noexcept
  {
    if (!cell || cell == slot.cell) { return true; }
    auto it = waited.find(cell->serial);
    return it != waited.end() && it->second >= number;
  }

  /// The (fence, record number) pairs of `tag` that `slot`'s stream has not waited on yet.
  std::vector<std::pair<cell_ptr, std::uint64_t>> needed_waits(slot_type& slot,
                                                               fence_tag const& tag)
  {
    std::vector<std::pair<cell_ptr, std::uint64_t>> out;
    std::lock_guard<spin_mutex> lock(slot.mutex);
    for (auto const& [cell, number] : tag.needs) {
      if (!ordered_for(slot, slot.waited, cell, number)) { out.emplace_back(cell, number); }
    }
    return out;
  }

  /// Enqueues on `stream` a wait for each fence's latest record (at least the needed number).
  bool enqueue_waits(slot_type& slot,
                     stream_type stream,
                     std::vector<std::pair<cell_ptr, std::uint64_t>> const& waits)
  {
    for (auto const& [cell, number] : waits) {
      std::uint64_t recorded = 0;
      {
        std::lock_guard<std::mutex> fence_lock(cell->mutex);
        if (!cell->event.has_value() || !platform_.device_wait(stream, *cell->event)) {
          return false;
        }
        recorded = cell->number;
      }
      stream_waits_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<spin_mutex> lock(slot.mutex);
      if (slot.waited.size() >= waited_capacity && slot.waited.count(cell->serial) == 0) {
        slot.waited.clear();  // forgotten waits are only repeated
      }
      auto& seen = slot.waited[cell->serial];
      seen       = std::max(seen, recorded);
    }
    return true;
  }

  /// Asks every other stream with cached blocks to fence them at its next call, and to fence
  /// its big frees from now on.
  void request_fences(slot_type& self)
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    for (auto& [id, slot] : slots_) {
      if (slot == &self) { continue; }
      slot->fence_requested.store(true, std::memory_order_relaxed);
      bool holds = false;
      {
        std::lock_guard<spin_mutex> slot_lock(slot->mutex);
        holds = slot->recent_count > 0 || !slot->cache.empty();
      }
      if (holds) { slot->demanded.store(true, std::memory_order_relaxed); }
    }
  }

  /**
   * @brief Grows the pool by one chunk and allocates from it (smaller on upstream failure,
   * down to the request).
   *
   * Chunks are multiples of `growth_granularity`, at least the request. Below
   * `small_pool_bytes` the pool doubles, from the first request (rmm's pool's rule). From
   * there, a request of at least 1/`big_request_fraction` of the pool gets a chunk of its own
   * size (a training step's logits: doubling a large pool for one block held about the pool's
   * size again); a smaller one grows the pool by half, by at most `default_growth_limit` (the
   * last growth leaves at most a third of the pool, and at most 512 MiB, unused, where
   * doubling leaves half). With `maximum_growth_size` the chunk is
   * the larger of the request and min(pool size or `small_pool_bytes` at first,
   * maximum_growth_size). In capture the growth beyond the request is at most
   * `small_pool_bytes`. With `maximum_pool_size`, a growth that would leave less room than it
   * takes takes all the room left.
   *
   * The chunk comes from the upstream on `stream`: the carved block is ordered for `stream`
   * and the rest is listed with a fence of `stream` recorded after the upstream call (in
   * `slot`'s cache when no fence can be recorded). While `stream` is captured, the chunk comes
   * on the pool's own stream, which is synchronized; the rest is then listed untagged.
   */
  void* grow(
    slot_type& slot, stream_type stream, std::size_t bytes, std::size_t size, std::size_t align)
  {
    std::lock_guard<std::mutex> growth_lock(growth_mutex_);
    // Another thread may have grown while this one waited.
    if (void* ptr = take_shared(slot, stream, bytes, size, align); ptr != nullptr) { return ptr; }
    auto const need = size + (align > pool_granularity ? align : 0);
    auto const held = pool_bytes_.load(std::memory_order_relaxed);
    auto const room = maximum_pool_size_
                        ? (*maximum_pool_size_ > held ? *maximum_pool_size_ - held : std::size_t{0})
                        : SIZE_MAX;
    if (need > room) { return nullptr; }
    // cudaMalloc would invalidate a global-mode capture; a stream sync is allowed in relaxed
    // mode on a stream that is not captured.
    [[maybe_unused]] auto relaxed = platform_.relax();
    bool const capturing          = platform_.is_capturing(stream);
    std::size_t step              = 0;
    if (maximum_growth_size_) {
      step = std::min(held == 0 ? small_pool_bytes : held, *maximum_growth_size_);
    } else {
      // Doubling below small_pool_bytes (rmm's pool's rule), then a big request alone, else
      // half the pool, at most default_growth_limit.
      auto const rule = held < small_pool_bytes ? held
                        : need >= held / big_request_fraction
                          ? 0
                          : std::min(held / growth_divisor, default_growth_limit);
      step =
        (std::max(need, rule) + growth_granularity - 1) / growth_granularity * growth_granularity;
    }
    // A capture needs a few blocks: its growth does not double the pool (doubling once per
    // capture on a new stream, CuPy's graph-test pattern, reached 16 GiB in 10 captures).
    if (capturing) { step = std::min(step, small_pool_bytes); }
    auto chunk = std::min(room, std::max(need, step));
    // A bounded pool whose growth would leave less room than it takes takes all of it: the
    // remainder, a chunk apart, could never serve a block as large as this one.
    if (maximum_pool_size_ && !capturing && room - chunk < chunk) { chunk = room; }
    chunk         = round_to_granule(chunk);
    auto const on = capturing ? platform_.private_stream() : stream;
    while (true) {
      char* ptr = nullptr;
      try {
        ptr = static_cast<char*>(upstream_.allocate(on, chunk, pool_granularity));
      } catch (typename Platform::out_of_memory const&) {
        if (chunk <= need) { return nullptr; }
        chunk = round_to_granule(std::max(need, chunk / 2));
        continue;
      }
      growths_.fetch_add(1, std::memory_order_relaxed);
      if (capturing) {
        if (!platform_.sync_stream(on)) {
          upstream_.deallocate(on, ptr, chunk, pool_granularity);
          return nullptr;
        }
        return add_chunk(ptr, chunk, size, align, fence_tag{}, nullptr, &slot, bytes);
      }
      fence_tag tag;
      if (chunk > size) {  // a rest to list (alignment padding included)
        auto const number = record_fence(slot, stream);
        if (!number) {  // no fence: the rest stays usable by this stream only
          return add_chunk(ptr, chunk, size, align, fence_tag{}, &slot, &slot, bytes);
        }
        tag.needs.emplace_back(slot.cell, *number);
      }
      return add_chunk(ptr, chunk, size, align, std::move(tag), nullptr, &slot, bytes);
    }
  }

  /**
   * @brief Registers a new chunk. With `user_slot`, carves `size` at `align` from its start
   * for that slot's stream (listed in its live blocks with `bytes`); lists the rest with `tag`
   * in the shared list, or in `rest_slot`'s cache when given.
   */
  char* add_chunk(char* ptr,
                  std::size_t chunk,
                  std::size_t size,
                  std::size_t align,
                  fence_tag const& tag,
                  slot_type* rest_slot,
                  slot_type* user_slot = nullptr,
                  std::size_t bytes    = 0)
  {
    {
      std::unique_lock<std::shared_mutex> lock(chunks_mutex_);
      chunks_.emplace(ptr, chunk);
    }
    pool_bytes_.fetch_add(chunk, std::memory_order_relaxed);
    char* user = nullptr;
    if (user_slot != nullptr) {
      auto const a = reinterpret_cast<std::uintptr_t>(ptr);
      user         = reinterpret_cast<char*>((a + align - 1) / align * align);
    }
    std::pair<char*, std::size_t> rest[2];
    std::size_t parts = 0;
    if (user == nullptr) {
      rest[parts++] = {ptr, chunk};
    } else {
      if (user > ptr) { rest[parts++] = {ptr, static_cast<std::size_t>(user - ptr)}; }
      if (user + size < ptr + chunk) {
        rest[parts++] = {user + size, static_cast<std::size_t>(ptr + chunk - (user + size))};
      }
    }
    if (rest_slot != nullptr) {
      std::lock_guard<spin_mutex> lock(rest_slot->mutex);
      for (std::size_t i = 0; i < parts; ++i) {
        rest_slot->cache.insert(rest[i].first, rest[i].second, no_tag{}, chunk_start_test());
      }
    } else {
      std::lock_guard<std::mutex> lock(shared_mutex_);
      for (std::size_t i = 0; i < parts; ++i) {
        shared_.insert(rest[i].first, rest[i].second, tag, chunk_start_test());
      }
    }
    if (user == nullptr) { return nullptr; }
    {
      std::lock_guard<spin_mutex> lock(user_slot->mutex);
      track(*user_slot, user, bytes);
    }
    return static_cast<char*>(account(user, size));
  }

  /// `reclaim_after`'s body (see there).
  template <typename Synchronize>
  bool reclaim(Synchronize&& synchronize)
  {
    // One reclaim at a time: a second one would find everything detached by the first and
    // raise out-of-memory while the first still holds the blocks. It waits, then syncs again.
    std::lock_guard<std::mutex> reclaim_lock(reclaim_mutex_);
    struct detached_cache {
      slot_type* slot;
      std::uint64_t incarnation;
      std::vector<std::pair<char*, std::size_t>> blocks;
    };
    std::vector<detached_cache> caches;
    std::vector<typename free_list<fence_tag>::block> fenced;
    std::vector<typename free_list<no_tag>::block> orphaned;
    {
      std::shared_lock<std::shared_mutex> lock(slots_mutex_);
      caches.reserve(slots_.size() + retiring_.size());
      auto detach = [&](slot_type* slot) {
        detached_cache d{slot, 0, {}};
        std::lock_guard<spin_mutex> slot_lock(slot->mutex);
        if (slot->graph) { return; }  // a graph's: no sync orders its later launches
        d.incarnation = slot->incarnation;
        d.blocks.reserve(slot->recent_count + slot->cache.block_count());
        for (std::size_t i = 0; i < slot->recent_count; ++i) {
          d.blocks.push_back(slot->recent[i]);
        }
        slot->recent_count = 0;
        slot->recent_bytes = 0;
        for (auto& b : slot->cache.take_all()) {
          d.blocks.emplace_back(b.ptr, b.size);
        }
        if (!d.blocks.empty()) { caches.push_back(std::move(d)); }
      };
      for (auto& [id, slot] : slots_) {
        detach(slot);
      }
      for (auto* slot : retiring_) {
        detach(slot);
      }
    }
    {
      std::lock_guard<std::mutex> lock(orphan_mutex_);
      orphaned = orphans_.take_all();
      orphan_bytes_.store(0, std::memory_order_relaxed);
    }
    {
      std::lock_guard<std::mutex> lock(shared_mutex_);
      for (auto& b : shared_.take_all()) {
        if (b.tag.needs.empty()) {
          shared_.insert(b.ptr, b.size, fence_tag{}, chunk_start_test());
        } else {
          fenced.push_back(std::move(b));
        }
      }
    }
    bool const synced = synchronize();  // failing, it changes nothing
    if (synced) { reclaim_syncs_.fetch_add(1, std::memory_order_relaxed); }
    {
      std::lock_guard<std::mutex> lock(shared_mutex_);
      for (auto& b : fenced) {
        shared_.insert(b.ptr, b.size, synced ? fence_tag{} : std::move(b.tag), chunk_start_test());
      }
      if (synced) {
        for (auto const& d : caches) {
          for (auto const& [p, n] : d.blocks) {
            shared_.insert(p, n, fence_tag{}, chunk_start_test());
          }
        }
        for (auto const& b : orphaned) {
          shared_.insert(b.ptr, b.size, fence_tag{}, chunk_start_test());
        }
      }
    }
    if (!synced) {
      std::vector<std::pair<char*, std::size_t>> homeless;
      for (auto const& d : caches) {
        std::lock_guard<spin_mutex> slot_lock(d.slot->mutex);
        bool const same = d.slot->incarnation == d.incarnation;
        for (auto const& [p, n] : d.blocks) {
          if (same) {
            d.slot->cache.insert(p, n, no_tag{}, chunk_start_test());
          } else {
            homeless.emplace_back(p, n);  // its slot was retired meanwhile
          }
        }
      }
      std::lock_guard<std::mutex> lock(orphan_mutex_);
      for (auto const& b : orphaned) {
        orphan_locked(b.ptr, b.size);
      }
      for (auto const& [p, n] : homeless) {
        orphan_locked(p, n);
      }
    }
    return synced;
  }

  /// Takes out of the shared list and the chunk registry every chunk it holds whole.
  std::vector<typename free_list<fence_tag>::block> take_whole_chunks()
  {
    std::vector<typename free_list<fence_tag>::block> whole;
    std::lock_guard<std::mutex> shared_lock(shared_mutex_);
    std::unique_lock<std::shared_mutex> chunks_lock(chunks_mutex_);
    std::vector<char*> starts;
    shared_.for_each([&](char* p, std::size_t n, fence_tag&) {
      if (auto it = chunks_.find(p); it != chunks_.end() && it->second == n) {
        starts.push_back(p);
      }
    });
    for (char* p : starts) {
      whole.push_back(shared_.take(p));
      pool_bytes_.fetch_sub(chunks_[p], std::memory_order_relaxed);
      chunks_.erase(p);
    }
    return whole;
  }

  /// A chunk taken by `take_whole_chunks` and kept: registered and listed again.
  void add_back_chunk(typename free_list<fence_tag>::block& b)
  {
    {
      std::unique_lock<std::shared_mutex> lock(chunks_mutex_);
      chunks_.emplace(b.ptr, b.size);
    }
    pool_bytes_.fetch_add(b.size, std::memory_order_relaxed);
    put_back_shared(b);
  }

  /// At shutdown: forgets the chunks that hold blocks of graphs that may still replay.
  void collect_graph_chunks_to_keep() noexcept
  {
    auto keep = [&](char* p) {
      auto it = chunks_.upper_bound(p);
      if (it != chunks_.begin()) { chunks_.erase(std::prev(it)); }
    };
    for (auto const& hold : holds_) {
      if (hold->gone()) { continue; }
      for (auto const& b : hold->blocks) {
        keep(b.first);
      }
    }
    for (auto& slot : all_slots_) {
      if (!slot->graph || slot->graph->gone()) { continue; }
      for (std::size_t i = 0; i < slot->recent_count; ++i) {
        keep(slot->recent[i].first);
      }
      slot->cache.for_each([&](char* p, std::size_t, no_tag&) { keep(p); });
    }
  }

  /// At shutdown: the pool's own stream waits on every fence of the shared list.
  void wait_on_every_fence() noexcept
  {
    try {
      [[maybe_unused]] auto relaxed = platform_.relax();
      auto const stream             = platform_.private_stream();
      shared_.for_each([&](char*, std::size_t, fence_tag& tag) { (void)wait_on_tag(stream, tag); });
    } catch (...) {  // no stream to wait on: the chunks go back unordered, as they would
    }
  }

  /// At shutdown: every chunk registered goes back upstream on the pool's own stream.
  void return_chunks() noexcept
  {
    try {
      [[maybe_unused]] auto relaxed = platform_.relax();
      auto const stream             = platform_.private_stream();
      for (auto& [ptr, size] : chunks_) {
        upstream_.deallocate(stream, ptr, size, pool_granularity);
      }
    } catch (...) {  // no stream: the chunks are left to the upstream's own teardown
    }
    platform_.destroy_private_stream();
  }

  /// Enqueues on `stream` a wait on each fence of `tag` (false when one cannot be enqueued).
  bool wait_on_tag(stream_type stream, fence_tag const& tag) noexcept
  {
    for (auto const& [cell, number] : tag.needs) {
      std::lock_guard<std::mutex> fence_lock(cell->mutex);
      if (!cell->event.has_value() || !platform_.device_wait(stream, *cell->event)) {
        return false;
      }
      stream_waits_.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
  }

  Platform platform_;
  Upstream upstream_;
  std::optional<std::size_t> maximum_pool_size_;
  std::optional<std::size_t> maximum_growth_size_;
  std::uint64_t const pool_key_;        // names this pool in threads' slot caches (never reused)
  std::uint64_t const default_id_;      // the default stream's identity (never swept)
  bool release_events_{true};           // false after a shutdown at process exit
  std::atomic<std::int64_t> events_{};  // events held by fences (declared before their holders)

  // Slots: `slots_` maps the identities in use; `retiring_` holds slots that retire_stream
  // took out while a call still held them; `spare_` retired objects for new streams;
  // `all_slots_` owns every object (for the pool's life: a stale reference may still lock).
  mutable std::shared_mutex slots_mutex_;
  std::unordered_map<std::uint64_t, slot_type*> slots_;
  std::vector<slot_type*> retiring_;
  std::vector<slot_type*> spare_;
  std::vector<std::unique_ptr<slot_type>> all_slots_;
  std::size_t sweep_bound_{slot_sweep_minimum};
  std::uint64_t incarnations_{};
  std::uint64_t next_serial_{1};

  std::mutex shared_mutex_;
  free_list<fence_tag> shared_;

  // Blocks and live blocks of retired slots: the blocks only a device sync frees.
  std::mutex orphan_mutex_;
  free_list<no_tag> orphans_;
  pointer_map<std::size_t> orphan_live_{64};
  std::atomic<std::size_t> orphan_bytes_{};

  // Graphs: holds of retired captured slots that still keep blocks; the signal the user
  // objects' callbacks bump (shared: a callback may run after the pool is gone).
  std::mutex graphs_mutex_;
  std::vector<std::shared_ptr<graph_hold>> holds_;
  std::shared_ptr<std::atomic<std::uint64_t>> graph_signal_{
    std::make_shared<std::atomic<std::uint64_t>>(0)};

  std::mutex growth_mutex_;
  std::mutex reclaim_mutex_;  // taken before any other lock, held through `synchronize()`
  mutable std::shared_mutex chunks_mutex_;
  std::map<char*, std::size_t> chunks_;

  std::atomic<std::int64_t> current_bytes_{};  // settled balances (exact after `stats`)
  std::atomic<std::size_t> peak_bytes_{};
  std::atomic<std::size_t> pool_bytes_{};
  std::atomic<std::uint64_t> cross_stream_reuse_{};
  std::atomic<std::uint64_t> growths_{};
  std::atomic<std::uint64_t> fences_{};
  std::atomic<std::uint64_t> stream_waits_{};
  std::atomic<std::uint64_t> reclaim_syncs_{};
  std::atomic<std::uint64_t> retired_count_{};
  std::atomic<std::uint64_t> rejected_frees_{};
  std::atomic<std::uint64_t> retired_hits_{};  // same-stream reuse of retired slots
};

}  // namespace rmm_fences::mr::detail
