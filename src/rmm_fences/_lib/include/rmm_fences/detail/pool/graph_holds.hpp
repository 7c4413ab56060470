/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stream-ordered pool, part: graphs. Every launch of an executable graph instantiated from a
 * capture replays the frees of the capture, so a captured stream's frees stay the graph's until
 * the graph and every executable graph of it are destroyed. The pool retains a user object into
 * the capture; its callback runs on a thread of the driver, may not call CUDA, and only marks
 * the hold released and bumps a signal that the pool reads at its next allocation.
 */
#pragma once

#include <rmm_fences/detail/pool/blocks.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace rmm_fences::mr::detail::pool {

/// The graph a captured stream's frees belong to.
struct graph_hold {
  std::shared_ptr<std::atomic<std::uint64_t>> signal;  // outlives the pool if need be
  std::atomic<bool> released{};                        // the user object's callback ran
  std::atomic<bool> attached{};                        // the graph retains the user object
  block_list blocks;  // of its retired slots (guarded by `graph_holds`' mutex)

  /// True once the graph and its executables are gone (and their launches complete).
  [[nodiscard]] bool gone() const noexcept
  { return attached.load(std::memory_order_acquire) && released.load(std::memory_order_acquire); }
};

/// The holds of retired captured slots that still keep blocks, and the signal of their
/// callbacks. Its mutex guards the list and the holds' blocks; no other lock is taken under it.
class graph_holds {
 public:
  /**
   * @brief A new hold for the capture `stream` is in: `platform` retains a user object into
   * the capture's graph, whose callback marks the hold released. When it cannot, the hold is
   * never released: the blocks stay the graph's for the pool's life.
   */
  template <typename Platform>
  std::shared_ptr<graph_hold> hold(Platform& platform, typename Platform::stream_type stream)
  {
    auto hold    = std::make_shared<graph_hold>();
    hold->signal = signal_;
    auto* ctx    = new std::shared_ptr<graph_hold>(hold);
    // The callback runs exactly once, and deletes `ctx`, whatever the answer.
    if (platform.retain_until_graph_destroyed(stream, &on_graph_destroyed, ctx)) {
      hold->attached.store(true, std::memory_order_release);
      // Released before it was attached (the graph went at once): let the next call see it.
      if (hold->released.load(std::memory_order_acquire)) { signal_again(); }
    }
    return hold;
  }

  /// Keeps a retired captured slot's cached blocks for its graph; false, keeping nothing,
  /// when the graph is gone (the caller shares them).
  bool keep(std::shared_ptr<graph_hold> const& hold, block_list const& blocks) noexcept
  {
    if (blocks.empty()) { return true; }
    if (hold->gone()) { return false; }
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      if (hold->blocks.empty()) { holds_.push_back(hold); }
      hold->blocks.insert(hold->blocks.end(), blocks.begin(), blocks.end());
    } catch (...) {  // no host memory: the blocks stay lost to the pool (never handed out)
    }
    return true;
  }

  /// True when a graph went since the last call (one atomic exchange).
  bool take_signal() noexcept { return signal_->exchange(0, std::memory_order_acq_rel) != 0; }

  /// Makes the next `take_signal` true (a slot of a gone graph is left for a later call).
  void signal_again() noexcept { signal_->fetch_add(1, std::memory_order_acq_rel); }

  /// Takes the blocks of the holds whose graphs are gone, and forgets those holds.
  block_list take_gone()
  {
    block_list blocks;
    std::lock_guard<std::mutex> lock(mutex_);
    auto const gone =
      std::stable_partition(holds_.begin(), holds_.end(), [](auto const& h) { return !h->gone(); });
    for (auto it = gone; it != holds_.end(); ++it) {
      blocks.insert(blocks.end(), (*it)->blocks.begin(), (*it)->blocks.end());
      (*it)->blocks.clear();
    }
    holds_.erase(gone, holds_.end());
    return blocks;
  }

  /// Calls `f(block)` for every block kept; with `only_live`, only those of graphs not gone.
  template <typename F>
  void for_each_block(F&& f, bool only_live = false)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto const& hold : holds_) {
      if (only_live && hold->gone()) { continue; }
      for (auto const& b : hold->blocks) {
        f(b);
      }
    }
  }

  /// Bytes kept for graphs.
  [[nodiscard]] std::uint64_t bytes()
  {
    std::uint64_t total = 0;
    for_each_block([&](untagged_block const& b) { total += b.size; });
    return total;
  }

  /// Forgets every hold (callbacks that run later touch only their hold and the signal).
  void clear() noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    holds_.clear();
  }

 private:
  static void on_graph_destroyed(void* ctx) noexcept
  {
    auto* hold = static_cast<std::shared_ptr<graph_hold>*>(ctx);
    (*hold)->released.store(true, std::memory_order_release);
    (*hold)->signal->fetch_add(1, std::memory_order_acq_rel);
    delete hold;
  }

  std::mutex mutex_;
  std::vector<std::shared_ptr<graph_hold>> holds_;
  std::shared_ptr<std::atomic<std::uint64_t>> signal_{
    std::make_shared<std::atomic<std::uint64_t>>(0)};
};

}  // namespace rmm_fences::mr::detail::pool
