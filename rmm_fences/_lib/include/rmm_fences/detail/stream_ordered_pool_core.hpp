/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of StreamOrderedPoolMemoryResource (DESIGN.md layer 1): no CUDA calls. The CUDA
 * build plugs in `cuda_pool_platform`; the CPU tests plug in manual fences and host memory.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmm_fences::mr {

/// Counters of a `stream_ordered_pool_memory_resource`.
struct stream_ordered_pool_stats {
  std::uint64_t current_bytes{};       ///< bytes allocated to users now
  std::uint64_t peak_bytes{};          ///< most bytes allocated to users at once
  std::uint64_t pool_bytes{};          ///< bytes held from the upstream
  std::uint64_t same_stream_reuse{};   ///< allocations served from the stream's own frees
  std::uint64_t cross_stream_reuse{};  ///< allocations that waited on another stream's fence
  std::uint64_t upstream_growths{};    ///< chunks taken from the upstream
  std::uint64_t fences{};              ///< fences recorded (one per batch of cached frees)
  std::uint64_t stream_waits{};        ///< stream-to-fence waits enqueued (no host sync)
  std::uint64_t reclaim_syncs{};       ///< device syncs before giving up (near out-of-memory)
  std::uint64_t retired_streams{};     ///< streams retired through `retire_stream`
};

}  // namespace rmm_fences::mr

namespace rmm_fences::detail {

/**
 * @brief The rules of the stream-ordered pool, over a platform and an upstream.
 *
 * `Platform` provides:
 *
 *   using stream_type; using fence_type; using out_of_memory;   // the upstream's exception
 *   [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t pool_bytes);
 *   std::uint64_t stream_id(stream_type) noexcept;             // identity, never reused
 *   fence_type create_fence(); void destroy_fence(fence_type) noexcept;
 *   bool record(fence_type, stream_type) noexcept;             // after work queued on stream
 *   bool stream_wait(stream_type waiter, fence_type) noexcept; // device-side wait, no host sync
 *   bool is_capturing(stream_type) noexcept;
 *   bool sync_device() noexcept;
 *   stream_type default_stream() noexcept;
 *   auto relax() noexcept;     // scope for calls not allowed in capture (growth, device sync)
 *
 * `Upstream`: `void* allocate(stream, bytes, alignment)`, `deallocate(...) noexcept`.
 *
 * Design (docs/stream_ordered_pool.md says the same for users):
 *
 *  - Every stream identity S has a slot. A block freed on S goes to S's *cache*, a free list
 *    that only S allocates from: stream order makes that reuse safe at once, with no CUDA call.
 *  - Fences are batched: S records one event (its slot's fence, re-recorded each time) when
 *    its cache holds `fence_batch` blocks or `pool_size / fence_fraction` bytes (so a stream
 *    that keeps reusing its own blocks never records one), when another
 *    stream asked for S's blocks, or when S is retired. Recording happens on a call that uses
 *    S, so S is alive. All of S's cached blocks then move to the shared list, tagged with
 *    (S, fence number).
 *  - A stream T takes a tagged block only after enqueuing `stream_wait(T, fence of S)`, unless T
 *    already waited on an equal or later fence of S. Waiting on a later record of S's fence is
 *    correct (it orders T after more of S's work), so one event per slot suffices.
 *  - Blocks of a stream destroyed without being retired stay in its cache: the pool never
 *    records on a stream it was not called with. `retire_stream(S)` fences S and hands its
 *    blocks to everyone. Right before out-of-memory, the pool synchronizes the device once and
 *    reclaims every cache; `release()` does the same and returns whole free chunks upstream.
 *  - Locks: each slot has its own mutex (the common path takes only the calling stream's);
 *    the shared list has one; growth from the upstream holds only `growth_mutex_`, never a
 *    lock another stream needs for its own blocks. Lock order: slot -> fence; shared -> chunks;
 *    no thread holds a slot's mutex and the shared list's at once.
 *  - During capture of the calling stream: no fence is recorded and no stream wait enqueued;
 *    allocation uses the stream's cache, untagged shared blocks, or upstream growth.
 */
template <typename Platform, typename Upstream>
class stream_ordered_pool_core {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;

  /// Cached blocks after which a stream's cache is fenced and shared.
  static constexpr std::size_t fence_batch = 32;
  /// Cached bytes (as a fraction of the pool) after which a stream's cache is fenced.
  static constexpr std::size_t fence_fraction = 16;
  /// Bytes a stream's allocation balance may drift before it is added to the pool's totals
  /// (so streams on different threads do not contend on one counter).
  static constexpr std::int64_t accounting_batch = std::int64_t{4} << 20;
  /// Frees per stream kept for exact-size reuse before they join the stream's free list.
  static constexpr std::size_t recent_capacity = 8;
  /// Size of the first chunk when no initial size is given.
  static constexpr std::size_t default_first_chunk = std::size_t{64} << 20;

  template <typename... PlatformArgs>
  stream_ordered_pool_core(Upstream upstream,
                           std::size_t initial_pool_size,
                           std::optional<std::size_t> maximum_pool_size,
                           PlatformArgs&&... platform_args)
    : platform_(std::forward<PlatformArgs>(platform_args)...),
      upstream_{std::move(upstream)},
      maximum_pool_size_{maximum_pool_size},
      generation_{next_generation()}
  {
    if (initial_pool_size > 0) {
      auto const size = round_to_granule(initial_pool_size);
      void* ptr       = upstream_.allocate(platform_.default_stream(), size, pool_granularity);
      add_chunk(static_cast<char*>(ptr), size, nullptr, 0);
    }
  }

  stream_ordered_pool_core(stream_ordered_pool_core const&)            = delete;
  stream_ordered_pool_core& operator=(stream_ordered_pool_core const&) = delete;

  /**
   * @brief Tears the pool down (single-threaded: only from the owner's destructor).
   *
   * With `device_alive`, returns every chunk to the upstream and destroys the fences; without
   * (process exit), forgets both without a call to the device or the upstream.
   */
  void shutdown(bool device_alive) noexcept
  {
    shared_.take_all();  // drops the shared list's references to slots
    for (auto& [id, slot] : slots_) {
      slot->cache.take_all();
      slot->recent_count = 0;
      if (!device_alive) { slot->fence.reset(); }
    }
    for (auto& slot : retired_) {
      slot->cache.take_all();
      slot->recent_count = 0;
      if (!device_alive) { slot->fence.reset(); }
    }
    slots_.clear();
    retired_.clear();
    if (device_alive) {
      for (auto& [ptr, size] : chunks_) {
        upstream_.deallocate(platform_.default_stream(), ptr, size, pool_granularity);
      }
    }
    chunks_.clear();
    pool_bytes_.store(0, std::memory_order_relaxed);
  }

  /**
   * @brief The same-stream path alone: a block freed earlier on `stream`, or nullptr.
   *
   * Makes no CUDA call but the stream identity query, never blocks, never grows the pool.
   */
  [[nodiscard]] void* try_allocate_cached(stream_type stream,
                                          std::size_t bytes,
                                          std::size_t alignment)
  {
    return from_cache(lookup(stream), round_to_granule(bytes),
                      std::max(alignment, pool_granularity));
  }

  /// Allocates `bytes` at `alignment` (at least the pool granularity) for use on `stream`.
  [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment)
  {
    auto const size  = round_to_granule(bytes);
    auto const align = std::max(alignment, pool_granularity);
    auto& slot       = lookup(stream);
    if (void* ptr = from_cache(slot, size, align); ptr != nullptr) { return ptr; }
    if (void* ptr = take_shared(slot, stream, size, align); ptr != nullptr) { return ptr; }
    request_fences(slot);
    if (void* ptr = grow(slot, stream, size, align); ptr != nullptr) { return ptr; }
    if (!platform_.is_capturing(stream) && reclaim()) {
      if (void* ptr = take_shared(slot, stream, size, align); ptr != nullptr) { return ptr; }
    }
    Platform::throw_out_of_memory(bytes, pool_bytes_.load(std::memory_order_relaxed));
  }

  /// Frees a block on `stream`: it is reusable on `stream` at once, elsewhere after a fence.
  void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t) noexcept
  {
    auto const size = round_to_granule(bytes);
    auto& slot      = lookup(stream);
    std::unique_lock<spin_mutex> lock(slot.mutex);
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
        return;
      }
    }
    if (should_fence(slot)) { fence_and_share(slot, stream, lock); }
  }

  /**
   * @brief Fences `stream` and hands its cached blocks to every stream; forgets the stream.
   *
   * Call before destroying a stream that freed blocks into the pool. Blocks freed on it later
   * are cached again under a new slot.
   */
  void retire_stream(stream_type stream)
  {
    auto const id = platform_.stream_id(stream);
    std::shared_ptr<slot_type> slot;
    {
      std::unique_lock<std::shared_mutex> lock(slots_mutex_);
      auto it = slots_.find(id);
      if (it == slots_.end()) { return; }
      slot = it->second;
      slots_.erase(it);
      generation_.store(next_generation(), std::memory_order_release);
      retired_.push_back(slot);
    }
    std::unique_lock<spin_mutex> lock(slot->mutex);
    fence_and_share(*slot, stream, lock);
    retired_count_.fetch_add(1, std::memory_order_relaxed);
  }

  /**
   * @brief Synchronizes the device, reclaims every cache and returns whole free chunks.
   *
   * While a capture prevents the synchronization, only chunks that no fence guards go back.
   * @return bytes returned to the upstream
   */
  std::size_t release()
  {
    reclaim();
    std::vector<std::pair<char*, std::size_t>> whole;
    {
      std::lock_guard<std::mutex> shared_lock(shared_mutex_);
      std::unique_lock<std::shared_mutex> chunks_lock(chunks_mutex_);
      for (auto const& [ptr, size] : chunks_) {
        whole.emplace_back(ptr, size);
      }
      std::vector<std::pair<char*, std::size_t>> free_whole;
      for (auto const& [ptr, size] : whole) {
        if (shared_holds_exactly(ptr, size)) { free_whole.emplace_back(ptr, size); }
      }
      for (auto const& [ptr, size] : free_whole) {
        shared_.take(ptr);
        chunks_.erase(ptr);
        pool_bytes_.fetch_sub(size, std::memory_order_relaxed);
      }
      whole.swap(free_whole);
    }
    std::size_t returned = 0;
    for (auto const& [ptr, size] : whole) {
      upstream_.deallocate(platform_.default_stream(), ptr, size, pool_granularity);
      returned += size;
    }
    return returned;
  }

  /// Bytes held from the upstream.
  [[nodiscard]] std::size_t pool_size() const noexcept
  {
    return pool_bytes_.load(std::memory_order_relaxed);
  }

  [[nodiscard]] std::optional<std::size_t> maximum_pool_size() const noexcept
  {
    return maximum_pool_size_;
  }

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
    for_each_slot([&](slot_type& slot) {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      settle(slot);
      same_stream += slot.same_stream_hits;
    });
    rmm_fences::mr::stream_ordered_pool_stats s;
    s.current_bytes      = static_cast<std::uint64_t>(current_bytes_.load(std::memory_order_relaxed));
    s.peak_bytes         = peak_bytes_.load(std::memory_order_relaxed);
    s.pool_bytes         = pool_bytes_.load(std::memory_order_relaxed);
    s.same_stream_reuse  = same_stream;
    s.cross_stream_reuse = cross_stream_reuse_.load(std::memory_order_relaxed);
    s.upstream_growths   = growths_.load(std::memory_order_relaxed);
    s.fences             = fences_.load(std::memory_order_relaxed);
    s.stream_waits       = stream_waits_.load(std::memory_order_relaxed);
    s.reclaim_syncs      = reclaim_syncs_.load(std::memory_order_relaxed);
    s.retired_streams    = retired_count_.load(std::memory_order_relaxed);
    return s;
  }

  /// Free blocks listed (in caches and shared), for tests: calls f(ptr, size, owner id or 0).
  template <typename F>
  void for_each_free_block(F&& f)
  {
    for_each_slot([&](slot_type& slot) {
      std::lock_guard<spin_mutex> slot_lock(slot.mutex);
      for (std::size_t i = 0; i < slot.recent_count; ++i) {
        f(slot.recent[i].first, slot.recent[i].second, slot.id);
      }
      slot.cache.for_each([&](char* p, std::size_t n, no_tag&) { f(p, n, slot.id); });
    });
    std::lock_guard<std::mutex> lock(shared_mutex_);
    shared_.for_each([&](char* p, std::size_t n, fence_tag&) { f(p, n, std::uint64_t{0}); });
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

  struct slot_type;

  /// The fences a user of a shared block must wait for: (slot, fence number) per stream.
  struct fence_tag {
    std::vector<std::pair<std::shared_ptr<slot_type>, std::uint64_t>> needs;

    static fence_tag merge(fence_tag a, fence_tag b)
    {
      for (auto& need : b.needs) {
        auto it = std::find_if(a.needs.begin(), a.needs.end(),
                               [&](auto const& n) { return n.first == need.first; });
        if (it == a.needs.end()) {
          a.needs.push_back(std::move(need));
        } else {
          it->second = std::max(it->second, need.second);
        }
      }
      return a;
    }
  };

  /// One stream identity: its cache of freed blocks and its fence (own cache lines: threads
  /// on different streams touch different slots).
  struct alignas(64) slot_type {
    slot_type(std::uint64_t stream_id, std::uint64_t serial_no, Platform* p)
      : id{stream_id}, serial{serial_no}, platform{p}
    {
    }
    ~slot_type()
    {
      if (fence.has_value()) { platform->destroy_fence(*fence); }
    }
    slot_type(slot_type const&)            = delete;
    slot_type& operator=(slot_type const&) = delete;

    std::uint64_t const id;
    std::uint64_t const serial;
    Platform* const platform;

    spin_mutex mutex;                     // guards the fields below
    free_list<no_tag> cache;              // freed on this stream since its last fence
    std::int64_t balance{};               // bytes allocated minus freed, not yet settled
    std::uint64_t same_stream_hits{};
    // The last few frees, kept as they are (no coalescing yet) for exact-size reuse without
    // touching the free list; part of the cache in every other respect (`flush_recent`).
    std::array<std::pair<char*, std::size_t>, recent_capacity> recent{};
    std::size_t recent_count{};
    std::size_t recent_bytes{};
    std::unordered_map<std::uint64_t, std::uint64_t> waited;  // other slot serial -> fence no.
    std::atomic<bool> fence_requested{};

    std::mutex fence_mutex;               // guards fence and fence_number (after `mutex`)
    std::optional<fence_type> fence;      // re-recorded at each fence of this stream
    std::uint64_t fence_number{};         // how many times it was recorded
  };

  /// Calls `f(slot)` for every slot, live or retired (a retired slot may still cache blocks
  /// freed during a capture or whose fence could not be recorded).
  template <typename F>
  void for_each_slot(F&& f)
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    for (auto& [id, slot] : slots_) {
      f(*slot);
    }
    for (auto& slot : retired_) {
      f(*slot);
    }
  }

  static std::uint64_t next_generation() noexcept
  {
    static std::atomic<std::uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }

  /// The slot of `stream`'s identity (created on first use). Hot path: a thread-local cache.
  slot_type& lookup(stream_type stream)
  {
    struct tls_entry {
      std::uint64_t generation;
      std::uint64_t id;
      slot_type* slot;
    };
    struct tls_cache {
      std::array<tls_entry, 8> entries;
      unsigned next_victim;
    };
    // One thread_local object: one TLS lookup per call. (The initial-exec model would save it,
    // but a module loaded after rmm and CuPy finds no static TLS left: the import fails.)
    static thread_local tls_cache cache{};

    auto const id  = platform_.stream_id(stream);
    auto const gen = generation_.load(std::memory_order_acquire);
    for (auto const& e : cache.entries) {
      if (e.generation == gen && e.id == id) { return *e.slot; }
    }
    slot_type* slot = nullptr;
    {
      std::shared_lock<std::shared_mutex> lock(slots_mutex_);
      if (auto it = slots_.find(id); it != slots_.end()) { slot = it->second.get(); }
    }
    if (slot == nullptr) {
      std::unique_lock<std::shared_mutex> lock(slots_mutex_);
      auto& entry = slots_[id];
      if (!entry) { entry = std::make_shared<slot_type>(id, next_serial_++, &platform_); }
      slot = entry.get();
    }
    cache.entries[cache.next_victim++ % cache.entries.size()] = {gen, id, slot};
    return *slot;
  }

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
           !peak_bytes_.compare_exchange_weak(peak, static_cast<std::size_t>(now),
                                              std::memory_order_relaxed)) {}
  }

  /// Adds a slot's balance to the pool's totals (caller holds slot.mutex).
  void settle(slot_type& slot) noexcept
  {
    if (slot.balance != 0) {
      add_current(slot.balance);
      slot.balance = 0;
    }
  }

  /// The same-stream path: the stream's last frees, then its free list.
  void* from_cache(slot_type& slot, std::size_t size, std::size_t align)
  {
    std::lock_guard<spin_mutex> lock(slot.mutex);
    char* ptr = take_recent(slot, size, align);
    if (ptr == nullptr) {
      auto b = slot.cache.take_best_fit(size, align);
      if (b.ptr == nullptr && slot.recent_count > 0) {
        flush_recent(slot);
        b = slot.cache.take_best_fit(size, align);
      }
      ptr = b.ptr;
    }
    if (ptr == nullptr) { return nullptr; }
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

  [[nodiscard]] bool should_fence(slot_type& slot) const noexcept
  {
    if (slot.fence_requested.load(std::memory_order_relaxed)) { return true; }
    // Counted in cached blocks, not frees: a stream that reuses its blocks never fences.
    if (slot.cache.block_count() + slot.recent_count >= fence_batch) { return true; }
    auto const pool = pool_bytes_.load(std::memory_order_relaxed);
    return slot.cache.free_bytes() + slot.recent_bytes >=
           std::max<std::size_t>(pool / fence_fraction, 1);
  }

  /// Records `slot`'s fence on `stream` and moves its cache to the shared list (called with
  /// `slot.mutex` held through `lock`, which it releases). Skipped during capture.
  void fence_and_share(slot_type& slot, stream_type stream, std::unique_lock<spin_mutex>& lock)
  {
    flush_recent(slot);
    if (slot.cache.empty() || platform_.is_capturing(stream)) { return; }
    std::uint64_t number = 0;
    {
      std::lock_guard<std::mutex> fence_lock(slot.fence_mutex);
      try {
        if (!slot.fence.has_value()) { slot.fence = platform_.create_fence(); }
      } catch (...) {
        return;  // no fence: the blocks stay in the cache, usable by this stream
      }
      if (!platform_.record(*slot.fence, stream)) { return; }
      number = ++slot.fence_number;
    }
    fences_.fetch_add(1, std::memory_order_relaxed);
    slot.fence_requested.store(false, std::memory_order_relaxed);
    auto blocks = slot.cache.take_all();
    lock.unlock();
    auto owner = shared_from_slot(slot);
    std::lock_guard<std::mutex> shared_lock(shared_mutex_);
    for (auto& b : blocks) {
      fence_tag tag;
      tag.needs.emplace_back(owner, number);
      shared_.insert(b.ptr, b.size, std::move(tag), chunk_start_test());
    }
  }

  /// The owning pointer of a slot (a live slot is in `slots_` or `retired_`).
  std::shared_ptr<slot_type> shared_from_slot(slot_type& slot)
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    if (auto it = slots_.find(slot.id); it != slots_.end() && it->second.get() == &slot) {
      return it->second;
    }
    for (auto const& s : retired_) {
      if (s.get() == &slot) { return s; }
    }
    return {};
  }

  /// Takes a block from the shared list for `slot`'s stream, enqueuing the fence waits it needs.
  void* take_shared(slot_type& slot, stream_type stream, std::size_t size, std::size_t align)
  {
    typename free_list<fence_tag>::block b;
    {
      std::lock_guard<std::mutex> lock(shared_mutex_);
      b = shared_.take_best_fit(size, align);
    }
    if (b.ptr == nullptr) { return nullptr; }
    auto waits = needed_waits(slot, b.tag);
    if (!waits.empty()) {
      if (platform_.is_capturing(stream) || !enqueue_waits(slot, stream, waits)) {
        std::lock_guard<std::mutex> lock(shared_mutex_);
        shared_.insert(b.ptr, b.size, std::move(b.tag), chunk_start_test());
        return nullptr;
      }
      cross_stream_reuse_.fetch_add(1, std::memory_order_relaxed);
    }
    return account(b.ptr, b.size);
  }

  /// The (slot, fence number) pairs of `tag` that `slot`'s stream has not waited on yet.
  std::vector<std::pair<std::shared_ptr<slot_type>, std::uint64_t>> needed_waits(
    slot_type& slot, fence_tag const& tag)
  {
    std::vector<std::pair<std::shared_ptr<slot_type>, std::uint64_t>> out;
    std::lock_guard<spin_mutex> lock(slot.mutex);
    for (auto const& [owner, number] : tag.needs) {
      if (!owner || owner.get() == &slot) { continue; }
      auto it = slot.waited.find(owner->serial);
      if (it != slot.waited.end() && it->second >= number) { continue; }
      out.emplace_back(owner, number);
    }
    return out;
  }

  /// Enqueues on `stream` a wait for each owner's latest fence (at least the needed number).
  bool enqueue_waits(slot_type& slot,
                     stream_type stream,
                     std::vector<std::pair<std::shared_ptr<slot_type>, std::uint64_t>> const& waits)
  {
    for (auto const& [owner, number] : waits) {
      std::uint64_t recorded = 0;
      {
        std::lock_guard<std::mutex> fence_lock(owner->fence_mutex);
        if (!owner->fence.has_value() || !platform_.stream_wait(stream, *owner->fence)) {
          return false;
        }
        recorded = owner->fence_number;
      }
      stream_waits_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<spin_mutex> lock(slot.mutex);
      auto& seen = slot.waited[owner->serial];
      seen       = std::max(seen, recorded);
    }
    return true;
  }

  /// Asks every other stream with cached blocks to fence them at its next call.
  void request_fences(slot_type& self)
  {
    std::shared_lock<std::shared_mutex> lock(slots_mutex_);
    for (auto& [id, slot] : slots_) {
      if (slot.get() != &self) { slot->fence_requested.store(true, std::memory_order_relaxed); }
    }
  }

  /// Grows the pool by one chunk (doubling, bounded, smaller on failure) and allocates from it.
  void* grow(slot_type& slot, stream_type stream, std::size_t size, std::size_t align)
  {
    std::lock_guard<std::mutex> growth_lock(growth_mutex_);
    // Another thread may have grown while this one waited.
    if (void* ptr = take_shared(slot, stream, size, align); ptr != nullptr) { return ptr; }
    auto const need  = size + (align > pool_granularity ? align : 0);
    auto const held  = pool_bytes_.load(std::memory_order_relaxed);
    auto const room  = maximum_pool_size_ ? (*maximum_pool_size_ > held
                                                ? *maximum_pool_size_ - held
                                                : std::size_t{0})
                                          : SIZE_MAX;
    if (need > room) { return nullptr; }
    auto chunk = std::min(room, std::max(need, held == 0 ? default_first_chunk : held));
    chunk      = round_to_granule(chunk);
    auto relaxed = platform_.relax();  // cudaMalloc would invalidate a global-mode capture
    while (true) {
      try {
        void* ptr = upstream_.allocate(platform_.default_stream(), chunk, pool_granularity);
        growths_.fetch_add(1, std::memory_order_relaxed);
        return add_chunk(static_cast<char*>(ptr), chunk, &slot, size, align);
      } catch (typename Platform::out_of_memory const&) {
        if (chunk <= need) { return nullptr; }
        chunk = round_to_granule(std::max(need, chunk / 2));
      }
    }
  }

  /// Registers a new chunk; with `slot`, carves `size` at `align` from its start for that
  /// stream (the new chunk is untagged, so no fence is needed) and lists the rest.
  void* add_chunk(char* ptr,
                  std::size_t chunk,
                  slot_type* slot,
                  std::size_t size,
                  std::size_t align = pool_granularity)
  {
    {
      std::unique_lock<std::shared_mutex> lock(chunks_mutex_);
      chunks_.emplace(ptr, chunk);
    }
    pool_bytes_.fetch_add(chunk, std::memory_order_relaxed);
    char* user = nullptr;
    if (slot != nullptr) {
      auto const a = reinterpret_cast<std::uintptr_t>(ptr);
      user         = reinterpret_cast<char*>((a + align - 1) / align * align);
    }
    std::lock_guard<std::mutex> lock(shared_mutex_);
    if (user == nullptr) {
      shared_.insert(ptr, chunk, fence_tag{}, chunk_start_test());
      return nullptr;
    }
    if (user > ptr) {
      shared_.insert(ptr, static_cast<std::size_t>(user - ptr), fence_tag{}, chunk_start_test());
    }
    if (user + size < ptr + chunk) {
      shared_.insert(user + size, static_cast<std::size_t>(ptr + chunk - (user + size)),
                     fence_tag{}, chunk_start_test());
    }
    return account(user, size);
  }

  /// Synchronizes the device, then moves every cache to the shared list with no fence needs.
  bool reclaim()
  {
    if (!platform_.sync_device()) { return false; }  // fails (and changes nothing) in capture
    reclaim_syncs_.fetch_add(1, std::memory_order_relaxed);
    std::vector<typename free_list<no_tag>::block> blocks;
    for_each_slot([&](slot_type& slot) {
      std::lock_guard<spin_mutex> slot_lock(slot.mutex);
      flush_recent(slot);
      for (auto& b : slot.cache.take_all()) {
        blocks.push_back(std::move(b));
      }
    });
    std::lock_guard<std::mutex> lock(shared_mutex_);
    std::vector<typename free_list<fence_tag>::block> shared_blocks = shared_.take_all();
    for (auto& b : shared_blocks) {
      shared_.insert(b.ptr, b.size, fence_tag{}, chunk_start_test());
    }
    for (auto& b : blocks) {
      shared_.insert(b.ptr, b.size, fence_tag{}, chunk_start_test());
    }
    return true;
  }

  /// True when the shared list holds the whole chunk [ptr, ptr + size) as one block that
  /// needs no fence (caller holds shared_mutex_ and chunks_mutex_).
  bool shared_holds_exactly(char* ptr, std::size_t size)
  {
    bool found = false;
    shared_.for_each([&](char* p, std::size_t n, fence_tag& tag) {
      if (p == ptr && n == size && tag.needs.empty()) { found = true; }
    });
    return found;
  }

  Platform platform_;
  Upstream upstream_;
  std::optional<std::size_t> maximum_pool_size_;

  std::atomic<std::uint64_t> generation_;  // changes when a slot leaves `slots_`
  mutable std::shared_mutex slots_mutex_;
  std::unordered_map<std::uint64_t, std::shared_ptr<slot_type>> slots_;
  std::vector<std::shared_ptr<slot_type>> retired_;  // kept: thread caches may point at them
  std::uint64_t next_serial_{1};

  std::mutex shared_mutex_;
  free_list<fence_tag> shared_;

  std::mutex growth_mutex_;
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
};

}  // namespace rmm_fences::detail
