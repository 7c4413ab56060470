/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the blocks handed out (address -> requested bytes), which check
 * every free before it touches a list (no locks: each map's owner guards it).
 */
#pragma once

#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/mr/free_result.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>

namespace rmm_fences::mr::detail {

namespace pool {

/**
 * @brief The code of a checked free in `stream_ordered_pool_memory_resource::deallocate_checked`:
 * 0 freed (`ok`), 1 not a live block of this pool (`unknown`: a double free or a foreign
 * pointer), 2 `size_mismatch`, 3 `foreign_stream` (a stream of another device).
 */
inline int status_code(free_result r) noexcept
{
  switch (r.check) {
    case free_check::ok: return 0;
    case free_check::size_mismatch: return 2;
    case free_check::foreign_stream: return 3;
    default: return 1;
  }
}

/// Live blocks: address -> the bytes the allocation asked for.
class live_blocks {
 public:
  /// Lists `ptr` as handed out for `bytes`. May throw bad_alloc.
  void track(void* ptr, std::size_t bytes) { track(key_of(ptr), bytes); }
  void track(std::uintptr_t key, std::size_t bytes) { map_.insert_or_assign(key, bytes); }

  /// A free of `key` with `bytes`: none when `key` is not listed; `ok` (forgotten) when the
  /// size matches; `size_mismatch` (kept) when it does not.
  [[gnu::always_inline]] std::optional<free_result> forget(std::uintptr_t key,
                                                           std::size_t bytes) noexcept
  {
    auto const i = map_.find_index(key);
    if (i == map_.npos) { return std::nullopt; }
    if (map_.value_at(i) != bytes) {
      return free_result{free_check::size_mismatch, map_.value_at(i)};
    }
    map_.erase_at(i);
    return free_result{};
  }

  /// Calls `f(key, bytes)` for every live block.
  template <typename F>
  void for_each(F&& f)
  { map_.for_each(f); }

  [[nodiscard]] std::size_t size() const noexcept { return map_.size(); }
  void clear() noexcept { map_.clear(); }

  static std::uintptr_t key_of(void const* ptr) noexcept
  { return reinterpret_cast<std::uintptr_t>(ptr); }

 private:
  pointer_map<std::size_t> map_{64};
};

/// Reports a refused free of `bytes` at `ptr` to the user, on one line (off the hot path).
template <typename Platform>
[[gnu::cold, gnu::noinline]] void report_rejected_free(Platform& platform,
                                                       free_result r,
                                                       void* ptr,
                                                       std::size_t bytes) noexcept
{
  char line[256];
  char const* what = nullptr;
  switch (r.check) {
    case free_check::size_mismatch:
      std::snprintf(line,
                    sizeof(line),
                    "StreamOrderedPoolMemoryResource: rejected free of %p: size mismatch: "
                    "allocated %zu bytes, freed with %zu; the pool is unchanged",
                    ptr,
                    r.allocated_bytes,
                    bytes);
      platform.report_rejected_free(line);
      return;
    case free_check::foreign_stream: what = "the stream belongs to another device"; break;
    default: what = "double free or foreign pointer (not a live block of this pool)"; break;
  }
  std::snprintf(line,
                sizeof(line),
                "StreamOrderedPoolMemoryResource: rejected free of %p (%zu bytes): %s; the pool is "
                "unchanged",
                ptr,
                bytes,
                what);
  platform.report_rejected_free(line);
}

}  // namespace pool
}  // namespace rmm_fences::mr::detail
