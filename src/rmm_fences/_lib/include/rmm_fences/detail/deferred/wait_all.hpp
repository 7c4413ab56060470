/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The owner's side of taking entries out of `deferred_free_list`: waiting on their fences,
 * outside the owner's lock, before their blocks are released.
 */
#pragma once

#include <rmm_fences/detail/deferred/stream_queues.hpp>

#include <cstddef>

namespace rmm_fences::mr::detail {

/// What `wait_all` did: fence waits that succeeded and that failed.
struct wait_counts {
  std::size_t succeeded{};
  std::size_t failed{};
};

/**
 * @brief Waits on the fence of every entry of `taken` that is not ready yet.
 *
 * Entries whose fence completed or was waited on go to `done`; entries whose wait failed (no
 * information: never read as complete) and unfenced entries go to `failed`. Entries sharing a
 * fence (same slot) are tested and waited on once. `taken` is cleared. Takes no lock: the
 * entries are the caller's, out of the list.
 */
template <typename FenceOps, typename Entries>
wait_counts wait_all(FenceOps& ops, Entries& taken, Entries& done, Entries& failed)
{
  wait_counts counts;
  auto last_slot = deferred::no_slot;
  bool last_done = false;
  for (auto& e : taken) {
    if (!e.fence.has_value()) {
      failed.push_back(e);
      continue;
    }
    bool ok = false;
    if (e.slot != deferred::no_slot && e.slot == last_slot) {
      ok = last_done;
    } else if (ops.ready(*e.fence)) {
      ok = true;
    } else if (ops.host_wait(*e.fence)) {
      ++counts.succeeded;
      ok = true;
    } else {
      ++counts.failed;
    }
    last_slot = e.slot;
    last_done = ok;
    if (ok) {
      done.push_back(e);
    } else {
      failed.push_back(e);
    }
  }
  taken.clear();
  return counts;
}

}  // namespace rmm_fences::mr::detail
