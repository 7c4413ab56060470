/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the shared list. Blocks any stream may take, each tagged with the
 * fences a taker must be ordered after: a stream T takes a tagged block only after enqueuing a
 * device-side wait on each fence it is not yet ordered after. While T is captured no wait can
 * be enqueued: it takes untagged blocks, or blocks whose fences a query finds complete.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/pool/chunk_registry.hpp>
#include <rmm_fences/detail/pool/fence.hpp>
#include <rmm_fences/detail/pool/pages.hpp>
#include <rmm_fences/detail/pool/request.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/// Shared blocks that fit a request looked at, in best-fit order, while the calling stream
/// is captured and the best fit needs a wait, for one that needs none.
inline constexpr std::size_t capture_fit_candidates = 16;

/// The shared free list under its mutex (never taken with a slot's; only fences' and the chunk
/// registry's mutexes are taken under it).
template <typename Platform>
class shared_list {
 public:
  using tag_type = fence_tag<Platform>;
  using block    = typename free_list<tag_type>::block;

  /// `platform` answers capture and fence queries for `take_for`; `chunks` tells where chunks
  /// start (blocks never merge across).
  shared_list(Platform& platform, chunk_registry& chunks) noexcept
    : platform_{platform}, chunks_{chunks}
  {
  }

  /// Lists one block (may throw bad_alloc).
  void insert(char* ptr, std::size_t size, tag_type tag)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    list_.insert(ptr, size, std::move(tag), chunks_.start_test());
  }

  /// Lists blocks, each with `tag` (may throw bad_alloc).
  template <typename Blocks>
  void insert_all(Blocks const& blocks, tag_type const& tag)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto const& b : blocks) {
      list_.insert(b.ptr, b.size, tag, chunks_.start_test());
    }
  }

  /// Lists blocks that no fence guards (one that finds no host memory is lost to the pool,
  /// never handed out twice).
  void list_untagged(block_list const& blocks) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    insert_or_lose_locked(list_, blocks, tag_type{}, chunks_);
  }

  /// Lists blocks, each with `tag` (one that finds no host memory is lost to the pool, never
  /// handed out twice).
  void list_tagged(block_list const& blocks, tag_type const& tag) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    insert_or_lose_locked(list_, blocks, tag, chunks_);
  }

  /// Lists `b`, taken from the list and not handed out, there again.
  void put_back(block& b) { insert(b.ptr, b.size, std::move(b.tag)); }

  /// The best fit for `size` at `align` (below `below` bytes), or a null block.
  block take_best_fit(std::size_t size, std::size_t align, std::size_t below = SIZE_MAX)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.take_best_fit(size, align, below);
  }

  /**
   * @brief Takes a block for `req` (its slot pinned), orders the stream after the block's
   * fences and lists it in the slot's live blocks: the block's address, or nullptr.
   *
   * The stream is ordered by stream waits, or, while it is captured, by a query that finds the
   * fences complete, else by taking the first block among the `capture_fit_candidates` best
   * fits that needs no wait. With `below`, only a block smaller than that, and only one that
   * needs no wait (the caller's alternative is a block of the stream's own cache).
   */
  char* take_for(alloc_request<Platform> const& req, std::size_t below = SIZE_MAX)
  {
    auto b = take_best_fit(req.size, req.align, below);
    if (b.ptr == nullptr) { return nullptr; }
    auto const waits = req.slot->needed_waits(b.tag);
    if (!waits.empty()) {
      if (below != SIZE_MAX) {  // the stream's own loose fit needs no wait
        put_back(b);
        return nullptr;
      }
      if (!order_after(req, waits, b)) { return nullptr; }
    }
    return hand_to(req, b);
  }

  /// Blocks handed to a stream that needed another stream's fence for them.
  [[nodiscard]] std::uint64_t cross_stream_takes() const noexcept
  { return cross_stream_.load(std::memory_order_relaxed); }

  /// Drops from every tag the fences a query finds complete (one query per fence).
  void drop_complete_needs() noexcept
  {
    try {
      std::unordered_map<fence_cell<Platform> const*, bool> known;
      std::lock_guard<std::mutex> lock(mutex_);
      list_.for_each([&](char*, std::size_t, tag_type& tag) {
        tag.drop_complete([&](fence_need<Platform> const& n) {
          auto [it, fresh] = known.try_emplace(n.cell.get());
          if (fresh) { it->second = n.complete(); }
          return it->second;
        });
      });
    } catch (...) {  // no host memory: the fences stay (waited on, never skipped)
    }
  }

  /// The size of the block that starts at `ptr` (0: none).
  [[nodiscard]] std::size_t size_of_block_at(char* ptr)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.size_of_block_at(ptr);
  }

  /// The block that ends at `end`: (start, size), or (nullptr, 0).
  [[nodiscard]] std::pair<char*, std::size_t> block_ending_at(char* end)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return list_.block_ending_at(end);
  }

  /**
   * @brief Takes up to `want` bytes of whole pages out of blocks that no fence guards (never
   * of the blocks that start at `keep`), largest blocks first, and out of the chunk registry;
   * the rest of each block stays listed. The ranges taken.
   */
  std::vector<std::pair<char*, std::size_t>> take_idle_pages(std::size_t page,
                                                             std::size_t want,
                                                             std::array<char*, 2> keep)
  {
    std::vector<std::pair<char*, std::size_t>> taken;
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::size_t, char*>> idle;  // (size, start), largest first
    list_.for_each([&](char* p, std::size_t n, tag_type& tag) {
      if (p != keep[0] && p != keep[1] && tag.needs.empty() && inner_pages(p, n, page).second > 0) {
        idle.emplace_back(n, p);
      }
    });
    std::sort(idle.begin(), idle.end(), std::greater<>{});
    std::size_t got = 0;
    for (auto const& [n, p] : idle) {
      if (got >= want) { break; }
      auto const [lo, bytes] = inner_pages(p, n, page);
      taken.reserve(taken.size() + 1);  // a throw comes before anything moved
      auto b = list_.take(p);
      chunks_.remove(lo, bytes);
      std::array<untagged_block, 2> rest{
        {{p, static_cast<std::size_t>(lo - p)},
         {lo + bytes, static_cast<std::size_t>(p + n - (lo + bytes))}}};
      for (auto const& r : rest) {
        if (r.size > 0) { insert_or_lose_locked(list_, std::array{r}, b.tag, chunks_); }
      }
      taken.emplace_back(lo, bytes);
      got += bytes;
    }
    return taken;
  }

  /// Takes out every block a fence guards (for a device synchronization).
  std::vector<block> take_fenced()
  {
    std::vector<block> fenced;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& b : list_.take_all()) {
      if (b.tag.needs.empty()) {
        list_.insert(b.ptr, b.size, tag_type{}, chunks_.start_test());
      } else {
        fenced.push_back(std::move(b));
      }
    }
    return fenced;
  }

  /// Lists blocks `take_fenced` took again: untagged after a synchronization that ordered
  /// them (`ordered`), else with their tags.
  void relist(std::vector<block>& blocks, bool ordered)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& b : blocks) {
      list_.insert(b.ptr, b.size, ordered ? tag_type{} : std::move(b.tag), chunks_.start_test());
    }
  }

  /// Takes out of the list and the chunk registry every chunk the list holds whole.
  std::vector<block> take_whole_chunks()
  {
    std::lock_guard<std::mutex> lock(mutex_);
    return chunks_.take_whole_locked(list_);
  }

  /// Calls `f(ptr, size, tag)` for every block.
  template <typename F>
  void for_each(F&& f)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    list_.for_each(f);
  }

  /// Forgets every block, dropping the tags' references to fences.
  void clear() noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    list_ = free_list<tag_type>{};
  }

 private:
  /// Orders `req`'s stream after `waits`, the fences `b` needs; in capture, when a query does
  /// not find them complete, `b` goes back and the first block further on that needs no wait
  /// replaces it. False (with `b` back in the list) when there is none.
  bool order_after(alloc_request<Platform> const& req, fence_needs<Platform> const& waits, block& b)
  {
    bool const capturing = platform_.is_capturing(req.stream);
    if (capturing ? complete_now(waits) : req.slot->enqueue_waits(req.stream, waits)) {
      cross_stream_.fetch_add(1, std::memory_order_relaxed);
      for (auto const& w : waits) {
        w.cell->wanted.store(true, std::memory_order_relaxed);
      }
      return true;
    }
    put_back(b);
    if (!capturing) { return false; }
    b = take_needing_no_wait(req);
    return b.ptr != nullptr;
  }

  /// Lists `b` in the live blocks of `req`'s slot (after this list's mutex was released).
  char* hand_to(alloc_request<Platform> const& req, block& b)
  {
    auto& slot = *req.slot;
    // Only its own fence guards the block: it takes back bytes it fenced that nobody took.
    bool const own_only = only_own_fence(b.tag, slot.cell);
    try {
      std::lock_guard<spin_mutex> lock(slot.mutex);
      slot.live.track(b.ptr, req.bytes);
    } catch (...) {
      put_back(b);
      throw;
    }
    // Nobody needed what it fenced, `demand_decay` times in a row: stop fencing its bytes
    // eagerly.
    if (own_only && slot.own_takes.fetch_add(1, std::memory_order_relaxed) + 1 >= demand_decay) {
      slot.own_takes.store(0, std::memory_order_relaxed);
      slot.demanded.store(false, std::memory_order_relaxed);
      slot.cell->wanted.store(false, std::memory_order_relaxed);
    }
    return b.ptr;
  }

  /// True when a query finds each need complete (queries are allowed in capture in relaxed
  /// mode).
  bool complete_now(fence_needs<Platform> const& needs) noexcept
  {
    [[maybe_unused]] auto relaxed = platform_.relax();
    return all_complete(needs);
  }

  /// For a capture whose best fit needs a wait: the first block among the
  /// `capture_fit_candidates` best fits that needs none (each fence it carries is the stream's
  /// own, waited on already, or found complete by a query).
  block take_needing_no_wait(alloc_request<Platform> const& req)
  {
    auto const& own   = req.slot->cell;
    auto const waited = req.slot->waited_copy();  // the slot's mutex is not held with this one
    [[maybe_unused]] auto relaxed = platform_.relax();
    bool queried                  = false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto b =
      list_.take_best_fit_if(req.size, req.align, capture_fit_candidates, [&](tag_type const& tag) {
        bool any = false;
        for (auto const& need : tag.needs) {
          if (ordered_for(own, waited, need)) { continue; }
          if (!need.complete()) { return false; }
          any = true;
        }
        queried = any;
        return true;
      });
    if (b.ptr != nullptr && queried) { cross_stream_.fetch_add(1, std::memory_order_relaxed); }
    return b;
  }

  Platform& platform_;
  chunk_registry& chunks_;
  std::mutex mutex_;
  free_list<tag_type> list_;
  std::atomic<std::uint64_t> cross_stream_{};
};

}  // namespace rmm_fences::mr::detail::pool
