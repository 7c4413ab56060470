/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: growth over a page arena, an upstream that backs one reserved
 * virtual address range with physical pages on demand. A growth maps only what the free
 * blocks around the place it maps lack, and free blocks merge across growths. When the pool
 * would hold more than `arena_slack_divisor`-th over the most bytes it had in use, a growth
 * first unmaps whole pages of free blocks whose fences a query finds complete (their work is
 * done, not only ordered: an unmap takes effect at once) and the arena backs the new range
 * with those pages. Unmapped ranges below the top (holes) are where growths map first, so
 * the address space used stops growing. Moving pages costs driver calls: once the peak in
 * use stopped rising, a growth moves them only while the remap allowance (remap_allowance.hpp)
 * has time left, else it maps fresh pages. Mapped and unmapped ranges change only under the
 * growth's lock; no CUDA call here (the arena makes them).
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/pool/chunk_registry.hpp>
#include <rmm_fences/detail/pool/counters.hpp>
#include <rmm_fences/detail/pool/fence.hpp>
#include <rmm_fences/detail/pool/pages.hpp>
#include <rmm_fences/detail/pool/remap_allowance.hpp>
#include <rmm_fences/detail/pool/request.hpp>
#include <rmm_fences/detail/pool/shared_list.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/**
 * @brief What the pool asks of a page arena (`Upstream::arena()` returns one, or nullptr).
 *
 *   std::size_t page_size() const noexcept;  // a power of two, a multiple of the granule
 *   char* base() const noexcept;             // the reserved range: [base, base + reserved)
 *   std::size_t reserved() const noexcept;
 *   std::size_t physical_bytes() const noexcept;  // pages held: mapped and spare
 *   std::size_t spare_bytes() const noexcept;     // pages held, mapped nowhere
 *   std::size_t peak_physical_bytes() const noexcept;  // the most pages held at once
 *   void map(char* p, std::size_t n);   // backs [p, p + n) (pages), spare pages first;
 *                                       // throws the platform's out_of_memory
 *   void unmap(char* p, std::size_t n) noexcept;  // at once: its pages become spare
 *   void trim() noexcept;                         // frees the spare pages
 *   std::uint64_t now_ns() const noexcept;        // a monotonic clock (times the moves)
 *   double remap_time_fraction() const noexcept;  // the share of time moves may take
 */
template <typename A>
concept page_arena = requires(A& a, A const& c, char* p, std::size_t n) {
  { c.page_size() } -> std::convertible_to<std::size_t>;
  { c.base() } -> std::convertible_to<char*>;
  { c.reserved() } -> std::convertible_to<std::size_t>;
  { c.physical_bytes() } -> std::convertible_to<std::size_t>;
  { c.spare_bytes() } -> std::convertible_to<std::size_t>;
  { c.peak_physical_bytes() } -> std::convertible_to<std::size_t>;
  a.map(p, n);
  a.unmap(p, n);
  a.trim();
  { c.now_ns() } -> std::convertible_to<std::uint64_t>;
  { c.remap_time_fraction() } -> std::convertible_to<double>;
};

/**
 * @brief Growth of a pool over the page arena `Arena` (the growth's lock held by callers of
 * `grow_locked`, `grow_initial` and `release`).
 *
 * A growth maps, in the lowest hole that holds it with the free blocks on both sides, else at
 * the top after the free block that ends there, the pages the request lacks; the new bytes
 * hold no earlier work (fresh, or unmapped once complete) and are listed untagged, merging
 * with those blocks. A growth for a captured stream merges with no block (it could wait on
 * none of their fences): it maps the whole request and starts a chunk of its own.
 */
template <typename Platform, page_arena Arena>
class arena_growth {
 public:
  using tag_type = fence_tag<Platform>;
  using request  = alloc_request<Platform>;

  arena_growth(Arena& arena,
               std::optional<std::size_t> maximum_pool_size,
               Platform& platform,
               chunk_registry& chunks,
               shared_list<Platform>& shared,
               pool_counters& counters)
    : arena_{arena},
      maximum_pool_size_{maximum_pool_size},
      platform_{platform},
      chunks_{chunks},
      shared_{shared},
      counters_{counters},
      top_{arena.base()},
      allowance_{arena.remap_time_fraction(), arena.now_ns()}
  {
  }

  /// The initial pages, at the start of the range, listed untagged.
  void grow_initial(std::size_t bytes)
  {
    auto const n = round_to_page(bytes, arena_.page_size());
    if (!fits_bounds(n)) { Platform::throw_out_of_memory(bytes, 0); }
    map_at(top_, n, /*merge=*/true);
  }

  /**
   * @brief Maps what `req` lacks where `where_to_map` says (first moving complete free pages
   * there when over the budget, and the peak in use rises or the remap allowance has time
   * left), then takes a block for it from the shared list. nullptr when the arena, its
   * reserve or `maximum_pool_size` leaves no room.
   */
  void* grow_locked(request const& req)
  {
    auto const began  = arena_.now_ns();
    bool const rising = in_use_with(req.need()) > counters_.peak_bytes.load();
    std::size_t moved = 0;
    bool const grown  = map_for(req, rising || allowance_.allows(began), moved);
    if (moved > 0) { count_move(began, moved, /*charged=*/!rising); }
    if (!grown) { return nullptr; }
    pool_counters::bump(counters_.growths);
    char* ptr = shared_.take_for(req);
    return ptr == nullptr ? nullptr : counters_.account(ptr, req.size);
  }

  /// Unmaps every whole page of the shared list's free blocks whose fences are complete and
  /// frees the arena's spare pages; the bytes it held before less after.
  std::size_t release()
  {
    auto const before = arena_.physical_bytes();
    unmap_complete_pages(SIZE_MAX, {});
    arena_.trim();
    return before - arena_.physical_bytes();
  }

  /// At shutdown, once no work uses them: unmaps `ranges` and frees every page.
  void unmap_all(std::vector<std::pair<char*, std::size_t>> const& ranges) noexcept
  {
    for (auto const& [ptr, size] : ranges) {
      arena_.unmap(ptr, size);
    }
    arena_.trim();
  }

  /// Bytes of free pages unmapped to be mapped where the pool grew, and the time it took.
  [[nodiscard]] std::uint64_t remapped_bytes() const noexcept
  { return remapped_bytes_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t remap_ns() const noexcept
  { return remap_ns_.load(std::memory_order_relaxed); }

  /// Bytes of physical pages held (mapped and spare), and the most held at once.
  [[nodiscard]] std::size_t physical_bytes() const noexcept { return arena_.physical_bytes(); }
  [[nodiscard]] std::size_t peak_physical_bytes() const noexcept
  { return arena_.peak_physical_bytes(); }

 private:
  [[nodiscard]] std::size_t remaining_reserve() const noexcept
  { return static_cast<std::size_t>(arena_.base() + arena_.reserved() - top_); }

  /// The bytes of pages held once `n` more are mapped (spare pages first).
  [[nodiscard]] std::size_t held_after(std::size_t n) const noexcept
  { return arena_.physical_bytes() + (n - std::min(n, arena_.spare_bytes())); }

  /// True when `n` more mapped bytes keep the pages held within `maximum_pool_size`.
  [[nodiscard]] bool fits_bounds(std::size_t n) const noexcept
  { return !maximum_pool_size_ || held_after(n) <= *maximum_pool_size_; }

  /// Maps the pages `req` lacks; over the budget it first unmaps complete free pages when
  /// `may_move`, and past `maximum_pool_size` or out of device memory whatever the allowance
  /// (the alternative is out-of-memory). `moved`: the bytes unmapped. False when nothing could
  /// be mapped.
  bool map_for(request const& req, bool may_move, std::size_t& moved)
  {
    bool const capturing = platform_.is_capturing(req.stream);
    auto spot            = where_to_map(req.need(), capturing);
    if (spot.at == nullptr) { return false; }
    // An unmap makes holes, which may join the chosen one or lower the top: choose again.
    moved = may_move ? unmap_over_budget(spot.bytes, req.need(), {spot.below, spot.above}) : 0;
    if (moved > 0) {
      spot = where_to_map(req.need(), capturing);
      if (spot.at == nullptr) { return false; }
    }
    if (fits_bounds(spot.bytes) && try_map(spot, capturing)) { return true; }
    // Complete free pages elsewhere back the range, or nothing does.
    auto const freed = unmap_complete_pages(spot.bytes, {spot.below, spot.above});
    if (freed == 0) { return false; }
    moved += freed;
    spot = where_to_map(req.need(), capturing);
    return spot.at != nullptr && fits_bounds(spot.bytes) && try_map(spot, capturing);
  }

  /// Counts a growth's move of `moved` bytes that began at `began`; when `charged`, its
  /// time comes out of the allowance.
  void count_move(std::uint64_t began, std::size_t moved, bool charged)
  {
    auto const end = arena_.now_ns();
    if (charged) { allowance_.spend(began, end); }
    remap_ns_.fetch_add(end - std::min(began, end), std::memory_order_relaxed);
    remapped_bytes_.fetch_add(moved, std::memory_order_relaxed);
  }

  /// The bytes in use once `need` more are.
  [[nodiscard]] std::size_t in_use_with(std::size_t need) const noexcept
  {
    return static_cast<std::size_t>(std::max<std::int64_t>(counters_.current_bytes.load(), 0)) +
           need;
  }

  /// Before mapping `n` bytes for a request of `need`: unmaps complete free pages (never of
  /// the blocks at `keep`) so that the pages held stay within `arena_budget`; the bytes
  /// unmapped.
  std::size_t unmap_over_budget(std::size_t n, std::size_t need, std::array<char*, 2> keep)
  {
    auto const after  = held_after(n);
    auto const budget = arena_budget(counters_.peak_bytes.load(), in_use_with(need));
    return after > budget ? unmap_complete_pages(after - budget, keep) : 0;
  }

  /// Unmaps up to `want` bytes (whole pages, largest free blocks first, never the blocks at
  /// `keep`) of free blocks whose fences a query finds complete; the bytes unmapped.
  std::size_t unmap_complete_pages(std::size_t want, std::array<char*, 2> keep)
  {
    shared_.drop_complete_needs();
    auto const cut                = shared_.take_idle_pages(arena_.page_size(), want, keep);
    std::size_t unmapped          = 0;
    [[maybe_unused]] auto relaxed = platform_.relax();
    for (auto const& [ptr, size] : cut) {
      arena_.unmap(ptr, size);
      add_hole(ptr, size);
      unmapped += size;
    }
    return unmapped;
  }

  /// Where a growth for `need` bytes maps: `bytes` at `at`, between the free blocks at
  /// `below` and `above` that it joins (or none); `at` null when the reserve has no room.
  struct spot {
    char* at{};
    std::size_t bytes{};
    char* below{};
    char* above{};
  };

  /// Where to map for `need`: the lowest hole that holds it with the free block that ends
  /// there (only the pages that block lacks are mapped) or, mapped whole, with the free blocks
  /// on both of its sides; else the top, after the free block that ends there. A captured
  /// stream's growth merges with no free block (it could wait on none of their fences).
  [[nodiscard]] spot where_to_map(std::size_t need, bool capturing)
  {
    auto const page = arena_.page_size();
    auto const at   = [&](char* start, std::size_t room, bool hole) {
      if (capturing) {
        return need <= room ? spot{start, round_to_page(need, page), nullptr, nullptr} : spot{};
      }
      auto const below = shared_.block_ending_at(start);
      auto const bytes = round_to_page(need - std::min(need, below.second), page);
      if (bytes <= room) { return spot{start, bytes, below.first, nullptr}; }
      // The whole hole, which joins the free blocks on both sides of it.
      if (hole && below.second + room + shared_.size_of_block_at(start + room) >= need) {
        return spot{start, room, below.first, start + room};
      }
      return spot{};
    };
    spot found;
    holes_.for_each([&](char* start, std::size_t size, no_tag&) {
      if (found.at == nullptr) { found = at(start, size, true); }
    });
    return found.at != nullptr ? found : at(top_, remaining_reserve(), false);
  }

  /// `map_at` for a growth at `spot`; false when the device has no page left.
  bool try_map(spot const& at, bool capturing)
  {
    try {
      map_at(at.at, at.bytes, /*merge=*/!capturing);
      return true;
    } catch (typename Platform::out_of_memory const&) {
      return false;
    }
  }

  /// Maps `n` bytes at `ptr` (a hole's start or the top), registers them (merged with the
  /// chunks around when `merge`) and lists them untagged.
  void map_at(char* ptr, std::size_t n, bool merge)
  {
    if (n == 0) { return; }
    [[maybe_unused]] auto relaxed = platform_.relax();
    arena_.map(ptr, n);
    if (ptr == top_) {
      top_ += n;
    } else {  // the front of the hole that starts at `ptr`
      auto const hole = holes_.take(ptr);
      if (hole.size > n) { holes_.insert(ptr + n, hole.size - n, no_tag{}, no_chunks); }
    }
    if (merge) {
      chunks_.add_merging(ptr, n);
    } else {
      chunks_.add(ptr, n);
    }
    shared_.insert(ptr, n, tag_type{});
  }

  /// Notes `[ptr, ptr + n)` unmapped: a hole, merged with the holes around it; a hole that
  /// reaches the top lowers the top instead.
  void add_hole(char* ptr, std::size_t n)
  {
    holes_.insert(ptr, n, no_tag{}, no_chunks);
    if (auto const [start, size] = holes_.block_ending_at(top_); start != nullptr) {
      (void)holes_.take(start);
      top_ = start;
    }
  }

  /// Holes merge with every neighbour: no chunk boundary lies between them.
  static constexpr auto no_chunks = [](char*) { return false; };

  Arena& arena_;
  std::optional<std::size_t> const maximum_pool_size_;
  Platform& platform_;
  chunk_registry& chunks_;
  shared_list<Platform>& shared_;
  pool_counters& counters_;
  char* top_;  // the end of the range mapped so far: a growth past the holes maps here
  free_list<no_tag> holes_;  // ranges below the top unmapped again
  remap_allowance allowance_;
  std::atomic<std::uint64_t> remapped_bytes_{};  // statistics read them without the lock
  std::atomic<std::uint64_t> remap_ns_{};
};

}  // namespace rmm_fences::mr::detail::pool
