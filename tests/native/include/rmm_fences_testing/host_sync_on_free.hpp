/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The SyncOnFree policy core on host memory with fences signalled by hand (CPU tests only).
 *
 * The host platform models what the core must survive on a GPU: streams with an identity
 * distinct from their handle (a destroyed stream's handle reused by a new stream; one
 * per-thread default stream handle for every thread), work that completes in stream order,
 * stream capture, and faults: a fence query, fence wait, device or stream synchronization,
 * fence record or identity query that fails, and "another thread captures in the global mode",
 * which makes every query, wait and synchronization fail. Fences can be recycled as CUDA's
 * pooled events are (`recycle_fences`): a fence released by the core is handed out again and
 * recorded elsewhere, and any test or wait of a released fence is counted. Every call is
 * thread-safe, so real threads can drive the core.
 */
#pragma once

#include <rmm_fences/detail/sync_on_free_core.hpp>
#include <rmm_fences_testing/heap_count.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

namespace rmm_fences::testing {

/// Thrown by `host_upstream` when its byte limit would be exceeded.
struct host_out_of_memory : std::bad_alloc {
  [[nodiscard]] char const* what() const noexcept override { return "host upstream: limit"; }
};

/// The handle of the per-thread default stream: one value, a different stream per thread.
inline constexpr std::uintptr_t per_thread_handle = 2;

/// The simulated thread of the caller (selects its per-thread default stream).
inline thread_local int host_thread = 0;

/// The calls the core made on its platform and its upstream (attempts, whatever their
/// outcome): the call-count profile of `host_sync_on_free::run_pairs`, with the heap
/// allocations and frees the core made itself (counted by `run_pairs` only).
struct platform_calls {
  std::uint64_t is_capturing{};
  std::uint64_t key{};
  std::uint64_t stream_id{};
  std::uint64_t acquire_fence{};
  std::uint64_t record{};
  std::uint64_t ready{};           ///< fence queries
  std::uint64_t ready_complete{};  ///< queries that found the fence complete
  std::uint64_t release_fence{};
  std::uint64_t host_wait{};
  std::uint64_t sync_stream{};
  std::uint64_t sync_device{};
  std::uint64_t upstream_allocate{};
  std::uint64_t upstream_deallocate{};
  std::uint64_t heap_allocations{};  ///< operator new calls of the core (not of this harness)
  std::uint64_t heap_frees{};        ///< operator delete calls of the core, non-null pointers
  std::uint64_t heap_failures{};     ///< of `heap_allocations`, those made to fail
};

/**
 * @brief Streams, their work and manual fences that follow stream order.
 *
 * Each stream (identity: an id never reused) has `enqueued` work items and `completed` ones;
 * a fence recorded on it is one more item and is signalled when `completed` reaches it.
 * `signal(i)` completes fence i and everything before it on its stream; `wait(i)` stands for a
 * host that blocks until i completes (it counts a forced wait when i had not completed).
 */
struct fence_board {
  struct fence {
    std::uintptr_t stream{};  ///< the handle it was recorded on
    std::uint64_t stream_id{};
    std::uint64_t position{};
    bool recorded{};
    bool signalled{};  ///< filled by `fence_at`
    bool released{};   ///< given back by the core (in the free list when recycling)
  };
  struct stream_state {
    std::uint64_t enqueued{};
    std::uint64_t completed{};
    bool capturing{};
  };

  mutable std::recursive_mutex m;
  std::vector<fence> fences;
  std::map<std::uint64_t, stream_state> streams;  // by identity
  std::map<std::uintptr_t, std::uint64_t> handles;
  std::map<int, std::uint64_t> per_thread;
  std::uint64_t next_id{1};

  // Faults: the next N calls of each kind fail; `global_capture` fails every query, wait and
  // synchronization (another thread captures in the global mode).
  int fail_query{};
  int fail_wait{};
  int fail_sync_device{};
  int fail_sync_stream{};
  int fail_record{};
  int fail_stream_id{};
  bool global_capture{};

  /// Released fences are handed out again by `acquire_fence` (as CUDA's event pool does).
  bool recycle_fences{};
  std::vector<std::size_t> free_fences;

  // What happened.
  std::uint64_t forced_waits{};
  std::uint64_t waits_ok{};
  std::uint64_t syncs_ok{};
  std::uint64_t failed_calls{};
  std::uint64_t invalidated_captures{};  ///< identity queries made on a capturing stream
  std::uint64_t identity_queries{};
  std::uint64_t records{};             ///< fences recorded (successful records)
  std::uint64_t released_fence_use{};  ///< tests, waits or releases of a released fence
  platform_calls calls;                ///< platform and upstream calls (since `run_pairs`)

  /// A fence is complete as soon as it is recorded (its stream has no work queued): the model
  /// of a device that processes a record before the next host call can query it.
  bool complete_at_record{};

  /// Runs once right after the next successful device synchronization (another thread's call
  /// that lands after the sync covered everything).
  std::function<void()> after_sync_device;

  std::uint64_t resolve(std::uintptr_t handle)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    std::uint64_t* id = nullptr;
    if (handle == per_thread_handle) {
      id = &per_thread[host_thread];
    } else {
      id = &handles[handle];
    }
    if (*id == 0) {
      *id = next_id++;
      streams[*id];
    }
    return *id;
  }

  stream_state& state(std::uintptr_t handle) { return streams[resolve(handle)]; }

  /// Work on `handle` that uses the blocks freed after it: returns (stream id, position).
  std::pair<std::uint64_t, std::uint64_t> launch(std::uintptr_t handle)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    auto const id = resolve(handle);
    auto& s       = streams[id];
    if (!s.capturing) { ++s.enqueued; }  // captured work runs only when the graph is launched
    return {id, s.enqueued};
  }

  [[nodiscard]] bool done(std::uint64_t id, std::uint64_t position) const
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    auto it = streams.find(id);
    return it != streams.end() && it->second.completed >= position;
  }

  fence fence_at(std::size_t i) const
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    auto f      = fences.at(i);
    f.signalled = f.recorded && done(f.stream_id, f.position);
    return f;
  }

  void signal(std::size_t i)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    auto const& f = fences.at(i);
    if (!f.recorded) { return; }
    auto& s     = streams[f.stream_id];
    s.completed = std::max(s.completed, f.position);
  }

  void signal_stream(std::uintptr_t handle)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    auto& s     = state(handle);
    s.completed = s.enqueued;
  }

  void signal_all()
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    for (auto& [id, s] : streams) {
      s.completed = s.enqueued;
    }
  }

  void begin_capture(std::uintptr_t handle)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    state(handle).capturing = true;
  }

  void end_capture(std::uintptr_t handle)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    state(handle).capturing = false;
  }

  [[nodiscard]] bool is_capturing(std::uintptr_t handle)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    return state(handle).capturing;
  }

  [[nodiscard]] bool any_capturing() const
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    return std::any_of(
      streams.begin(), streams.end(), [](auto const& kv) { return kv.second.capturing; });
  }

  /// The stream behind `handle` is destroyed and a new one gets the same handle.
  void reuse_handle(std::uintptr_t handle)
  {
    std::lock_guard<std::recursive_mutex> lock(m);
    auto& id = handle == per_thread_handle ? per_thread[host_thread] : handles[handle];
    id       = next_id++;
    streams[id];
  }

  /// Consumes one injected failure of `counter` (or the global capture); true: fail.
  bool fails(int& counter, bool by_global_capture = true)
  {
    if ((by_global_capture && global_capture) || counter > 0) {
      if (counter > 0) { --counter; }
      ++failed_calls;
      return true;
    }
    return false;
  }
};

/// `sync_on_free_core`'s platform over a `fence_board`.
class host_platform {
 public:
  using fence_type    = std::size_t;
  using stream_type   = std::uintptr_t;
  using out_of_memory = host_out_of_memory;

  explicit host_platform(std::shared_ptr<fence_board> board) : board_{std::move(board)} {}

  /// True only when `f` is known complete; a failed query (injected) is not.
  [[nodiscard]] bool ready(fence_type f) const
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.ready;
    note_use(f);
    if (board_->fails(board_->fail_query)) { return false; }
    bool const complete = board_->fence_at(f).signalled;
    board_->calls.ready_complete += complete ? 1 : 0;
    return complete;
  }

  bool host_wait(fence_type f)
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.host_wait;
    note_use(f);
    if (board_->fails(board_->fail_wait)) { return false; }
    if (!board_->fence_at(f).signalled) { ++board_->forced_waits; }
    board_->signal(f);
    ++board_->waits_ok;
    return true;
  }

  fence_type acquire_fence()
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.acquire_fence;
    if (board_->recycle_fences && !board_->free_fences.empty()) {
      auto const f = board_->free_fences.back();
      board_->free_fences.pop_back();
      board_->fences.at(f).released = false;
      return f;
    }
    board_->fences.push_back({});
    return board_->fences.size() - 1;
  }

  void release_fence(fence_type f) noexcept
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.release_fence;
    note_use(f);
    board_->fences.at(f).released = true;
    if (board_->recycle_fences) { board_->free_fences.push_back(f); }
  }

  bool record(fence_type f, stream_type stream) noexcept
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.record;
    // Records run in relaxed capture mode: another thread's global capture does not fail them.
    if (board_->fails(board_->fail_record, /*by_global_capture=*/false)) { return false; }
    auto const id = board_->resolve(stream);
    auto& s       = board_->streams[id];
    ++s.enqueued;
    note_use(f);
    auto& fence     = board_->fences.at(f);
    fence.stream    = stream;
    fence.stream_id = id;
    fence.position  = s.enqueued;
    fence.recorded  = true;
    ++board_->records;
    if (board_->complete_at_record) { s.completed = s.enqueued; }
    return true;
  }

  bool is_capturing(stream_type stream) noexcept
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.is_capturing;
    return board_->is_capturing(stream);
  }

  bool sync_device() noexcept
  {
    harness_scope const harness;  // not the core's heap use
    std::function<void()> after;
    {
      std::lock_guard<std::recursive_mutex> lock(board_->m);
      ++board_->calls.sync_device;
      // A capture under way makes a device synchronization fail.
      if (board_->any_capturing()) {
        ++board_->failed_calls;
        return false;
      }
      if (board_->fails(board_->fail_sync_device)) { return false; }
      board_->signal_all();
      ++board_->syncs_ok;
      after.swap(board_->after_sync_device);
    }
    if (after) { after(); }
    return true;
  }

  bool sync_stream(stream_type stream) noexcept
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.sync_stream;
    if (board_->fails(board_->fail_sync_stream)) { return false; }
    if (board_->is_capturing(stream)) {
      ++board_->failed_calls;
      return false;
    }
    board_->signal_stream(stream);
    ++board_->syncs_ok;
    return true;
  }

  /// The handle, except the per-thread default stream, qualified by the calling thread.
  std::uintptr_t key(stream_type stream) noexcept
  {
    harness_scope const harness;  // not the core's heap use
    {
      std::lock_guard<std::recursive_mutex> lock(board_->m);
      ++board_->calls.key;
    }
    if (stream == per_thread_handle) {
      return (std::uintptr_t{1} << 62U) | static_cast<std::uintptr_t>(host_thread);
    }
    return stream;
  }

  std::uint64_t stream_id(stream_type stream) noexcept
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++board_->calls.stream_id;
    ++board_->identity_queries;
    if (board_->is_capturing(stream)) { ++board_->invalidated_captures; }
    if (board_->fails(board_->fail_stream_id, /*by_global_capture=*/false)) { return 0; }
    return board_->resolve(stream);
  }

  static stream_type default_stream() noexcept { return 0; }

 private:
  /// Counts a call on a fence the core had given back (caller holds the board's lock).
  void note_use(fence_type f) const
  {
    if (board_->fences.at(f).released) { ++board_->released_fence_use; }
  }

  std::shared_ptr<fence_board> board_;
};

/**
 * @brief Host memory with a byte limit that logs every block it gets back.
 *
 * Each release records whether the work that used the block had completed (`last_use` is
 * filled by the harness when the block is freed: the stream identity and work position).
 */
class host_upstream {
 public:
  struct release_record {
    std::uintptr_t ptr;
    std::size_t bytes;
    std::uintptr_t stream;
    bool fence_signalled;  ///< the work before the free had completed
  };

  host_upstream(std::size_t limit, std::shared_ptr<fence_board> board)
    : limit_{limit}, board_{std::move(board)}
  {
  }

  void* allocate(std::uintptr_t, std::size_t bytes, std::size_t alignment)
  {
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::mutex> lock(*mutex_);
    count_call(&platform_calls::upstream_allocate);
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
    harness_scope const harness;  // not the core's heap use
    std::lock_guard<std::mutex> lock(*mutex_);
    count_call(&platform_calls::upstream_deallocate);
    auto const p   = reinterpret_cast<std::uintptr_t>(ptr);
    bool signalled = true;
    if (auto it = last_use.find(p); it != last_use.end()) {
      signalled = board_->done(it->second.first, it->second.second);
      last_use.erase(it);
    }
    auto live = live_.find(p);
    if (ptr != nullptr && (live == live_.end() || live->second != bytes)) { ++bad_frees; }
    releases.push_back({p, bytes, stream, signalled});
    if (live != live_.end()) {
      used_ -= live->second;
      live_.erase(live);
      std::free(ptr);
    }
  }

  /// Notes the work that used `ptr` before its free (kept if already noted: a double free).
  bool note_last_use(std::uintptr_t p, std::pair<std::uint64_t, std::uint64_t> use)
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    return last_use.emplace(p, use).second;
  }

  /// Takes the last use noted for `p` (freed, not released): the block is handed out again.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> take_last_use(std::uintptr_t p)
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    auto it = last_use.find(p);
    if (it == last_use.end()) { return std::nullopt; }
    auto const use = it->second;
    last_use.erase(it);
    return use;
  }

  /// True while `p` was freed (noted) and not released yet.
  [[nodiscard]] bool noted(std::uintptr_t p) const
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    return last_use.count(p) > 0;
  }

  /// The noted (pending) addresses.
  [[nodiscard]] std::vector<std::uintptr_t> noted_all() const
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    std::vector<std::uintptr_t> out;
    out.reserve(last_use.size());
    for (auto const& [p, use] : last_use) {
      out.push_back(p);
    }
    return out;
  }

  void forget_last_use(std::uintptr_t p)
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    last_use.erase(p);
  }

  ~host_upstream()
  {
    for (auto const& [p, bytes] : live_) {
      std::free(reinterpret_cast<void*>(p));
    }
  }

  host_upstream(host_upstream&& other) noexcept
    : last_use{std::move(other.last_use)},
      releases{std::move(other.releases)},
      bad_frees{other.bad_frees},
      mutex_{std::move(other.mutex_)},
      limit_{other.limit_},
      used_{other.used_},
      live_{std::move(other.live_)},
      board_{std::move(other.board_)}
  { other.live_.clear(); }

  [[nodiscard]] std::size_t used() const
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    return used_;
  }

  std::vector<release_record> releases_copy() const
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    return releases;
  }

  std::map<std::uintptr_t, std::pair<std::uint64_t, std::uint64_t>> last_use;
  std::vector<release_record> releases;
  std::uint64_t bad_frees{};  ///< frees of blocks it did not hand out (or of another size)

 private:
  void count_call(std::uint64_t platform_calls::* counter) const
  {
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    ++(board_->calls.*counter);
  }

  std::unique_ptr<std::mutex> mutex_{std::make_unique<std::mutex>()};
  std::size_t limit_;
  std::size_t used_{};
  std::map<std::uintptr_t, std::size_t> live_;
  std::shared_ptr<fence_board> board_;
};

/// Outcome of `host_sync_on_free::run_threads`.
struct thread_run_result {
  std::uint64_t frees{};
  std::uint64_t unsafe_releases{};  ///< blocks that reached the upstream before their work ended
  std::uint64_t reuses{};           ///< pending blocks handed out again without the upstream
  std::uint64_t unsafe_reuses{};    ///< of those, on another stream before their work ended
  std::uint64_t upstream_bad_frees{};
  std::uint64_t lost{};  ///< bytes neither live, pending nor returned at the end
  std::uint64_t syncs_counted{};
  std::uint64_t syncs_succeeded{};
  std::uint64_t invalidated_captures{};
  std::uint64_t pending_after_flush{};
  std::uint64_t released_fence_use{};  ///< tests, waits or records of a fence given back
};

/**
 * @brief The SyncOnFree core driven by a test: host memory, hand-signalled fences.
 */
class host_sync_on_free {
  using core_type = rmm_fences::mr::detail::sync_on_free_core<host_platform, host_upstream>;

 public:
  host_sync_on_free(rmm_fences::mr::sync_mode mode,
                    std::optional<std::size_t> max_pending_bytes,
                    std::size_t upstream_limit,
                    std::size_t max_batch_frees,
                    std::optional<std::size_t> max_batch_bytes,
                    bool reuse_on_stream = true)
    : board_{std::make_shared<fence_board>()},
      core_{host_upstream{upstream_limit, board_},
            mode,
            max_pending_bytes,
            rmm_fences::mr::detail::batch_limits{max_batch_frees, max_batch_bytes},
            reuse_on_stream,
            board_}
  {
  }

  /// Allocates, and checks a pending block handed out again (`check_reuse`).
  void* allocate(std::uintptr_t stream, std::size_t bytes, std::size_t alignment)
  {
    void* p = core_.allocate(stream, bytes, alignment);
    check_reuse(stream, p);
    return p;
  }

  /**
   * @brief The oracle of a block handed out again while pending (freed, its last use noted,
   * not released upstream): safe only for the very stream that used it last (same identity,
   * not capturing: its new work queues after the old) or once that work is done.
   */
  void check_reuse(std::uintptr_t stream, void* p)
  {
    auto const use = core_.upstream().take_last_use(reinterpret_cast<std::uintptr_t>(p));
    if (!use.has_value()) { return; }
    reuses_.fetch_add(1);
    bool const same = board_->resolve(stream) == use->first && !board_->is_capturing(stream);
    if (!same && !board_->done(use->first, use->second)) { unsafe_reuses_.fetch_add(1); }
  }

  [[nodiscard]] std::uint64_t reuses() const noexcept { return reuses_.load(); }
  [[nodiscard]] std::uint64_t unsafe_reuses() const noexcept { return unsafe_reuses_.load(); }

  /**
   * @brief Launches work that uses `ptr` on `stream`, then frees it (checked).
   *
   * `fence_out`: the fence the block now waits for, or -1 (released, parked, or in a batch
   * whose fence is not recorded yet).
   */
  rmm_fences::mr::free_result deallocate(std::uintptr_t stream,
                                         void* ptr,
                                         std::size_t bytes,
                                         std::size_t align,
                                         std::int64_t* fence_out,
                                         bool checked = true)
  {
    auto const p     = reinterpret_cast<std::uintptr_t>(ptr);
    auto const noted = core_.upstream().note_last_use(p, board_->launch(stream));
    rmm_fences::mr::free_result r{};
    if (checked) {
      r = core_.deallocate_checked(stream, ptr, bytes, align);
    } else {
      core_.deallocate(stream, ptr, bytes, align);
      r.check = rmm_fences::mr::free_check::ok;
    }
    bool const rejected = r.check == rmm_fences::mr::free_check::unknown ||
                          r.check == rmm_fences::mr::free_check::pending ||
                          r.check == rmm_fences::mr::free_check::size_mismatch;
    if (rejected && noted) { core_.upstream().forget_last_use(p); }
    *fence_out = fence_of(ptr);
    return r;
  }

  /// The fence the pending block at `ptr` waits for, or -1 (none yet, or not pending).
  std::int64_t fence_of(void* ptr) const
  {
    auto const f = core_.fence_of(ptr);
    return f.has_value() ? static_cast<std::int64_t>(*f) : -1;
  }

  /// The noexcept `deallocate` (reports a bad free on stderr), without the harness's bookkeeping.
  void deallocate_unchecked(std::uintptr_t stream, void* ptr, std::size_t bytes, std::size_t align)
  { core_.deallocate(stream, ptr, bytes, align); }

  [[nodiscard]] bool is_pending(void* ptr)
  { return core_.upstream().noted(reinterpret_cast<std::uintptr_t>(ptr)); }

  std::set<void*> pending_set()
  {
    // Rebuilt from the upstream log (under its lock): pending = freed (noted), not released.
    std::set<void*> out;
    for (auto p : core_.upstream().noted_all()) {
      out.insert(reinterpret_cast<void*>(p));
    }
    return out;
  }

  std::size_t flush() { return core_.drain(/*include_parked=*/true, 0); }

  /// After the next successful device sync, another thread frees `ptr` on `stream` in capture
  /// (work launched first): a block that sync does not cover.
  void free_in_capture_after_next_device_sync(std::uintptr_t stream, void* ptr, std::size_t bytes)
  {
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    board_->after_sync_device = [this, stream, ptr, bytes] {
      std::int64_t fence = -1;
      core_.upstream().note_last_use(reinterpret_cast<std::uintptr_t>(ptr), board_->launch(stream));
      board_->begin_capture(stream);
      (void)core_.deallocate_checked(stream, ptr, bytes, 256);
      board_->end_capture(stream);
      (void)fence;
    };
  }

  /**
   * @brief Real threads racing: `workers` threads allocate, launch work, free (on their own
   * stream or their per-thread default stream), poll and flush; one thread signals streams,
   * toggles a global capture elsewhere and injects query/wait failures.
   */
  thread_run_result run_threads(int workers, int iterations, std::uint64_t random_state)
  {
    std::atomic<bool> stop{false};
    std::atomic<bool> chaos_started{false};
    std::atomic<std::uint64_t> frees{0};
    {
      // The first calls of each kind fail whatever the scheduling: every mode meets faults.
      std::lock_guard<std::recursive_mutex> lock(board_->m);
      for (int* fault : {&board_->fail_wait,
                         &board_->fail_sync_device,
                         &board_->fail_sync_stream,
                         &board_->fail_record}) {
        *fault = 2;
      }
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < workers; ++t) {
      threads.emplace_back([&, t] {
        // The workers start once the chaos runs: on a machine with few cores they could
        // otherwise finish before it injected anything.
        while (!chaos_started.load()) {
          std::this_thread::yield();
        }
        host_thread = 100 + t;
        std::mt19937_64 rng(random_state * 7919 + t);
        std::uintptr_t const own = 1000 + t;
        std::vector<std::tuple<void*, std::size_t, std::uintptr_t>> live;
        for (int i = 0; i < iterations; ++i) {
          auto const r = rng() % 100;
          if (r < 45 || live.empty()) {
            // Half of one of four sizes: a block freed lately on a stream is often taken back.
            std::size_t const bytes = (rng() % 2) ? 256 * (1 + rng() % 4) : 64 + rng() % 4096;
            std::uintptr_t const s  = (rng() % 2) ? own : per_thread_handle;
            try {
              live.emplace_back(allocate(s, bytes, 256), bytes, s);
            } catch (host_out_of_memory const&) {
            }
          } else if (r < 90) {
            auto const k         = rng() % live.size();
            auto [ptr, bytes, s] = live[k];
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            std::int64_t fence = -1;
            bool const capture = rng() % 8 == 0;
            if (capture) { board_->begin_capture(s); }
            (void)deallocate(s, ptr, bytes, 256, &fence);
            if (capture) { board_->end_capture(s); }
            frees.fetch_add(1);
          } else if (r < 97) {
            try {
              void* p = core_.allocate(own, 0, 256);  // polls
              core_.deallocate(own, p, 0, 256);
            } catch (host_out_of_memory const&) {
            }
          } else {
            (void)flush();
          }
        }
        for (auto [ptr, bytes, s] : live) {
          std::int64_t fence = -1;
          (void)deallocate(s, ptr, bytes, 256, &fence);
          frees.fetch_add(1);
        }
      });
    }
    std::thread chaos([&] {
      std::mt19937_64 rng(random_state);
      while (!stop.load()) {
        auto const r = rng() % 100;
        {
          std::lock_guard<std::recursive_mutex> lock(board_->m);
          if (r < 40) {
            if (!board_->streams.empty()) {
              auto it = board_->streams.begin();
              std::advance(it, static_cast<std::ptrdiff_t>(rng() % board_->streams.size()));
              it->second.completed = it->second.enqueued;
            }
          } else if (r < 55) {
            board_->global_capture = !board_->global_capture;
          } else if (r < 65) {
            board_->fail_query = 1 + static_cast<int>(rng() % 3);
          } else if (r < 75) {
            board_->fail_wait = 1;
          } else if (r < 80) {
            board_->fail_sync_device = 1;
          } else if (r < 85) {
            board_->fail_sync_stream = 1;
          } else if (r < 90) {
            board_->fail_record = 1;
          }
        }
        chaos_started.store(true);
        std::this_thread::yield();
      }
    });
    for (auto& th : threads) {
      th.join();
    }
    stop.store(true);
    chaos.join();
    {
      std::lock_guard<std::recursive_mutex> lock(board_->m);
      board_->global_capture = false;
      board_->fail_query = board_->fail_wait = board_->fail_sync_device = 0;
      board_->fail_sync_stream = board_->fail_record = board_->fail_stream_id = 0;
      for (auto& [id, s] : board_->streams) {
        s.capturing = false;
      }
    }
    thread_run_result out;
    out.frees = frees.load();
    (void)flush();
    out.pending_after_flush = core_.pending_count();
    auto const releases     = core_.upstream().releases_copy();
    for (auto const& r : releases) {
      out.unsafe_releases += !r.fence_signalled;
    }
    out.upstream_bad_frees   = core_.upstream().bad_frees;
    out.lost                 = core_.upstream().used() - core_.pending_bytes();
    auto const s             = core_.stats();
    out.syncs_counted        = s.syncs;
    out.syncs_succeeded      = board_->waits_ok + board_->syncs_ok;
    out.invalidated_captures = board_->invalidated_captures;
    out.released_fence_use   = board_->released_fence_use;
    out.reuses               = reuses_.load();
    out.unsafe_reuses        = unsafe_reuses_.load();
    return out;
  }

  /**
   * @brief `pairs` allocate + deallocate pairs of `bytes` on `stream` with no device work (as
   * the native alloc/free benchmark runs them); returns the platform and upstream calls they
   * made, and the heap allocations and frees the core made in them (the counts start again
   * from 0).
   *
   * With `lag` 0, each fence recorded before a call is complete when that call begins (the
   * stream has no work); a fence recorded during a call is complete during that call only with
   * `complete_at_record`. With `lag` > 0, a fence recorded in pair j is complete from pair
   * j + 1 + `lag` on (several fences pending at once: a device that trails the host), pairs
   * counted across consecutive calls with a lag on the same stream; `complete_at_record` must
   * be false then.
   *
   * With `fail_heap_every` > 0, every `fail_heap_every`-th heap allocation of the core fails
   * (the core out of host memory); a pair whose allocation fails frees nothing.
   */
  platform_calls run_pairs(std::uintptr_t stream,
                           std::size_t bytes,
                           std::uint64_t pairs,
                           bool complete_at_record,
                           std::uint64_t lag             = 0,
                           std::uint64_t fail_heap_every = 0)
  {
    if (lag > 0 && complete_at_record) {
      throw std::invalid_argument("run_pairs: lag > 0 needs complete_at_record false");
    }
    if (lag == 0 || stream != pairs_stream_) { pair_starts_.clear(); }
    pairs_stream_ = stream;
    // sized before the count: the loop makes no harness heap use
    pair_starts_.reserve(lag > 0 ? pair_starts_.size() + pairs : 0);
    {
      std::lock_guard<std::recursive_mutex> lock(board_->m);
      board_->calls              = {};
      board_->complete_at_record = complete_at_record;
      (void)board_->resolve(stream);
    }
    // Completes what is due before a call of the last pair begun.
    auto complete = [&] {
      harness_scope const harness;
      if (lag == 0) {
        board_->signal_all();
        return;
      }
      auto const n = pair_starts_.size();
      if (n <= lag) { return; }
      std::lock_guard<std::recursive_mutex> lock(board_->m);
      auto& s     = board_->state(stream);
      s.completed = std::max(s.completed, pair_starts_[n - 1 - lag]);
    };
    heap_counts heap;
    {
      count_heap const counting{fail_heap_every};
      for (std::uint64_t i = 0; i < pairs; ++i) {
        if (lag > 0) {
          harness_scope const harness;
          std::lock_guard<std::recursive_mutex> lock(board_->m);
          pair_starts_.push_back(board_->state(stream).enqueued);
        }
        complete();
        void* ptr = nullptr;
        try {
          ptr = core_.allocate(stream, bytes, 256);
        } catch (std::bad_alloc const&) {
          if (fail_heap_every == 0) { throw; }
          continue;
        }
        complete();
        core_.deallocate(stream, ptr, bytes, 256);
      }
      heap = count_heap::counted();
    }
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    board_->complete_at_record     = false;
    board_->calls.heap_allocations = heap.allocations;
    board_->calls.heap_frees       = heap.frees;
    board_->calls.heap_failures    = heap.failed;
    return board_->calls;
  }

  /// The platform and upstream calls so far (since the last `run_pairs`).
  platform_calls calls() const
  {
    std::lock_guard<std::recursive_mutex> lock(board_->m);
    return board_->calls;
  }

  core_type& core() noexcept { return core_; }
  fence_board& board() noexcept { return *board_; }
  host_upstream& upstream() noexcept { return core_.upstream(); }

 private:
  std::shared_ptr<fence_board> board_;
  core_type core_;
  std::atomic<std::uint64_t> reuses_{};         // pending blocks handed out again
  std::atomic<std::uint64_t> unsafe_reuses_{};  // of those, before their work ended elsewhere
  std::vector<std::uint64_t> pair_starts_;      ///< `run_pairs` with a lag: the stream's work
                                                ///< enqueued when each pair began
  std::uintptr_t pairs_stream_{};               ///< the stream of the last `run_pairs`
};

}  // namespace rmm_fences::testing
