/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazard tracker's detection: the fence checks made at a free and at an allocation, and
 * the rules that name a hazard from their answers.
 */
#pragma once

#include <rmm_fences/detail/stack_trace.hpp>
#include <rmm_fences/detail/tracker/allocation_ledger.hpp>
#include <rmm_fences/detail/tracker/cross_checks.hpp>
#include <rmm_fences/detail/tracker/freed_ranges.hpp>
#include <rmm_fences/detail/tracker/hazard_log.hpp>
#include <rmm_fences/detail/tracker/held_fence.hpp>
#include <rmm_fences/mr/hazards.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::tracker {

/**
 * @brief The fence checks of a hazard tracker and the deferred ones still open.
 *
 * No lock: `hazard_tracker_core` calls every member under its mutex. It counts in the
 * tracker's stats (`fences`, `stream_waits`, `unchecked`) and notes hazards in its log.
 *
 * Over a stream-ordered upstream only undeclared cross-stream frees are checked (a deferred
 * `cross_checks` entry), and a free on the allocation stream makes no platform call. Over
 * another upstream a free with work still queued on the freeing or (undeclared) allocation
 * stream is a `freed_in_flight`, and the freed range is watched (`freed_ranges`) until its
 * fence completes: a block handed out over it before then, on another stream, is a
 * `reuse_before_fence`. A check that cannot be made is counted in `unchecked`, never read as
 * complete nor as in flight.
 */
template <typename Platform>
class fence_checks {
 public:
  using stream_type = typename Platform::stream_type;
  using fence_type  = typename Platform::fence_type;
  using fence_state = typename Platform::fence_state;
  using stack_ptr   = std::shared_ptr<stack_trace const>;
  using notice_list = std::vector<hazard_record>;

  fence_checks(Platform& platform, bool ordered, hazard_tracker_stats& stats, hazard_log& log)
    : platform_{platform},
      ordered_{ordered},
      stats_{stats},
      log_{log},
      freed_{platform},
      cross_{platform}
  {
  }

  /// Deferred checks not settled yet, and freed ranges still watched.
  [[nodiscard]] std::size_t pending() const noexcept { return cross_.size() + freed_.size(); }

  /// Releases every fence still held.
  void release_fences() noexcept
  {
    freed_.release_all();
    cross_.release_all();
  }

  /// Forgets the fences without platform calls.
  void abandon_fences() noexcept
  {
    freed_.clear();
    cross_.clear();
  }

  /// Settles the deferred checks whose fences completed (never blocks).
  void poll(notice_list& notices)
  {
    if (!cross_.empty()) { settle_cross(notices); }
    freed_.poll();  // nothing watched over a stream-ordered upstream
  }

  /// A freed range overlapping [ptr, ptr + bytes) with an unfinished fence of another stream
  /// (only over an upstream that is not stream-ordered).
  std::optional<hazard_record> check_reuse(std::uintptr_t ptr,
                                           std::size_t bytes,
                                           stream_type stream,
                                           stack_ptr const& stack)
  {
    if (ordered_ || freed_.empty()) { return std::nullopt; }
    if (platform_.is_capturing(stream)) {
      stats_.unchecked += 1;
      return std::nullopt;
    }
    auto const key   = Platform::key(stream);
    auto const found = freed_.take_overlapping(ptr, bytes, key, stats_.unchecked);
    if (!found) { return std::nullopt; }
    return hazard_record{.kind         = hazard_kind::reuse_before_fence,
                         .ptr          = ptr,
                         .size         = bytes,
                         .tracked_size = found->size,
                         .stream       = key,
                         .streams      = {found->stream},
                         .stack        = stack};
  }

  /**
   * @brief Orders the free of `block` at `ptr` on `stream` after its declared streams, then
   * checks what the upstream's kind requires; true when a strict call (`stopped` given) must
   * stop at a hazard (then in `*stopped`).
   */
  bool check_free(stream_type stream,
                  std::uintptr_t ptr,
                  live_block const& block,
                  stack_ptr const& stack,
                  hazard_record* stopped,
                  notice_list& notices)
  {
    free_site const site{stream, Platform::key(stream), ptr, block, stack, notices};
    bool const undeclared_user = block.stream != site.key && !block.declares(block.stream);
    bool const declared_other  = std::any_of(
      block.declared.begin(), block.declared.end(), [&](auto s) { return s != site.key; });
    if (ordered_ && !undeclared_user && !declared_other) { return false; }
    if (platform_.is_capturing(stream)) {
      stats_.unchecked += 1;
      return false;
    }
    streams in_flight;
    streams unreachable;  // streams this thread cannot name
    order_after_declared(site, in_flight, unreachable);
    if (!ordered_) {
      return check_unordered_free(site, undeclared_user, stopped, in_flight, unreachable);
    }
    // Stream-ordered upstream: only the undeclared allocation stream can race with reuse.
    if (undeclared_user) {
      if (auto const user = checkable_stream(block.stream, unreachable); user) {
        check_cross(site, *user);
      }
    }
    note_unreachable(site, std::move(unreachable));
    return false;
  }

 private:
  using streams = std::vector<std::uintptr_t>;

  /// The free being checked: its stream (and key), the block and the call's stack.
  struct free_site {
    stream_type stream;
    std::uintptr_t key;
    std::uintptr_t ptr;
    live_block const& block;
    stack_ptr const& stack;
    notice_list& notices;
  };

  /// A hazard seen at the free `site`, made by the work queued on `in`.
  static hazard_record free_hazard(hazard_kind kind, free_site const& site, streams in)
  {
    return hazard_record{.kind             = kind,
                         .ptr              = site.ptr,
                         .size             = site.block.size,
                         .tracked_size     = site.block.size,
                         .stream           = site.key,
                         .streams          = std::move(in),
                         .stack            = site.stack,
                         .allocation_stack = site.block.stack};
  }

  /// The stream of `key` when a fence can be recorded on it now. Otherwise nullopt, and the
  /// key is listed in `unreachable` (another thread's per-thread default stream, which this
  /// thread cannot name) or the skipped check counted in `unchecked` (the stream is captured).
  std::optional<stream_type> checkable_stream(std::uintptr_t key, streams& unreachable)
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

  /// Orders the free after each stream declared for the block (other than the freeing one) by
  /// a device-side wait on a fence recorded there; over an upstream that is not stream-ordered,
  /// a declared stream with work still queued is added to `in_flight`.
  void order_after_declared(free_site const& site, streams& in_flight, streams& unreachable)
  {
    for (auto const user_key : site.block.declared) {
      if (user_key == site.key) { continue; }
      auto const user = checkable_stream(user_key, unreachable);
      if (!user) { continue; }
      held_fence<Platform> fence{platform_};
      if (!platform_.record(fence.get(), *user)) {
        stats_.unchecked += 1;  // neither ordered nor checked
        continue;
      }
      stats_.fences += 1;
      if (!ordered_) { test(fence.get(), user_key, in_flight); }
      if (platform_.device_wait(site.stream, fence.get())) {
        stats_.stream_waits += 1;
      } else {
        stats_.unchecked += 1;  // the free is not ordered after the declared stream
      }
    }
  }

  /// The checks of a free over an upstream that is not stream-ordered: the freeing stream's
  /// and, when undeclared, the allocation stream's queued work make a `freed_in_flight`; the
  /// freed range is then watched until its fence completes. Returns as `check_free`.
  bool check_unordered_free(free_site const& site,
                            bool undeclared_user,
                            hazard_record* stopped,
                            streams& in_flight,
                            streams& unreachable)
  {
    held_fence<Platform> free_fence{platform_};
    bool const recorded = platform_.record(free_fence.get(), site.stream);
    if (recorded) {
      stats_.fences += 1;
      streams mine;
      test(free_fence.get(), site.key, mine);
      in_flight.insert(in_flight.begin(), mine.begin(), mine.end());
    } else {
      stats_.unchecked += 1;
    }
    if (undeclared_user) { test_user_stream(site.block.stream, in_flight, unreachable); }
    if (!in_flight.empty()) {
      auto hazard = free_hazard(hazard_kind::freed_in_flight, site, std::move(in_flight));
      if (stopped != nullptr) {
        hazard.raised = true;
        *stopped      = log_.note(std::move(hazard), site.notices);
        return true;
      }
      log_.note(std::move(hazard), site.notices);
    }
    note_unreachable(site, std::move(unreachable));
    if (recorded) {
      freed_.watch(site.ptr, site.block.size, site.key, free_fence, stats_.unchecked);
    }
    return false;
  }

  /// Records and tests a fence on the allocation stream `alloc_key` (when it can be named and
  /// is not captured): work still queued there adds it to `in_flight`.
  void test_user_stream(std::uintptr_t alloc_key, streams& in_flight, streams& unreachable)
  {
    auto const user = checkable_stream(alloc_key, unreachable);
    if (!user) { return; }
    held_fence<Platform> user_fence{platform_};
    if (platform_.record(user_fence.get(), *user)) {
      stats_.fences += 1;
      test(user_fence.get(), alloc_key, in_flight);
    } else {
      stats_.unchecked += 1;
    }
  }

  /// Tests a fence just recorded on `key`'s stream: pending adds `key` to `in_flight`; a
  /// failed test is counted as unchecked (never read as complete nor as in flight).
  void test(fence_type fence, std::uintptr_t key, streams& in_flight)
  {
    switch (platform_.query(fence)) {
      case fence_state::complete: break;
      case fence_state::pending: in_flight.push_back(key); break;
      default: stats_.unchecked += 1; break;
    }
  }

  /// Starts the deferred check of the free `site` of a block allocated on `user`, an
  /// undeclared stream, over a stream-ordered upstream.
  void check_cross(free_site const& site, stream_type user)
  {
    held_fence<Platform> user_fence{platform_};
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
    held_fence<Platform> free_fence{platform_};
    if (!platform_.record(free_fence.get(), site.stream)) {
      stats_.unchecked += 1;
      return;
    }
    stats_.fences += 1;
    cross_.add(typename cross_checks<Platform>::check{site.ptr,
                                                      site.block.size,
                                                      site.key,
                                                      site.block.stream,
                                                      user_fence.get(),
                                                      free_fence.get(),
                                                      site.stack,
                                                      site.block.stack});
    (void)user_fence.take();
    (void)free_fence.take();
    settle_cross(site.notices);
  }

  void settle_cross(notice_list& notices)
  {
    cross_.settle(stats_.unchecked,
                  [&](hazard_record hazard) { log_.note(std::move(hazard), notices); });
  }

  /// A free on a stream that cannot be ordered after `unreachable` (other threads' per-thread
  /// default streams, which the freeing thread cannot name): reported as a `cross_stream_free`
  /// that could not be checked, and counted as unchecked.
  void note_unreachable(free_site const& site, streams unreachable)
  {
    if (unreachable.empty()) { return; }
    stats_.unchecked += unreachable.size();
    log_.note(free_hazard(hazard_kind::cross_stream_free, site, std::move(unreachable)),
              site.notices);
  }

  Platform& platform_;
  bool const ordered_;
  hazard_tracker_stats& stats_;
  hazard_log& log_;
  freed_ranges<Platform> freed_;
  cross_checks<Platform> cross_;
};

}  // namespace rmm_fences::mr::detail::tracker
