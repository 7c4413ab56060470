/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of SyncOnFreeResourceAdaptor (docs/design.md#layers, policy cores): no CUDA calls.
 * The CUDA build plugs in `cuda_platform` (events, stream sync); the CPU tests plug in manual
 * fences and host memory, so both run this very code.
 */
#pragma once

#include <rmm_fences/detail/deferred_free_list.hpp>
#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>
#include <rmm_fences/mr/free_result.hpp>
#include <rmm_fences/mr/stats.hpp>
#include <rmm_fences/mr/sync_mode.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <new>
#include <optional>
#include <utility>

namespace rmm_fences::mr::detail {

/**
 * @brief The rules of SyncOnFree, over a platform and an upstream.
 *
 * `Platform` provides:
 *
 *   using fence_type; using stream_type; using out_of_memory;     // exception of the upstream
 *   bool ready(fence_type);                    // true only when known complete (error: false)
 *   bool host_wait(fence_type);                // blocking wait; false when the wait failed
 *   fence_type acquire_fence(); void release_fence(fence_type) noexcept;
 *   bool record(fence_type, stream_type) noexcept;                // fence after queued work
 *   bool is_capturing(stream_type) noexcept;
 *   bool sync_device() noexcept; bool sync_stream(stream_type) noexcept;  // false: failed
 *   std::uintptr_t key(stream_type) noexcept;  // per-thread default streams told apart
 *   std::uint64_t stream_id(stream_type) noexcept;  // process-unique identity, 0 if unknown;
 *                                                   // never called on a capturing stream
 *   stream_type default_stream() noexcept;
 *
 * `Upstream` provides `void* allocate(stream, bytes, alignment)` and a `noexcept deallocate`.
 *
 * Rules: in deferred mode a fence is recorded on the freeing stream before the block is listed;
 * a listed block goes upstream only after its fence reported complete, or a wait on it or a
 * device synchronization begun after it was taken out of the list succeeded. A failed query,
 * wait or synchronization never releases a block and never counts as a sync: the block stays
 * listed and is retried later. In device and stream mode a failed synchronization falls back to
 * the deferred rule; when not even a fence can be recorded the block is parked. Every call
 * polls without blocking; above `max_pending_bytes` the oldest fences are waited on; on
 * out-of-memory every fence is waited on (and parked blocks go if the device synchronizes) and
 * the allocation retried once.
 *
 * During capture of the calling stream nothing is queried or synchronized: frees are parked.
 * A parked block gets its fence at a later call outside capture only on the very stream that
 * freed it: same key (a per-thread default stream is qualified by its thread) and same
 * process-unique identity. The identity of a stream is asked once per key, at its first free
 * outside capture (never of a capturing stream, which would invalidate the capture); a block
 * parked on a stream never seen outside capture has no known identity and stays parked until
 * a device synchronization succeeds (`drain`).
 *
 * Frees are checked against the blocks handed out (ptr -> bytes): a double free, a foreign
 * pointer or a size mismatch is rejected before any fence or upstream call.
 *
 * One mutex guards the list; fence waits and upstream calls run outside it. A spin lock
 * guards the live-block map.
 */
template <typename Platform, typename Upstream>
class sync_on_free_core {
 public:
  using stream_type = typename Platform::stream_type;
  using list_type   = deferred_free_list<Platform>;
  using entry       = typename list_type::entry;
  using buffer      = typename list_type::entry_buffer;

  template <typename... PlatformArgs>
  sync_on_free_core(Upstream upstream,
                    rmm_fences::mr::sync_mode mode,
                    std::optional<std::size_t> max_pending_bytes,
                    PlatformArgs&&... platform_args)
    : platform_(std::forward<PlatformArgs>(platform_args)...),
      upstream_{std::move(upstream)},
      mode_{mode},
      max_pending_bytes_{max_pending_bytes}
  {
  }

  sync_on_free_core(sync_on_free_core const&)            = delete;
  sync_on_free_core& operator=(sync_on_free_core const&) = delete;

  /// Polls, then allocates from the upstream; on out-of-memory drains and retries once.
  [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment)
  {
    // Nothing listed: nothing to poll, and the capture test waits for the out-of-memory path.
    if (listed_hint_.load(std::memory_order_relaxed) > 0 && !platform_.is_capturing(stream)) {
      poll(stream);
    }
    auto [ptr, retried] = allocate_with_drain<typename Platform::out_of_memory>(
      [&] { return upstream_.allocate(stream, bytes, alignment); },
      [&] {
        return !platform_.is_capturing(stream) && drain(/*include_parked=*/true, stream) > 0;
      });
    if (retried) { oom_retries_.fetch_add(1, std::memory_order_relaxed); }
    if (ptr != nullptr && bytes > 0) {
      try {
        std::lock_guard<spin_mutex> lock(live_mutex_);
        live_.insert_or_assign(reinterpret_cast<std::uintptr_t>(ptr), bytes);
      } catch (...) {
        upstream_.deallocate(stream, ptr, bytes, alignment);
        throw;
      }
    }
    return ptr;
  }

  /**
   * @brief Frees by the mode's rule; parks the block during capture of `stream`.
   *
   * A bad free (double free, foreign pointer, size mismatch) changes nothing: it is counted in
   * `rejected_frees` and reported on one line of stderr.
   */
  void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    auto const result = deallocate_checked(stream, ptr, bytes, alignment);
    if (result.check == rmm_fences::mr::free_check::unknown ||
        result.check == rmm_fences::mr::free_check::pending ||
        result.check == rmm_fences::mr::free_check::size_mismatch) {
      report_rejected(ptr, bytes, result);
    }
  }

  /**
   * @brief `deallocate` that returns what the check found instead of reporting it.
   *
   * On `unknown`, `pending` or `size_mismatch` nothing was done (the free is counted in
   * `rejected_frees`); the caller names the problem.
   */
  rmm_fences::mr::free_result deallocate_checked(stream_type stream,
                                                 void* ptr,
                                                 std::size_t bytes,
                                                 std::size_t alignment) noexcept
  {
    auto const result = untrack(ptr, bytes);
    if (result.check != rmm_fences::mr::free_check::ok &&
        result.check != rmm_fences::mr::free_check::untracked) {
      rejected_frees_.fetch_add(1, std::memory_order_relaxed);
      return result;
    }
    free_block(stream, deferred_block{ptr, bytes, alignment});
    return result;
  }

  /**
   * @brief Waits for every fenced block and returns it upstream on `stream`.
   *
   * With `include_parked`, parked blocks (and blocks whose fence wait failed) go too if a device
   * synchronization begun after they were taken out succeeds; otherwise they stay listed.
   * @return the number of blocks returned
   */
  std::size_t drain(bool include_parked, stream_type stream)
  {
    buffer taken;
    buffer done;
    buffer failed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      list_.take_all_fenced(taken);
      // Detached before the sync: a block parked by another thread once the sync began is not
      // covered by it and stays listed.
      if (include_parked) { list_.take_parked(taken); }
      list_changed();
    }
    std::size_t fenced_failures = 0;
    count_syncs(wait_all(platform_, taken, done, failed));
    for (auto const& e : failed) {
      fenced_failures += e.fence.has_value();
    }
    count_failures(fenced_failures);
    if (!failed.empty() && include_parked) {
      if (platform_.sync_device()) {
        count_syncs(1);
        for (auto& e : failed) {
          done.push_back(std::move(e));
        }
        failed.clear();
      } else {
        count_failures(1);
      }
    }
    relist(failed);
    auto const n = done.size();
    release(done, stream);
    return n;
  }

  [[nodiscard]] rmm_fences::mr::sync_mode mode() const noexcept { return mode_; }

  [[nodiscard]] std::optional<std::size_t> max_pending_bytes() const noexcept
  { return max_pending_bytes_; }

  /// Bytes freed by the caller that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_bytes() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.pending_bytes();
  }

  /// Number of freed blocks that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_count() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.pending_count();
  }

  /// Number of blocks handed out and not freed yet.
  [[nodiscard]] std::size_t live_count() const
  {
    std::lock_guard<spin_mutex> lock(live_mutex_);
    return live_.size();
  }

  /// A snapshot of the counters.
  [[nodiscard]] rmm_fences::mr::sync_on_free_stats stats() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rmm_fences::mr::sync_on_free_stats s;
    s.syncs              = syncs_.load(std::memory_order_relaxed);
    s.deferred           = deferred_;
    s.released           = released_.load(std::memory_order_relaxed);
    s.oom_retries        = oom_retries_.load(std::memory_order_relaxed);
    s.parked             = parked_;
    s.peak_pending_bytes = peak_pending_bytes_;
    s.failed_syncs       = failed_syncs_.load(std::memory_order_relaxed);
    s.rejected_frees     = rejected_frees_.load(std::memory_order_relaxed);
    return s;
  }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }

 private:
  using key_type = std::uintptr_t;

  void count_syncs(std::size_t n) noexcept
  {
    if (n > 0) { syncs_.fetch_add(n, std::memory_order_relaxed); }
  }

  void count_failures(std::size_t n) noexcept
  {
    if (n > 0) { failed_syncs_.fetch_add(n, std::memory_order_relaxed); }
  }

  /// Updates the peak and the lock-free hint after the list changed (caller holds the lock).
  void list_changed() noexcept
  {
    peak_pending_bytes_ = std::max<std::uint64_t>(peak_pending_bytes_, list_.pending_bytes());
    listed_hint_.store(list_.pending_count(), std::memory_order_relaxed);
  }

  /// Removes `ptr` from the live blocks if it is one of `bytes` bytes; says what it found.
  rmm_fences::mr::free_result untrack(void* ptr, std::size_t bytes) noexcept
  {
    using rmm_fences::mr::free_check;
    if (ptr == nullptr) { return {free_check::untracked, 0}; }
    auto const key = reinterpret_cast<std::uintptr_t>(ptr);
    {
      std::lock_guard<spin_mutex> lock(live_mutex_);
      if (auto const i = live_.find_index(key); i != live_.npos) {
        if (live_.value_at(i) != bytes) { return {free_check::size_mismatch, live_.value_at(i)}; }
        live_.erase_at(i);
        return {free_check::ok, bytes};
      }
    }
    if (bytes == 0) { return {free_check::untracked, 0}; }
    std::lock_guard<std::mutex> lock(mutex_);
    return {list_.contains(ptr) ? free_check::pending : free_check::unknown, 0};
  }

  static void report_rejected(void* ptr, std::size_t bytes, rmm_fences::mr::free_result r) noexcept
  {
    using rmm_fences::mr::free_check;
    if (r.check == free_check::size_mismatch) {
      std::fprintf(stderr,
                   "rmm_fences: SyncOnFreeResourceAdaptor rejected the free of %p (%zu bytes): "
                   "size mismatch, the block was allocated with %zu bytes; nothing was freed\n",
                   ptr,
                   bytes,
                   r.allocated_bytes);
    } else {
      std::fprintf(stderr,
                   "rmm_fences: SyncOnFreeResourceAdaptor rejected the free of %p (%zu bytes): "
                   "%s; nothing was freed\n",
                   ptr,
                   bytes,
                   r.check == free_check::pending
                     ? "double free, the block is already freed and pending its fence"
                     : "not a live block of this adaptor (double free or foreign pointer)");
    }
  }

  /// Frees a checked block by the mode's rule.
  void free_block(stream_type stream, deferred_block block) noexcept
  {
    if (platform_.is_capturing(stream)) {
      park(stream, block, /*verifiable=*/true);
      return;
    }
    switch (mode_) {
      case rmm_fences::mr::sync_mode::device:
      case rmm_fences::mr::sync_mode::stream: {
        bool const synced = mode_ == rmm_fences::mr::sync_mode::device
                              ? platform_.sync_device()
                              : platform_.sync_stream(stream);
        if (!synced) {
          count_failures(1);
          defer(stream, block, /*sync_if_no_fence=*/false);
          return;
        }
        count_syncs(1);
        remember_stream(stream);
        break;
      }
      case rmm_fences::mr::sync_mode::deferred:
        defer(stream, block, /*sync_if_no_fence=*/true);
        return;
    }
    if (listed_hint_.load(std::memory_order_relaxed) > 0) { poll(stream); }
    upstream_.deallocate(stream, block.ptr, block.bytes, block.alignment);
  }

  /**
   * @brief Records a fence and lists the block.
   *
   * When no fence can be recorded: with `sync_if_no_fence` the stream is synchronized and the
   * block freed at once; when that fails too (or is not tried) the block is parked with no
   * stream identity, released only after a device synchronization succeeds.
   */
  void defer(stream_type stream, deferred_block block, bool sync_if_no_fence) noexcept
  {
    std::optional<typename Platform::fence_type> fence;
    try {
      fence = platform_.acquire_fence();
    } catch (...) {
    }
    // The fence is recorded before the block is listed, so no thread sees it without its fence.
    if (fence.has_value() && !platform_.record(*fence, stream)) {
      platform_.release_fence(*fence);
      fence.reset();
    }
    if (!fence.has_value()) {
      if (sync_if_no_fence) {
        if (platform_.sync_stream(stream)) {
          count_syncs(1);
          if (listed_hint_.load(std::memory_order_relaxed) > 0) { poll(stream); }
          upstream_.deallocate(stream, block.ptr, block.bytes, block.alignment);
          return;
        }
        count_failures(1);
      }
      park(stream, block, /*verifiable=*/false);
      return;
    }
    buffer ready;
    buffer oldest;
    bool listed  = false;
    bool need_id = false;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      try_arm_parked(stream);
      list_.release_ready(platform_, ready);
      list_.push(platform_.key(stream), block, *fence);
      listed = true;
      ++deferred_;
      if (max_pending_bytes_ && list_.pending_bytes() > *max_pending_bytes_) {
        list_.take_oldest_until(*max_pending_bytes_, oldest);
      }
      list_changed();
      need_id = known_id(platform_.key(stream)) == nullptr;
    } catch (...) {
      // Out of host memory while listing; handled below.
    }
    if (!listed) {
      if (platform_.host_wait(*fence)) {
        count_syncs(1);
        ready.push_back(entry{block, fence, 0, platform_.key(stream), 0});
      } else {
        // Neither listed nor known done: leaking the block is the only safe choice.
        count_failures(1);
        platform_.release_fence(*fence);
      }
    }
    if (need_id) { remember_stream(stream); }
    settle_oldest(oldest);
    release(ready, stream);
    release(oldest, stream);
  }

  /// Waits on the fences of blocks taken above the cap; those whose wait failed are relisted.
  void settle_oldest(buffer& oldest) noexcept
  {
    if (oldest.empty()) { return; }
    buffer taken;
    for (auto& e : oldest) {
      taken.push_back(std::move(e));
    }
    oldest.clear();
    buffer failed;
    count_syncs(wait_all(platform_, taken, oldest, failed));
    count_failures(failed.size());
    relist(failed);
  }

  /// Lists again blocks whose wait failed (nothing known about them).
  void relist(buffer& failed) noexcept
  {
    if (failed.empty()) { return; }
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      list_.restore(failed);
      list_changed();
    } catch (...) {
      // No host memory to list them again: leaking is the only safe choice.
    }
    failed.clear();
  }

  /**
   * @brief Lists a block without a fence.
   *
   * `verifiable`: freed during capture of `stream`; it remembers the stream's identity if known
   * (seen outside capture before), so a later call on that very stream can arm it. Otherwise
   * only a device synchronization releases it.
   */
  void park(stream_type stream, deferred_block block, bool verifiable) noexcept
  {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      auto const key   = platform_.key(stream);
      std::uint64_t id = list_type::unknown_stream;
      if (verifiable) {
        if (auto const* known = known_id(key); known != nullptr) { id = *known; }
      }
      list_.park(key, id, block);
      ++parked_;
      list_changed();
    } catch (...) {
      // No host memory to list it: leaking the block is the only safe choice.
    }
  }

  /// The identity last seen for `key`, or nullptr (caller holds the lock).
  [[nodiscard]] std::uint64_t const* known_id(key_type key) noexcept { return ids_.find(key + 1); }

  /// Notes `key`'s identity (caller holds the lock); no host memory: stays unknown.
  void note_id(key_type key, std::uint64_t id) noexcept
  {
    if (id == list_type::unknown_stream) { return; }
    try {
      ids_.insert_or_assign(key + 1, id);
    } catch (...) {
    }
  }

  /**
   * @brief Remembers the identity of `stream` (not capturing) the first time its key is seen.
   *
   * One identity query per stream key, never per free. A stale identity (the handle reused
   * since) only keeps blocks parked longer: identities are never reused, so it can never match
   * another stream; arming refreshes it.
   */
  void remember_stream(stream_type stream) noexcept
  {
    auto const key = platform_.key(stream);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (known_id(key) != nullptr) { return; }
    }
    auto const id = platform_.stream_id(stream);
    std::lock_guard<std::mutex> lock(mutex_);
    note_id(key, id);
  }

  /// Gives the parked blocks freed on this very stream their fence (caller holds the lock).
  void arm_parked(stream_type stream)
  {
    auto const key = platform_.key(stream);
    if (!list_.has_armable(key)) { return; }
    auto const id = platform_.stream_id(stream);
    note_id(key, id);
    list_.arm(key, id, [&] {
      auto fence = platform_.acquire_fence();
      if (!platform_.record(fence, stream)) {
        platform_.release_fence(fence);
        throw std::bad_alloc{};
      }
      return fence;
    });
  }

  /// `arm_parked`; a failure (no fence, no host memory) leaves the blocks parked for later.
  void try_arm_parked(stream_type stream) noexcept
  {
    try {
      arm_parked(stream);
    } catch (...) {
    }
  }

  /// Returns every block whose fence completed; never blocks.
  void poll(stream_type stream) noexcept
  {
    buffer ready;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      try_arm_parked(stream);
      list_.release_ready(platform_, ready);
      list_changed();
    } catch (...) {
      // No host memory for the released entries: they stay listed for a later call.
    }
    release(ready, stream);
  }

  /// Hands fenced-off blocks to the upstream on `stream` and recycles their fences.
  void release(buffer& blocks, stream_type stream) noexcept
  {
    if (blocks.empty()) { return; }
    for (auto& e : blocks) {
      upstream_.deallocate(stream, e.block.ptr, e.block.bytes, e.block.alignment);
      if (e.fence.has_value()) { platform_.release_fence(*e.fence); }
    }
    released_.fetch_add(blocks.size(), std::memory_order_relaxed);
    blocks.clear();
  }

  Platform platform_;
  Upstream upstream_;
  rmm_fences::mr::sync_mode mode_;
  std::optional<std::size_t> max_pending_bytes_;

  mutable std::mutex mutex_;
  list_type list_;                          // guarded by mutex_
  std::uint64_t deferred_{};                // guarded by mutex_
  std::uint64_t parked_{};                  // guarded by mutex_
  std::uint64_t peak_pending_bytes_{};      // guarded by mutex_
  pointer_map<std::uint64_t> ids_{64};      // guarded by mutex_: stream key + 1 -> identity
  std::atomic<std::size_t> listed_hint_{};  // pending_count, read without the lock
  std::atomic<std::uint64_t> syncs_{};
  std::atomic<std::uint64_t> released_{};
  std::atomic<std::uint64_t> oom_retries_{};
  std::atomic<std::uint64_t> failed_syncs_{};
  std::atomic<std::uint64_t> rejected_frees_{};

  mutable spin_mutex live_mutex_;
  pointer_map<std::size_t> live_;  // guarded by live_mutex_: blocks handed out -> bytes
};

}  // namespace rmm_fences::mr::detail
