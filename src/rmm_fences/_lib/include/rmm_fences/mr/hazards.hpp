/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazards that `hazard_tracking_resource_adaptor` reports, and its records of them and of
 * live allocations.
 */
#pragma once

#include <rmm_fences/detail/stack_trace.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace rmm_fences::mr {

/// The hazards, numbered from 0 without gaps. `hazard_kind_name` spells each one; Python's
/// `rmm_fences._hazards.HAZARD_KINDS` is those names, by value.
enum class hazard_kind : int {
  freed_in_flight      = 0,
  reuse_before_fence   = 1,
  cross_stream_free    = 2,
  double_free          = 3,
  foreign_free         = 4,
  size_mismatch        = 5,
  leak                 = 6,
  allocated_while_live = 7,  ///< the upstream handed out an address that is still live
};

/**
 * @brief The name of a hazard kind (its enumerator's name), or nullptr past the last kind.
 *
 * No `default:`: a kind left out here fails the build (-Werror=switch), and the bindings list
 * the kinds by calling this from 0 up to the first nullptr.
 */
constexpr char const* hazard_kind_name(hazard_kind kind) noexcept
{
  switch (kind) {
    case hazard_kind::freed_in_flight: return "freed_in_flight";
    case hazard_kind::reuse_before_fence: return "reuse_before_fence";
    case hazard_kind::cross_stream_free: return "cross_stream_free";
    case hazard_kind::double_free: return "double_free";
    case hazard_kind::foreign_free: return "foreign_free";
    case hazard_kind::size_mismatch: return "size_mismatch";
    case hazard_kind::leak: return "leak";
    case hazard_kind::allocated_while_live: return "allocated_while_live";
  }
  return nullptr;
}

/// One observed hazard.
struct hazard_record {
  hazard_kind kind{};
  std::uintptr_t ptr{};
  std::size_t size{};          ///< bytes named by the call that showed the hazard
  std::size_t tracked_size{};  ///< bytes of the block as allocated (0: not a live block)
  std::uintptr_t stream{};     ///< stream of the call that showed the hazard
  /// Streams whose unfinished work makes it a hazard (empty for bad frees and leaks).
  std::vector<std::uintptr_t> streams;
  std::shared_ptr<detail::stack_trace const> stack;             ///< the call that showed it
  std::shared_ptr<detail::stack_trace const> allocation_stack;  ///< the block's allocation
  std::uint64_t serial{};                                       ///< order of detection, from 1
  bool raised{};  ///< already raised to the caller (strict Python calls)
};

/// One live allocation.
struct allocation_record {
  std::uintptr_t ptr{};
  std::size_t size{};
  std::uintptr_t stream{};               ///< allocation stream
  std::vector<std::uintptr_t> declared;  ///< streams declared with record_stream
  std::shared_ptr<detail::stack_trace const> stack;
  std::uint64_t serial{};
};

}  // namespace rmm_fences::mr
