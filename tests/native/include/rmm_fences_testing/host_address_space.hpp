/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Test harness (CPU tests only): the addresses of the host pool's upstream chunks. The pool's
 * choices depend on where its chunks lie (a best fit among blocks of one size takes the lowest
 * address), so the harness hands out addresses the way the device's allocator does, lowest
 * free range first, and the same ones whatever ran before in the process: a range reserved
 * once per upstream, without swap reserved, whose pages the kernel backs only when touched.
 */
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace rmm_fences::testing {

/// Chunks at the lowest free address that fits, each aligned to `chunk_alignment` or more.
class host_address_space {
 public:
  /// Chunks start at multiples of this (cudaMalloc's large allocations do).
  static constexpr std::size_t chunk_alignment = std::size_t{2} << 20;
  /// The most address space one upstream reserves.
  static constexpr std::size_t max_reserve = std::size_t{64} << 30;

  /// A space for chunks of `limit` bytes in all (reserved on first use).
  explicit host_address_space(std::size_t limit) noexcept
    : size_{std::min(max_reserve, limit + limit / 4 + (std::size_t{64} << 20))}
  {
  }
  host_address_space(host_address_space const&)            = delete;
  host_address_space& operator=(host_address_space const&) = delete;
  ~host_address_space()
  {
    if (base_ != nullptr) { ::munmap(base_, size_); }
  }

  /// `bytes` at the lowest free address aligned to `alignment` (and `chunk_alignment`), or
  /// nullptr when no free range holds them (or no space could be reserved).
  void* take(std::size_t bytes, std::size_t alignment)
  {
    if (!reserve()) { return nullptr; }
    auto const align = std::max(alignment, chunk_alignment);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      auto const [start, end] = *it;
      auto const at           = (start + align - 1) / align * align;
      if (at > end || end - at < bytes) { continue; }
      free_.erase(it);
      if (at > start) { free_.emplace(start, at); }
      if (at + bytes < end) { free_.emplace(at + bytes, end); }
      return reinterpret_cast<void*>(at);
    }
    return nullptr;
  }

  /// True when `p` lies in this space.
  [[nodiscard]] bool holds(void const* p) const noexcept
  {
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    auto const b = reinterpret_cast<std::uintptr_t>(base_);
    return base_ != nullptr && a >= b && a < b + size_;
  }

  /// Gives back `[p, p + bytes)`, taken from this space, merging it with free neighbours.
  void give(void* p, std::size_t bytes) noexcept
  {
    auto start = reinterpret_cast<std::uintptr_t>(p);
    auto end   = start + bytes;
    auto next  = free_.lower_bound(start);
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->second == start) {
        start = prev->first;
        free_.erase(prev);
      }
    }
    if (next != free_.end() && next->first == end) {
      end = next->second;
      free_.erase(next);
    }
    free_.emplace(start, end);
  }

 private:
  bool reserve() noexcept
  {
    if (base_ != nullptr) { return true; }
    void* p = ::mmap(
      nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { return false; }
    base_ = static_cast<char*>(p);
    // From the first aligned address: where the space starts must not move the chunks.
    auto const b  = reinterpret_cast<std::uintptr_t>(base_);
    auto const at = (b + chunk_alignment - 1) / chunk_alignment * chunk_alignment;
    free_.emplace(at, b + size_);
    return true;
  }

  std::size_t size_;
  char* base_{};
  std::map<std::uintptr_t, std::uintptr_t> free_;  // start -> end
};

}  // namespace rmm_fences::testing
