/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The stream-ordered pool's policy core on host memory with logged fences (CPU tests only).
 */
#pragma once

#include <rmm_fences/detail/stream_ordered_pool_core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

namespace rmm_fences::testing {

/// Thrown by `host_chunk_upstream` when its limit would be exceeded.
struct pool_host_out_of_memory : std::bad_alloc {
  [[nodiscard]] char const* what() const noexcept override { return "host upstream: limit"; }
};

/**
 * @brief What the pool did with fences, against a logical clock the harness advances once per
 * call: records (fence, stream, clock), stream waits (waiter, recording stream, clock of the
 * record waited on), device syncs (clock).
 */
struct pool_log {
  std::uint64_t clock{};
  std::vector<std::uint64_t> fence_stream;  // fence index -> stream it was last recorded on
  std::vector<std::uint64_t> fence_clock;   // fence index -> clock of its last record
  std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> waits;
  std::vector<std::uint64_t> syncs;
  std::set<std::uint64_t> capturing;
  std::uint64_t records{};
};

/// `stream_ordered_pool_core`'s platform over a `pool_log`; streams are their own ids.
class host_pool_platform {
 public:
  using stream_type   = std::uint64_t;
  using fence_type    = std::size_t;
  using out_of_memory = pool_host_out_of_memory;

  explicit host_pool_platform(std::shared_ptr<pool_log> log) : log_{std::move(log)} {}

  static std::uint64_t stream_id(stream_type s) noexcept { return s; }

  fence_type create_fence()
  {
    log_->fence_stream.push_back(0);
    log_->fence_clock.push_back(0);
    return log_->fence_stream.size() - 1;
  }
  void destroy_fence(fence_type) noexcept {}

  bool record(fence_type f, stream_type s) noexcept
  {
    log_->fence_stream[f] = s;
    log_->fence_clock[f]  = log_->clock;
    ++log_->records;
    return true;
  }

  bool stream_wait(stream_type waiter, fence_type f) noexcept
  {
    try {
      log_->waits.emplace_back(waiter, log_->fence_stream[f], log_->fence_clock[f]);
    } catch (...) {
      return false;
    }
    return true;
  }

  bool is_capturing(stream_type s) noexcept { return log_->capturing.count(s) > 0; }

  bool sync_device() noexcept
  {
    if (!log_->capturing.empty()) { return false; }
    log_->syncs.push_back(log_->clock);
    return true;
  }

  static stream_type default_stream() noexcept { return 0; }

  struct no_scope {};
  static no_scope relax() noexcept { return {}; }

  [[noreturn]] static void throw_out_of_memory(std::size_t, std::size_t)
  {
    throw pool_host_out_of_memory{};
  }

 private:
  std::shared_ptr<pool_log> log_;
};

/// Host chunks with a byte limit (the pool's upstream in the tests).
class host_chunk_upstream {
 public:
  explicit host_chunk_upstream(std::size_t limit) : limit_{limit} {}
  host_chunk_upstream(host_chunk_upstream&&) noexcept = default;
  ~host_chunk_upstream()
  {
    for (auto const& [p, n] : live_) {
      std::free(p);
    }
  }

  void* allocate(std::uint64_t, std::size_t bytes, std::size_t alignment)
  {
    if (used_ + bytes > limit_) { throw pool_host_out_of_memory{}; }
    void* p = std::aligned_alloc(alignment, bytes);
    if (p == nullptr) { throw std::bad_alloc{}; }
    used_ += bytes;
    live_[p] = bytes;
    return p;
  }

  void deallocate(std::uint64_t, void* p, std::size_t bytes, std::size_t) noexcept
  {
    used_ -= bytes;
    live_.erase(p);
    std::free(p);
  }

  [[nodiscard]] std::size_t used() const noexcept { return used_; }
  [[nodiscard]] std::size_t chunks() const noexcept { return live_.size(); }

 private:
  std::size_t limit_;
  std::size_t used_{};
  std::map<void*, std::size_t> live_;
};

/// The pool core driven by a test.
class host_pool {
  using core_type =
    rmm_fences::detail::stream_ordered_pool_core<host_pool_platform, host_chunk_upstream>;

 public:
  host_pool(std::size_t initial, std::optional<std::size_t> maximum, std::size_t upstream_limit)
    : log_{std::make_shared<pool_log>()},
      core_{host_chunk_upstream{upstream_limit}, initial, maximum, log_}
  {
  }
  ~host_pool() { core_.shutdown(true); }

  void* allocate(std::uint64_t stream, std::size_t bytes, std::size_t alignment)
  {
    ++log_->clock;
    return core_.allocate(stream, bytes, alignment);
  }
  void deallocate(std::uint64_t stream, void* p, std::size_t bytes)
  {
    ++log_->clock;
    core_.deallocate(stream, p, bytes, 256);
  }
  void retire(std::uint64_t stream)
  {
    ++log_->clock;
    core_.retire_stream(stream);
  }
  std::size_t release()
  {
    ++log_->clock;
    return core_.release();
  }

  core_type& core() noexcept { return core_; }
  pool_log& log() noexcept { return *log_; }

  /// Free blocks as (address, size, owner stream or 0 for shared).
  std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t>> free_blocks()
  {
    std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t>> out;
    core_.for_each_free_block([&](char* p, std::size_t n, std::uint64_t owner) {
      out.emplace_back(reinterpret_cast<std::uintptr_t>(p), n, owner);
    });
    return out;
  }

  std::vector<std::pair<std::uintptr_t, std::size_t>> chunks()
  {
    std::vector<std::pair<std::uintptr_t, std::size_t>> out;
    for (auto const& [p, n] : core_.chunks()) {
      out.emplace_back(reinterpret_cast<std::uintptr_t>(p), n);
    }
    return out;
  }

 private:
  std::shared_ptr<pool_log> log_;
  core_type core_;
};

}  // namespace rmm_fences::testing
