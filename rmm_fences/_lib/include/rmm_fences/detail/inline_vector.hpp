/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/**
 * @brief A push-only sequence that keeps its first `N` elements inline and the rest on the
 * heap. Hot paths collect a few entries per call without touching the allocator.
 *
 * `T` must be default-constructible and movable.
 */
template <typename T, std::size_t N>
class inline_vector {
 public:
  void push_back(T value)
  {
    if (size_ < N) {
      inline_[size_] = std::move(value);
    } else {
      overflow_.push_back(std::move(value));
    }
    ++size_;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  [[nodiscard]] T& operator[](std::size_t i) noexcept
  { return i < N ? inline_[i] : overflow_[i - N]; }
  [[nodiscard]] T const& operator[](std::size_t i) const noexcept
  { return i < N ? inline_[i] : overflow_[i - N]; }

  void clear() noexcept
  {
    size_ = 0;
    overflow_.clear();
  }

  /// Minimal forward iteration (range-for).
  template <typename Vec, typename Ref>
  class basic_iterator {
   public:
    basic_iterator(Vec* v, std::size_t i) : v_{v}, i_{i} {}
    Ref operator*() const { return (*v_)[i_]; }
    basic_iterator& operator++()
    {
      ++i_;
      return *this;
    }
    bool operator!=(basic_iterator const& other) const { return i_ != other.i_; }

   private:
    Vec* v_;
    std::size_t i_;
  };
  using iterator       = basic_iterator<inline_vector, T&>;
  using const_iterator = basic_iterator<inline_vector const, T const&>;

  iterator begin() noexcept { return {this, 0}; }
  iterator end() noexcept { return {this, size_}; }
  const_iterator begin() const noexcept { return {this, 0}; }
  const_iterator end() const noexcept { return {this, size_}; }

 private:
  std::array<T, N> inline_{};
  std::vector<T> overflow_;
  std::size_t size_{};
};

}  // namespace rmm_fences::mr::detail
