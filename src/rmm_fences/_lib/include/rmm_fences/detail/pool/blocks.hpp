/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the words its free lists share (no locks, no CUDA call).
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>

#include <vector>

namespace rmm_fences::mr::detail::pool {

/// The tag of a block that no fence guards: a stream's own cache, the orphans.
struct no_tag {
  static no_tag merge(no_tag, no_tag) noexcept { return {}; }
};

/// A free block that no fence guards: (address, size).
using untagged_block = free_list<no_tag>::block;

/// Free blocks in transit between the pool's lists.
using block_list = std::vector<untagged_block>;

}  // namespace rmm_fences::mr::detail::pool
