/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of SyncOnFreeResourceAdaptor (docs/design.md#layers, policy cores): no CUDA calls.
 * The CUDA build plugs in `cuda_platform` (events, stream sync); the CPU tests plug in manual
 * fences and host memory, so both run this very code. This header holds the rules and the
 * modes; its parts are
 *   sync_on_free/batch_limits.hpp   when a batch of deferred frees gets its fence
 *   sync_on_free/live_blocks.hpp    the blocks handed out, against which frees are checked
 *   sync_on_free/pending_list.hpp   the pending-free list behind its mutex
 *   sync_on_free/fence_batcher.hpp  fence records per batch, waits, release to the upstream
 *   sync_on_free/counters.hpp       the lock-free counters
 */
#pragma once

#include <rmm_fences/detail/deferred_free_list.hpp>
#include <rmm_fences/detail/sync_on_free/batch_limits.hpp>
#include <rmm_fences/detail/sync_on_free/counters.hpp>
#include <rmm_fences/detail/sync_on_free/fence_batcher.hpp>
#include <rmm_fences/detail/sync_on_free/live_blocks.hpp>
#include <rmm_fences/mr/free_result.hpp>
#include <rmm_fences/mr/stats.hpp>
#include <rmm_fences/mr/sync_mode.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

namespace rmm_fences::mr::detail {

/**
 * @brief Allocation with one drain-and-retry on out-of-memory.
 *
 * Calls `try_allocate()`; if it throws `OutOfMemory` and `drain()` freed something (returns
 * true), calls `try_allocate()` once more. Any second failure propagates.
 *
 * @return the pointer and whether a retry happened
 */
template <typename OutOfMemory, typename TryAllocate, typename Drain>
std::pair<void*, bool> allocate_with_drain(TryAllocate&& try_allocate, Drain&& drain)
{
  try {
    return {try_allocate(), false};
  } catch (OutOfMemory const&) {
    if (!drain()) { throw; }
  }
  return {try_allocate(), true};
}

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
 * In deferred mode an allocation first takes back a block of the same bytes and alignment
 * among the last `reuse_window` (16) entries of its stream, batched or fenced, when the stream
 * is the very one that freed it (same key and identity, asked outside capture): stream order
 * puts the new owner's work after the old, so no fence is needed and the upstream is not
 * called.
 *
 * Frees are checked against the blocks handed out (ptr -> bytes): a double free, a foreign
 * pointer or a size mismatch is rejected before any fence or upstream call.
 *
 * Lock rule: the core holds no lock of its own. The pending list's mutex
 * (`sync_on_free::pending_list`) guards the listed blocks and the stream identities; fence
 * records, waits, synchronizations and upstream calls run outside it. The spin lock of
 * `sync_on_free::live_blocks` guards the live-block map. The two are never held together.
 */
template <typename Platform, typename Upstream>
class sync_on_free_core {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;
  using list_type   = deferred_free_list<Platform>;
  using entry       = typename list_type::entry;
  using buffer      = typename list_type::entry_buffer;

  /// `reuse_on_stream`: in deferred mode, an allocation may take back a block freed lately on
  /// its own stream (`take_back`).
  template <typename... PlatformArgs>
  sync_on_free_core(Upstream upstream,
                    rmm_fences::mr::sync_mode mode,
                    std::optional<std::size_t> max_pending_bytes,
                    batch_limits batch,
                    bool reuse_on_stream,
                    PlatformArgs&&... platform_args)
    : platform_(std::forward<PlatformArgs>(platform_args)...),
      upstream_{std::move(upstream)},
      mode_{mode},
      reuse_on_stream_{reuse_on_stream && mode == rmm_fences::mr::sync_mode::deferred},
      batcher_{platform_,
               upstream_,
               counts_,
               max_pending_bytes,
               sync_on_free::validated(batch),
               mode == rmm_fences::mr::sync_mode::deferred ? batch.max_frees : 1}
  {
  }

  sync_on_free_core(sync_on_free_core const&)            = delete;
  sync_on_free_core& operator=(sync_on_free_core const&) = delete;

  /// In deferred mode, first a block freed lately on `stream` (`take_back`); then polls when
  /// due and allocates from the upstream; on out-of-memory drains and retries once.
  [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes, std::size_t alignment)
  {
    if (void* ptr = take_back(stream, bytes, alignment); ptr != nullptr) { return ptr; }
    // Nothing to test: no capture test either (the out-of-memory path makes its own).
    if (list().poll_due() && !platform_.is_capturing(stream)) { batcher_.poll(stream); }
    auto [ptr, retried] = allocate_with_drain<typename Platform::out_of_memory>(
      [&] { return upstream_.allocate(stream, bytes, alignment); },
      [&] {
        return !platform_.is_capturing(stream) && drain(/*include_parked=*/true, stream) > 0;
      });
    if (retried) { sync_on_free::counters::add(counts_.oom_retries, 1); }
    if (ptr != nullptr && bytes > 0) {
      try {
        live_.insert(ptr, bytes);
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
      sync_on_free::report_rejected(ptr, bytes, result);
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
      sync_on_free::counters::add(counts_.rejected_frees, 1);
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
  { return batcher_.drain(include_parked, stream); }

  [[nodiscard]] rmm_fences::mr::sync_mode mode() const noexcept { return mode_; }

  /// Whether an allocation may take back a block freed lately on its stream (deferred mode).
  [[nodiscard]] bool reuse_on_stream() const noexcept { return reuse_on_stream_; }

  [[nodiscard]] std::optional<std::size_t> max_pending_bytes() const noexcept
  { return list().max_pending_bytes(); }

  [[nodiscard]] std::size_t max_batch_frees() const noexcept { return list().batch().max_frees; }

  [[nodiscard]] std::optional<std::size_t> max_batch_bytes() const noexcept
  { return list().batch().max_bytes; }

  /// Bytes freed by the caller that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_bytes() const { return list().pending_bytes(); }

  /// Number of freed blocks that did not reach the upstream yet.
  [[nodiscard]] std::size_t pending_count() const { return list().pending_count(); }

  /// The fence the pending block at `ptr` waits for; empty when it has none (yet) or is not
  /// pending. For tests and diagnostics.
  [[nodiscard]] std::optional<fence_type> fence_of(void const* ptr) const
  { return list().fence_of(ptr); }

  /// Number of blocks handed out and not freed yet.
  [[nodiscard]] std::size_t live_count() const { return live_.size(); }

  /// A snapshot of the counters.
  [[nodiscard]] rmm_fences::mr::sync_on_free_stats stats() const
  {
    rmm_fences::mr::sync_on_free_stats s;
    list().fill(s);
    counts_.fill(s);
    return s;
  }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }

 private:
  using no_fence_rule = sync_on_free::no_fence_rule;

  /**
   * @brief Deferred mode: a pending block of `bytes` at `alignment` among the last 16 freed
   * on `stream`, when `stream` is the very stream that freed it (same key and identity, not
   * capturing); nullptr otherwise. The stream orders the new owner's work after the work that
   * used the block, so it needs no fence and never reaches the upstream in between (the CUB
   * temp-storage loop: one free and one allocation of one size per step).
   */
  void* take_back(stream_type stream, std::size_t bytes, std::size_t alignment)
  {
    if (!reuse_on_stream_ || bytes == 0) { return nullptr; }
    auto const key = platform_.key(stream);
    auto const id  = list().freed_id(key, bytes, alignment);
    // The identity is asked only outside capture (a query would invalidate the capture).
    if (!id.has_value() || platform_.is_capturing(stream) || platform_.stream_id(stream) != *id) {
      return nullptr;
    }
    auto const block = list().take_freed(key, *id, bytes, alignment);
    if (!block.has_value()) { return nullptr; }  // another thread took it first
    try {
      live_.insert(block->ptr, bytes);
    } catch (...) {  // no host memory to track it: freed again, as its owner would
      batcher_.defer(stream, *block, /*fence_now=*/false, no_fence_rule::sync_stream);
      throw;
    }
    return block->ptr;
  }

  [[nodiscard]] sync_on_free::pending_list<Platform>& list() noexcept { return batcher_.list(); }
  [[nodiscard]] sync_on_free::pending_list<Platform> const& list() const noexcept
  { return batcher_.list(); }

  /// Removes `ptr` from the live blocks if it is one of `bytes` bytes; says what it found.
  rmm_fences::mr::free_result untrack(void* ptr, std::size_t bytes) noexcept
  {
    using rmm_fences::mr::free_check;
    if (ptr == nullptr) { return {free_check::untracked, 0}; }
    if (auto const live = live_.take(ptr, bytes); live.has_value()) { return *live; }
    if (bytes == 0) { return {free_check::untracked, 0}; }
    return {list().contains(ptr) ? free_check::pending : free_check::unknown, 0};
  }

  /// Frees a checked block by the mode's rule.
  void free_block(stream_type stream, deferred_block block) noexcept
  {
    if (platform_.is_capturing(stream)) {
      batcher_.park(stream, block, /*verifiable=*/true);
      return;
    }
    switch (mode_) {
      case rmm_fences::mr::sync_mode::device:
      case rmm_fences::mr::sync_mode::stream: {
        bool const synced = mode_ == rmm_fences::mr::sync_mode::device
                              ? platform_.sync_device()
                              : platform_.sync_stream(stream);
        if (!synced) {
          counts_.count_failures(1);
          batcher_.defer(stream, block, /*fence_now=*/true, no_fence_rule::park);
          return;
        }
        counts_.count_syncs(1);
        batcher_.remember_stream(stream);
        break;
      }
      case rmm_fences::mr::sync_mode::deferred:
        batcher_.defer(stream, block, /*fence_now=*/false, no_fence_rule::sync_stream);
        return;
    }
    if (list().poll_due()) { batcher_.poll(stream); }
    upstream_.deallocate(stream, block.ptr, block.bytes, block.alignment);
  }

  Platform platform_;
  Upstream upstream_;
  rmm_fences::mr::sync_mode mode_;
  bool reuse_on_stream_;
  sync_on_free::counters counts_;
  sync_on_free::fence_batcher<Platform, Upstream> batcher_;
  sync_on_free::live_blocks live_;
};

}  // namespace rmm_fences::mr::detail
