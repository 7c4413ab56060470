/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/hazard_tracking_resource_adaptor_impl.hpp>
#include <rmm_fences/mr/hazards.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace rmm_fences::mr {

/**
 * @brief Tracks every live allocation with its streams and reports the hazards of freeing
 * while device work may still use a block: `freed_in_flight`, `reuse_before_fence`,
 * `cross_stream_free`, `double_free`, `foreign_free`, `size_mismatch`, and an upstream that
 * hands out a live address, `allocated_while_live` (docs/hazard_tracking.md).
 *
 * Bad frees never reach the upstream. Hazards are recorded (and handed to a hook), never
 * thrown from `deallocate`. A check that cannot be made (stream capture, a failed event
 * record, query or wait, another thread's per-thread default stream) is counted in
 * `stats().unchecked`, never read as passed.
 *
 * Copyable: copies share one state (`cuda::mr::shared_resource`).
 */
class hazard_tracking_resource_adaptor
  : public cuda::mr::shared_resource<detail::hazard_tracking_resource_adaptor_impl> {
  using shared_base = cuda::mr::shared_resource<detail::hazard_tracking_resource_adaptor_impl>;

 public:
  /// Enables the `cuda::mr::device_accessible` property.
  friend void get_property(hazard_tracking_resource_adaptor const&,
                           cuda::mr::device_accessible) noexcept
  {
  }

  /**
   * @brief Wraps `upstream`, on the current device.
   *
   * @param upstream the resource that serves the allocations
   * @param upstream_stream_ordered whether `upstream` orders reuse by stream (or frees
   * synchronously); when false every free is fenced and checked
   * @param nvtx register each allocation as an NVTX memory region of its device allocation
   * (a pool chunk), for compute-sanitizer; costs nothing without a tool attached
   */
  explicit hazard_tracking_resource_adaptor(
    cuda::mr::any_resource<cuda::mr::device_accessible> upstream,
    bool upstream_stream_ordered,
    bool nvtx = true)
    : shared_base(cuda::std::in_place_type<detail::hazard_tracking_resource_adaptor_impl>,
                  std::move(upstream),
                  upstream_stream_ordered,
                  nvtx)
  {
  }

  using hazard_record     = rmm_fences::mr::hazard_record;
  using allocation_record = rmm_fences::mr::allocation_record;
  using stats_type        = rmm_fences::mr::hazard_tracker_stats;
  /// Called for each hazard not raised to the caller, with the tracker's lock released.
  using hazard_hook = void (*)(hazard_record const&, void* context);
  /// Fills its argument with the calling thread's Python frames; false when it has none.
  using python_stack_hook = rmm_fences::mr::detail::stack_trace::python_hook;

  /**
   * @brief `allocate` that can stop a hazard: with `stopped` given, a block handed out before
   * the fence of its previous free completed goes back upstream, `*stopped` holds the hazard
   * and nullptr is returned.
   */
  [[nodiscard]] void* allocate_checked(cuda::stream_ref stream,
                                       std::size_t bytes,
                                       std::size_t alignment,
                                       hazard_record* stopped)
  {
    try {
      return get().core().allocate(stream, bytes, alignment, stopped);
    } catch (...) {
      detail::rethrow_allocation_error("HazardTrackingResourceAdaptor");
    }
  }

  /**
   * @brief `deallocate` that can stop a hazard: with `stopped` given, a free that shows one
   * (a bad free, `freed_in_flight`) changes nothing, `*stopped` holds it and true is returned.
   * A null free is a no-op (false: nothing recorded, nothing reaches the upstream).
   */
  bool deallocate_checked(cuda::stream_ref stream,
                          void* ptr,
                          std::size_t bytes,
                          std::size_t alignment,
                          hazard_record* stopped)
  {
    if (ptr == nullptr) { return false; }
    return get().core().deallocate(stream, ptr, bytes, alignment, stopped);
  }

  /// Declares that `stream` uses the live allocation starting at `ptr`; false if there is none
  /// (always for a null `ptr`).
  bool record_stream(void* ptr, cuda::stream_ref stream)
  {
    if (ptr == nullptr) { return false; }
    return get().core().record_stream(ptr, stream);
  }

  /// Settles the deferred checks that can be settled now.
  void poll() { get().core().poll(); }
  /// The live allocations, oldest first.
  [[nodiscard]] std::vector<allocation_record> outstanding() { return get().core().outstanding(); }
  /// The hazards recorded since construction or `reset`, oldest first.
  [[nodiscard]] std::vector<hazard_record> hazards() { return get().core().hazards(); }
  /// Forgets the recorded hazards; the peak restarts from the bytes allocated now.
  void reset() { get().core().reset(); }
  [[nodiscard]] stats_type stats() { return get().core().stats(); }
  /// Bytes allocated and not freed, per allocation stream key.
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::size_t>> stream_bytes()
  { return get().core().stream_bytes(); }
  /// Deferred checks not settled yet.
  [[nodiscard]] std::size_t pending_checks() { return get().core().pending_checks(); }

  /// Calls `hook(record, context)` for each hazard not raised to the caller (nullptr: none).
  void set_hazard_hook(hazard_hook hook, void* context) noexcept
  { get().core().set_hazard_hook(hook, context); }
  /// Stacks on (with an optional source of Python frames) or off.
  void set_capture_stacks(bool on, python_stack_hook python) noexcept
  { get().core().set_capture_stacks(on, python); }
  /// Whether a tool (compute-sanitizer, Nsight) took the NVTX annotations so far.
  [[nodiscard]] bool nvtx_active() noexcept { return get().nvtx_active(); }
};

static_assert(
  cuda::mr::resource_with<hazard_tracking_resource_adaptor, cuda::mr::device_accessible>,
  "hazard_tracking_resource_adaptor does not satisfy the cuda::mr::resource concept");

}  // namespace rmm_fences::mr
