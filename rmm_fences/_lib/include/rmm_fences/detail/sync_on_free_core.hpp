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
#include <stdexcept>
#include <utility>

namespace rmm_fences::mr::detail {

/**
 * @brief How many deferred frees on one stream share one fence.
 *
 * A batch's fence is recorded once the batch holds `max_frees` frees or (when set) `max_bytes`
 * bytes, and whenever the adaptor needs its blocks back (the pending cap, out of memory,
 * `drain`). `max_frees == 1`: one fence per free.
 */
struct batch_limits {
  std::size_t max_frees{rmm_fences::mr::default_max_batch_frees};
  std::optional<std::size_t> max_bytes{rmm_fences::mr::default_max_batch_bytes};
};

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
 * Rules: in deferred mode a free outside capture joins its stream's *batch* without a CUDA
 * call; one fence is recorded on the freeing stream for the whole batch (a fence recorded on a
 * stream after a free covers that free and every earlier one on the stream) once the batch
 * holds `batch_limits::max_frees` frees or `max_bytes` bytes, when the pending total goes over
 * `max_pending_bytes`, and when the adaptor needs the blocks back (out of memory, `drain`).
 * A fence is recorded only during a call on the very stream that freed the blocks (same key
 * and same process-unique identity, asked right before the record; the first free on a stream
 * is fenced at once, and its identity noted), because the freeing stream may be destroyed
 * after its free returned: a batch whose stream is never used again goes upstream after a
 * device synchronization (`drain`). A listed block goes upstream only after a fence recorded
 * after its free reported complete, or a wait on it or a device synchronization begun after it
 * was taken out of the list succeeded. A failed query, wait or synchronization never releases a
 * block and never counts as a sync: the block stays listed and is retried later. When no fence
 * can be recorded the stream is synchronized and the batch freed; when that fails too the batch
 * is parked. In device and stream mode a failed synchronization falls back to the deferred rule
 * with the fence recorded at once; when not even a fence can be recorded the block is parked.
 * Fences are tested without blocking on one call in `max_frees` and by the free that records a
 * batch, before its record (the fence recorded in that call is never tested in it: the device
 * has not processed it yet; and a fence found complete is back in the pool for the record);
 * above `max_pending_bytes` the oldest fences are waited on; on
 * out-of-memory every fence is waited on (and unfenced blocks go if the device synchronizes) and
 * the allocation retried once.
 *
 * During capture of the calling stream nothing is queried or synchronized: frees are parked.
 * A parked block gets its fence at a later call outside capture only on the very stream that
 * freed it: same key (a per-thread default stream is qualified by its thread) and same
 * process-unique identity. The identity of a stream is asked at its first free outside capture
 * and before each record that covers earlier calls (never of a capturing stream, which would
 * invalidate the capture); a block parked on a stream never seen outside capture has no known
 * identity and stays parked until a device synchronization succeeds (`drain`).
 *
 * Frees are checked against the blocks handed out (ptr -> bytes): a double free, a foreign
 * pointer or a size mismatch is rejected before any fence or upstream call.
 *
 * One mutex guards the list; fence records, waits, synchronizations and upstream calls run
 * outside it. A spin lock guards the live-block map.
 */
template <typename Platform, typename Upstream>
class sync_on_free_core {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;
  using list_type   = deferred_free_list<Platform>;
  using entry       = typename list_type::entry;
  using buffer      = typename list_type::entry_buffer;

  template <typename... PlatformArgs>
  sync_on_free_core(Upstream upstream,
                    rmm_fences::mr::sync_mode mode,
                    std::optional<std::size_t> max_pending_bytes,
                    batch_limits batch,
                    PlatformArgs&&... platform_args)
    : platform_(std::forward<PlatformArgs>(platform_args)...),
      upstream_{std::move(upstream)},
      mode_{mode},
      max_pending_bytes_{max_pending_bytes},
      batch_{validated(batch)},
      poll_every_{mode == rmm_fences::mr::sync_mode::deferred ? batch_.max_frees : 1},
      list_{kept_entries(batch_)},
      spill_{kept_entries(batch_)}
  {
  }

  sync_on_free_core(sync_on_free_core const&)            = delete;
  sync_on_free_core& operator=(sync_on_free_core const&) = delete;

  /// Polls when due, then allocates from the upstream; on out-of-memory drains and retries once.
  [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment)
  {
    // Nothing to test: no capture test either (the out-of-memory path makes its own).
    if (poll_due() && !platform_.is_capturing(stream)) { poll(stream); }
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
   * First records a fence for the batch of `stream` (when it is not capturing): a live stream,
   * so its blocks need no device synchronization. With `include_parked`, unfenced blocks
   * (batches of other streams, parked blocks, blocks whose fence wait failed) go too if a
   * device synchronization begun after they were taken out succeeds; otherwise they stay
   * listed.
   * @return the number of blocks returned
   */
  std::size_t drain(bool include_parked, stream_type stream)
  {
    if (!platform_.is_capturing(stream)) { fence_stream(stream); }
    buffer taken{&spill_};
    buffer done{&spill_};
    buffer failed{&spill_};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      list_.take_all_fenced(taken);
      // Detached before the sync: a block listed by another thread once the sync began is not
      // covered by it and stays listed.
      if (include_parked) { list_.take_unfenced(taken); }
      list_changed();
    }
    auto const waits = wait_all(platform_, taken, done, failed);
    count_syncs(waits.succeeded);
    count_failures(waits.failed);
    if (!failed.empty() && include_parked) {
      if (platform_.sync_device()) {
        count_syncs(1);
        for (auto& e : failed) {
          done.push_back(e);
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

  [[nodiscard]] std::size_t max_batch_frees() const noexcept { return batch_.max_frees; }

  [[nodiscard]] std::optional<std::size_t> max_batch_bytes() const noexcept
  { return batch_.max_bytes; }

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

  /// The fence the pending block at `ptr` waits for; empty when it has none (yet) or is not
  /// pending. For tests and diagnostics.
  [[nodiscard]] std::optional<fence_type> fence_of(void const* ptr) const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.fence_of(ptr);
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
    s.fences             = fences_.load(std::memory_order_relaxed);
    return s;
  }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }

 private:
  using key_type = std::uintptr_t;

  static constexpr auto unknown_stream = list_type::unknown_stream;
  static constexpr auto no_entry       = list_type::no_entry;

  /// What `fence_listed` does when no fence can be recorded.
  enum class no_fence_rule {
    keep,         ///< leave the blocks as they are (a later call retries)
    park,         ///< park the batch: a device synchronization releases it
    sync_stream,  ///< synchronize the stream and free the batch; if that fails, park it
  };

  /**
   * @brief The host storage of entries kept for reuse, per stream queue and per scratch buffer:
   * what a few batches hold (4 * `max_frees`), at least 256 entries and at most 65536.
   */
  static std::size_t kept_entries(batch_limits const& batch) noexcept
  {
    constexpr std::size_t least = 256;
    constexpr std::size_t most  = std::size_t{1} << 16;
    return std::clamp(std::min(batch.max_frees, most) * 4, least, most);
  }

  static batch_limits validated(batch_limits batch)
  {
    if (batch.max_frees == 0) {
      throw std::invalid_argument("max_batch_frees must be at least 1, got 0");
    }
    if (batch.max_bytes.has_value() && *batch.max_bytes == 0) {
      throw std::invalid_argument("max_batch_bytes must be positive (or empty: no byte limit)");
    }
    return batch;
  }

  void count_syncs(std::size_t n) noexcept
  {
    if (n > 0) { syncs_.fetch_add(n, std::memory_order_relaxed); }
  }

  void count_failures(std::size_t n) noexcept
  {
    if (n > 0) { failed_syncs_.fetch_add(n, std::memory_order_relaxed); }
  }

  /**
   * @brief Updates the peak and the lock-free hints after the list changed (caller holds the
   * lock). `peak`: false while the total is over the cap, before the cap applied.
   */
  void list_changed(bool peak = true) noexcept
  {
    if (peak) {
      peak_pending_bytes_ = std::max<std::uint64_t>(peak_pending_bytes_, list_.pending_bytes());
    }
    pollable_hint_.store(list_.fenced_count() + list_.armable_count(), std::memory_order_relaxed);
  }

  /**
   * @brief True on the calls that test fences, only while fenced or armable blocks are listed:
   * in deferred mode one call in `max_frees` (every call when 1), in the other modes (whose
   * listed blocks are failures' fallbacks) every call.
   */
  bool poll_due() noexcept
  {
    if (pollable_hint_.load(std::memory_order_relaxed) == 0) { return false; }
    if (poll_every_ == 1) { return true; }
    return calls_.fetch_add(1, std::memory_order_relaxed) % poll_every_ == 0;
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
          defer(stream, block, /*fence_now=*/true, no_fence_rule::park);
          return;
        }
        count_syncs(1);
        remember_stream(stream);
        break;
      }
      case rmm_fences::mr::sync_mode::deferred:
        defer(stream, block, /*fence_now=*/false, no_fence_rule::sync_stream);
        return;
    }
    if (poll_due()) { poll(stream); }
    upstream_.deallocate(stream, block.ptr, block.bytes, block.alignment);
  }

  /**
   * @brief Lists the block in its stream's batch; records the batch's fence when the batch is
   * full, the pending total is over the cap, the stream is new, or `fence_now`.
   *
   * When no fence can be recorded, `rule` says what becomes of the batch. With no host memory
   * to list the block, it is fenced alone and waited on (or its stream synchronized); if that
   * fails too, it is leaked, never reused early.
   */
  void defer(stream_type stream, deferred_block block, bool fence_now, no_fence_rule rule) noexcept
  {
    auto const key       = platform_.key(stream);
    std::uint64_t own    = no_entry;
    std::uint64_t before = 0;
    bool listed          = false;
    bool record          = false;
    bool verify          = false;
    bool over_cap        = false;
    buffer ready{&spill_};
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      auto const* known  = known_id(key);
      auto const pushed  = list_.push(key, known == nullptr ? unknown_stream : *known, block);
      own                = pushed.seq;
      listed             = true;
      auto const& batch  = pushed.batch;
      bool const armable = pushed.armable;
      over_cap = max_pending_bytes_.has_value() && list_.pending_bytes() > *max_pending_bytes_;
      record   = fence_now || known == nullptr || over_cap || armable ||
                 batch.count >= batch_.max_frees ||
                 (batch_.max_bytes.has_value() && batch.bytes >= *batch_.max_bytes);
      // The fence covers blocks of earlier calls (or this is the stream's first free): ask the
      // stream's identity, so that only blocks freed on this very stream get it.
      verify = known == nullptr || armable || batch.count > 1;
      before = list_.next_seq();
      if (!record) {
        ++deferred_;
        if (poll_due()) { list_.release_ready(platform_, ready); }
      } else {
        // Before the record: the fences of earlier calls go back to the pool first (the one
        // found complete is the one recorded next), and the record never precedes the test
        // of the stream's previous fence. The fence recorded in this call is not tested in it:
        // a device processes a record after the call that made it.
        list_.release_ready(platform_, ready);
      }
      list_changed(/*peak=*/!over_cap);
    } catch (...) {
      // Out of host memory: not listed (handled below), or listed and not polled.
    }
    if (!listed) {
      settle_unlisted(stream, block);
      return;
    }
    if (record) {
      buffer oldest{&spill_};
      fence_listed(stream, key, own, before, verify, rule, ready, &oldest);
      settle_oldest(oldest);
      release(oldest, stream);
    }
    release(ready, stream);
  }

  /**
   * @brief Records one fence on `stream` (not capturing) for its unfenced blocks listed before
   * `before`: the block `own_seq` freed in this call and, when `verify` (the stream's identity
   * is asked first), every block freed on this very stream. When no fence can be recorded,
   * `rule` applies.
   *
   * With `oldest`, blocks over the cap are taken out (oldest fences first) for the caller to
   * wait on. No fence is tested here: the caller tests those of earlier calls before the
   * record, and the fence just recorded would be pending (a device processes a record after
   * the call that made it; a later call tests it). The block `own_seq` counts as deferred
   * unless the stream was synchronized for it or it was parked.
   */
  void fence_listed(stream_type stream,
                    key_type key,
                    std::uint64_t own_seq,
                    std::uint64_t before,
                    bool verify,
                    no_fence_rule rule,
                    buffer& synced,
                    buffer* oldest) noexcept
  {
    auto const id  = verify ? platform_.stream_id(stream) : unknown_stream;
    auto fence     = record_fence(stream);
    bool synced_ok = false;
    if (!fence.has_value() && rule == no_fence_rule::sync_stream) {
      synced_ok = platform_.sync_stream(stream);
      if (synced_ok) {
        count_syncs(1);
      } else {
        count_failures(1);
      }
    }
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      note_id(key, id);
      bool own_blocked = false;  // the stream was synchronized for it, or it was parked
      if (fence.has_value()) {
        // arm throws (no host memory) before changing anything: the fence goes back below
        if (list_.arm(key, id, own_seq, before, *fence) == 0) { platform_.release_fence(*fence); }
        fence.reset();
      } else if (synced_ok) {
        own_blocked = list_.take_synced(key, id, own_seq, before, synced);
      } else if (rule != no_fence_rule::keep) {
        auto const [parked, own] = list_.park_unfenceable(key, id, own_seq, before);
        parked_ += parked;
        own_blocked = own;
      }
      if (own_seq != no_entry && !own_blocked) { ++deferred_; }
      if (oldest != nullptr && max_pending_bytes_.has_value() &&
          list_.pending_bytes() > *max_pending_bytes_) {
        list_.take_oldest_until(*max_pending_bytes_, *oldest);
      }
      list_changed();
    } catch (...) {
      // No host memory (for the fence's reference count, or the buffers): what was not done
      // stays listed for a later call.
      if (fence.has_value()) { platform_.release_fence(*fence); }
    }
  }

  /// Records the fence of the batch (and of the armable parked blocks) of `stream`, if any.
  void fence_stream(stream_type stream) noexcept
  {
    auto const key       = platform_.key(stream);
    std::uint64_t before = 0;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (list_.batch(key).count == 0 && !list_.has_armable(key)) { return; }
      before = list_.next_seq();
    } catch (...) {
      return;
    }
    buffer none{&spill_};
    fence_listed(
      stream, key, no_entry, before, /*verify=*/true, no_fence_rule::keep, none, nullptr);
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
    fences_.fetch_add(1, std::memory_order_relaxed);
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
      count_failures(1);
      return;
    }
    count_syncs(1);
    upstream_.deallocate(stream, block.ptr, block.bytes, block.alignment);
    released_.fetch_add(1, std::memory_order_relaxed);
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
    count_syncs(waits.succeeded);
    count_failures(waits.failed);
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
      std::uint64_t id = unknown_stream;
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
    if (id == unknown_stream) { return; }
    try {
      ids_.insert_or_assign(key + 1, id);
    } catch (...) {
    }
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
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (known_id(key) != nullptr) { return; }
      }
      auto const id = platform_.stream_id(stream);
      std::lock_guard<std::mutex> lock(mutex_);
      note_id(key, id);
    } catch (...) {
    }
  }

  /// Returns every block whose fence completed, and arms the parked blocks of this very
  /// stream; never blocks.
  void poll(stream_type stream) noexcept
  {
    auto const key       = platform_.key(stream);
    bool arm             = false;
    std::uint64_t before = 0;
    buffer ready{&spill_};
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      arm    = list_.has_armable(key);
      before = list_.next_seq();
      list_.release_ready(platform_, ready);
      list_changed();
    } catch (...) {
      // No host memory for the released entries: they stay listed for a later call.
    }
    if (arm) {
      buffer none{&spill_};
      fence_listed(stream,
                   key,
                   no_entry,
                   before,
                   /*verify=*/true,
                   no_fence_rule::keep,
                   none,
                   nullptr);
    }
    release(ready, stream);
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
      holds_fences = holds_fences || e.slot != list_type::no_slot;
    }
    released_.fetch_add(blocks.size(), std::memory_order_relaxed);
    if (holds_fences) {
      try {
        std::lock_guard<std::mutex> lock(mutex_);
        list_.settle(platform_, blocks);
      } catch (...) {
        // The fences stay referenced: never recycled, which is safe.
      }
    }
    blocks.clear();
  }

  Platform platform_;
  Upstream upstream_;
  rmm_fences::mr::sync_mode mode_;
  std::optional<std::size_t> max_pending_bytes_;
  batch_limits batch_;
  std::size_t poll_every_;  // calls per fence test (while something is listed)

  mutable std::mutex mutex_;
  list_type list_;                               // guarded by mutex_
  typename list_type::entry_spill_cache spill_;  // storage of the buffers (its own lock)
  std::uint64_t parked_{};                       // guarded by mutex_
  std::uint64_t deferred_{};                     // guarded by mutex_
  std::uint64_t peak_pending_bytes_{};           // guarded by mutex_
  pointer_map<std::uint64_t> ids_{64};           // guarded by mutex_: stream key + 1 -> identity
  std::atomic<std::size_t> pollable_hint_{};     // fenced + armable entries, read without the lock
  std::atomic<std::uint64_t> calls_{};           // calls that found something to test
  std::atomic<std::uint64_t> syncs_{};
  std::atomic<std::uint64_t> released_{};
  std::atomic<std::uint64_t> oom_retries_{};
  std::atomic<std::uint64_t> failed_syncs_{};
  std::atomic<std::uint64_t> rejected_frees_{};
  std::atomic<std::uint64_t> fences_{};

  mutable spin_mutex live_mutex_;
  pointer_map<std::size_t> live_;  // guarded by live_mutex_: blocks handed out -> bytes
};

}  // namespace rmm_fences::mr::detail
