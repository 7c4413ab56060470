/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: growth from the upstream and chunks given back to it (the only
 * calls to the upstream). Growth allocates on the requesting stream S (a stream-ordered
 * upstream may hand out memory whose previous user's work is ordered only on S): the carved
 * block is ordered for S, and the rest is listed tagged with a fence of S recorded after the
 * upstream call. While S is captured, growth uses the pool's own stream instead (never S: that
 * would put an allocation node into the graph; never the legacy stream), synchronizes it and
 * lists the chunk untagged. Chunks go back upstream on the pool's own stream, after a wait on
 * each fence that guards them. An upstream that offers a page arena (`arena()` not null) is
 * grown by the arena's rules instead (page_arena.hpp).
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/chunk_registry.hpp>
#include <rmm_fences/detail/pool/counters.hpp>
#include <rmm_fences/detail/pool/fence.hpp>
#include <rmm_fences/detail/pool/growth_rule.hpp>
#include <rmm_fences/detail/pool/page_arena.hpp>
#include <rmm_fences/detail/pool/request.hpp>
#include <rmm_fences/detail/pool/shared_list.hpp>
#include <rmm_fences/detail/pool/stream_slot.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>

#include <cstddef>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

namespace rmm_fences::mr::detail::pool {

/// The bounds a pool was made with.
struct growth_bounds {
  std::optional<std::size_t> maximum_pool_size;    ///< bytes held from the upstream at most
  std::optional<std::size_t> maximum_growth_size;  ///< a chunk's bytes beyond the request
};

/// An upstream that may offer a page arena: `arena()` returns it, or nullptr.
template <typename U>
concept may_offer_arena = requires(U& u) {
  { u.arena() } -> std::convertible_to<void const*>;
};

/// The arena growth of `Upstream` (none: std::monostate).
template <typename Platform, typename Upstream>
struct arena_part {
  using type = std::monostate;
};
template <typename Platform, may_offer_arena Upstream>
struct arena_part<Platform, Upstream> {
  using type =
    arena_growth<Platform, std::remove_pointer_t<decltype(std::declval<Upstream&>().arena())>>;
};

/// The upstream, the pool's bounds and one growth at a time (`lock`); grown chunks are
/// registered in `chunks` and their free parts listed in `shared` (or the requesting slot's
/// cache).
template <typename Platform, typename Upstream>
class upstream_growth {
 public:
  using stream_type = typename Platform::stream_type;
  using tag_type    = fence_tag<Platform>;
  using request     = alloc_request<Platform>;

  upstream_growth(Upstream upstream,
                  growth_bounds bounds,
                  Platform& platform,
                  chunk_registry& chunks,
                  shared_list<Platform>& shared,
                  pool_counters& counters)
    : upstream_{std::move(upstream)},
      bounds_{bounds},
      platform_{platform},
      chunks_{chunks},
      shared_{shared},
      counters_{counters}
  {
    if constexpr (may_offer_arena<Upstream>) {
      if (auto* arena = upstream_.arena(); arena != nullptr) {
        arena_.emplace(*arena, bounds.maximum_pool_size, platform, chunks, shared, counters);
      }
    }
  }

  /// Bytes of memory held: the chunks, or the arena's pages (mapped and spare).
  [[nodiscard]] std::size_t physical_bytes() const noexcept
  {
    if constexpr (may_offer_arena<Upstream>) {
      if (arena_) { return arena_->physical_bytes(); }
    }
    return chunks_.bytes();
  }

  /// The most bytes of memory held at once.
  [[nodiscard]] std::size_t peak_physical_bytes() const noexcept
  {
    if constexpr (may_offer_arena<Upstream>) {
      if (arena_) { return arena_->peak_physical_bytes(); }
    }
    return chunks_.peak_bytes();
  }

  /// Over a page arena: bytes of free pages moved to where the pool grew, and the time the
  /// moves took (nanoseconds); 0 over chunks.
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> remapped() const noexcept
  {
    if constexpr (may_offer_arena<Upstream>) {
      if (arena_) { return {arena_->remapped_bytes(), arena_->remap_ns()}; }
    }
    return {0, 0};
  }

  /// The initial chunk: on the pool's own stream, synchronized, so it is free of any earlier
  /// work and listed untagged.
  void grow_initial(std::size_t bytes)
  {
    if (bytes > max_request) { Platform::throw_out_of_memory(bytes, 0); }
    if constexpr (may_offer_arena<Upstream>) {
      if (arena_) { return arena_->grow_initial(bytes); }
    }
    auto const size               = round_to_granule(bytes);
    [[maybe_unused]] auto relaxed = platform_.relax();
    auto const stream             = platform_.private_stream();
    void* ptr                     = upstream_.allocate(stream, size, pool_granularity);
    if (!platform_.sync_stream(stream)) {
      upstream_.deallocate(stream, ptr, size, pool_granularity);
      Platform::throw_out_of_memory(bytes, 0);
    }
    chunks_.add(static_cast<char*>(ptr), size);
    shared_.insert(static_cast<char*>(ptr), size, tag_type{});
  }

  /// One growth at a time: held through `grow_locked`.
  [[nodiscard]] std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

  /**
   * @brief Grows the pool by one chunk (`growth_chunk`; smaller on upstream failure, down to
   * the request) and allocates `req` from it; nullptr when the bound leaves no room or the
   * upstream has none (the caller holds `lock()` and `req.slot` pinned).
   */
  void* grow_locked(request const& req)
  {
    if constexpr (may_offer_arena<Upstream>) {
      if (arena_) { return arena_->grow_locked(req); }
    }
    auto const held = chunks_.bytes();
    auto const room = room_left(held);
    if (room && req.need() > *room) { return nullptr; }
    // An upstream allocation would invalidate a global-mode capture; a stream sync is allowed
    // in relaxed mode on a stream that is not captured.
    [[maybe_unused]] auto relaxed = platform_.relax();
    bool const capturing          = platform_.is_capturing(req.stream);
    auto chunk =
      growth_chunk({held, req.need(), room, bounds_.maximum_growth_size, capturing, small_streak_});
    auto const on = capturing ? platform_.private_stream() : req.stream;
    while (true) {
      char* ptr = nullptr;
      try {
        ptr = static_cast<char*>(upstream_.allocate(on, chunk, pool_granularity));
      } catch (typename Platform::out_of_memory const&) {
        auto const smaller = smaller_chunk(chunk, req.need());
        if (!smaller) { return nullptr; }
        chunk = *smaller;
        continue;
      }
      pool_counters::bump(counters_.growths);
      small_streak_ = req.need() <= small_request_bytes ? small_streak_ + chunk : 0;
      return capturing ? list_captured_chunk(req, ptr, chunk, on)
                       : list_grown_chunk(req, ptr, chunk);
    }
  }

  /// Returns upstream every chunk the shared list holds whole, on the pool's own stream after
  /// a stream wait on each fence that guards it (a chunk whose wait fails stays); its bytes.
  std::size_t release_whole_chunks()
  {
    if constexpr (may_offer_arena<Upstream>) {
      if (arena_) {  // the mapped range changes only under the growth's lock
        std::lock_guard<std::mutex> lock(mutex_);
        return arena_->release();
      }
    }
    auto whole = shared_.take_whole_chunks();
    if (whole.empty()) { return 0; }
    // On the pool's own stream: never the legacy stream, which a capture may forbid.
    [[maybe_unused]] auto relaxed = platform_.relax();
    auto const stream             = platform_.private_stream();
    std::size_t returned          = 0;
    for (auto& b : whole) {
      if (!b.tag.wait_all(stream)) {  // not ordered after its last users: kept
        chunks_.add(b.ptr, b.size);
        shared_.put_back(b);
        continue;
      }
      upstream_.deallocate(stream, b.ptr, b.size, pool_granularity);
      returned += b.size;
    }
    return returned;
  }

  /// At shutdown: the pool's own stream waits on every fence of the shared list.
  void wait_on_shared_fences() noexcept
  {
    try {
      [[maybe_unused]] auto relaxed = platform_.relax();
      auto const stream             = platform_.private_stream();
      shared_.for_each([&](char*, std::size_t, tag_type& tag) { (void)tag.wait_all(stream); });
    } catch (...) {  // no stream to wait on: the chunks go back unordered, as they would
    }
  }

  /// At shutdown: every chunk registered goes back upstream on the pool's own stream.
  void return_all() noexcept
  {
    try {
      [[maybe_unused]] auto relaxed = platform_.relax();
      auto const stream             = platform_.private_stream();
      if constexpr (may_offer_arena<Upstream>) {
        if (arena_) {  // an unmap is at once: after the waits on the fences ran
          if (platform_.sync_stream(stream)) { arena_->unmap_all(chunks_.snapshot()); }
          platform_.destroy_private_stream();
          return;
        }
      }
      for (auto const& [ptr, size] : chunks_.snapshot()) {
        upstream_.deallocate(stream, ptr, size, pool_granularity);
      }
    } catch (...) {  // no stream: the chunks are left to the upstream's own teardown
    }
    platform_.destroy_private_stream();
  }

  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] Upstream const& upstream() const noexcept { return upstream_; }
  [[nodiscard]] growth_bounds const& bounds() const noexcept { return bounds_; }

 private:
  /// Bytes left below `maximum_pool_size` when `held` (empty: no bound).
  [[nodiscard]] std::optional<std::size_t> room_left(std::size_t held) const noexcept
  {
    if (!bounds_.maximum_pool_size) { return std::nullopt; }
    auto const bound = *bounds_.maximum_pool_size;
    return bound > held ? bound - held : std::size_t{0};
  }

  /// A chunk grown on the request's stream: the rest is listed with a fence of that stream
  /// recorded after the upstream call (in the slot's cache when no fence can be recorded).
  void* list_grown_chunk(request const& req, char* ptr, std::size_t chunk)
  {
    if (chunk == req.size) { return register_and_carve(req, ptr, chunk, tag_type{}, nullptr); }
    auto const number = req.slot->cell->record(req.stream);
    if (!number) {  // no fence: the rest stays usable by this stream only
      return register_and_carve(req, ptr, chunk, tag_type{}, req.slot);
    }
    return register_and_carve(req, ptr, chunk, tag_type::of(req.slot->cell, *number), nullptr);
  }

  /// A chunk grown on the pool's own stream `on` during capture: free of earlier work once
  /// `on` is synchronized, and listed untagged.
  void* list_captured_chunk(request const& req, char* ptr, std::size_t chunk, stream_type on)
  {
    if (!platform_.sync_stream(on)) {
      upstream_.deallocate(on, ptr, chunk, pool_granularity);
      return nullptr;
    }
    return register_and_carve(req, ptr, chunk, tag_type{}, nullptr);
  }

  /// Registers a new chunk and carves the request's block from its start; lists the rest with
  /// `tag` in the shared list, or in `rest_slot`'s cache when given.
  void* register_and_carve(request const& req,
                           char* ptr,
                           std::size_t chunk,
                           tag_type const& tag,
                           stream_slot<Platform>* rest_slot)
  {
    chunks_.add(ptr, chunk);
    auto const carved = carve_chunk(ptr, chunk, req.size, req.align);
    if (rest_slot != nullptr) {
      std::lock_guard<spin_mutex> lock(rest_slot->mutex);
      rest_slot->list_cached_locked(carved.rest());
    } else {
      shared_.insert_all(carved.rest(), tag);
    }
    {
      std::lock_guard<spin_mutex> lock(req.slot->mutex);
      req.slot->live.track(carved.block, req.bytes);
    }
    return counters_.account(carved.block, req.size);
  }

  Upstream upstream_;
  std::optional<typename arena_part<Platform, Upstream>::type> arena_;
  growth_bounds const bounds_;
  std::mutex mutex_;
  std::size_t small_streak_{};  ///< `growth_state::small_streak` (guarded by `mutex_`)
  Platform& platform_;
  chunk_registry& chunks_;
  shared_list<Platform>& shared_;
  pool_counters& counters_;
};

}  // namespace rmm_fences::mr::detail::pool
