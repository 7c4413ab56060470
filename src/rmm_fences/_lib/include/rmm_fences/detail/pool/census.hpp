/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: the census, the read-only listing of every block of the pool's
 * chunks with the place that holds it (for tests and tools; no CUDA call). A friend of
 * `stream_ordered_pool_core`, it reads the core's parts and changes nothing.
 */
#pragma once

#include <rmm_fences/detail/free_list.hpp>
#include <rmm_fences/detail/pool/blocks.hpp>
#include <rmm_fences/detail/spin_mutex.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace rmm_fences::mr::detail::pool {

/// Where a block of the pool's chunks is, as a census sees it.
enum class block_place : int {
  live,            ///< handed out (its size rounded to the granule)
  cached,          ///< in a stream's cache, freed after its last fence record: only that
                   ///< stream reuses it until the fencing rule shares it
  cached_covered,  ///< in a stream's cache, covered by a record: shared once another stream
                   ///< runs short (or the stream is retired)
  shared,          ///< in the shared list, no fence: any stream takes it
  shared_fenced,   ///< in the shared list behind fences: another stream takes it after a
                   ///< stream wait (a captured one only once a query finds them complete)
  graph,           ///< a captured stream's cache, or kept for a graph that may replay it
  orphan,          ///< left by a slot retired without a record: only a device sync frees it
};

/// The number of `block_place` values.
inline constexpr int block_places = 7;

/**
 * @brief One block of a census. `owner`: the stream identity whose slot holds it (live, cached,
 * a captured stream's cache); for a shared block behind fences, the identity whose fence
 * guards it when every fence it needs is one slot's; else the core's `shared_owner` for shared
 * blocks, `orphan_owner` for orphans and retired slots' live blocks, `graph_owner` for
 * graphs' kept blocks. `fences`: the fence records a shared block's tag names.
 */
struct census_block {
  char* ptr{};
  std::size_t size{};
  block_place place{};
  std::uint64_t owner{};
  std::size_t fences{};
};

/// A live block in a census: the span its request was rounded to.
inline census_block live_census_block(std::uintptr_t key,
                                      std::size_t bytes,
                                      std::uint64_t owner) noexcept
{ return {reinterpret_cast<char*>(key), round_to_granule(bytes), block_place::live, owner, 0}; }

/// A census's blocks of one slot (its lock held): its cache (a captured stream's is its
/// graph's) and its live blocks.
template <typename Slot, typename F>
void census_slot_locked(Slot& slot, F& f)
{
  auto const place = slot.graph          ? block_place::graph
                     : slot.covered != 0 ? block_place::cached_covered
                                         : block_place::cached;
  slot.for_each_cached_locked(
    [&](char* p, std::size_t n) { f(census_block{p, n, place, slot.id, 0}); });
  slot.live.for_each(
    [&](std::uintptr_t key, std::size_t bytes) { f(live_census_block(key, bytes, slot.id)); });
}

/// The stream whose fence guards a shared block: the one slot whose fences `tag` names, else
/// `nobody` (no fence, several slots', or a fence no slot holds any more).
template <typename Tag>
std::uint64_t fenced_by(Tag const& tag,
                        std::unordered_map<void const*, std::uint64_t> const& owners,
                        std::uint64_t nobody)
{
  std::optional<std::uint64_t> owner;
  for (auto const& need : tag.needs) {
    auto const it = owners.find(need.cell.get());
    if (it == owners.end() || (owner && *owner != it->second)) { return nobody; }
    owner = it->second;
  }
  return owner.value_or(nobody);
}

/**
 * @brief The census of `core` (a `stream_ordered_pool_core`): calls f(census_block) for every
 * block of the pool's chunks, free and live, with the place that holds it.
 *
 * Read-only: takes the parts' locks one at a time and changes nothing (not even the balances
 * `stats()` settles); `f` runs under them and may not call the pool. The blocks tile the
 * chunks exactly while no other call is in flight (a block a call took from a list is in none
 * until it is handed out).
 */
template <typename Core, typename F>
void census(Core& core, F&& f)
{
  std::unordered_map<void const*, std::uint64_t> fence_owner;  // a slot's fence -> its stream
  core.slots_.for_each([&](typename Core::slot_type& slot) {
    std::lock_guard<spin_mutex> lock(slot.mutex);
    census_slot_locked(slot, f);
    fence_owner.emplace(slot.cell.get(), slot.id);
  });
  core.graphs_.for_each_block([&](untagged_block const& b) {
    f(census_block{b.ptr, b.size, block_place::graph, Core::graph_owner, 0});
  });
  core.shared_.for_each([&](char* p, std::size_t n, typename Core::tag_type& tag) {
    auto const place = tag.needs.empty() ? block_place::shared : block_place::shared_fenced;
    f(census_block{p, n, place, fenced_by(tag, fence_owner, Core::shared_owner), tag.needs.size()});
  });
  core.orphans_.for_each([&](char* p, std::size_t n) {
    f(census_block{p, n, block_place::orphan, Core::orphan_owner, 0});
  });
  core.orphans_.for_each_live([&](std::uintptr_t key, std::size_t bytes) {
    f(live_census_block(key, bytes, Core::orphan_owner));
  });
}

}  // namespace rmm_fences::mr::detail::pool
