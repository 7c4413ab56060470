/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * What `sync_on_free_resource_adaptor::deallocate_checked` found.
 */
#pragma once

#include <cstddef>

namespace rmm_fences::mr {

/// What the check of a free found.
enum class free_check : int {
  ok            = 0,  ///< a live block of this size handed out by the adaptor
  untracked     = 1,  ///< a null pointer (a no-op), or a size-0 free of an untracked pointer
                      ///< (passed through)
  unknown       = 2,  ///< not handed out by the adaptor, or already returned to the upstream
  pending       = 3,  ///< already freed: its release waits for a fence (a double free)
  size_mismatch = 4,  ///< handed out with another size
};

/// The check of a free and, for a size mismatch, the size the block was allocated with.
struct free_result {
  free_check check{free_check::ok};
  std::size_t allocated_bytes{};
};

}  // namespace rmm_fences::mr
