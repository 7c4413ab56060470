/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * What the check of a free found: the one answer of every policy core's checked free
 * (`sync_on_free_resource_adaptor::deallocate_checked`, the stream-ordered pool's live blocks,
 * the hazard tracker's ledger).
 */
#pragma once

#include <cstddef>

namespace rmm_fences::mr {

/// What the check of a free found.
enum class free_check : int {
  ok             = 0,  ///< a live block of this size handed out by the resource
  untracked      = 1,  ///< SyncOnFree: a null pointer (a no-op), or a size-0 free of an
                       ///< untracked pointer (passed through)
  unknown        = 2,  ///< not a live block: never handed out by the resource, or freed already
                       ///< (SyncOnFree: returned to the upstream)
  pending        = 3,  ///< SyncOnFree: already freed, its release waits for a fence (a double
                       ///< free)
  size_mismatch  = 4,  ///< a live block handed out with another size (`allocated_bytes`)
  foreign_stream = 5,  ///< the pool: freed on a stream of another device
};

/// The check of a free and, for a size mismatch, the size the block was allocated with.
struct free_result {
  free_check check{free_check::ok};
  std::size_t allocated_bytes{};
};

}  // namespace rmm_fences::mr
