/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The shared fences of `deferred_free_list`: one slot per recorded fence, counting the entries
 * that rely on it.
 */
#pragma once

#include <rmm_fences/detail/deferred/stream_queues.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rmm_fences::mr::detail::deferred {

/**
 * @brief Reference counts of fences shared by the entries of one batch.
 *
 * No lock: only `deferred_free_list` uses it, and the list's owner serializes every call.
 *
 * Entries sharing a fence hold one reference each to its slot; the fence goes back to its
 * owner (`FenceOps::release_fence`) only when the last reference is dropped, so a fence is
 * never recycled (and recorded again elsewhere) while an entry still relies on it. Dropping a
 * reference never allocates.
 */
template <typename Fence>
class fence_slots {
 public:
  /// A new slot holding `fence`, with no reference yet. May throw `std::bad_alloc` (nothing
  /// changed).
  std::uint32_t add(Fence fence)
  {
    if (free_.empty()) {
      // so that `discard` never allocates (doubling, as slots_ grows)
      if (free_.capacity() <= slots_.size()) { free_.reserve(2 * slots_.size() + 1); }
      slots_.push_back(slot{fence, 0});
      return static_cast<std::uint32_t>(slots_.size() - 1);
    }
    auto const index = free_.back();
    free_.pop_back();
    slots_[index] = slot{fence, 0};
    return index;
  }

  /// Sets the number of entries holding the slot (once they are armed).
  void set_refs(std::uint32_t index, std::size_t refs) noexcept { slots_[index].refs = refs; }

  /// Frees a slot that no entry holds; its fence stays the caller's.
  void discard(std::uint32_t index) noexcept { free_.push_back(index); }

  /// Drops one reference (none for `no_slot`); the last one gives the fence to `ops`.
  template <typename FenceOps>
  void drop(FenceOps& ops, std::uint32_t index) noexcept
  {
    if (index == no_slot) { return; }
    if (--slots_[index].refs == 0) {
      ops.release_fence(slots_[index].fence);
      discard(index);
    }
  }

 private:
  struct slot {
    Fence fence{};
    std::size_t refs{};  ///< entries holding the fence, listed or taken out and not settled
  };

  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_;  // capacity >= slots_.size(): pushing never throws
};

}  // namespace rmm_fences::mr::detail::deferred
