/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <rmm_fences/detail/spin_mutex.hpp>

#include <array>
#include <cstddef>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail {

/**
 * @brief Heap storage that `inline_vector`s spilled into, kept for the next ones.
 *
 * A vector that spills takes a kept storage (so it allocates nothing while that is large
 * enough) and gives its storage back when it is destroyed. At most `Slots` storages of at most
 * `max_kept` elements are kept; a larger or surplus one is freed, as without a cache.
 * Thread-safe (a spin lock, never held while taking another lock).
 */
template <typename T, std::size_t Slots>
class spill_cache {
 public:
  explicit spill_cache(std::size_t max_kept) noexcept : max_kept_{max_kept} {}
  spill_cache(spill_cache const&)            = delete;
  spill_cache& operator=(spill_cache const&) = delete;

  /// Moves a kept storage into `v` (empty, without storage); none kept: `v` stays as it is.
  void take(std::vector<T>& v) noexcept
  {
    std::lock_guard<spin_mutex> lock(mutex_);
    for (auto& kept : kept_) {
      if (kept.capacity() > 0) {
        kept.swap(v);
        return;
      }
    }
  }

  /// Keeps the storage of `v` (its elements destroyed) when it is small enough and a slot is
  /// free; otherwise leaves `v` to free it.
  void give(std::vector<T>& v) noexcept
  {
    if (v.capacity() == 0 || v.capacity() > max_kept_) { return; }
    v.clear();
    std::lock_guard<spin_mutex> lock(mutex_);
    for (auto& kept : kept_) {
      if (kept.capacity() == 0) {
        kept.swap(v);
        return;
      }
    }
  }

 private:
  spin_mutex mutex_;
  std::size_t max_kept_;
  std::array<std::vector<T>, Slots> kept_;
};

/// No cache: an `inline_vector`'s spilled storage is freed with it.
struct no_spill_cache {};

/**
 * @brief A push-only sequence that keeps its first `N` elements inline and the rest on the
 * heap. Hot paths collect a few entries per call without touching the allocator.
 *
 * `clear()` keeps the heap storage. With a `SpillCache` (a `spill_cache`), the heap storage
 * comes from the cache given at construction and goes back to it on destruction, so vectors
 * made call after call reuse one storage.
 *
 * `T` must be default-constructible and movable.
 */
template <typename T, std::size_t N, typename SpillCache = no_spill_cache>
class inline_vector {
  static constexpr bool cached = !std::is_same_v<SpillCache, no_spill_cache>;

 public:
  inline_vector() = default;
  /// Spills into storage of `cache` (kept for the next vectors); nullptr: no cache.
  explicit inline_vector(SpillCache* cache) noexcept
    requires cached
    : cache_{cache}
  {
  }
  inline_vector(inline_vector const&)            = default;
  inline_vector(inline_vector&&)                 = default;
  inline_vector& operator=(inline_vector const&) = default;
  inline_vector& operator=(inline_vector&&)      = default;
  ~inline_vector()
  {
    if constexpr (cached) {
      if (cache_ != nullptr) { cache_->give(overflow_); }
    }
  }

  void push_back(T value)
  {
    if (size_ < N) {
      inline_[size_] = std::move(value);
    } else {
      if constexpr (cached) {
        if (cache_ != nullptr && overflow_.capacity() == 0) { cache_->take(overflow_); }
      }
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

  /// Empties the sequence; the heap storage stays for the next elements.
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
  [[no_unique_address]] std::conditional_t<cached, SpillCache*, no_spill_cache> cache_{};
};

}  // namespace rmm_fences::mr::detail
