/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The blocks SyncOnFree handed out, against which each free is checked, and the report of a
 * rejected free.
 */
#pragma once

#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>
#include <rmm_fences/mr/free_result.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>

namespace rmm_fences::mr::detail::sync_on_free {

/**
 * @brief The live blocks (ptr -> bytes) of a `sync_on_free_core`.
 *
 * Lock rule: `mutex_` (a spin lock) guards `blocks_`; every member takes it and returns with it
 * released, and no other lock is taken while it is held.
 */
class live_blocks {
 public:
  /// Notes a block handed out. May throw `std::bad_alloc` (nothing changed).
  void insert(void* ptr, std::size_t bytes)
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    blocks_.insert_or_assign(reinterpret_cast<std::uintptr_t>(ptr), bytes);
  }

  /**
   * @brief Forgets the live block at `ptr` if it has `bytes` bytes.
   * @return `ok`, or `size_mismatch` (the block stays live) with its size; empty when `ptr` is
   * not live
   */
  std::optional<rmm_fences::mr::free_result> take(void* ptr, std::size_t bytes) noexcept
  {
    using rmm_fences::mr::free_check;
    auto const key = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard<spin_mutex> lock(mutex_);
    auto const i = blocks_.find_index(key);
    if (i == blocks_.npos) { return std::nullopt; }
    if (blocks_.value_at(i) != bytes) {
      return rmm_fences::mr::free_result{free_check::size_mismatch, blocks_.value_at(i)};
    }
    blocks_.erase_at(i);
    return rmm_fences::mr::free_result{free_check::ok, bytes};
  }

  [[nodiscard]] std::size_t size() const
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    return blocks_.size();
  }

 private:
  mutable spin_mutex mutex_;
  pointer_map<std::size_t> blocks_;
};

/// One line on stderr naming a free that was rejected (nothing was freed).
inline void report_rejected(void* ptr, std::size_t bytes, rmm_fences::mr::free_result r) noexcept
{
  using rmm_fences::mr::free_check;
  if (r.check == free_check::size_mismatch) {
    std::fprintf(stderr,
                 "rmm_fences: SyncOnFreeResourceAdaptor rejected the free of %p (%zu bytes): "
                 "size mismatch, the block was allocated with %zu bytes; nothing was freed\n",
                 ptr,
                 bytes,
                 r.allocated_bytes);
  } else {
    std::fprintf(stderr,
                 "rmm_fences: SyncOnFreeResourceAdaptor rejected the free of %p (%zu bytes): "
                 "%s; nothing was freed\n",
                 ptr,
                 bytes,
                 r.check == free_check::pending
                   ? "double free, the block is already freed and pending its fence"
                   : "not a live block of this adaptor (double free or foreign pointer)");
  }
}

}  // namespace rmm_fences::mr::detail::sync_on_free
