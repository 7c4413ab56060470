/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Counting of the heap allocations a policy core makes (CPU tests only).
 *
 * The test module replaces the global `operator new` and `operator delete` (heap_count.cpp,
 * linked with -Bsymbolic-functions so that every call from the module reaches them whatever
 * else the process loaded): they count, on the calling thread, while a `count_heap` scope is
 * open and no `harness_scope` is. The harness's platforms and upstreams open a
 * `harness_scope` in each call the core makes on them, so what is counted is what the core
 * itself (its containers included) allocates and frees. A scope can also make every n-th
 * counted allocation fail (`std::bad_alloc`; nullptr from the nothrow forms): the core out of
 * host memory.
 */
#pragma once

#include <cstdint>

namespace rmm_fences::testing {

/// Heap allocations (attempts) and frees (of non-null pointers) counted on one thread.
struct heap_counts {
  std::uint64_t allocations{};
  std::uint64_t frees{};
  std::uint64_t failed{};  ///< allocations made to fail
};

namespace detail {
/// Counting is on for this thread (a `count_heap` scope is open, no `harness_scope`).
inline thread_local bool heap_counting = false;
/// What was counted on this thread since its last `count_heap` scope opened.
inline thread_local heap_counts heap_counted{};
/// Every n-th counted allocation fails (0: none).
inline thread_local std::uint64_t heap_fail_every = 0;
}  // namespace detail

/// Counts this thread's heap allocations and frees while it lives (from 0); with
/// `fail_every` > 0, every `fail_every`-th counted allocation fails.
class count_heap {
 public:
  explicit count_heap(std::uint64_t fail_every = 0) noexcept
    : was_{detail::heap_counting}, fail_every_was_{detail::heap_fail_every}
  {
    detail::heap_counted    = {};
    detail::heap_counting   = true;
    detail::heap_fail_every = fail_every;
  }
  ~count_heap()
  {
    detail::heap_counting   = was_;
    detail::heap_fail_every = fail_every_was_;
  }
  count_heap(count_heap const&)            = delete;
  count_heap& operator=(count_heap const&) = delete;

  /// What was counted so far.
  [[nodiscard]] static heap_counts counted() noexcept { return detail::heap_counted; }

 private:
  bool was_;
  std::uint64_t fail_every_was_;
};

/// Pauses the count while the harness (a platform or upstream call) runs.
class harness_scope {
 public:
  harness_scope() noexcept : was_{detail::heap_counting} { detail::heap_counting = false; }
  ~harness_scope() { detail::heap_counting = was_; }
  harness_scope(harness_scope const&)            = delete;
  harness_scope& operator=(harness_scope const&) = delete;

 private:
  bool was_;
};

/// Called by the replaced operators before an allocation; false: it must fail.
inline bool note_heap_allocation() noexcept
{
  if (!detail::heap_counting) { return true; }
  auto const n = ++detail::heap_counted.allocations;
  if (detail::heap_fail_every > 0 && n % detail::heap_fail_every == 0) {
    ++detail::heap_counted.failed;
    return false;
  }
  return true;
}

inline void note_heap_free(void const* ptr) noexcept
{
  if (detail::heap_counting && ptr != nullptr) { ++detail::heap_counted.frees; }
}

}  // namespace rmm_fences::testing
