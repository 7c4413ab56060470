/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * `ring_deque` (the queues of the deferred free list) over integers, by position, for the CPU
 * tests to check against a list.
 */
#pragma once

#include <rmm_fences/detail/ring_deque.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rmm_fences::testing {

class host_ring_deque {
  using deque_type = rmm_fences::mr::detail::ring_deque<std::int64_t>;

 public:
  void push_back(std::int64_t value) { d_.push_back(value); }
  void pop_front() noexcept { d_.pop_front(); }

  /// Erases the element at position `i` (< size); returns the position `erase` returned.
  std::size_t erase_at(std::size_t i) noexcept
  { return d_.erase(deque_type::iterator{&d_, i}).index(); }

  /// Inserts before position `i` (<= size); returns the position `insert` returned.
  std::size_t insert_at(std::size_t i, std::int64_t value)
  { return d_.insert(deque_type::iterator{&d_, i}, value).index(); }

  void shrink(std::size_t kept) noexcept { d_.shrink(kept); }

  [[nodiscard]] std::vector<std::int64_t> values() const
  {
    std::vector<std::int64_t> out;
    for (auto const& v : d_) {
      out.push_back(v);
    }
    return out;
  }

  [[nodiscard]] std::size_t size() const noexcept { return d_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return d_.capacity(); }

 private:
  deque_type d_;
};

}  // namespace rmm_fences::testing
