/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazard tracker's per-allocation records: the live blocks, and the addresses freed
 * recently.
 */
#pragma once

#include <rmm_fences/detail/pointer_map.hpp>
#include <rmm_fences/detail/stack_trace.hpp>
#include <rmm_fences/mr/free_result.hpp>
#include <rmm_fences/mr/hazards.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::tracker {

/// The record of one live allocation.
struct live_block {
  std::size_t size{};
  std::uintptr_t stream{};               ///< allocation stream (its key)
  std::vector<std::uintptr_t> declared;  ///< streams declared with record_stream (keys)
  std::shared_ptr<stack_trace const> stack;
  std::uint64_t serial{};
  /// An earlier allocation of the same address, still live (`allocated_while_live`).
  std::unique_ptr<live_block> earlier;

  /// True when `key` is one of the streams declared for the block.
  [[nodiscard]] bool declares(std::uintptr_t key) const
  { return std::find(declared.begin(), declared.end(), key) != declared.end(); }
};

/// An address freed recently, with the size it was freed with.
struct freed_address {
  std::uintptr_t ptr{};
  std::size_t size{};
};

/**
 * @brief The live blocks of a hazard tracker, by address, and a table of recently freed
 * addresses.
 *
 * No lock: `hazard_tracker_core` calls every member under its mutex.
 *
 * An address the upstream hands out again while it is live keeps every record: the newest at
 * the head, the earlier ones behind it (`live_block::earlier`); a free takes the record of its
 * size. The table of recently freed addresses tells a double free from a foreign one: a slot
 * holds the latest address freed that maps to it, and is read only for an address that is not
 * live, so allocating a block again needs no update.
 */
class allocation_ledger {
 public:
  static constexpr std::size_t recently_freed_slots = 1U << 16U;

  allocation_ledger() { recently_freed_.resize(recently_freed_slots); }

  /// The newest record of the live address `ptr`, or nullptr.
  [[nodiscard]] live_block* find(std::uintptr_t ptr) noexcept { return blocks_.find(ptr); }

  /// The record, empty, of a block at an address that is not live, for the caller to fill in
  /// place (a record built aside and moved in costs the hot path a stalled copy). May throw
  /// (nothing changed).
  [[nodiscard]] live_block& insert(std::uintptr_t ptr) { return blocks_.find_or_insert(ptr); }

  /// Makes `record` the newest record of the live address whose head is `head`; the head moves
  /// into `earlier`, allocated by the caller so that nothing here throws.
  void shadow(live_block& head, live_block record, std::unique_ptr<live_block> earlier) noexcept
  {
    *earlier       = std::move(head);
    record.earlier = std::move(earlier);
    head           = std::move(record);
    shadowed_ += 1;
  }

  /// A free checked against the records (`match_free`): what it found, and where.
  struct free_match {
    free_result result;    ///< `ok`, `unknown` (not live) or `size_mismatch`
    live_block* head{};    ///< the newest record of the address; nullptr when it is not live
    live_block* parent{};  ///< the record in front of `block`; nullptr when `block` is the head
    live_block* block{};   ///< the record of the freed size; nullptr unless `ok`
    std::size_t slot{};    ///< where the address's records sit in the table (for `remove`)
  };

  /**
   * @brief Checks a free of `bytes` at `ptr`: the record of that size among those of the
   * address (several only after an `allocated_while_live`). A `size_mismatch` carries the
   * newest record's size.
   */
  [[nodiscard]] free_match match_free(std::uintptr_t ptr, std::size_t bytes) noexcept
  {
    free_match m{{free_check::unknown, 0}};
    m.slot = blocks_.find_index(ptr);
    if (m.slot == decltype(blocks_)::npos) { return m; }
    m.head = &blocks_.value_at(m.slot);
    for (m.block = m.head; m.block != nullptr && m.block->size != bytes;
         m.block = m.block->earlier.get()) {
      m.parent = m.block;
    }
    m.result = m.block != nullptr ? free_result{free_check::ok, bytes}
                                  : free_result{free_check::size_mismatch, m.head->size};
    return m;
  }

  /// Removes the record an `ok` match found (the table unchanged since); true when the address
  /// is no longer live.
  bool remove(free_match const& m) noexcept
  {
    if (m.parent != nullptr) {
      m.parent->earlier = std::move(m.block->earlier);
      shadowed_ -= 1;
      return false;
    }
    auto& head = *m.head;
    if (head.earlier) {
      auto earlier = std::move(head.earlier);
      head         = std::move(*earlier);
      shadowed_ -= 1;
      return false;
    }
    blocks_.erase_at(m.slot);
    return true;
  }

  /// Adds `key` to the declared streams of every record of `ptr`; false when `ptr` is not live.
  bool declare(std::uintptr_t ptr, std::uintptr_t key)
  {
    auto* block = blocks_.find(ptr);
    if (block == nullptr) { return false; }
    for (; block != nullptr; block = block->earlier.get()) {  // every record of the address
      if (!block->declares(key)) { block->declared.push_back(key); }
    }
    return true;
  }

  /// The last address freed among those sharing the slot of `ptr`.
  [[nodiscard]] freed_address const& recently_freed(std::uintptr_t ptr) const noexcept
  { return recently_freed_[slot(ptr)]; }

  void remember_freed(std::uintptr_t ptr, std::size_t size) noexcept
  { recently_freed_[slot(ptr)] = freed_address{ptr, size}; }

  /// The live blocks, oldest first (an address handed out twice is listed twice).
  [[nodiscard]] std::vector<allocation_record> outstanding() const
  {
    std::vector<allocation_record> out;
    out.reserve(blocks_.size() + shadowed_);
    for_each_record([&](std::uintptr_t ptr, live_block const& block) {
      out.push_back(allocation_record{
        ptr, block.size, block.stream, block.declared, block.stack, block.serial});
    });
    std::sort(
      out.begin(), out.end(), [](auto const& a, auto const& b) { return a.serial < b.serial; });
    return out;
  }

  /// Adds the bytes live per allocation stream into `bytes`.
  void add_stream_bytes(std::map<std::uintptr_t, std::size_t>& bytes) const
  {
    for_each_record(
      [&](std::uintptr_t, live_block const& block) { bytes[block.stream] += block.size; });
  }

 private:
  /// Direct-mapped by 256-byte granule: blocks within 16 MiB of each other never collide.
  static std::size_t slot(std::uintptr_t ptr) noexcept
  { return static_cast<std::size_t>(ptr >> 8U) & (recently_freed_slots - 1); }

  template <typename Visit>
  void for_each_record(Visit&& visit) const
  {
    blocks_.for_each([&](std::uintptr_t ptr, live_block const& head) {
      for (auto const* block = &head; block != nullptr; block = block->earlier.get()) {
        visit(ptr, *block);
      }
    });
  }

  pointer_map<live_block> blocks_;
  std::size_t shadowed_{};  ///< earlier records of live addresses (`live_block::earlier`)
  std::vector<freed_address> recently_freed_;
};

}  // namespace rmm_fences::mr::detail::tracker
