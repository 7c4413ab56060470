/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core of the PyTorch allocator (rmm_fences.allocators.torch; docs/torch.md,
 * docs/design.md#layers, policy cores): no CUDA calls. The CUDA build plugs in
 * `torch_cuda_platform` (_torch.hpp); the CPU tests plug in a logging host platform, so both run
 * this very code.
 */
#pragma once

#include <rmm_fences/detail/inline_vector.hpp>
#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <utility>

namespace rmm_fences::mr::detail {

/**
 * @brief What PyTorch's pluggable allocator needs from an RMM resource: stream-ordered
 * allocations whose free honours `Tensor.record_stream`.
 *
 * PyTorch frees a block on the stream it was allocated on (with its size), whatever streams used
 * it since. `record_stream(ptr, s)` says that `s` used the block too: at the free, the
 * allocation stream first waits (on the device) for a fence recorded on each such `s`, so the
 * stream-ordered free on the allocation stream comes after their work.
 *
 * `Platform` provides:
 *
 *   using fence_type; using stream_type; using out_of_memory;     // exception of the upstream
 *   fence_type acquire_fence(); void release_fence(fence_type) noexcept;
 *   bool record(fence_type, stream_type) noexcept;                // fence after queued work
 *   bool device_wait(stream_type waiter, fence_type) noexcept;    // waiter waits, host does not
 *   bool sync_stream(stream_type) noexcept;                       // host waits; false: failed
 *
 * `Upstream` provides `void* allocate(stream, bytes, alignment)` and a `noexcept
 * deallocate(stream, ptr, bytes, alignment)`.
 *
 * Rules: a free of a pointer that is not live here (double free, foreign pointer) or of another
 * size is rejected (counted, one line on stderr) and never reaches the upstream. For each
 * recorded stream a fence is recorded there and the allocation stream waits on it; the fence is
 * released as soon as the wait is enqueued (a wait uses the record current at the time of the
 * call). When the record or the wait fails the host synchronizes the recorded stream instead;
 * when that fails too the block is leaked (counted): handing it back would let the upstream
 * reuse it while that stream may still use it.
 *
 * Thread-safe: one mutex guards the live blocks and the byte counters; it is never held across
 * an upstream call or a platform call.
 */
template <typename Platform, typename Upstream>
class torch_allocator_core {
 public:
  using stream_type = typename Platform::stream_type;

  /// rmm's CUDA_ALLOCATION_ALIGNMENT: every block is asked of the upstream with it.
  static constexpr std::size_t alignment = 256;

  template <typename... PlatformArgs>
  explicit torch_allocator_core(Upstream upstream, PlatformArgs&&... platform_args)
    : platform_(std::forward<PlatformArgs>(platform_args)...), upstream_{std::move(upstream)}
  {
  }

  torch_allocator_core(torch_allocator_core const&)            = delete;
  torch_allocator_core& operator=(torch_allocator_core const&) = delete;

  /**
   * @brief A block of `bytes` from the upstream on `stream`, remembered until its free.
   *
   * The upstream's out-of-memory exception is counted (`num_ooms`) and rethrown. A 0-byte
   * request goes to the upstream as it is; a null result is neither remembered nor counted.
   */
  [[nodiscard]] void* allocate(stream_type stream, std::size_t bytes)
  {
    void* ptr = nullptr;
    try {
      ptr = upstream_.allocate(stream, bytes, alignment);
    } catch (typename Platform::out_of_memory const&) {
      num_ooms_.fetch_add(1, std::memory_order_relaxed);
      throw;
    }
    if (ptr == nullptr) { return ptr; }
    try {
      block b;
      b.bytes  = bytes;
      b.stream = stream;
      std::lock_guard<std::mutex> lock(mutex_);
      live_.insert_or_assign(reinterpret_cast<std::uintptr_t>(ptr), std::move(b));
      ++counts_.allocations;
      counts_.allocated_bytes += bytes;
      ++counts_.current_allocations;
      counts_.current_bytes += bytes;
      counts_.peak_allocations = std::max(counts_.peak_allocations, counts_.current_allocations);
      counts_.peak_bytes       = std::max(counts_.peak_bytes, counts_.current_bytes);
    } catch (...) {
      upstream_.deallocate(stream, ptr, bytes, alignment);
      throw;
    }
    return ptr;
  }

  /**
   * @brief `allocate`, but the upstream's out-of-memory gives nullptr (still counted in
   * `num_ooms`) instead of an exception; any other exception propagates.
   *
   * For PyTorch's native caching allocator over a MemPool (`torch.cuda.MemPool`), which takes
   * nullptr as out of memory: it then frees its cached segments, retries, and raises
   * `torch.cuda.OutOfMemoryError`.
   */
  [[nodiscard]] void* try_allocate(stream_type stream, std::size_t bytes)
  {
    try {
      return allocate(stream, bytes);
    } catch (typename Platform::out_of_memory const&) {
      return nullptr;
    }
  }

  /**
   * @brief `stream` uses the block at `ptr` (exactly what `allocate` returned) too.
   *
   * The allocation stream itself, or a stream already recorded, adds nothing. A pointer that is
   * not live here is counted in `unknown_record_streams` and otherwise ignored.
   * @return whether `ptr` is a live block
   */
  bool record_stream(void* ptr, stream_type stream)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* b = ptr == nullptr ? nullptr : live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == nullptr) {
      unknown_record_streams_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    ++counts_.record_stream_calls;
    if (stream == b->stream) { return true; }
    for (auto const& s : b->recorded) {
      if (s == stream) { return true; }
    }
    b->recorded.push_back(stream);
    return true;
  }

  /**
   * @brief Returns the block to the upstream on `stream` after every recorded stream's work.
   *
   * `bytes` and `stream` are the block's (PyTorch passes those of the allocation; a free on
   * another stream waits for the allocation stream as for a recorded one). Never throws; a bad
   * free changes nothing but the counters and one line on stderr.
   */
  void deallocate(void* ptr, std::size_t bytes, stream_type stream) noexcept
  {
    if (ptr == nullptr) { return; }
    block b;
    std::optional<std::size_t> mismatch;
    bool accepted = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto const i = live_.find_index(reinterpret_cast<std::uintptr_t>(ptr));
      if (i != live_.npos && live_.value_at(i).bytes != bytes) {
        mismatch = live_.value_at(i).bytes;
      } else if (i != live_.npos) {
        b = std::move(live_.value_at(i));
        live_.erase_at(i);
        ++counts_.frees;
        counts_.freed_bytes += bytes;
        --counts_.current_allocations;
        counts_.current_bytes -= bytes;
        accepted = true;
      }
    }
    if (!accepted) {
      rejected_frees_.fetch_add(1, std::memory_order_relaxed);
      report_rejected(ptr, bytes, mismatch);
      return;
    }
    // PyTorch frees on the allocation stream; a free on another stream orders it after the
    // allocation stream's work as after a recorded stream's.
    bool counted       = false;
    auto const ordered = [&](stream_type used) {
      if (used == stream) { return true; }
      if (!counted) {
        recorded_frees_.fetch_add(1, std::memory_order_relaxed);
        counted = true;
      }
      return order_after(stream, used);
    };
    bool safe = ordered(b.stream);
    for (std::size_t i = 0; safe && i < b.recorded.size(); ++i) {
      safe = ordered(b.recorded[i]);
    }
    if (!safe) {
      leaked_blocks_.fetch_add(1, std::memory_order_relaxed);
      leaked_bytes_.fetch_add(bytes, std::memory_order_relaxed);
      return;
    }
    upstream_.deallocate(stream, ptr, bytes, alignment);
  }

  /// A snapshot of the counters.
  [[nodiscard]] rmm_fences::mr::torch_allocator_stats stats() const
  {
    rmm_fences::mr::torch_allocator_stats s;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      s = counts_;
    }
    s.num_ooms               = num_ooms_.load(std::memory_order_relaxed);
    s.recorded_frees         = recorded_frees_.load(std::memory_order_relaxed);
    s.stream_waits           = stream_waits_.load(std::memory_order_relaxed);
    s.stream_syncs           = stream_syncs_.load(std::memory_order_relaxed);
    s.leaked_blocks          = leaked_blocks_.load(std::memory_order_relaxed);
    s.leaked_bytes           = leaked_bytes_.load(std::memory_order_relaxed);
    s.rejected_frees         = rejected_frees_.load(std::memory_order_relaxed);
    s.unknown_record_streams = unknown_record_streams_.load(std::memory_order_relaxed);
    return s;
  }

  /// The peaks restart from the current values.
  void reset_peak() noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    counts_.peak_allocations = counts_.current_allocations;
    counts_.peak_bytes       = counts_.current_bytes;
  }

  /// Number of blocks handed out and not freed yet.
  [[nodiscard]] std::size_t live_count() const
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.size();
  }

  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }

 private:
  /// A live block: its size, allocation stream and the other streams recorded on it.
  struct block {
    std::size_t bytes{};
    stream_type stream{};
    inline_vector<stream_type, 2> recorded;
  };

  /**
   * @brief Orders `waiter` after the work queued on `used` so far: a device-side wait on a
   * fence recorded there, else a host sync of `used`. False: neither worked.
   */
  bool order_after(stream_type waiter, stream_type used) noexcept
  {
    std::optional<typename Platform::fence_type> fence;
    try {
      fence = platform_.acquire_fence();
    } catch (...) {
    }
    if (fence.has_value()) {
      bool const ordered = platform_.record(*fence, used) && platform_.device_wait(waiter, *fence);
      // The wait is enqueued with the record current now: the fence can be reused at once.
      platform_.release_fence(*fence);
      if (ordered) {
        stream_waits_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
    }
    if (platform_.sync_stream(used)) {
      stream_syncs_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    return false;
  }

  static void report_rejected(void* ptr,
                              std::size_t bytes,
                              std::optional<std::size_t> allocated) noexcept
  {
    if (allocated.has_value()) {
      std::fprintf(stderr,
                   "rmm_fences: torch allocator rejected the free of %p (%zu bytes): size "
                   "mismatch, the block was allocated with %zu bytes; nothing was freed\n",
                   ptr,
                   bytes,
                   *allocated);
    } else {
      std::fprintf(stderr,
                   "rmm_fences: torch allocator rejected the free of %p (%zu bytes): not a live "
                   "block of this allocator (double free or foreign pointer); nothing was freed\n",
                   ptr,
                   bytes);
    }
  }

  Platform platform_;
  Upstream upstream_;

  mutable std::mutex mutex_;
  pointer_map<block> live_{256};                  // guarded by mutex_
  rmm_fences::mr::torch_allocator_stats counts_;  // guarded by mutex_: the byte/block counters
  std::atomic<std::uint64_t> num_ooms_{};
  std::atomic<std::uint64_t> recorded_frees_{};
  std::atomic<std::uint64_t> stream_waits_{};
  std::atomic<std::uint64_t> stream_syncs_{};
  std::atomic<std::uint64_t> leaked_blocks_{};
  std::atomic<std::uint64_t> leaked_bytes_{};
  std::atomic<std::uint64_t> rejected_frees_{};
  std::atomic<std::uint64_t> unknown_record_streams_{};
};

}  // namespace rmm_fences::mr::detail
