/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of SyncOnFreeResourceAdaptor (DESIGN.md layer 1): no CUDA calls. The CUDA build
 * plugs in `cuda_platform` (events, stream sync); the CPU tests plug in manual fences and host
 * memory, so both run this very code.
 */
#pragma once

#include <rmm_fences/detail/deferred_free_list.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <optional>
#include <utility>

namespace rmm_fences::mr {

/// What `sync_on_free_resource_adaptor` does before a freed block goes back upstream.
enum class sync_mode : int {
  device   = 0,  ///< synchronize the adaptor's device (what cudaFree does)
  stream   = 1,  ///< synchronize the freeing stream
  deferred = 2,  ///< record an event; release the block once the event completed
};

/// Counters of a `sync_on_free_resource_adaptor` (monotonic, except the peak).
struct sync_on_free_stats {
  std::uint64_t syncs{};               ///< host waits: device or stream syncs, fence waits
  std::uint64_t deferred{};            ///< frees that recorded a fence and returned at once
  std::uint64_t released{};            ///< listed blocks handed to the upstream
  std::uint64_t oom_retries{};         ///< allocations retried after draining pending blocks
  std::uint64_t parked{};              ///< frees made during stream capture
  std::uint64_t peak_pending_bytes{};  ///< largest pending total seen (after the cap applied)
};

}  // namespace rmm_fences::mr

namespace rmm_fences::detail {

/**
 * @brief The rules of SyncOnFree, over a platform and an upstream.
 *
 * `Platform` provides:
 *
 *   using fence_type; using stream_type; using out_of_memory;     // exception of the upstream
 *   bool ready(fence_type); void wait(fence_type);                // fence test / blocking wait
 *   fence_type acquire_fence(); void release_fence(fence_type) noexcept;
 *   bool record(fence_type, stream_type) noexcept;                // fence after queued work
 *   bool is_capturing(stream_type) noexcept;
 *   void sync_device() noexcept; bool try_sync_device() noexcept; void sync_stream(stream_type)
 *   std::uintptr_t key(stream_type) noexcept; stream_type default_stream() noexcept;
 *
 * `Upstream` provides `void* allocate(stream, bytes, alignment)` and a `noexcept deallocate`.
 *
 * Rules (DESIGN.md): in deferred mode a fence is recorded on the freeing stream before the block
 * is listed; a listed block goes upstream only after its fence reported ready or was waited on;
 * every call polls without blocking; above `max_pending_bytes` the oldest fences are waited on;
 * on out-of-memory every fence is waited on and the allocation retried once. During capture of
 * the calling stream nothing is queried or synchronized: frees are parked and get their fence at
 * the next call on that stream outside capture. One mutex guards the list; fence waits and
 * upstream calls run outside it.
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
        return !platform_.is_capturing(stream) && drain(/*include_parked=*/false, stream) > 0;
      });
    if (retried) { oom_retries_.fetch_add(1, std::memory_order_relaxed); }
    return ptr;
  }

  /// Frees by the mode's rule; parks the block during capture of `stream`.
  void deallocate(stream_type stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept
  {
    deferred_block const block{ptr, bytes, alignment};
    if (platform_.is_capturing(stream)) {
      park(stream, block);
      return;
    }
    switch (mode_) {
      case rmm_fences::mr::sync_mode::device:
        platform_.sync_device();
        count_syncs(1);
        break;
      case rmm_fences::mr::sync_mode::stream:
        platform_.sync_stream(stream);
        count_syncs(1);
        break;
      case rmm_fences::mr::sync_mode::deferred:
        if (defer(stream, block)) { return; }
        break;
    }
    if (listed_hint_.load(std::memory_order_relaxed) > 0) { poll(stream); }
    upstream_.deallocate(stream, ptr, bytes, alignment);
  }

  /**
   * @brief Waits for every fenced block and returns it upstream on `stream`.
   *
   * With `include_parked`, parked blocks go too if a device synchronization succeeds (it fails
   * while a capture is under way; they stay parked then).
   * @return the number of blocks returned
   */
  std::size_t drain(bool include_parked, stream_type stream)
  {
    buffer taken;
    bool any_parked = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      list_.take_all_fenced(taken);
      any_parked = list_.parked_count() > 0;
      list_changed();
    }
    count_syncs(wait_all(platform_, taken));
    if (include_parked && any_parked && platform_.try_sync_device()) {
      count_syncs(1);
      std::lock_guard<std::mutex> lock(mutex_);
      list_.take_parked(taken);
      list_changed();
    }
    auto const n = taken.size();
    release(taken, stream);
    return n;
  }

  [[nodiscard]] rmm_fences::mr::sync_mode mode() const noexcept { return mode_; }

  [[nodiscard]] std::optional<std::size_t> max_pending_bytes() const noexcept
  {
    return max_pending_bytes_;
  }

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
    return s;
  }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }

 private:
  void count_syncs(std::size_t n) noexcept
  {
    if (n > 0) { syncs_.fetch_add(n, std::memory_order_relaxed); }
  }

  /// Updates the peak and the lock-free hint after the list changed (caller holds the lock).
  void list_changed() noexcept
  {
    peak_pending_bytes_ = std::max<std::uint64_t>(peak_pending_bytes_, list_.pending_bytes());
    listed_hint_.store(list_.pending_count(), std::memory_order_relaxed);
  }

  /// Records a fence and lists the block; false when it could not (the caller then frees it
  /// synchronously, after this function waited on the stream).
  bool defer(stream_type stream, deferred_block block) noexcept
  {
    typename Platform::fence_type fence{};
    try {
      fence = platform_.acquire_fence();
    } catch (...) {
      platform_.sync_stream(stream);
      count_syncs(1);
      return false;
    }
    // The fence is recorded before the block is listed, so no thread sees it without its fence.
    if (!platform_.record(fence, stream)) {
      platform_.release_fence(fence);
      platform_.sync_stream(stream);
      count_syncs(1);
      return false;
    }
    buffer ready;
    buffer oldest;
    bool listed = false;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      arm_parked(stream);
      list_.release_ready(platform_, ready);
      list_.push(platform_.key(stream), block, fence);
      listed = true;
      ++deferred_;
      if (max_pending_bytes_ && list_.pending_bytes() > *max_pending_bytes_) {
        list_.take_oldest_until(*max_pending_bytes_, oldest);
      }
      list_changed();
    } catch (...) {
      // Out of host memory while listing; an unlisted block is freed synchronously instead.
    }
    if (!listed) {
      platform_.wait(fence);
      count_syncs(1);
      platform_.release_fence(fence);
    }
    count_syncs(wait_all(platform_, oldest));
    release(ready, stream);
    release(oldest, stream);
    return listed;
  }

  void park(stream_type stream, deferred_block block) noexcept
  {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      list_.park(platform_.key(stream), block);
      ++parked_;
      list_changed();
    } catch (...) {
      // No host memory to list it: during capture, leaking the block is the only safe choice.
    }
  }

  /// Gives the parked blocks of `stream` their fence (caller holds the lock; not capturing).
  void arm_parked(stream_type stream)
  {
    if (!list_.has_parked(platform_.key(stream))) { return; }
    list_.arm(platform_.key(stream), [&] {
      auto fence = platform_.acquire_fence();
      if (!platform_.record(fence, stream)) {
        platform_.release_fence(fence);
        throw std::bad_alloc{};
      }
      return fence;
    });
  }

  /// Returns every block whose fence completed; never blocks.
  void poll(stream_type stream) noexcept
  {
    buffer ready;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      arm_parked(stream);
      list_.release_ready(platform_, ready);
      list_changed();
    } catch (...) {
      // Arming failed (no fence or no host memory): the blocks stay listed for a later call.
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
  std::atomic<std::size_t> listed_hint_{};  // pending_count, read without the lock
  std::atomic<std::uint64_t> syncs_{};
  std::atomic<std::uint64_t> released_{};
  std::atomic<std::uint64_t> oom_retries_{};
};

}  // namespace rmm_fences::detail
