/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The limits of SyncOnFree's fence batching: when a batch of deferred frees gets its fence.
 */
#pragma once

#include <rmm_fences/mr/sync_mode.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <stdexcept>

namespace rmm_fences::mr::detail {

/**
 * @brief How many deferred frees on one stream share one fence.
 *
 * A batch's fence is recorded once the batch holds `max_frees` frees or (when set) `max_bytes`
 * bytes, and whenever the adaptor needs its blocks back (the pending cap, out of memory,
 * `drain`). `max_frees == 1`: one fence per free. Plain values: no lock.
 */
struct batch_limits {
  std::size_t max_frees{rmm_fences::mr::default_max_batch_frees};
  std::optional<std::size_t> max_bytes{rmm_fences::mr::default_max_batch_bytes};

  /// True when a batch of `count` frees and `bytes` bytes is due its fence.
  [[nodiscard]] bool full(std::size_t count, std::size_t bytes) const noexcept
  { return count >= max_frees || (max_bytes.has_value() && bytes >= *max_bytes); }
};

namespace sync_on_free {

/// `batch`, or `std::invalid_argument` when it holds a zero limit.
inline batch_limits validated(batch_limits batch)
{
  if (batch.max_frees == 0) {
    throw std::invalid_argument("max_batch_frees must be at least 1, got 0");
  }
  if (batch.max_bytes.has_value() && *batch.max_bytes == 0) {
    throw std::invalid_argument("max_batch_bytes must be positive (or empty: no byte limit)");
  }
  return batch;
}

/**
 * @brief The host storage of entries kept for reuse, per stream queue and per scratch buffer:
 * what a few batches hold (4 * `max_frees`), at least 256 entries and at most 65536.
 */
inline std::size_t kept_entries(batch_limits const& batch) noexcept
{
  constexpr std::size_t least = 256;
  constexpr std::size_t most  = std::size_t{1} << 16;
  return std::clamp(std::min(batch.max_frees, most) * 4, least, most);
}

}  // namespace sync_on_free
}  // namespace rmm_fences::mr::detail
