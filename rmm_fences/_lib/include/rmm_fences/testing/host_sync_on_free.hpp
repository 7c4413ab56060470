/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The SyncOnFree policy core on host memory with fences signalled by hand (CPU tests only).
 */
#pragma once

#include <rmm_fences/detail/sync_on_free_core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace rmm_fences::testing {

/// Thrown by `host_upstream` when its byte limit would be exceeded.
struct host_out_of_memory : std::bad_alloc {
  [[nodiscard]] char const* what() const noexcept override { return "host upstream: limit"; }
};

/**
 * @brief Manual fences that follow stream order.
 *
 * Fence i is recorded on a stream; `signal(i)` also signals every earlier fence of that stream,
 * as a GPU completes a stream's work in order. `wait(i)` stands for a host that blocks until i
 * completes: it signals i and counts a forced wait.
 */
struct fence_board {
  struct fence {
    std::uintptr_t stream{};
    bool recorded{};
    bool signalled{};
  };
  std::vector<fence> fences;
  std::set<std::uintptr_t> capturing;
  std::uint64_t forced_waits{};
  bool fail_next_record{};

  void signal(std::size_t id)
  {
    auto const stream = fences.at(id).stream;
    for (std::size_t i = 0; i <= id; ++i) {
      if (fences[i].recorded && fences[i].stream == stream) { fences[i].signalled = true; }
    }
  }

  void signal_stream(std::uintptr_t stream)
  {
    for (auto& f : fences) {
      if (f.recorded && f.stream == stream) { f.signalled = true; }
    }
  }

  void signal_all()
  {
    for (auto& f : fences) {
      if (f.recorded) { f.signalled = true; }
    }
  }
};

/// `sync_on_free_core`'s platform over a `fence_board`.
class host_platform {
 public:
  using fence_type    = std::size_t;
  using stream_type   = std::uintptr_t;
  using out_of_memory = host_out_of_memory;

  explicit host_platform(std::shared_ptr<fence_board> board) : board_{std::move(board)} {}

  [[nodiscard]] bool ready(fence_type f) const { return board_->fences.at(f).signalled; }

  void wait(fence_type f)
  {
    if (!board_->fences.at(f).signalled) { ++board_->forced_waits; }
    board_->signal(f);
  }

  fence_type acquire_fence()
  {
    board_->fences.push_back({});
    return board_->fences.size() - 1;
  }

  void release_fence(fence_type) noexcept {}

  bool record(fence_type f, stream_type stream) noexcept
  {
    if (board_->fail_next_record) {
      board_->fail_next_record = false;
      return false;
    }
    board_->fences[f].stream   = stream;
    board_->fences[f].recorded = true;
    return true;
  }

  bool is_capturing(stream_type stream) noexcept { return board_->capturing.count(stream) > 0; }

  void sync_device() noexcept { board_->signal_all(); }

  bool try_sync_device() noexcept
  {
    if (!board_->capturing.empty()) { return false; }
    board_->signal_all();
    return true;
  }

  void sync_stream(stream_type stream) noexcept { board_->signal_stream(stream); }

  static std::uintptr_t key(stream_type stream) noexcept { return stream; }
  static stream_type default_stream() noexcept { return 0; }

 private:
  std::shared_ptr<fence_board> board_;
};

/**
 * @brief Host memory with a byte limit that logs every block it gets back.
 *
 * Each release records whether the fence under which the block was freed had signalled
 * (`fence_of` is filled by the harness when the block is freed).
 */
class host_upstream {
 public:
  struct release_record {
    std::uintptr_t ptr;
    std::size_t bytes;
    std::uintptr_t stream;
    bool fence_signalled;
  };

  host_upstream(std::size_t limit, std::shared_ptr<fence_board> board)
    : limit_{limit}, board_{std::move(board)}
  {
  }

  void* allocate(std::uintptr_t, std::size_t bytes, std::size_t alignment)
  {
    if (used_ + bytes > limit_) { throw host_out_of_memory{}; }
    auto const size = ((bytes == 0 ? 1 : bytes) + alignment - 1) / alignment * alignment;
    void* ptr       = std::aligned_alloc(alignment, size);
    if (ptr == nullptr) { throw std::bad_alloc{}; }
    used_ += bytes;
    live_[reinterpret_cast<std::uintptr_t>(ptr)] = bytes;
    return ptr;
  }

  void deallocate(std::uintptr_t stream, void* ptr, std::size_t bytes, std::size_t) noexcept
  {
    auto const p  = reinterpret_cast<std::uintptr_t>(ptr);
    bool signalled = true;
    if (auto it = fence_of.find(p); it != fence_of.end()) {
      signalled = board_->fences.at(it->second).signalled;
      fence_of.erase(it);
    }
    releases.push_back({p, bytes, stream, signalled});
    live_.erase(p);
    used_ -= bytes;
    std::free(ptr);
  }

  ~host_upstream()
  {
    for (auto const& [p, bytes] : live_) {
      std::free(reinterpret_cast<void*>(p));
    }
  }

  host_upstream(host_upstream&& other) noexcept = default;

  [[nodiscard]] std::size_t used() const noexcept { return used_; }

  std::map<std::uintptr_t, std::size_t> fence_of;  ///< freed block -> fence it waits for
  std::vector<release_record> releases;

 private:
  std::size_t limit_;
  std::size_t used_{};
  std::map<std::uintptr_t, std::size_t> live_;
  std::shared_ptr<fence_board> board_;
};

/**
 * @brief The SyncOnFree core driven by a test: host memory, hand-signalled fences.
 */
class host_sync_on_free {
  using core_type = rmm_fences::detail::sync_on_free_core<host_platform, host_upstream>;

 public:
  host_sync_on_free(rmm_fences::mr::sync_mode mode,
                    std::optional<std::size_t> max_pending_bytes,
                    std::size_t upstream_limit)
    : board_{std::make_shared<fence_board>()},
      core_{host_upstream{upstream_limit, board_}, mode, max_pending_bytes, board_}
  {
  }

  void* allocate(std::uintptr_t stream, std::size_t bytes, std::size_t alignment)
  {
    return core_.allocate(stream, bytes, alignment);
  }

  /// Frees `ptr`; returns the id of the fence it waits for, or -1 if it went upstream at once.
  std::int64_t deallocate(std::uintptr_t stream, void* ptr, std::size_t bytes, std::size_t align)
  {
    auto const next_fence = board_->fences.size();
    auto const will_fence = core_.mode() == rmm_fences::mr::sync_mode::deferred &&
                            board_->capturing.count(stream) == 0 && !board_->fail_next_record;
    if (will_fence) { core_.upstream().fence_of[reinterpret_cast<std::uintptr_t>(ptr)] = next_fence; }
    core_.deallocate(stream, ptr, bytes, align);
    return will_fence ? static_cast<std::int64_t>(next_fence) : -1;
  }

  std::size_t flush() { return core_.drain(/*include_parked=*/true, 0); }

  core_type& core() noexcept { return core_; }
  fence_board& board() noexcept { return *board_; }
  host_upstream& upstream() noexcept { return core_.upstream(); }

 private:
  std::shared_ptr<fence_board> board_;
  core_type core_;
};

}  // namespace rmm_fences::testing
