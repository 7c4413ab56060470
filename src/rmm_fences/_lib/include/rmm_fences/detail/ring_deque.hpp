/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/**
 * @brief A double-ended sequence in one circular array that keeps its storage: pushing at the
 * back and popping at the front allocate nothing while the size stays within the capacity
 * (`std::deque` allocates and frees a chunk every few elements that pass through it).
 *
 * Erasing or inserting in the middle moves the elements on the shorter side (linear, as a
 * deque's). Iterators are positions from the front: an erase returns the position of the
 * element that followed, and any insert, erase or growth invalidates the others.
 *
 * `T` must be default-constructible with non-throwing moves. Growth (doubling) gives the strong
 * guarantee: when the new array cannot be allocated, `std::bad_alloc` leaves the deque as it
 * was. `shrink` gives storage back once few elements are left in a large array.
 */
template <typename T>
class ring_deque {
  static_assert(std::is_nothrow_move_assignable_v<T> && std::is_nothrow_default_constructible_v<T>);

 public:
  /// The capacity of the first array.
  static constexpr std::size_t min_capacity = 8;

  template <bool Const>
  class basic_iterator {
   public:
    using ring_type = std::conditional_t<Const, ring_deque const, ring_deque>;
    using reference = std::conditional_t<Const, T const&, T&>;
    using pointer   = std::conditional_t<Const, T const*, T*>;

    basic_iterator() = default;
    basic_iterator(ring_type* ring, std::size_t index) noexcept : ring_{ring}, index_{index} {}

    reference operator*() const noexcept { return ring_->at(index_); }
    pointer operator->() const noexcept { return &ring_->at(index_); }
    basic_iterator& operator++() noexcept
    {
      ++index_;
      return *this;
    }
    bool operator==(basic_iterator const& other) const noexcept
    { return ring_ == other.ring_ && index_ == other.index_; }
    bool operator!=(basic_iterator const& other) const noexcept { return !(*this == other); }

    /// The position from the front.
    [[nodiscard]] std::size_t index() const noexcept { return index_; }

   private:
    ring_type* ring_{};
    std::size_t index_{};
  };
  using iterator       = basic_iterator<false>;
  using const_iterator = basic_iterator<true>;

  ring_deque()                             = default;
  ring_deque(ring_deque const&)            = default;
  ring_deque& operator=(ring_deque const&) = default;
  ring_deque(ring_deque&& other) noexcept
    : slots_{std::move(other.slots_)},
      head_{std::exchange(other.head_, 0)},
      size_{std::exchange(other.size_, 0)}
  { other.slots_.clear(); }
  ring_deque& operator=(ring_deque&& other) noexcept
  {
    slots_ = std::move(other.slots_);
    other.slots_.clear();
    head_ = std::exchange(other.head_, 0);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  ~ring_deque() = default;

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_.size(); }

  [[nodiscard]] T& at(std::size_t i) noexcept { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  [[nodiscard]] T const& at(std::size_t i) const noexcept
  { return slots_[(head_ + i) & (slots_.size() - 1)]; }

  iterator begin() noexcept { return {this, 0}; }
  iterator end() noexcept { return {this, size_}; }
  const_iterator begin() const noexcept { return {this, 0}; }
  const_iterator end() const noexcept { return {this, size_}; }

  /// Appends `value`; throws `std::bad_alloc` (nothing changed) when a full array cannot grow.
  void push_back(T value)
  {
    reserve_one();
    at(size_) = std::move(value);
    ++size_;
  }

  /**
   * @brief Appends an element and returns it for the caller to assign every field: it holds
   * what the slot's last occupant left. Cheaper than `push_back` of a value built aside, whose
   * copy in waits on the stores that built it. Throws as `push_back`.
   */
  T& push_back_slot()
  {
    reserve_one();
    return at(size_++);
  }

  /// Removes the front element (the deque must not be empty).
  void pop_front() noexcept
  {
    vacate(at(0));
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }

  /// Removes the element at `pos`; returns the position of the one that followed it.
  iterator erase(iterator pos) noexcept
  {
    auto const i = pos.index();
    if (i < size_ - 1 - i) {  // fewer elements before it: move them one step back
      for (auto k = i; k > 0; --k) {
        at(k) = std::move(at(k - 1));
      }
      pop_front();
    } else {
      for (auto k = i; k + 1 < size_; ++k) {
        at(k) = std::move(at(k + 1));
      }
      vacate(at(size_ - 1));
      --size_;
    }
    return {this, i};
  }

  /// Inserts `value` before `pos`; returns its position. Throws `std::bad_alloc` (nothing
  /// changed) when a full array cannot grow.
  iterator insert(iterator pos, T value)
  {
    auto const i = pos.index();
    reserve_one();
    for (auto k = size_; k > i; --k) {
      at(k) = std::move(at(k - 1));
    }
    at(i) = std::move(value);
    ++size_;
    return {this, i};
  }

  /**
   * @brief Gives storage back when the array holds more than `kept` elements and a quarter or
   * less of it is used: all of it when empty, else half or more (to the smallest power of two,
   * at least `min_capacity`, that holds twice the elements; no host memory for the smaller
   * array: it stays as it is). Never throws.
   */
  void shrink(std::size_t kept) noexcept
  {
    if (slots_.size() <= kept || 4 * size_ > slots_.size()) { return; }
    if (size_ == 0) {
      std::vector<T>{}.swap(slots_);
      head_ = 0;
      return;
    }
    auto const smaller = std::max(min_capacity, std::bit_ceil(2 * size_));
    if (smaller >= slots_.size()) { return; }
    try {
      relocate(smaller);
    } catch (...) {
    }
  }

 private:
  /// A slot left: what its element holds is released (a trivially destructible element holds
  /// nothing, and is left as it is: rebuilding it would cost a hot path a stalled copy).
  static void vacate(T& slot) noexcept
  {
    if constexpr (!std::is_trivially_destructible_v<T>) { slot = T{}; }
  }

  void reserve_one()
  {
    if (size_ < slots_.size()) { return; }
    relocate(slots_.empty() ? min_capacity : 2 * slots_.size());
  }

  /// Moves the elements to the front of a new array of `capacity` (a power of two).
  void relocate(std::size_t capacity)
  {
    std::vector<T> moved(capacity);  // may throw: nothing changed yet
    for (std::size_t k = 0; k < size_; ++k) {
      moved[k] = std::move(at(k));
    }
    slots_.swap(moved);
    head_ = 0;
  }

  std::vector<T> slots_;  // size: a power of two, or 0
  std::size_t head_{};
  std::size_t size_{};
};

}  // namespace rmm_fences::mr::detail
