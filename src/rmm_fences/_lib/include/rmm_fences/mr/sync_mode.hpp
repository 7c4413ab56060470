/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The modes of `sync_on_free_resource_adaptor` and the defaults of its deferred batches.
 */
#pragma once

#include <cstddef>

namespace rmm_fences::mr {

/// What `sync_on_free_resource_adaptor` does before a freed block goes back upstream.
enum class sync_mode : int {
  device   = 0,  ///< synchronize the adaptor's device (what cudaFree does)
  stream   = 1,  ///< synchronize the freeing stream
  deferred = 2,  ///< record an event; release the block once the event completed
};

/// Default `max_batch_frees`: deferred frees on one stream that share one event at most.
inline constexpr std::size_t default_max_batch_frees = 16;

/// Default `max_batch_bytes`: bytes freed on one stream that wait for one event at most.
inline constexpr std::size_t default_max_batch_bytes = std::size_t{64} << 20U;

}  // namespace rmm_fences::mr
