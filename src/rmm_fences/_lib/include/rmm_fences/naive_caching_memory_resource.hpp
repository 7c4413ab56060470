/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/naive_caching_memory_resource_impl.hpp>

#include <cuda/memory_resource>

#include <cstddef>
#include <cstdint>

namespace rmm_fences::mr {

/**
 * @brief UNSAFE: a size-keyed cache that reuses freed blocks on any stream with no fence.
 *
 * Reproduces the hazard of docs/design.md#the-question (a block freed while a kernel still reads it
 * is handed to another stream at once). Wrap it in `sync_on_free_resource_adaptor` to make it safe.
 */
class naive_caching_memory_resource
  : public cuda::mr::shared_resource<detail::naive_caching_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::naive_caching_memory_resource_impl>;

 public:
  friend void get_property(naive_caching_memory_resource const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

  explicit naive_caching_memory_resource(
    cuda::mr::any_resource<cuda::mr::device_accessible> upstream)
    : shared_base(cuda::std::in_place_type<detail::naive_caching_memory_resource_impl>,
                  std::move(upstream))
  {
  }

  /// Returns every cached block to the upstream.
  void release() noexcept { get().release(); }
  /// Bytes held in the cache.
  [[nodiscard]] std::size_t cached_bytes() const { return get().cached_bytes(); }
  /// Allocations served from the cache.
  [[nodiscard]] std::uint64_t hits() const { return get().hits(); }
  /// Allocations that went upstream.
  [[nodiscard]] std::uint64_t misses() const { return get().misses(); }
};

static_assert(cuda::mr::resource_with<naive_caching_memory_resource, cuda::mr::device_accessible>,
              "naive_caching_memory_resource does not satisfy the cuda::mr::resource concept");

}  // namespace rmm_fences::mr
