/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * A hash map from device addresses to values: open addressing, linear probing, deletion by
 * backward shift (no tombstones). Inserting and erasing allocate nothing until the table
 * grows, and hashing costs one multiply, which keeps the tracker's hot path short.
 *
 * Invariants:
 * - key 0 marks an empty slot, so address 0 is never present: `find`/`find_index` of 0 give
 *   not-found (the probe tests for an empty slot before it compares keys, so this costs no
 *   extra branch) and `insert_or_assign` of 0 throws std::invalid_argument (one never-taken
 *   branch beside the growth test). `size()` counts only real entries;
 * - every key sits at or after its home slot, with no empty slot in between (wrapping);
 * - at most half the slots are used.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

template <typename Value>
class pointer_map {
 public:
  explicit pointer_map(std::size_t capacity = 1024) { rehash(round_up(capacity * 2)); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// What `find_index` returns for a key that is not present.
  static constexpr std::size_t npos = ~std::size_t{0};

  /// The slot of `key`, or `npos` (always for key 0): with `value_at` and `erase_at`, a lookup
  /// followed by an erase costs one probe.
  [[nodiscard]] std::size_t find_index(std::uintptr_t key) const noexcept
  {
    for (auto i = home(key);; i = next(i)) {
      if (slots_[i].key == 0) { return npos; }  // first: key 0 (the empty marker) never matches
      if (slots_[i].key == key) { return i; }
    }
  }

  [[nodiscard]] Value& value_at(std::size_t i) noexcept { return slots_[i].value; }
  [[nodiscard]] Value const& value_at(std::size_t i) const noexcept { return slots_[i].value; }

  /// The value of `key`, or nullptr.
  [[nodiscard]] Value* find(std::uintptr_t key) noexcept
  {
    auto const i = find_index(key);
    return i == npos ? nullptr : &slots_[i].value;
  }

  /// Inserts or replaces the value of `key`. May grow the table. Key 0 (the empty-slot marker,
  /// never an address handed out) throws std::invalid_argument and changes nothing.
  void insert_or_assign(std::uintptr_t key, Value value) { find_or_insert(key) = std::move(value); }

  /**
   * @brief The value of `key`, inserted as `Value{}` when absent (every empty slot holds
   * `Value{}`), for the caller to fill in place. May grow the table; key 0 throws as
   * `insert_or_assign` does.
   */
  Value& find_or_insert(std::uintptr_t key)
  {
    if (key == 0) [[unlikely]] { throw_zero_key(); }
    if (2 * (size_ + 1) > slots_.size()) { rehash(2 * slots_.size()); }
    for (auto i = home(key);; i = next(i)) {
      auto& s = slots_[i];
      if (s.key == key) { return s.value; }
      if (s.key == 0) {
        s.key = key;
        ++size_;
        return s.value;
      }
    }
  }

  /// Removes `key`'s entry and returns its value (a default value when `key` is absent or 0).
  Value take(std::uintptr_t key) noexcept
  {
    auto const i = find_index(key);
    if (i == npos) { return Value{}; }
    Value out = std::move(slots_[i].value);
    erase_at(i);
    return out;
  }

  /// Erases the entry in slot `i` (from `find_index`).
  [[gnu::always_inline]] void erase_at(std::size_t i) noexcept
  {
    // Backward shift: pull later entries of the run into the hole when their home allows it.
    for (auto j = next(i);; j = next(j)) {
      auto& s = slots_[j];
      if (s.key == 0) { break; }
      auto const h       = home(s.key);
      bool const movable = (i <= j) ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i].key   = s.key;
        slots_[i].value = std::move(s.value);
        i               = j;
      }
    }
    slots_[i].key = 0;
    reset(slots_[i].value);
    --size_;
  }

  /// Erases every entry (the table keeps its size: nothing is allocated).
  void clear() noexcept
  {
    for (auto& s : slots_) {
      s.key = 0;
      reset(s.value);
    }
    size_ = 0;
  }

  /// Calls `fn(key, value)` for every entry.
  template <typename Fn>
  void for_each(Fn&& fn) const
  {
    for (auto const& s : slots_) {
      if (s.key != 0) { fn(s.key, s.value); }
    }
  }

 private:
  struct slot {
    std::uintptr_t key{};
    Value value{};
  };

  static_assert(std::is_nothrow_default_constructible_v<Value>,
                "an empty slot is rebuilt in place, which must not throw");

  /// Makes `v` the empty slot's `Value{}` in place: no temporary, no move assignment (a value
  /// with members that own memory, as the tracker's records, would pay for both per erase).
  static void reset(Value& v) noexcept
  {
    std::destroy_at(&v);
    std::construct_at(&v);
  }

  [[noreturn, gnu::cold, gnu::noinline]] static void throw_zero_key()
  {
    throw std::invalid_argument(
      "pointer_map: key 0 marks an empty slot and is never an address: nothing inserted");
  }

  static std::size_t round_up(std::size_t n)
  {
    std::size_t p = 16;
    while (p < n) {
      p *= 2;
    }
    return p;
  }

  [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept
  { return static_cast<std::size_t>(((key >> 8U) * 0x9E3779B97F4A7C15ULL) >> shift_); }
  [[nodiscard]] std::size_t next(std::size_t i) const noexcept { return (i + 1) & mask_; }

  void rehash(std::size_t count)
  {
    std::vector<slot> old(count);
    old.swap(slots_);
    mask_  = count - 1;
    shift_ = 64;
    for (auto c = count; c > 1; c /= 2) {
      --shift_;
    }
    size_ = 0;
    for (auto& s : old) {
      if (s.key != 0) { insert_or_assign(s.key, std::move(s.value)); }
    }
  }

  std::vector<slot> slots_;
  std::size_t size_{};
  std::size_t mask_{};
  unsigned shift_{};
};

}  // namespace rmm_fences::mr::detail
