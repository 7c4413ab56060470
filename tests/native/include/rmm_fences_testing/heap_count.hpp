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
 * itself (its containers included) allocates and frees.
 */
#pragma once

#include <cstdint>

namespace rmm_fences::testing {

/// Heap allocations and frees (of non-null pointers) counted on one thread.
struct heap_counts {
  std::uint64_t allocations{};
  std::uint64_t frees{};
};

namespace detail {
/// Counting is on for this thread (a `count_heap` scope is open, no `harness_scope`).
inline thread_local bool heap_counting = false;
/// What was counted on this thread since its last `count_heap` scope opened.
inline thread_local heap_counts heap_counted{};
}  // namespace detail

/// Counts this thread's heap allocations and frees while it lives (from 0).
class count_heap {
 public:
  count_heap() noexcept : was_{detail::heap_counting}
  {
    detail::heap_counted  = {};
    detail::heap_counting = true;
  }
  ~count_heap() { detail::heap_counting = was_; }
  count_heap(count_heap const&)            = delete;
  count_heap& operator=(count_heap const&) = delete;

  /// What was counted so far.
  [[nodiscard]] static heap_counts counted() noexcept { return detail::heap_counted; }

 private:
  bool was_;
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

/// Called by the replaced operators.
inline void note_heap_allocation() noexcept
{
  if (detail::heap_counting) { ++detail::heap_counted.allocations; }
}

inline void note_heap_free(void const* ptr) noexcept
{
  if (detail::heap_counting && ptr != nullptr) { ++detail::heap_counted.frees; }
}

}  // namespace rmm_fences::testing
