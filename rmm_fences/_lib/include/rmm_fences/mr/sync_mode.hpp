/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The modes of `sync_on_free_resource_adaptor`.
 */
#pragma once

namespace rmm_fences::mr {

/// What `sync_on_free_resource_adaptor` does before a freed block goes back upstream.
enum class sync_mode : int {
  device   = 0,  ///< synchronize the adaptor's device (what cudaFree does)
  stream   = 1,  ///< synchronize the freeing stream
  deferred = 2,  ///< record an event; release the block once the event completed
};

}  // namespace rmm_fences::mr
