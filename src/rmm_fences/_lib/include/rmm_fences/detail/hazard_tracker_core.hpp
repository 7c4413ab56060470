/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Policy core (docs/design.md#layers, policy cores) of the hazard tracker: the bookkeeping of live
 * and freed blocks and the rules that name a hazard. No CUDA calls: streams, fences and the
 * upstream are template parameters, so the CPU tests run this very code on a simulated device.
 * This header holds the calls (allocate, free, record_stream, queries); its parts are
 *   tracker/allocation_ledger.hpp  the live blocks and the recently freed addresses
 *   tracker/fence_checks.hpp       the fence checks at a free and an allocation (detection)
 *   tracker/freed_ranges.hpp       freed ranges watched until their fence completes
 *   tracker/cross_checks.hpp       deferred checks of cross-stream frees
 *   tracker/hazard_log.hpp         the hazards recorded, and the hook (report)
 *   tracker/held_fence.hpp         a fence released on every path
 *
 * Platform provides
 *   stream_type, fence_type
 *   fence_state: an enum with complete, pending, failed (what a non-blocking test found)
 *   static std::uintptr_t key(stream_type)           stream identity in records; a per-thread
 *                                                     default stream's key names its thread
 *                                                     (`per_thread_stream_keys`,
 *                                                     stream_identity.hpp)
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
 *
 * Lock rule: one spin lock, `mutex_`, guards the ledger, the fence checks, the log and `stats_`
 * (the parts hold no lock of their own); members ending in `_locked` expect it held. Upstream
 * calls, stack captures and the hook run with it released. Platform calls (records, tests,
 * device waits, annotations) run under it: a platform's own lock (its fence pool) is taken after
 * it, never before. `capture_stacks_` and `python_hook_` are atomics, read without it.
 */
#pragma once

#include <rmm_fences/detail/spin_mutex.hpp>
#include <rmm_fences/detail/stack_trace.hpp>
#include <rmm_fences/detail/tracker/allocation_ledger.hpp>
#include <rmm_fences/detail/tracker/fence_checks.hpp>
#include <rmm_fences/detail/tracker/hazard_log.hpp>
#include <rmm_fences/mr/free_result.hpp>
#include <rmm_fences/mr/hazards.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

template <typename Platform, typename Upstream>
class hazard_tracker_core {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;
  using fence_state = typename Platform::fence_state;
  /// Called for each hazard not raised to the caller, with the lock released.
  using hazard_hook = tracker::hazard_log::hazard_hook;

  static constexpr std::size_t max_hazards      = tracker::hazard_log::max_hazards;
  static constexpr std::size_t max_freed_ranges = tracker::freed_ranges<Platform>::max_ranges;
  static constexpr std::size_t recently_freed_slots =
    tracker::allocation_ledger::recently_freed_slots;
  static constexpr std::size_t freed_polls_per_call =
    tracker::freed_ranges<Platform>::polls_per_call;

  /**
   * @param upstream_stream_ordered true when the upstream orders reuse by stream (or frees
   * synchronously): then only undeclared cross-stream frees are checked, and a free on the
   * allocation stream makes no platform call at all.
   */
  template <typename... PlatformArgs>
  hazard_tracker_core(Upstream upstream, bool upstream_stream_ordered, PlatformArgs&&... args)
    : upstream_{std::move(upstream)},
      ordered_{upstream_stream_ordered},
      platform_{std::forward<PlatformArgs>(args)...},
      checks_{platform_, ordered_, stats_, log_}
  {
  }

  hazard_tracker_core(hazard_tracker_core const&)            = delete;
  hazard_tracker_core& operator=(hazard_tracker_core const&) = delete;

  ~hazard_tracker_core() = default;

  /// Releases every fence still held (call while the platform is alive).
  void release_fences() noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    checks_.release_fences();
  }

  /// Forgets the fences without platform calls (process exit).
  void abandon_fences() noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    checks_.abandon_fences();
  }

  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }
  [[nodiscard]] Platform& platform() noexcept { return platform_; }
  [[nodiscard]] bool upstream_stream_ordered() const noexcept { return ordered_; }

  void set_hazard_hook(hazard_hook hook, void* context) noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    log_.set_hook(hook, context);
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
      checks_.poll(notices);
      give_back = track_locked(call_site{stream, ptr, bytes, stack, stopped, notices});
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
    free_outcome outcome{};
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      checks_.poll(notices);
      outcome = untrack_locked(call_site{stream, ptr, bytes, stack, stopped, notices});
    }
    if (outcome.release) { upstream_.deallocate(stream, ptr, bytes, alignment); }
    notify(notices);
    return outcome.halted;
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
    return ledger_.declare(reinterpret_cast<std::uintptr_t>(ptr), Platform::key(stream));
  }

  /// Settles the deferred checks whose fences completed (never blocks).
  void poll()
  {
    std::vector<hazard_record> notices;
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      checks_.poll(notices);
    }
    notify(notices);
  }

  /// The live blocks, oldest first (an address handed out twice is listed twice).
  [[nodiscard]] std::vector<allocation_record> outstanding() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    return ledger_.outstanding();
  }

  /// The hazards recorded since construction or `reset`, oldest first.
  [[nodiscard]] std::vector<hazard_record> hazards() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    return log_.records();
  }

  /// Forgets the recorded hazards; the peak restarts from the bytes allocated now.
  void reset()
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    log_.clear();
    stats_.peak_bytes = stats_.allocated_bytes;
  }

  [[nodiscard]] hazard_tracker_stats stats() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    auto s    = stats_;
    s.hazards = log_.count();
    return s;
  }

  /// Bytes live per allocation stream (a walk over the live blocks).
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::size_t>> stream_bytes() const
  {
    std::map<std::uintptr_t, std::size_t> bytes;
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      ledger_.add_stream_bytes(bytes);
    }
    return {bytes.begin(), bytes.end()};
  }

  /// Deferred checks not settled yet, and freed ranges still watched.
  [[nodiscard]] std::size_t pending_checks() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    return checks_.pending();
  }

 private:
  using live_block = tracker::live_block;
  using stack_ptr  = std::shared_ptr<stack_trace const>;

  /// One allocate or free call, as its locked steps see it (`stopped`: a strict call's hazard).
  struct call_site {
    stream_type stream;
    void* ptr;
    std::size_t bytes;
    stack_ptr const& stack;
    hazard_record* stopped;
    std::vector<hazard_record>& notices;

    [[nodiscard]] std::uintptr_t key() const noexcept
    { return reinterpret_cast<std::uintptr_t>(ptr); }
  };

  /// What a free did: stopped at a hazard (strict call), or handed to the upstream.
  struct free_outcome {
    bool halted{};
    bool release{};
  };

  stack_ptr capture_stack() const
  {
    if (!capture_stacks_.load(std::memory_order_relaxed)) { return nullptr; }
    return stack_trace::capture(python_hook_.load(), 3);
  }

  /// Checks the reuse of freed ranges and records the block `c.ptr`; true when a strict call
  /// stops at a `reuse_before_fence` (the block goes back to the upstream untracked).
  [[gnu::always_inline]] bool track_locked(call_site const& c)
  {
    auto const key = c.key();
    if (auto hazard = checks_.check_reuse(key, c.bytes, c.stream, c.stack); hazard) {
      if (c.stopped != nullptr) {
        hazard->raised = true;
        *c.stopped     = log_.note(std::move(*hazard), c.notices);
        ledger_.remember_freed(key, c.bytes);
        return true;
      }
      log_.note(std::move(*hazard), c.notices);
    }
    add_record_locked(c);
    return false;
  }

  /// Records the block `c.ptr`; an address still live is an `allocated_while_live`, and both
  /// records are kept.
  [[gnu::always_inline]] void add_record_locked(call_site const& c)
  {
    auto const key = c.key();
    if (auto* const existing = ledger_.find(key); existing != nullptr) {
      live_block record{c.bytes, Platform::key(c.stream), {}, c.stack, serial_ + 1, nullptr};
      hazard_record hazard{.kind             = hazard_kind::allocated_while_live,
                           .ptr              = key,
                           .size             = c.bytes,
                           .tracked_size     = existing->size,
                           .stream           = record.stream,
                           .streams          = {existing->stream},
                           .stack            = c.stack,
                           .allocation_stack = existing->stack};
      auto earlier = std::make_unique<live_block>();  // may throw: nothing changed
      log_.note(std::move(hazard), c.notices);
      ledger_.shadow(*existing, std::move(record), std::move(earlier));  // no throw from here on
    } else {
      auto& record  = ledger_.insert(key);  // may throw: nothing changed
      record.size   = c.bytes;
      record.stream = Platform::key(c.stream);
      record.stack  = c.stack;
      record.serial = serial_ + 1;
      platform_.annotate_allocation(c.ptr, c.bytes);
    }
    ++serial_;
    stats_.allocations += 1;
    stats_.allocated_bytes += c.bytes;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.allocated_bytes);
  }

  /// The free of `c.ptr`: rejected (a bad free), stopped at a hazard (strict call), or checked
  /// and forgotten, to be handed to the upstream.
  [[gnu::always_inline]] free_outcome untrack_locked(call_site const& c)
  {
    auto const key   = c.key();
    auto const match = ledger_.match_free(key, c.bytes);
    if (match.result.check == free_check::unknown) { return {reject_unknown_locked(c), false}; }
    if (match.result.check == free_check::size_mismatch) {
      hazard_record hazard{.kind             = hazard_kind::size_mismatch,
                           .ptr              = key,
                           .size             = c.bytes,
                           .tracked_size     = match.result.allocated_bytes,
                           .stream           = Platform::key(c.stream),
                           .stack            = c.stack,
                           .allocation_stack = match.head->stack};
      stats_.rejected_frees += 1;
      return {log_.stop_or_note(std::move(hazard), c.stopped, c.notices), false};
    }
    bool halted = false;
    try {
      halted = checks_.check_free(c.stream, key, *match.block, c.stack, c.stopped, c.notices);
    } catch (...) {
      stats_.unchecked += 1;  // no fence (out of events or host memory): free unchecked
    }
    if (halted) { return {true, false}; }
    ledger_.remember_freed(key, c.bytes);
    stats_.deallocations += 1;
    stats_.allocated_bytes -= c.bytes;
    if (ledger_.remove(match)) { platform_.annotate_free(c.ptr); }
    return {false, true};
  }

  /// The free of an address that is not live: a `double_free` when it was freed recently,
  /// else a `foreign_free`.
  bool reject_unknown_locked(call_site const& c)
  {
    auto const key    = c.key();
    auto const& freed = ledger_.recently_freed(key);
    bool const again  = freed.ptr == key;
    hazard_record hazard{.kind = again ? hazard_kind::double_free : hazard_kind::foreign_free,
                         .ptr  = key,
                         .size = c.bytes,
                         .tracked_size = again ? freed.size : 0,
                         .stream       = Platform::key(c.stream),
                         .stack        = c.stack};
    stats_.rejected_frees += 1;
    return log_.stop_or_note(std::move(hazard), c.stopped, c.notices);
  }

  /// Calls the hook on each of `notices`; takes the lock only to read the hook.
  void notify(std::vector<hazard_record> const& notices)
  {
    if (notices.empty()) { return; }
    hazard_hook hook{};
    void* context{};
    {
      std::lock_guard<spin_mutex> lock(mutex_);
      std::tie(hook, context) = log_.hook();
    }
    if (hook == nullptr) { return; }
    for (auto const& hazard : notices) {
      hook(hazard, context);
    }
  }

  Upstream upstream_;
  bool const ordered_;
  Platform platform_;

  mutable spin_mutex mutex_;
  tracker::allocation_ledger ledger_;
  tracker::hazard_log log_;
  hazard_tracker_stats stats_{};
  tracker::fence_checks<Platform> checks_;
  std::uint64_t serial_{};
  std::atomic<bool> capture_stacks_{false};
  std::atomic<stack_trace::python_hook> python_hook_{nullptr};
};

}  // namespace rmm_fences::mr::detail
