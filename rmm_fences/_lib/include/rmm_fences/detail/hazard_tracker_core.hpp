/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core (docs/design.md#layers, policy cores) of the hazard tracker: the bookkeeping of live
 * and freed blocks and the rules that name a hazard. No CUDA calls: streams, fences and the
 * upstream are template parameters, so the CPU tests run this very code on a simulated device.
 *
 * Platform provides
 *   stream_type, fence_type
 *   fence_state: an enum with complete, pending, failed (what a non-blocking test found)
 *   static std::uintptr_t key(stream_type)           stream identity in records; a per-thread
 *                                                     default stream's key names its thread
 *                                                     (`per_thread_stream_key`)
 *   static std::optional<stream_type> stream(std::uintptr_t key)
 *                                                     and back; nullopt when the calling thread
 *                                                     cannot name that stream (another thread's
 *                                                     per-thread default stream)
 *   fence_type acquire_fence(); void release_fence(fence_type)
 *   bool record(fence_type, stream_type)              false: not recorded (no information)
 *   fence_state query(fence_type)                     of a recorded fence; failed: no information
 *   bool device_wait(stream_type waiter, fence_type)  device-side wait, no host block
 *   bool is_capturing(stream_type)                    no fence is touched on such a stream
 *   void annotate_allocation(void*, std::size_t); void annotate_free(void*)
 * Upstream provides allocate(stream, bytes, alignment) and deallocate(stream, ptr, bytes,
 * alignment).
 *
 * Invariants:
 * - A bad free (double, foreign, wrong size) never reaches the upstream and leaves the live
 *   block, if any, untouched.
 * - Every fence the core acquires is released exactly once (when its check is settled, or at
 *   destruction), on every path, exceptions included.
 * - A check that could not be made (a failed record, query or wait, a capturing stream, a
 *   stream this thread cannot name) is counted in `unchecked`: a failure is never read as
 *   "complete" (no silent pass) nor as "in flight" (no false hazard).
 * - allocations - deallocations == the live records (`outstanding()`), also when the upstream
 *   hands out an address that is still live (both records are kept).
 * - Hooks are called with the lock released.
 */
#pragma once

#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>
#include <rmm_fences/detail/stack_trace.hpp>
#include <rmm_fences/mr/hazards.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/**
 * @brief Stream keys of per-thread default streams.
 *
 * The per-thread default stream's handle (2 in CUDA) names another stream on every thread, so
 * its key carries a token of the thread: `(token << 3) | 2`, token >= 1. Stream handles are
 * pointers to driver objects (8-byte aligned), so such a key never equals a handle.
 */
struct per_thread_stream_keys {
  static constexpr std::uintptr_t tag = 2;

  /// A token of the calling thread, never reused in the process (counted from 1).
  static std::uint64_t this_thread_token() noexcept
  {
    static std::atomic<std::uint64_t> next{1};
    thread_local std::uint64_t const token = next.fetch_add(1, std::memory_order_relaxed);
    return token;
  }

  static constexpr std::uintptr_t key(std::uint64_t token) noexcept
  { return (static_cast<std::uintptr_t>(token) << 3U) | tag; }

  static constexpr bool is_per_thread(std::uintptr_t key) noexcept
  { return (key & 7U) == tag && key > 7U; }
};

template <typename Platform, typename Upstream>
class hazard_tracker_core {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;
  using fence_state = typename Platform::fence_state;
  /// Called for each hazard not raised to the caller, with the lock released.
  using hazard_hook = void (*)(hazard_record const&, void* context);

  /// The most hazard records kept (later ones are counted only), freed ranges watched,
  /// and slots of the table of recently freed addresses (which tells a double free from a
  /// foreign one; a slot holds the latest address freed that maps to it, and is read only for
  /// an address that is not live, so allocating a block again needs no update).
  static constexpr std::size_t max_hazards          = 10000;
  static constexpr std::size_t max_freed_ranges     = 1U << 16U;
  static constexpr std::size_t recently_freed_slots = 1U << 16U;
  static constexpr std::size_t freed_polls_per_call = 16;

  /**
   * @param upstream_stream_ordered true when the upstream orders reuse by stream (or frees
   * synchronously): then only undeclared cross-stream frees are checked, and a free on the
   * allocation stream makes no platform call at all.
   */
  template <typename... PlatformArgs>
  hazard_tracker_core(Upstream upstream, bool upstream_stream_ordered, PlatformArgs&&... args)
    : upstream_{std::move(upstream)},
      ordered_{upstream_stream_ordered},
      platform_{std::forward<PlatformArgs>(args)...}
  { recently_freed_.resize(recently_freed_slots); }

  hazard_tracker_core(hazard_tracker_core const&)            = delete;
  hazard_tracker_core& operator=(hazard_tracker_core const&) = delete;

  ~hazard_tracker_core() = default;

  /// Releases every fence still held (call while the platform is alive).
  void release_fences() noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    for (auto& [start, range] : freed_) {
      platform_.release_fence(range.fence);
    }
    freed_.clear();
    freed_order_.clear();
    for (auto& check : pending_) {
      platform_.release_fence(check.user_fence);
      platform_.release_fence(check.free_fence);
    }
    pending_.clear();
  }

  /// Forgets the fences without platform calls (process exit).
  void abandon_fences() noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    freed_.clear();
    freed_order_.clear();
    pending_.clear();
  }

  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }
  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] bool upstream_stream_ordered() const noexcept { return ordered_; }

  void set_hazard_hook(hazard_hook hook, void* context) noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    hook_         = hook;
    hook_context_ = context;
  }

  /// Stacks on (with an optional Python frame source) or off.
  void set_capture_stacks(bool on, stack_trace::python_hook python) noexcept
  {
    python_hook_.store(python);
    capture_stacks_.store(on);
  }
  [[nodiscard]] bool capture_stacks() const noexcept { return capture_stacks_.load(); }

  /**
   * @brief Allocates from the upstream and tracks the block.
   *
   * Over an upstream that is not stream-ordered, a block overlapping a freed range whose fence
   * has not completed, handed out on another stream, is a `reuse_before_fence`. A strict call
   * (`stopped` given) sends that block straight back to the upstream, fills `*stopped` and
   * returns nullptr.
   *
   * An address that is still live, handed out again by the upstream, is an
   * `allocated_while_live` (never stopped: the upstream's first block is still in use). Both
   * records are kept: each later free of that address takes the record of its size.
   */
  void* allocate(stream_type stream,
                 std::size_t bytes,
                 std::size_t alignment,
                 hazard_record* stopped = nullptr)
  {
    auto stack = capture_stack();
    void* ptr  = upstream_.allocate(stream, bytes, alignment);
    if (ptr == nullptr) { return nullptr; }  // an empty allocation: nothing to track
    std::vector<hazard_record> notices;
    bool give_back = false;
    try {
      std::lock_guard<spin_mutex> lock(mutex_);
      poll_locked(notices);
      auto const key = reinterpret_cast<std::uintptr_t>(ptr);
      if (!ordered_ && !freed_.empty()) {
        if (auto hazard = check_reuse_locked(key, bytes, stream, stack); hazard) {
          if (stopped != nullptr) {
            hazard->raised = true;
            give_back      = true;
            *stopped       = note_locked(std::move(*hazard), notices);
            remember_freed_locked(key, bytes);
          } else {
            note_locked(std::move(*hazard), notices);
          }
        }
      }
      if (!give_back) {
        live_block record{bytes, Platform::key(stream), {}, stack, serial_ + 1, nullptr};
        if (auto* const existing = live_.find(key); existing != nullptr) {
          hazard_record hazard{};
          hazard.kind             = hazard_kind::allocated_while_live;
          hazard.ptr              = key;
          hazard.size             = bytes;
          hazard.tracked_size     = existing->size;
          hazard.stream           = record.stream;
          hazard.streams          = {existing->stream};
          hazard.stack            = std::move(stack);
          hazard.allocation_stack = existing->stack;
          auto earlier            = std::make_unique<live_block>();  // may throw: nothing changed
          note_locked(std::move(hazard), notices);
          *earlier       = std::move(*existing);  // no throw from here on
          record.earlier = std::move(earlier);
          *existing      = std::move(record);
          shadowed_ += 1;
        } else {
          live_.insert_or_assign(key, std::move(record));
          platform_.annotate_allocation(ptr, bytes);
        }
        ++serial_;
        stats_.allocations += 1;
        stats_.allocated_bytes += bytes;
        stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.allocated_bytes);
      }
    } catch (...) {
      upstream_.deallocate(stream, ptr, bytes, alignment);  // bookkeeping failed: lose nothing
      throw;
    }
    if (give_back) { upstream_.deallocate(stream, ptr, bytes, alignment); }
    notify(notices);
    return give_back ? nullptr : ptr;
  }

  /**
   * @brief Frees a tracked block, or records why it must not reach the upstream.
   *
   * In a strict call (`stopped` given), a hazard seen at the free (a bad free, or
   * `freed_in_flight`) stops it: the block stays live, nothing reaches the upstream, `*stopped`
   * holds the hazard and true is returned.
   */
  bool deallocate(stream_type stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment,
                  hazard_record* stopped = nullptr)
  {
    if (ptr == nullptr) {
      upstream_.deallocate(stream, ptr, bytes, alignment);  // an empty allocation's free
      return false;
    }
    auto stack = capture_stack();
    std::vector<hazard_record> notices;
    bool halted  = false;
    bool release = false;
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      poll_locked(notices);
      auto const key    = reinterpret_cast<std::uintptr_t>(ptr);
      auto* const block = live_.find(key);
      if (block == nullptr) {
        auto const& freed = recently_freed_[freed_slot(key)];
        bool const again  = freed.ptr == key;
        hazard_record hazard{};
        hazard.kind         = again ? hazard_kind::double_free : hazard_kind::foreign_free;
        hazard.ptr          = key;
        hazard.size         = bytes;
        hazard.tracked_size = again ? freed.size : 0;
        hazard.stream       = Platform::key(stream);
        hazard.stack        = stack;
        stats_.rejected_frees += 1;
        halted = stop_or_note_locked(std::move(hazard), stopped, notices);
      } else {
        // The record of this size (several only after an `allocated_while_live`).
        live_block* parent = nullptr;
        live_block* match  = block;
        while (match != nullptr && match->size != bytes) {
          parent = match;
          match  = match->earlier.get();
        }
        if (match == nullptr) {
          hazard_record hazard{};
          hazard.kind             = hazard_kind::size_mismatch;
          hazard.ptr              = key;
          hazard.size             = bytes;
          hazard.tracked_size     = block->size;
          hazard.stream           = Platform::key(stream);
          hazard.stack            = stack;
          hazard.allocation_stack = block->stack;
          stats_.rejected_frees += 1;
          halted = stop_or_note_locked(std::move(hazard), stopped, notices);
        } else {
          try {
            halted = fence_free_locked(stream, key, *match, stack, stopped, notices);
          } catch (...) {
            stats_.unchecked += 1;  // no fence (out of events or host memory): free unchecked
          }
          if (!halted) {
            remember_freed_locked(key, bytes);
            stats_.deallocations += 1;
            stats_.allocated_bytes -= bytes;
            if (parent != nullptr) {
              parent->earlier = std::move(match->earlier);
              shadowed_ -= 1;
            } else if (block->earlier) {
              auto earlier = std::move(block->earlier);
              *block       = std::move(*earlier);
              shadowed_ -= 1;
            } else {
              platform_.annotate_free(ptr);
              (void)live_.take(key);
            }
            release = true;
          }
        }
      }
    }
    if (release) { upstream_.deallocate(stream, ptr, bytes, alignment); }
    notify(notices);
    return halted;
  }

  /**
   * @brief Declares that `stream` uses the live block at `ptr`: its free will be ordered after
   * the work queued on `stream` up to the free (a device-side wait, as PyTorch's
   * `record_stream` promises).
   *
   * @return false when `ptr` is not a live block of this tracker
   */
  bool record_stream(void* ptr, stream_type stream)
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    auto* block = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (block == nullptr) { return false; }
    auto const key = Platform::key(stream);
    for (; block != nullptr; block = block->earlier.get()) {  // every record of the address
      if (!declares(*block, key)) { block->declared.push_back(key); }
    }
    return true;
  }

  /// Settles the deferred checks whose fences completed (never blocks).
  void poll()
  {
    std::vector<hazard_record> notices;
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      poll_locked(notices);
    }
    notify(notices);
  }

  /// The live blocks, oldest first (an address handed out twice is listed twice).
  [[nodiscard]] std::vector<allocation_record> outstanding() const
  {
    std::vector<allocation_record> out;
    std::lock_guard<spin_mutex> lock(mutex_);
    out.reserve(live_.size() + shadowed_);
    live_.for_each([&](std::uintptr_t ptr, live_block const& head) {
      for (auto const* block = &head; block != nullptr; block = block->earlier.get()) {
        out.push_back(allocation_record{
          ptr, block->size, block->stream, block->declared, block->stack, block->serial});
      }
    });
    std::sort(
      out.begin(), out.end(), [](auto const& a, auto const& b) { return a.serial < b.serial; });
    return out;
  }

  /// The hazards recorded since construction or `reset`, oldest first.
  [[nodiscard]] std::vector<hazard_record> hazards() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    return hazards_;
  }

  /// Forgets the recorded hazards; the peak restarts from the bytes allocated now.
  void reset()
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    hazards_.clear();
    stats_.peak_bytes = stats_.allocated_bytes;
  }

  [[nodiscard]] hazard_tracker_stats stats() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    return stats_;
  }

  /// Bytes live per allocation stream (a walk over the live blocks).
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::size_t>> stream_bytes() const
  {
    std::map<std::uintptr_t, std::size_t> bytes;
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      live_.for_each([&](std::uintptr_t, live_block const& head) {
        for (auto const* block = &head; block != nullptr; block = block->earlier.get()) {
          bytes[block->stream] += block->size;
        }
      });
    }
    return {bytes.begin(), bytes.end()};
  }

  /// Deferred checks not settled yet, and freed ranges still watched.
  [[nodiscard]] std::size_t pending_checks() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    return pending_.size() + freed_.size();
  }

 private:
  struct live_block {
    std::size_t size{};
    std::uintptr_t stream{};               ///< allocation stream (its key)
    std::vector<std::uintptr_t> declared;  ///< streams declared with record_stream (keys)
    std::shared_ptr<stack_trace const> stack;
    std::uint64_t serial{};
    /// An earlier allocation of the same address, still live (`allocated_while_live`).
    std::unique_ptr<live_block> earlier;
  };

  /// A fence released when it goes out of scope unless `take()`n (no fence lost on a throw).
  class held_fence {
   public:
    explicit held_fence(Platform& platform) : platform_{platform}, fence_{platform.acquire_fence()}
    {
    }
    held_fence(held_fence const&)            = delete;
    held_fence& operator=(held_fence const&) = delete;
    ~held_fence()
    {
      if (held_) { platform_.release_fence(fence_); }
    }
    [[nodiscard]] fence_type get() const noexcept { return fence_; }
    fence_type take() noexcept
    {
      held_ = false;
      return fence_;
    }

   private:
    Platform& platform_;
    fence_type fence_;
    bool held_{true};
  };

  /// A block freed over an upstream that is not stream-ordered, until its fence completes.
  struct freed_range {
    std::size_t size{};
    std::uintptr_t stream{};
    fence_type fence{};
    std::uint64_t serial{};
  };

  /// A free on another stream than the allocation stream while that stream had work queued:
  /// a hazard if the free's fence completes while that work is still running.
  struct cross_check {
    std::uintptr_t ptr{};
    std::size_t size{};
    std::uintptr_t free_stream{};
    std::uintptr_t user_stream{};
    fence_type user_fence{};
    fence_type free_fence{};
    std::shared_ptr<stack_trace const> stack;
    std::shared_ptr<stack_trace const> allocation_stack;
  };

  struct freed_address {
    std::uintptr_t ptr{};
    std::size_t size{};
  };

  /// Direct-mapped by 256-byte granule: blocks within 16 MiB of each other never collide.
  static std::size_t freed_slot(std::uintptr_t ptr) noexcept
  { return static_cast<std::size_t>(ptr >> 8U) & (recently_freed_slots - 1); }

  /// The stream of `key` when a fence can be recorded on it now. Otherwise nullopt, and the
  /// key is listed in `unreachable` (another thread's per-thread default stream, which this
  /// thread cannot name) or the skipped check counted in `unchecked` (the stream is captured).
  std::optional<stream_type> checkable_stream_locked(std::uintptr_t key,
                                                     std::vector<std::uintptr_t>& unreachable)
  {
    auto const user = Platform::stream(key);
    if (!user) {
      unreachable.push_back(key);
      return std::nullopt;
    }
    if (platform_.is_capturing(*user)) {
      stats_.unchecked += 1;
      return std::nullopt;
    }
    return user;
  }

  /// A hazard seen at the free of the live `block` at `ptr` on the stream `free_key`.
  static hazard_record free_hazard(hazard_kind kind,
                                   std::uintptr_t ptr,
                                   live_block const& block,
                                   std::uintptr_t free_key,
                                   std::vector<std::uintptr_t> streams,
                                   std::shared_ptr<stack_trace const> const& stack)
  {
    hazard_record hazard{};
    hazard.kind             = kind;
    hazard.ptr              = ptr;
    hazard.size             = block.size;
    hazard.tracked_size     = block.size;
    hazard.stream           = free_key;
    hazard.streams          = std::move(streams);
    hazard.stack            = stack;
    hazard.allocation_stack = block.stack;
    return hazard;
  }

  static bool declares(live_block const& block, std::uintptr_t key)
  { return std::find(block.declared.begin(), block.declared.end(), key) != block.declared.end(); }

  std::shared_ptr<stack_trace const> capture_stack() const
  {
    if (!capture_stacks_.load(std::memory_order_relaxed)) { return nullptr; }
    return stack_trace::capture(python_hook_.load(), 3);
  }

  /// Orders the free after declared streams, then checks what the upstream's kind requires;
  /// true when a strict call (`stopped` given) must stop at a hazard (then in `*stopped`).
  bool fence_free_locked(stream_type stream,
                         std::uintptr_t ptr,
                         live_block const& block,
                         std::shared_ptr<stack_trace const> const& stack,
                         hazard_record* stopped,
                         std::vector<hazard_record>& notices)
  {
    auto const free_key        = Platform::key(stream);
    auto const alloc_key       = block.stream;
    bool const undeclared_user = alloc_key != free_key && !declares(block, alloc_key);
    bool const declared_other  = std::any_of(
      block.declared.begin(), block.declared.end(), [&](auto s) { return s != free_key; });
    if (ordered_ && !undeclared_user && !declared_other) { return false; }
    if (platform_.is_capturing(stream)) {
      stats_.unchecked += 1;
      return false;
    }

    std::vector<std::uintptr_t> in_flight;
    std::vector<std::uintptr_t> unreachable;  // streams this thread cannot name
    order_after_declared_locked(stream, block, free_key, in_flight, unreachable);

    if (!ordered_) {
      return check_unordered_free_locked(
        stream, ptr, block, undeclared_user, stack, stopped, notices, in_flight, unreachable);
    }

    // Stream-ordered upstream: only the undeclared allocation stream can race with reuse.
    if (undeclared_user) {
      if (auto const user = checkable_stream_locked(alloc_key, unreachable); user) {
        check_cross_locked(stream, *user, ptr, block, free_key, stack, notices);
      }
    }
    note_unreachable_locked(ptr, block, free_key, std::move(unreachable), stack, notices);
    return false;
  }

  /// Orders the free on `stream` after each stream declared for `block` (other than the freeing
  /// one) by a device-side wait on a fence recorded there; over an upstream that is not
  /// stream-ordered, a declared stream with work still queued is added to `in_flight`.
  void order_after_declared_locked(stream_type stream,
                                   live_block const& block,
                                   std::uintptr_t free_key,
                                   std::vector<std::uintptr_t>& in_flight,
                                   std::vector<std::uintptr_t>& unreachable)
  {
    for (auto const user_key : block.declared) {
      if (user_key == free_key) { continue; }
      auto const user = checkable_stream_locked(user_key, unreachable);
      if (!user) { continue; }
      held_fence fence{platform_};
      if (!platform_.record(fence.get(), *user)) {
        stats_.unchecked += 1;  // neither ordered nor checked
        continue;
      }
      stats_.fences += 1;
      if (!ordered_) { test_locked(fence.get(), user_key, in_flight); }
      if (platform_.device_wait(stream, fence.get())) {
        stats_.stream_waits += 1;
      } else {
        stats_.unchecked += 1;  // the free is not ordered after the declared stream
      }
    }
  }

  /// The checks of a free over an upstream that is not stream-ordered: the freeing stream's
  /// and, when undeclared, the allocation stream's queued work make a `freed_in_flight`; the
  /// freed range is then watched until its fence completes. Returns as `fence_free_locked`.
  bool check_unordered_free_locked(stream_type stream,
                                   std::uintptr_t ptr,
                                   live_block const& block,
                                   bool undeclared_user,
                                   std::shared_ptr<stack_trace const> const& stack,
                                   hazard_record* stopped,
                                   std::vector<hazard_record>& notices,
                                   std::vector<std::uintptr_t>& in_flight,
                                   std::vector<std::uintptr_t>& unreachable)
  {
    auto const free_key = Platform::key(stream);
    held_fence free_fence{platform_};
    bool const recorded = platform_.record(free_fence.get(), stream);
    if (recorded) {
      stats_.fences += 1;
      std::vector<std::uintptr_t> mine;
      test_locked(free_fence.get(), free_key, mine);
      in_flight.insert(in_flight.begin(), mine.begin(), mine.end());
    } else {
      stats_.unchecked += 1;
    }
    if (undeclared_user) { test_user_stream_locked(block.stream, in_flight, unreachable); }
    if (!in_flight.empty()) {
      auto hazard = free_hazard(
        hazard_kind::freed_in_flight, ptr, block, free_key, std::move(in_flight), stack);
      if (stopped != nullptr) {
        hazard.raised = true;
        *stopped      = note_locked(std::move(hazard), notices);
        return true;
      }
      note_locked(std::move(hazard), notices);
    }
    note_unreachable_locked(ptr, block, free_key, std::move(unreachable), stack, notices);
    if (recorded) { watch_freed_locked(ptr, block.size, free_key, free_fence); }
    return false;
  }

  /// Records and tests a fence on the allocation stream `alloc_key` (when it can be named and
  /// is not captured): work still queued there adds it to `in_flight`.
  void test_user_stream_locked(std::uintptr_t alloc_key,
                               std::vector<std::uintptr_t>& in_flight,
                               std::vector<std::uintptr_t>& unreachable)
  {
    auto const user = checkable_stream_locked(alloc_key, unreachable);
    if (!user) { return; }
    held_fence user_fence{platform_};
    if (platform_.record(user_fence.get(), *user)) {
      stats_.fences += 1;
      test_locked(user_fence.get(), alloc_key, in_flight);
    } else {
      stats_.unchecked += 1;
    }
  }

  /// Tests a fence just recorded on `key`'s stream: pending adds `key` to `in_flight`; a
  /// failed test is counted as unchecked (never read as complete nor as in flight).
  void test_locked(fence_type fence, std::uintptr_t key, std::vector<std::uintptr_t>& in_flight)
  {
    switch (platform_.query(fence)) {
      case fence_state::complete: break;
      case fence_state::pending: in_flight.push_back(key); break;
      default: stats_.unchecked += 1; break;
    }
  }

  /// Starts the deferred check of a free on `stream` of a block allocated on `user`, an
  /// undeclared stream, over a stream-ordered upstream.
  void check_cross_locked(stream_type stream,
                          stream_type user,
                          std::uintptr_t ptr,
                          live_block const& block,
                          std::uintptr_t free_key,
                          std::shared_ptr<stack_trace const> const& stack,
                          std::vector<hazard_record>& notices)
  {
    held_fence user_fence{platform_};
    if (!platform_.record(user_fence.get(), user)) {
      stats_.unchecked += 1;
      return;
    }
    stats_.fences += 1;
    switch (platform_.query(user_fence.get())) {
      case fence_state::complete: return;  // the allocation stream's work ran
      case fence_state::pending: break;
      default: stats_.unchecked += 1; return;
    }
    held_fence free_fence{platform_};
    if (!platform_.record(free_fence.get(), stream)) {
      stats_.unchecked += 1;
      return;
    }
    stats_.fences += 1;
    pending_.push_back(cross_check{ptr,
                                   block.size,
                                   free_key,
                                   block.stream,
                                   user_fence.get(),
                                   free_fence.get(),
                                   stack,
                                   block.stack});
    (void)user_fence.take();
    (void)free_fence.take();
    settle_cross_checks_locked(notices);
  }

  /// A free on a stream that cannot be ordered after `unreachable` (other threads' per-thread
  /// default streams, which the freeing thread cannot name): reported as a `cross_stream_free`
  /// that could not be checked, and counted as unchecked.
  void note_unreachable_locked(std::uintptr_t ptr,
                               live_block const& block,
                               std::uintptr_t free_key,
                               std::vector<std::uintptr_t> unreachable,
                               std::shared_ptr<stack_trace const> const& stack,
                               std::vector<hazard_record>& notices)
  {
    if (unreachable.empty()) { return; }
    stats_.unchecked += unreachable.size();
    note_locked(
      free_hazard(
        hazard_kind::cross_stream_free, ptr, block, free_key, std::move(unreachable), stack),
      notices);
  }

  /// A freed range overlapping [ptr, ptr + bytes) with an unfinished fence of another stream.
  std::optional<hazard_record> check_reuse_locked(std::uintptr_t ptr,
                                                  std::size_t bytes,
                                                  stream_type stream,
                                                  std::shared_ptr<stack_trace const> const& stack)
  {
    if (platform_.is_capturing(stream)) {
      stats_.unchecked += 1;
      return std::nullopt;
    }
    auto const key   = Platform::key(stream);
    auto const first = ptr >= max_freed_size_ ? ptr - max_freed_size_ + 1 : 0;
    std::optional<hazard_record> found;
    for (auto it = freed_.lower_bound(first); it != freed_.end() && it->first < ptr + bytes;) {
      auto const& range = it->second;
      if (it->first + range.size <= ptr) {
        ++it;
        continue;
      }
      auto const state =
        !found && range.stream != key ? platform_.query(range.fence) : fence_state::complete;
      if (state == fence_state::failed) { stats_.unchecked += 1; }
      if (state == fence_state::pending) {
        hazard_record hazard{};
        hazard.kind         = hazard_kind::reuse_before_fence;
        hazard.ptr          = ptr;
        hazard.size         = bytes;
        hazard.tracked_size = range.size;
        hazard.stream       = key;
        hazard.streams      = {range.stream};
        hazard.stack        = stack;
        found               = std::move(hazard);
      }
      platform_.release_fence(range.fence);
      it = freed_.erase(it);  // the range is live again
    }
    return found;
  }

  void watch_freed_locked(std::uintptr_t ptr,
                          std::size_t size,
                          std::uintptr_t stream,
                          held_fence& fence)
  {
    if (freed_.size() >= max_freed_ranges) {
      drop_oldest_freed_locked();
      stats_.unchecked += 1;
    }
    auto const serial = freed_serial_ + 1;
    auto const it     = freed_.emplace(ptr, freed_range{size, stream, fence.get(), serial});
    try {
      freed_order_.emplace_back(ptr, serial);
    } catch (...) {
      freed_.erase(it);
      throw;
    }
    (void)fence.take();
    freed_serial_   = serial;
    max_freed_size_ = std::max(max_freed_size_, size);
  }

  /// The oldest watched range (already settled entries are skipped).
  typename std::multimap<std::uintptr_t, freed_range>::iterator oldest_freed_locked()
  {
    while (!freed_order_.empty()) {
      auto const [ptr, serial] = freed_order_.front();
      auto [lo, hi]            = freed_.equal_range(ptr);
      for (auto it = lo; it != hi; ++it) {
        if (it->second.serial == serial) { return it; }
      }
      freed_order_.pop_front();
    }
    return freed_.end();
  }

  void drop_oldest_freed_locked()
  {
    auto const it = oldest_freed_locked();
    if (it == freed_.end()) { return; }
    platform_.release_fence(it->second.fence);
    freed_.erase(it);
    freed_order_.pop_front();
  }

  void poll_locked(std::vector<hazard_record>& notices)
  {
    if (!pending_.empty()) { settle_cross_checks_locked(notices); }
    if (freed_order_.empty()) { return; }  // always so over a stream-ordered upstream
    for (std::size_t i = 0; i < freed_polls_per_call && !freed_.empty(); ++i) {
      auto const it = oldest_freed_locked();
      // pending, or a failed test (retried later; a reuse tests it again)
      if (it == freed_.end() || platform_.query(it->second.fence) != fence_state::complete) {
        break;
      }
      platform_.release_fence(it->second.fence);
      freed_.erase(it);
      freed_order_.pop_front();
    }
    if (freed_.empty()) {
      freed_order_.clear();
      max_freed_size_ = 0;
    }
  }

  /// A cross-stream free is proven unordered when its fence completes before the work that
  /// was queued on the allocation stream at the free; settled either way once one completes.
  /// A failed test settles it as unchecked (a later answer could hide the order in between).
  void settle_cross_checks_locked(std::vector<hazard_record>& notices)
  {
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto const user = platform_.query(it->user_fence);
      auto const free =
        user == fence_state::pending ? platform_.query(it->free_fence) : fence_state::pending;
      if (user == fence_state::pending && free == fence_state::pending) {
        ++it;
        continue;
      }
      bool const failed = user == fence_state::failed || free == fence_state::failed;
      if (failed) { stats_.unchecked += 1; }
      if (user == fence_state::pending && free == fence_state::complete) {
        hazard_record hazard{};
        hazard.kind             = hazard_kind::cross_stream_free;
        hazard.ptr              = it->ptr;
        hazard.size             = it->size;
        hazard.tracked_size     = it->size;
        hazard.stream           = it->free_stream;
        hazard.streams          = {it->user_stream};
        hazard.stack            = it->stack;
        hazard.allocation_stack = it->allocation_stack;
        note_locked(std::move(hazard), notices);
      }
      platform_.release_fence(it->user_fence);
      platform_.release_fence(it->free_fence);
      it = pending_.erase(it);
    }
  }

  /// Records a bad free; a strict call gets it in `*stopped` (and true).
  bool stop_or_note_locked(hazard_record hazard,
                           hazard_record* stopped,
                           std::vector<hazard_record>& notices)
  {
    hazard.raised = stopped != nullptr;
    auto noted    = note_locked(std::move(hazard), notices);
    if (stopped != nullptr) { *stopped = std::move(noted); }
    return stopped != nullptr;
  }

  /// Records `hazard` (numbered) and queues it for the hook unless it is raised; returns it.
  hazard_record note_locked(hazard_record hazard, std::vector<hazard_record>& notices)
  {
    stats_.hazards += 1;
    hazard.serial = stats_.hazards;
    if (hazards_.size() < max_hazards) { hazards_.push_back(hazard); }
    if (!hazard.raised && hook_ != nullptr) { notices.push_back(hazard); }
    return hazard;
  }

  void notify(std::vector<hazard_record> const& notices)
  {
    if (notices.empty()) { return; }
    hazard_hook hook{};
    void* context{};
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      hook    = hook_;
      context = hook_context_;
    }
    if (hook == nullptr) { return; }
    for (auto const& hazard : notices) {
      hook(hazard, context);
    }
  }

  void remember_freed_locked(std::uintptr_t ptr, std::size_t size) noexcept
  { recently_freed_[freed_slot(ptr)] = freed_address{ptr, size}; }

  Upstream upstream_;
  bool const ordered_;
  Platform platform_;

  mutable spin_mutex mutex_;
  pointer_map<live_block> live_;
  std::multimap<std::uintptr_t, freed_range> freed_;
  std::deque<std::pair<std::uintptr_t, std::uint64_t>> freed_order_;
  std::size_t max_freed_size_{};
  std::uint64_t freed_serial_{};
  std::vector<cross_check> pending_;
  std::vector<freed_address> recently_freed_;
  std::vector<hazard_record> hazards_;
  std::size_t shadowed_{};  ///< earlier records of live addresses (`live_block::earlier`)
  hazard_tracker_stats stats_{};
  std::uint64_t serial_{};
  hazard_hook hook_{};
  void* hook_context_{};
  std::atomic<bool> capture_stacks_{false};
  std::atomic<stack_trace::python_hook> python_hook_{nullptr};
};

}  // namespace rmm_fences::mr::detail
