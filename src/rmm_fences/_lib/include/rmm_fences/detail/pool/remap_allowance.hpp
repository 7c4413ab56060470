/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the time a pool over a page arena may spend moving pages. To stay
 * within its budget a growth unmaps free pages and maps them where it grows; each page moved
 * costs two driver calls. While the pool's peak in use rises, a move saves pages it would
 * hold from then on, and it always may. Once the peak stops rising, a workload whose free
 * bytes seldom sit where its next request needs them would move pages on every pass, so those
 * moves take at most `fraction` of the time: a token bucket of time that fills at `fraction`
 * of the time that passes, up to `fraction` of `remap_window_ns`, and that each such move
 * empties by what it took. Without credit, a growth maps fresh pages instead (the pool holds
 * more). Plain values: the growth's lock guards them.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace rmm_fences::mr::detail::pool {

/// The default share of its time a pool over a page arena may spend moving pages once its
/// peak in use stopped rising.
inline constexpr double default_remap_time_fraction = 0.05;

/// The bucket holds `fraction` of this many nanoseconds: the most time the pool may spend
/// moving pages at once after a pause.
inline constexpr double remap_window_ns = 1e9;

/// `fraction`, or `std::invalid_argument` when it is not within [0, 1].
inline double validated_remap_time_fraction(double fraction)
{
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("remap_time_fraction must be within [0, 1], got " +
                                std::to_string(fraction));
  }
  return fraction;
}

/**
 * @brief The time left for moving pages, on the arena's clock (nanoseconds).
 *
 * Over any stretch of time `T` the moves it is charged for take at most
 * `fraction * (T + remap_window_ns)`, plus the one move that began with credit left.
 * `fraction` 0: none; 1: every move. (A growth that would pass `maximum_pool_size` or finds
 * the device out of memory moves pages whatever the allowance says.)
 */
class remap_allowance {
 public:
  remap_allowance(double fraction, std::uint64_t now) noexcept
    : fraction_{fraction}, last_{now}, credit_{fraction * remap_window_ns}
  {
  }

  /// True when a growth at `now` may move pages.
  [[nodiscard]] bool allows(std::uint64_t now) noexcept
  {
    if (fraction_ >= 1.0) { return true; }
    accrue(now);
    return credit_ > 0.0;
  }

  /// Charges the time from `from` to `to` that a move took.
  void spend(std::uint64_t from, std::uint64_t to) noexcept
  {
    accrue(to);
    credit_ -= static_cast<double>(to - std::min(from, to));
  }

 private:
  void accrue(std::uint64_t now) noexcept
  {
    if (now <= last_) { return; }
    credit_ =
      std::min(fraction_ * remap_window_ns, credit_ + fraction_ * static_cast<double>(now - last_));
    last_ = now;
  }

  double fraction_;
  std::uint64_t last_;
  double credit_;
};

}  // namespace rmm_fences::mr::detail::pool
