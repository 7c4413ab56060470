/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <atomic>
#include <thread>

namespace rmm_fences::mr::detail {

/**
 * @brief A test-and-test-and-set lock for short critical sections (a stream's free list).
 *
 * Cheaper than `std::mutex` when uncontended; yields after a short spin so a preempted holder
 * is not starved. Satisfies Lockable (`std::lock_guard`, `std::unique_lock`).
 */
class spin_mutex {
 public:
  /// Uncontended: one exchange, inlined at every call site; contended: `lock_contended`.
  [[gnu::always_inline]] void lock() noexcept
  {
    if (!locked_.exchange(true, std::memory_order_acquire)) [[likely]] { return; }
    lock_contended();
  }

  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }

  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  /// The rest of a `lock` whose first exchange found the lock held: spin (then yield) while
  /// it is held, exchange again (out of line).
  [[gnu::noinline, gnu::cold]] void lock_contended() noexcept
  {
    unsigned spins = 0;
    do {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) {
          std::this_thread::yield();
        } else {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        }
      }
      ++spins;
    } while (locked_.exchange(true, std::memory_order_acquire));
  }

  std::atomic<bool> locked_{false};
};

}  // namespace rmm_fences::mr::detail
