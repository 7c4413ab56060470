/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: each thread's last slot lookups, the hot path's way to its stream's
 * slot without the slot table's mutex. An entry may be stale: the caller checks the slot's
 * incarnation under the slot's mutex and looks up again when it changed.
 */
#pragma once

#include <rmm_fences/detail/pool/stream_slot.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>

namespace rmm_fences::mr::detail::pool {

/// A thread-local cache of (pool, stream identity) -> slot reference, eight entries a thread.
template <typename Platform>
class thread_slot_cache {
 public:
  using ref_type = slot_ref<Platform>;

  /// This thread's cached reference to the slot of `id`, if any.
  [[nodiscard, gnu::always_inline]] std::optional<ref_type> find(std::uint64_t id) const noexcept
  {
    for (auto const& e : tls().entries) {
      if (e.owner == key_ && e.id == id) { return ref_type{e.slot, e.incarnation}; }
    }
    return std::nullopt;
  }

  /// Caches `ref` as this thread's reference to the slot of `id`.
  void remember(std::uint64_t id, ref_type ref) const noexcept
  {
    auto& cache  = tls();
    entry* found = nullptr;
    for (auto& e : cache.entries) {
      if (e.owner == key_ && e.id == id) { found = &e; }
    }
    if (found == nullptr) { found = &cache.entries[cache.next_victim++ % cache.entries.size()]; }
    *found = {key_, id, ref.slot, ref.incarnation};
  }

 private:
  struct entry {
    std::uint64_t owner;
    std::uint64_t id;
    stream_slot<Platform>* slot;
    std::uint64_t incarnation;
  };
  struct entries_of_thread {
    std::array<entry, 8> entries;
    unsigned next_victim;
  };

  /// One thread_local object: one TLS lookup per call. (The initial-exec model would save it,
  /// but a module loaded after rmm and CuPy finds no static TLS left: the import fails.)
  static entries_of_thread& tls() noexcept
  {
    static thread_local entries_of_thread cache{};
    return cache;
  }

  static std::uint64_t next_key() noexcept
  {
    static std::atomic<std::uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }

  /// Names this cache's pool in threads' entries; never reused, so entries of a destroyed pool
  /// never match.
  std::uint64_t const key_{next_key()};
};

}  // namespace rmm_fences::mr::detail::pool
