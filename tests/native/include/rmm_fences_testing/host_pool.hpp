/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The stream-ordered pool's policy core on host memory with logged fences (CPU tests only).
 *
 * The platform is thread-safe and can inject faults: records, stream waits, fence queries and
 * syncs that fail, a capture in progress on any stream (with a capture id that forked streams
 * share), streams that report one identity, streams of another device, and a callback run
 * inside `sync_device` (another thread's free landing while the device synchronizes).
 * Recorded fences complete when the test says so (`complete`, `complete_all`); a handle can
 * be destroyed and reused by a new stream (`destroy_stream`): the pool sees the same identity,
 * the oracle a new stream.
 *
 * An oracle checks every allocation and every chunk returned upstream: no block reaches a
 * stream other than the one that freed it without a wait on a fence recorded at or after that
 * free (or a device sync, or a sync of the freeing stream, or a query that found such a fence
 * complete, after it), and no two live blocks overlap. Memory of a new chunk counts as freed
 * on the stream the upstream allocated it on (a shared stream-ordered upstream orders its
 * previous user's work only on that stream).
 *
 * Graphs are actors of their own. A stream being captured is, for the oracle, the pair
 * (capture id, stream): bytes it frees belong to the capture's graph, which may replay them at
 * any later launch, so they may reach no other stream, and no later use of the same stream
 * outside the capture, until the graph and every executable graph instantiated from it are
 * destroyed; no sync, wait or query orders a later launch. The platform holds the user objects
 * the pool retains into a capture (`retain_until_graph_destroyed`) and runs their callbacks
 * when that happens. A device sync, a host sync of a stream other than the pool's own, a fence
 * recorded on a captured stream or a wait enqueued on one, issued while a capture is live,
 * is a violation: it invalidates a global-mode capture in any thread, or joins the graph.
 */
#pragma once

#include <rmm_fences/detail/stream_identity.hpp>
#include <rmm_fences/detail/stream_ordered_pool_core.hpp>
#include <rmm_fences_testing/host_address_space.hpp>
#include <rmm_fences_testing/host_pool_census.hpp>

#include <sys/mman.h>

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
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace rmm_fences::testing {

/// Thrown by `host_chunk_upstream` when its limit would be exceeded.
struct pool_host_out_of_memory : std::bad_alloc {
  [[nodiscard]] char const* what() const noexcept override { return "host upstream: limit"; }
};

/// The pool-owned stream of the host platform (growth during capture, chunks returned).
inline constexpr std::uint64_t host_private_stream = 0xFFFF'FF00ULL;

/**
 * @brief What the pool did with fences, against a logical clock the harness advances once per
 * call: records (fence, stream, clock), stream waits (waiter, recording stream, clock of the
 * record waited on), device syncs (clock), stream syncs (stream, clock), fences found
 * complete (stream, clock of the record), upstream calls. Every member is guarded by `mutex`
 * (the clock is atomic).
 *
 * The oracle names a stream by its handle plus, from the first `destroy_stream` of that
 * handle on, its epoch (`oracle_stream`): a handle reused by a new stream is another stream.
 */
struct pool_log {
  mutable std::mutex mutex;
  std::atomic<std::uint64_t> clock{};
  std::vector<std::uint64_t> fence_stream;  // fence index -> stream it was last recorded on
  std::vector<std::uint64_t> fence_clock;   // fence index -> clock of its last record (0: none)
  std::vector<bool> fence_released;         // fence index -> given back by the pool
  std::vector<std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>> waits;
  std::vector<std::uint64_t> syncs;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> stream_syncs;  // (stream, clock)
  std::set<std::uint64_t> capturing;
  std::map<std::uint64_t, std::uint64_t> capture_ids;  // capturing stream -> capture id
  std::map<std::uint64_t, std::uint64_t> aliases;      // stream -> the identity it reports
  std::set<std::uint64_t> foreign;                     // streams of another device
  std::map<std::uint64_t, std::uint64_t> epochs;       // handle -> times it was destroyed
  std::map<std::uint64_t, int> capture_modes;          // capturing stream -> mode (0 global,
                                                       // 1 thread-local, 2 relaxed)
  /// A capture's graph: from capture begin, through instantiations and launches, until it and
  /// every executable graph are destroyed (`released`: the user objects' callbacks ran).
  struct graph_state {
    int capturing{};  // streams capturing into it now
    bool ended{};     // the capture ended: the graph exists until destroyed
    bool destroyed{};
    int execs{};  // executable graphs instantiated from it and not destroyed
    std::uint64_t launches{};
    bool released{};
    std::vector<std::pair<void (*)(void*), void*>> holds;  // user objects it retains
  };
  std::map<std::uint64_t, graph_state> graphs;  // capture id -> graph
  std::uint64_t records{};
  std::uint64_t fences_acquired{};
  std::uint64_t fences_released{};
  // Completion: work of a stream queued up to these clocks ran (per oracle stream; all).
  std::map<std::uint64_t, std::uint64_t> completed;
  std::uint64_t completed_all{};
  bool idle{};  // the streams run no work: every recorded fence is complete (a replay)
  std::vector<std::pair<std::uint64_t, std::uint64_t>> observed;  // fences found complete
  // Fault injection: the next N calls of each kind fail.
  int fail_records{};
  int fail_waits{};
  int fail_syncs{};
  int fail_stream_syncs{};
  int fail_queries{};
  int fail_retains{};
  std::function<void()> sync_hook;  // run once inside the next successful sync_device
  // Run before each upstream allocation, outside every lock: (bytes, stream).
  std::function<void(std::size_t, std::uint64_t)> upstream_hook;
  // Upstream calls: (allocate?, address, bytes, stream, clock).
  std::vector<std::tuple<bool, std::uintptr_t, std::size_t, std::uint64_t, std::uint64_t>>
    upstream_calls;

  // --- the oracle ------------------------------------------------------------------------
  struct freed_range {
    std::uintptr_t end;
    std::uint64_t stream;
    std::uint64_t clock;
    std::uint64_t graph{};  // the capture id when freed by a captured stream
  };
  std::map<std::uintptr_t, freed_range> freed;  // start -> range freed and not yet reused
  std::map<std::uintptr_t, std::pair<std::size_t, std::size_t>> live;  // ptr -> (bytes, size)
  std::vector<std::string> violations;

  std::uint64_t tick() noexcept { return clock.fetch_add(1, std::memory_order_relaxed) + 1; }
  std::uint64_t now() const noexcept { return clock.load(std::memory_order_relaxed); }

  /// The oracle's name of the stream that handle `s` names now (caller holds mutex).
  [[nodiscard]] std::uint64_t oracle_stream(std::uint64_t s) const
  {
    auto it = epochs.find(s);
    return it == epochs.end() ? s : s + (it->second << 40);
  }

  /// The oracle's name of handle `s` now: while it is captured, (capture id, stream) mixed as
  /// the pool mixes them, else `oracle_stream(s)` (caller holds mutex).
  [[nodiscard]] std::uint64_t oracle_name(std::uint64_t s) const
  {
    if (capturing.count(s) > 0) {
      return rmm_fences::mr::detail::capturing_stream_identity(capture_ids.at(s), s);
    }
    return oracle_stream(s);
  }

  /// The capture id `s` captures into, or 0 (caller holds mutex).
  [[nodiscard]] std::uint64_t capture_of(std::uint64_t s) const
  {
    auto it = capture_ids.find(s);
    return capturing.count(s) > 0 && it != capture_ids.end() ? it->second : 0;
  }

  /// True when `waiter` is ordered after `stream`'s work up to `at`; bytes a graph freed
  /// (`graph`) only for the same captured stream, or once the graph is released (caller holds
  /// mutex).
  [[nodiscard]] bool ordered_after(std::uint64_t waiter,
                                   std::uint64_t stream,
                                   std::uint64_t at,
                                   std::uint64_t graph = 0) const
  {
    if (waiter == stream) { return true; }
    if (graph != 0) {
      auto it = graphs.find(graph);
      return it != graphs.end() && it->second.released;
    }
    for (auto s : syncs) {
      if (s >= at) { return true; }
    }
    for (auto const& [s, c] : stream_syncs) {
      if (s == stream && c >= at) { return true; }
    }
    for (auto const& [w, s, c] : waits) {
      if (w == waiter && s == stream && c >= at) { return true; }
    }
    for (auto const& [s, c] : observed) {
      if (s == stream && c >= at) { return true; }
    }
    return false;
  }

  /// True when `stream`'s work up to `at` ran (a completion the test declared, a device sync,
  /// a sync of that stream or a fence of it found complete after `at`); bytes a graph freed
  /// (`graph`) only once the graph is released (caller holds mutex).
  [[nodiscard]] bool done_after(std::uint64_t stream,
                                std::uint64_t at,
                                std::uint64_t graph = 0) const
  {
    if (graph != 0) {
      auto it = graphs.find(graph);
      return it != graphs.end() && it->second.released;
    }
    if (completed_all >= at) { return true; }
    if (auto it = completed.find(stream); it != completed.end() && it->second >= at) {
      return true;
    }
    auto const after = [&](auto const& list) {
      return std::any_of(list.begin(), list.end(), [&](auto const& e) {
        return e.first == stream && e.second >= at;
      });
    };
    return std::any_of(syncs.begin(), syncs.end(), [&](auto c) { return c >= at; }) ||
           after(stream_syncs) || after(observed);
  }

  /// Pages [p, p + n) unmapped at once: every byte freed there must have its last use done,
  /// and none may be live (caller holds mutex).
  void unmapped(std::uintptr_t p, std::size_t n)
  {
    auto const end = p + n;
    auto live_it   = live.lower_bound(p);
    if (live_it != live.begin() &&
        std::prev(live_it)->first + std::prev(live_it)->second.second > p) {
      --live_it;
    }
    if (live_it != live.end() && live_it->first < end) {
      violation("pages unmapped under a live block");
    }
    auto it = freed.lower_bound(p);
    if (it != freed.begin() && std::prev(it)->second.end > p) { --it; }
    while (it != freed.end() && it->first < end) {
      auto const [start, range] = *it;
      it                        = freed.erase(it);
      if (!done_after(range.stream, range.clock, range.graph)) {
        std::ostringstream os;
        os << "pages [0x" << std::hex << p << ", 0x" << end << std::dec
           << ") unmapped while work of stream " << range.stream << " freed at clock "
           << range.clock << (range.graph != 0 ? " (a graph that may replay)" : "")
           << " may still run";
        violation(os.str());
      }
      if (start < p) { freed[start] = {p, range.stream, range.clock, range.graph}; }
      if (range.end > end) { freed[end] = {range.end, range.stream, range.clock, range.graph}; }
    }
  }

  void violation(std::string what)
  {
    if (violations.size() < 20) { violations.push_back(std::move(what)); }
  }

  /// Checks memory [p, p + n) handed to `stream` against every earlier free it overlaps and
  /// forgets those frees (caller holds mutex).
  void hand_over(std::uintptr_t p, std::size_t n, std::uint64_t stream, char const* what)
  {
    auto const end = p + n;
    auto it        = freed.lower_bound(p);
    if (it != freed.begin() && std::prev(it)->second.end > p) { --it; }
    while (it != freed.end() && it->first < end) {
      auto const [start, range] = *it;
      it                        = freed.erase(it);
      if (!ordered_after(stream, range.stream, range.clock, range.graph)) {
        std::ostringstream os;
        os << what << " [0x" << std::hex << p << ", 0x" << end << std::dec << ") to stream "
           << stream << " overlaps bytes freed on stream " << range.stream << " at clock "
           << range.clock;
        if (range.graph != 0) {
          os << " in the capture of graph " << range.graph << ", which may still replay";
        } else {
          os << " with no wait on a later fence of it nor a sync after it";
        }
        violation(os.str());
      }
      if (start < p) { freed[start] = {p, range.stream, range.clock, range.graph}; }
      if (range.end > end) { freed[end] = {range.end, range.stream, range.clock, range.graph}; }
    }
  }

  void claim(void* ptr, std::size_t bytes, std::size_t size, std::uint64_t stream)
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto const p = reinterpret_cast<std::uintptr_t>(ptr);
    auto next    = live.lower_bound(p);
    bool overlap = next != live.end() && next->first < p + size;
    if (next != live.begin()) {
      auto prev = std::prev(next);
      overlap   = overlap || prev->first + prev->second.second > p;
    }
    if (overlap) {
      std::ostringstream os;
      os << "allocation 0x" << std::hex << p << std::dec << " (" << size
         << " bytes) overlaps a live block";
      violation(os.str());
    }
    hand_over(p, size, oracle_name(stream), "allocation");
    live[p] = {bytes, size};
  }

  /// A user free of a live block (as the oracle knows it) on handle `stream`; other frees are
  /// ignored.
  void note_free(void* ptr, std::size_t bytes, std::uint64_t stream, std::uint64_t at)
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto const p = reinterpret_cast<std::uintptr_t>(ptr);
    auto it      = live.find(p);
    if (it == live.end() || it->second.first != bytes) { return; }
    freed[p] = {p + it->second.second, oracle_name(stream), at, capture_of(stream)};
    live.erase(it);
  }

  /// True while any stream is captured (caller holds mutex).
  [[nodiscard]] bool capture_live() const noexcept { return !capturing.empty(); }

  /// The graph of capture `cid` and its executables are gone: its user objects' callbacks
  /// are returned for the caller to run without the lock (caller holds mutex).
  std::vector<std::pair<void (*)(void*), void*>> release_if_gone(std::uint64_t cid)
  {
    auto& g = graphs[cid];
    if (g.released || g.capturing > 0 || !g.ended || !g.destroyed || g.execs > 0) { return {}; }
    g.released = true;
    return std::move(g.holds);
  }
};

/// `stream_ordered_pool_core`'s platform over a `pool_log`; streams are their own ids.
class host_pool_platform {
 public:
  using stream_type   = std::uint64_t;
  using fence_type    = std::size_t;
  using out_of_memory = pool_host_out_of_memory;

  explicit host_pool_platform(std::shared_ptr<pool_log> log) : log_{std::move(log)} {}

  /// As the CUDA platform: a capturing stream is told apart by (capture id, stream).
  std::uint64_t stream_id(stream_type s) const noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->capturing.count(s) > 0) {
      auto it = log_->capture_ids.find(s);
      if (it != log_->capture_ids.end()) {
        return rmm_fences::mr::detail::capturing_stream_identity(it->second, s);
      }
    }
    if (auto it = log_->aliases.find(s); it != log_->aliases.end()) { return it->second; }
    return s;
  }

  fence_type acquire_fence()
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->fence_stream.push_back(0);
    log_->fence_clock.push_back(0);
    log_->fence_released.push_back(false);
    ++log_->fences_acquired;
    return log_->fence_stream.size() - 1;
  }

  /// Counts the fence as given back (a second release of one fence is an oracle violation).
  void release_fence(fence_type f) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->fence_released[f]) {
      log_->violation("fence " + std::to_string(f) + " released twice");
      return;
    }
    log_->fence_released[f] = true;
    ++log_->fences_released;
  }

  bool record(fence_type f, stream_type s) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->fail_records > 0) {
      --log_->fail_records;
      return false;
    }
    if (log_->fence_released[f]) { log_->violation("record of a released fence"); }
    if (log_->capturing.count(s) > 0) {
      log_->violation("fence recorded on captured stream " + std::to_string(s));
    }
    log_->fence_stream[f] = log_->oracle_stream(s);
    log_->fence_clock[f]  = log_->now();
    ++log_->records;
    return true;
  }

  bool device_wait(stream_type waiter, fence_type f) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->fail_waits > 0) {
      --log_->fail_waits;
      return false;
    }
    if (log_->fence_released[f]) { log_->violation("wait on a released fence"); }
    if (log_->capturing.count(waiter) > 0) {
      log_->violation("stream wait enqueued on captured stream " + std::to_string(waiter));
    }
    try {
      log_->waits.emplace_back(
        log_->oracle_stream(waiter), log_->fence_stream[f], log_->fence_clock[f]);
    } catch (...) {
      return false;
    }
    return true;
  }

  /// True when the fence's last record is known complete (`complete`, `complete_all`); the
  /// oracle then counts its stream's work up to that record as done for every stream.
  bool ready(fence_type f) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->fail_queries > 0) {
      --log_->fail_queries;
      return false;
    }
    if (log_->fence_released[f]) { log_->violation("query of a released fence"); }
    auto const at = log_->fence_clock[f];
    if (at == 0) { return false; }  // never recorded: never read as a fence
    auto const stream = log_->fence_stream[f];
    auto it           = log_->completed.find(stream);
    if (!log_->idle && log_->completed_all < at &&
        (it == log_->completed.end() || it->second < at)) {
      return false;
    }
    try {
      log_->observed.emplace_back(stream, at);
    } catch (...) {
      return false;
    }
    return true;
  }

  bool is_capturing(stream_type s) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    return log_->capturing.count(s) > 0;
  }

  /// Fails while any stream captures, a violation: it would invalidate a global-mode capture
  /// in any thread (or when told to); runs the hook after the synchronization point, outside
  /// the log's lock.
  bool sync_device() noexcept
  {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      if (log_->fail_syncs > 0) {
        --log_->fail_syncs;
        return false;
      }
      if (log_->capture_live()) {
        log_->violation("device sync while a capture is live");
        return false;
      }
      log_->syncs.push_back(log_->now());
      hook.swap(log_->sync_hook);
    }
    if (hook) { hook(); }
    return true;
  }

  bool sync_stream(stream_type s) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->fail_stream_syncs > 0) {
      --log_->fail_stream_syncs;
      return false;
    }
    if (log_->capturing.count(s) > 0) { return false; }
    // The pool's own stream carries only the upstream's calls and waits on fences of streams
    // that are not captured: its sync touches no capture.
    if (s != host_private_stream && log_->capture_live()) {
      log_->violation("host sync of stream " + std::to_string(s) + " while a capture is live");
    }
    log_->stream_syncs.emplace_back(log_->oracle_stream(s), log_->now());
    return true;
  }

  /**
   * @brief Ties `fn(ctx)` to the graph `s` captures into: it runs once that graph and every
   * executable graph instantiated from it are destroyed. False (and `fn(ctx)` at once) when
   * `s` is not captured or when told to fail; `fn` runs exactly once either way.
   */
  bool retain_until_graph_destroyed(stream_type s, void (*fn)(void*), void* ctx) noexcept
  {
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      auto const cid = log_->capture_of(s);
      if (log_->fail_retains > 0) {
        --log_->fail_retains;
      } else if (cid != 0) {
        try {
          log_->graphs[cid].holds.emplace_back(fn, ctx);
          return true;
        } catch (...) {
        }
      }
    }
    fn(ctx);
    return false;
  }

  /// False for a stream marked as belonging to another device.
  bool stream_on_device(stream_type s) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    return log_->foreign.count(s) == 0;
  }

  static stream_type default_stream() noexcept { return 0; }
  static stream_type private_stream() noexcept { return host_private_stream; }
  static void destroy_private_stream() noexcept {}

  struct no_scope {};
  static no_scope relax() noexcept { return {}; }

  [[noreturn]] static void throw_out_of_memory(std::size_t, std::size_t)
  { throw pool_host_out_of_memory{}; }

  static void report_rejected_free(char const* line) noexcept { (void)line; }

 private:
  std::shared_ptr<pool_log> log_;
};

/**
 * @brief A page arena on host memory (the pool's upstream when a test asks for one): one
 * reserved range of `reserve` bytes (never touched unless a test writes to its blocks), pages
 * of `page` bytes held up to `limit`. Tells the oracle of each unmap, which must find the
 * work on those bytes done; logs maps and unmaps as upstream calls (stream 0). Its clock
 * (`now_ns`) models time: `costs.call_ns` per call of the pool (the log's clock) and
 * `costs.page_ns` per page mapped or unmapped and per range mapped (its access set); zero
 * costs stop it. Once its peak in use stopped rising, the pool may spend
 * `costs.remap_time_fraction` of that time moving pages (1: every move its budget asks for).
 */
struct host_arena_costs {
  std::uint64_t call_ns{};
  std::uint64_t page_ns{};
  double remap_time_fraction{1.0};
};

class host_page_arena {
 public:
  host_page_arena(std::size_t page,
                  std::size_t reserve,
                  std::size_t limit,
                  std::shared_ptr<pool_log> log,
                  host_arena_costs costs = {})
    : page_{page},
      reserved_{reserve / page * page},
      limit_{limit},
      log_{std::move(log)},
      costs_{costs}
  {
    void* p = ::mmap(nullptr,
                     reserved_,
                     PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1,
                     0);
    if (p == MAP_FAILED) { throw std::bad_alloc{}; }
    // Pages at page-aligned addresses: the reserve starts at a page boundary.
    base_ = static_cast<char*>(p);
  }
  host_page_arena(host_page_arena const&)            = delete;
  host_page_arena& operator=(host_page_arena const&) = delete;
  ~host_page_arena() { ::munmap(base_, reserved_); }

  [[nodiscard]] std::size_t page_size() const noexcept { return page_; }
  [[nodiscard]] char* base() const noexcept { return base_; }
  [[nodiscard]] std::size_t reserved() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t physical_bytes() const noexcept { return mapped_ + spare_; }
  [[nodiscard]] std::size_t spare_bytes() const noexcept { return spare_; }
  [[nodiscard]] std::size_t mapped_bytes() const noexcept { return mapped_; }
  [[nodiscard]] std::size_t peak_physical_bytes() const noexcept { return peak_; }
  [[nodiscard]] std::uint64_t maps() const noexcept { return maps_; }
  /// The end of the highest page mapped so far, from the start of the reserve.
  [[nodiscard]] std::size_t address_high_mark() const noexcept { return high_mark_; }
  [[nodiscard]] std::uint64_t unmaps() const noexcept { return unmaps_; }
  /// Pages mapped and unmapped so far (each a driver call of the CUDA arena).
  [[nodiscard]] std::uint64_t page_calls() const noexcept { return page_calls_; }
  /// The modelled time: the pool's calls and the page calls at their costs.
  [[nodiscard]] std::uint64_t now_ns() const noexcept
  { return log_->now() * costs_.call_ns + busy_ns_.load(std::memory_order_relaxed); }
  [[nodiscard]] double remap_time_fraction() const noexcept { return costs_.remap_time_fraction; }
  /// The modelled time spent in page calls.
  [[nodiscard]] std::uint64_t busy_ns() const noexcept
  { return busy_ns_.load(std::memory_order_relaxed); }

  void map(char* p, std::size_t n)
  {
    std::function<void(std::size_t, std::uint64_t)> hook;
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      hook = log_->upstream_hook;
    }
    if (hook) { hook(n, 0); }
    auto const fresh = n - std::min(n, spare_);
    if (mapped_ + spare_ + fresh > limit_) { throw pool_host_out_of_memory{}; }
    std::lock_guard<std::mutex> lock(log_->mutex);
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    if (a % page_ != 0 || n % page_ != 0 || p < base_ || p + n > base_ + reserved_) {
      log_->violation("map of a range that is not whole pages of the reserve");
    }
    if (!mapped_ranges_.empty()) {
      auto it = mapped_ranges_.lower_bound(a + n);
      if (it != mapped_ranges_.begin() && std::prev(it)->second > a) {
        log_->violation("map of pages mapped already");
      }
    }
    auto lo = a, hi = a + n;  // merged with mapped neighbours: an unmap may span both
    if (auto next = mapped_ranges_.find(hi); next != mapped_ranges_.end()) {
      hi = next->second;
      mapped_ranges_.erase(next);
    }
    if (auto prev = mapped_ranges_.lower_bound(lo); prev != mapped_ranges_.begin()) {
      --prev;
      if (prev->second == lo) {
        lo = prev->first;
        mapped_ranges_.erase(prev);
      }
    }
    mapped_ranges_[lo] = hi;
    spare_ -= n - fresh;
    mapped_ += n;
    peak_      = std::max(peak_, mapped_ + spare_);
    high_mark_ = std::max(high_mark_, static_cast<std::size_t>(p + n - base_));
    ++maps_;
    spend(n / page_ + 1);
    log_->upstream_calls.emplace_back(true, a, n, 0, log_->now());
  }

  void unmap(char* p, std::size_t n) noexcept
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    if (!unmark(a, n)) { log_->violation("unmap of pages not mapped"); }
    log_->unmapped(a, n);
    log_->upstream_calls.emplace_back(false, a, n, 0, log_->now());
    mapped_ -= n;
    spare_ += n;
    ++unmaps_;
    spend(n / page_);
    ::madvise(p, n, MADV_DONTNEED);
  }

  void trim() noexcept { spare_ = 0; }

 private:
  /// Counts `calls` page calls and their modelled time (the log's mutex held).
  void spend(std::uint64_t calls) noexcept
  {
    page_calls_ += calls;
    busy_ns_.fetch_add(calls * costs_.page_ns, std::memory_order_relaxed);
  }

  /// Takes [a, a + n) out of the mapped ranges; false when it is not inside one.
  bool unmark(std::uintptr_t a, std::size_t n)
  {
    auto it = mapped_ranges_.upper_bound(a);
    if (it == mapped_ranges_.begin()) { return false; }
    --it;
    auto const [lo, hi] = *it;
    if (a + n > hi) { return false; }
    mapped_ranges_.erase(it);
    if (lo < a) { mapped_ranges_[lo] = a; }
    if (a + n < hi) { mapped_ranges_[a + n] = hi; }
    return true;
  }

  std::size_t page_;
  std::size_t reserved_;
  std::size_t limit_;
  std::shared_ptr<pool_log> log_;
  char* base_{};
  std::size_t mapped_{};
  std::size_t spare_{};
  std::size_t peak_{};
  std::uint64_t maps_{};
  std::uint64_t unmaps_{};
  std::uint64_t page_calls_{};
  std::atomic<std::uint64_t> busy_ns_{};  // read by statistics without the log's mutex
  host_arena_costs costs_;
  std::size_t high_mark_{};
  std::map<std::uintptr_t, std::uintptr_t> mapped_ranges_;  // start -> end
};

/// Host chunks with a byte limit (the pool's upstream in the tests); logs the stream of each
/// call and tells the oracle (a chunk's bytes count as freed on that stream). Given a page
/// size, it offers a page arena instead (`arena()`), of `limit` bytes of pages.
class host_chunk_upstream {
 public:
  host_chunk_upstream(std::size_t limit,
                      std::shared_ptr<pool_log> log,
                      std::size_t arena_page    = 0,
                      std::size_t arena_reserve = 0,
                      host_arena_costs costs    = {})
    : limit_{limit},
      log_{std::move(log)},
      mutex_{std::make_unique<std::mutex>()},
      space_{std::make_unique<host_address_space>(limit)}
  {
    if (arena_page != 0) {
      // 256 GiB of address space by default: several times the largest log's peak, and a
      // few hundred pools alive at once (a state machine's runs) within the process's space.
      auto const reserve = arena_reserve != 0 ? arena_reserve : std::size_t{1} << 38;
      arena_ = std::make_unique<host_page_arena>(arena_page, reserve, limit, log_, costs);
    }
  }

  /// The page arena, or nullptr (chunks).
  [[nodiscard]] host_page_arena* arena() const noexcept { return arena_.get(); }
  host_chunk_upstream(host_chunk_upstream&&) noexcept = default;
  ~host_chunk_upstream()
  {
    for (auto const& [p, n] : live_) {
      if (!space_->holds(p)) { std::free(p); }
    }
  }

  void* allocate(std::uint64_t stream, std::size_t bytes, std::size_t alignment)
  {
    run_hook(bytes, stream);
    std::lock_guard<std::mutex> guard(*mutex_);
    if (used_ + bytes > limit_) { throw pool_host_out_of_memory{}; }
    void* p = space_->take(bytes, alignment);  // where the device would put it
    if (p == nullptr) { p = std::aligned_alloc(alignment, bytes); }
    if (p == nullptr) { throw std::bad_alloc{}; }
    used_ += bytes;
    live_[p] = bytes;
    std::lock_guard<std::mutex> lock(log_->mutex);
    auto const a  = reinterpret_cast<std::uintptr_t>(p);
    auto const at = log_->now();
    auto const on = log_->oracle_stream(stream);
    log_->upstream_calls.emplace_back(true, a, bytes, stream, at);
    // The previous user's work on these bytes is ordered only on `stream`.
    log_->hand_over(a, bytes, on, "upstream chunk");
    log_->freed[a] = {a + bytes, on, at};
    return p;
  }

  void deallocate(std::uint64_t stream, void* p, std::size_t bytes, std::size_t) noexcept
  {
    std::lock_guard<std::mutex> guard(*mutex_);
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      auto const a = reinterpret_cast<std::uintptr_t>(p);
      log_->upstream_calls.emplace_back(false, a, bytes, stream, log_->now());
      log_->hand_over(a, bytes, log_->oracle_stream(stream), "chunk returned upstream");
    }
    used_ -= bytes;
    live_.erase(p);
    if (space_->holds(p)) {
      space_->give(p, bytes);
    } else {
      std::free(p);
    }
  }

  [[nodiscard]] std::size_t used() const noexcept { return used_; }
  [[nodiscard]] std::size_t chunks() const noexcept { return live_.size(); }

 private:
  void run_hook(std::size_t bytes, std::uint64_t stream)
  {
    std::function<void(std::size_t, std::uint64_t)> hook;
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      hook = log_->upstream_hook;
    }
    if (hook) { hook(bytes, stream); }
  }

  std::size_t limit_;
  std::shared_ptr<pool_log> log_;
  std::unique_ptr<std::mutex> mutex_;
  std::size_t used_{};
  std::map<void*, std::size_t> live_;
  std::unique_ptr<host_address_space> space_;  // the chunks' addresses
  std::unique_ptr<host_page_arena> arena_;
};

/// A census taken as the pool asked the upstream for a chunk (`host_pool::record_growths`).
struct growth_census {
  std::uint64_t clock{};
  std::uint64_t stream{};
  std::size_t chunk{};
  pool_census census;
};

/// The pool core driven by a test.
class host_pool {
  using core_type =
    rmm_fences::mr::detail::stream_ordered_pool_core<host_pool_platform, host_chunk_upstream>;

 public:
  /// A census's owners that are no stream (the core's).
  static constexpr std::uint64_t orphan_owner = core_type::orphan_owner;
  static constexpr std::uint64_t graph_owner  = core_type::graph_owner;
  static constexpr std::uint64_t shared_owner = core_type::shared_owner;

  host_pool(std::size_t initial,
            std::optional<std::size_t> maximum,
            std::size_t upstream_limit,
            std::optional<std::size_t> maximum_growth = std::nullopt,
            std::size_t arena_page                    = 0,
            std::size_t arena_reserve                 = 0,
            host_arena_costs costs                    = {})
    : log_{std::make_shared<pool_log>()},
      core_{host_chunk_upstream{upstream_limit, log_, arena_page, arena_reserve, costs},
            initial,
            maximum,
            maximum_growth,
            log_}
  {
  }

  /// The page arena the pool grows over, or nullptr (chunks).
  [[nodiscard]] host_page_arena* arena() noexcept { return core_.upstream().arena(); }
  ~host_pool() { core_.shutdown(true); }

  void* allocate(std::uint64_t stream, std::size_t bytes, std::size_t alignment)
  {
    log_->tick();
    void* p = core_.allocate(stream, bytes, alignment);
    log_->claim(p, bytes, rmm_fences::mr::detail::round_to_granule(bytes), stream);
    return p;
  }

  /// The Python resource's path: the same-stream path alone first, then `allocate`.
  void* allocate_cached_first(std::uint64_t stream, std::size_t bytes, std::size_t alignment)
  {
    log_->tick();
    void* p = core_.try_allocate_cached(stream, bytes, alignment);
    if (p == nullptr) { p = core_.allocate(stream, bytes, alignment); }
    log_->claim(p, bytes, rmm_fences::mr::detail::round_to_granule(bytes), stream);
    return p;
  }

  /// The checked free: 0 done, 1 not a live block, 2 size mismatch (`allocated` set).
  int deallocate(std::uint64_t stream, void* p, std::size_t bytes, std::size_t* allocated)
  {
    auto const at = log_->tick();
    auto const r  = core_.deallocate_checked(stream, p, bytes);
    if (r.check == rmm_fences::mr::free_check::ok) { log_->note_free(p, bytes, stream, at); }
    if (allocated != nullptr) { *allocated = r.allocated_bytes; }
    return rmm_fences::mr::detail::pool::status_code(r);
  }

  /// The census of the pool now (`take_census`; no other call in flight).
  pool_census census() { return take_census(core_); }

  /// From now on, a census before each upstream allocation: what the pool held when it
  /// decided to grow, after its own attempts to find a block (single-threaded use).
  void record_growths()
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->upstream_hook = [this](std::size_t bytes, std::uint64_t stream) {
      growths_.push_back({log_->now(), stream, bytes, take_census(core_)});
    };
  }
  [[nodiscard]] std::vector<growth_census> const& growths() const noexcept { return growths_; }

  /// The noexcept free (what rmm's resource_ref calls).
  void deallocate_unchecked(std::uint64_t stream, void* p, std::size_t bytes)
  {
    auto const at = log_->tick();
    // The oracle notes the free first: once listed, another thread may take the block.
    log_->note_free(p, bytes, stream, at);
    core_.deallocate(stream, p, bytes, 256);
  }

  void retire(std::uint64_t stream)
  {
    log_->tick();
    core_.retire_stream(stream);
  }
  std::size_t release()
  {
    log_->tick();
    return core_.release();
  }
  /// What the resource's destructor asks before it returns the chunks: whether free blocks
  /// no fence covers remain (they would need a device synchronization).
  bool holds_unfenced_blocks() { return core_.holds_unfenced_blocks(); }

  /// The named reclaim, through the platform's device sync.
  bool synchronize_and_reclaim()
  {
    log_->tick();
    return core_.reclaim_after([this] { return core_.platform().sync_device(); });
  }

  /// `stream` begins capturing into capture `capture_id` (streams forked into one capture
  /// share it) in `mode` (0 global, 1 thread-local, 2 relaxed).
  void begin_capture(std::uint64_t stream, std::uint64_t capture_id, int mode = 0)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->capturing.count(stream) > 0) { return; }
    log_->capturing.insert(stream);
    log_->capture_ids[stream]   = capture_id;
    log_->capture_modes[stream] = mode;
    ++log_->graphs[capture_id].capturing;
  }
  /// `stream` leaves its capture; the last one to leave makes the graph exist.
  void end_capture(std::uint64_t stream)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    if (log_->capturing.count(stream) == 0) { return; }
    auto const cid = log_->capture_ids[stream];
    log_->capturing.erase(stream);
    log_->capture_ids.erase(stream);
    log_->capture_modes.erase(stream);
    if (--log_->graphs[cid].capturing == 0) { log_->graphs[cid].ended = true; }
  }
  /// An executable graph of capture `cid` (false: no graph to instantiate).
  bool instantiate(std::uint64_t cid)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    auto& g = log_->graphs[cid];
    if (!g.ended || g.destroyed || g.capturing > 0) { return false; }
    ++g.execs;
    return true;
  }
  /// A launch of an executable graph of `cid`: it replays what the capture recorded,
  /// including the blocks freed in it (false: no executable graph).
  bool launch(std::uint64_t cid)
  {
    log_->tick();
    std::lock_guard<std::mutex> lock(log_->mutex);
    auto& g = log_->graphs[cid];
    if (g.execs == 0) { return false; }
    ++g.launches;
    return true;
  }
  /// Destroys one executable graph of `cid` (false: none).
  bool destroy_exec(std::uint64_t cid) { return drop_graph(cid, true); }
  /// Destroys the graph of `cid` (false: not a graph, or destroyed already).
  bool destroy_graph(std::uint64_t cid) { return drop_graph(cid, false); }
  /// True once the graph of `cid` and its executables are destroyed (callbacks ran).
  bool graph_released(std::uint64_t cid)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    auto it = log_->graphs.find(cid);
    return it != log_->graphs.end() && it->second.released;
  }
  void alias(std::uint64_t stream, std::uint64_t identity)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->aliases[stream] = identity;
  }
  void mark_foreign(std::uint64_t stream)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->foreign.insert(stream);
  }
  /// The next `n` calls of `kind` (0 record, 1 stream wait, 2 device sync, 3 stream sync,
  /// 4 fence query, 5 user object retained into a capture) fail.
  void fail_next(int kind, int n)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    (kind == 0   ? log_->fail_records
     : kind == 1 ? log_->fail_waits
     : kind == 2 ? log_->fail_syncs
     : kind == 3 ? log_->fail_stream_syncs
     : kind == 4 ? log_->fail_queries
                 : log_->fail_retains) = n;
  }

  /// The work queued so far on the stream that `stream` names has run: its fences recorded
  /// until now query as complete.
  void complete(std::uint64_t stream)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->completed[log_->oracle_stream(stream)] = log_->now();
  }

  /// The work queued so far on every stream has run.
  void complete_all()
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->completed_all = log_->now();
  }

  /// From now on (`on`), the streams run no work of their own, as in a replay of an
  /// allocation log: every fence recorded is complete (and found so by a query).
  void set_idle(bool on)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->idle = on;
  }

  /// The stream that `stream` names is destroyed: a later use of the handle is a new stream
  /// for the oracle, while the pool sees the same identity (a handle reused by the driver).
  void destroy_stream(std::uint64_t stream)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    ++log_->epochs[stream];
  }

  /// Fences the pool holds now (acquired and not released).
  std::uint64_t fences_held()
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    return log_->fences_acquired - log_->fences_released;
  }

  /// Inside the next device sync, "another thread" frees `p` on `stream` (after the sync
  /// point); returns through `free_clock` the clock of that free.
  void free_inside_next_sync(std::uint64_t stream, void* p, std::size_t bytes)
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->sync_hook = [this, stream, p, bytes] {
      hook_free_clock_ = log_->tick();
      log_->note_free(p, bytes, stream, hook_free_clock_);
      core_.deallocate(stream, p, bytes, 256);
    };
  }
  [[nodiscard]] std::uint64_t hook_free_clock() const noexcept { return hook_free_clock_; }

  /**
   * @brief Real threads: each thread allocates, frees (mostly on its own stream, sometimes on
   * a neighbour's), retires, releases and runs out of memory against a bounded pool, with
   * faults injected now and then. Runs without the GIL; the oracle records violations.
   * @return operations that raised out-of-memory
   */
  std::size_t run_threads(int threads, int iterations, std::uint64_t random_state)
  {
    std::atomic<std::size_t> ooms{};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([this, t, threads, iterations, random_state, &ooms] {
        std::mt19937_64 rng(random_state * 1000003 + static_cast<std::uint64_t>(t));
        std::uint64_t const own = static_cast<std::uint64_t>(t) + 1;
        std::vector<std::pair<void*, std::size_t>> mine;
        for (int i = 0; i < iterations; ++i) {
          auto const r = rng() % 100;
          if (r < 45 || mine.empty()) {
            std::size_t const bytes =
              (rng() % 4 == 0) ? (std::size_t{1} << (12 + rng() % 8)) : 256 * (1 + rng() % 64);
            try {
              mine.emplace_back(allocate(own, bytes, 256), bytes);
            } catch (pool_host_out_of_memory const&) {
              ++ooms;
            }
          } else if (r < 90) {
            auto const k = rng() % mine.size();
            auto [p, n]  = mine[k];
            mine[k]      = mine.back();
            mine.pop_back();
            // Mostly on its own stream; sometimes on the next thread's (its user work was
            // ordered there).
            auto const s = (rng() % 8 == 0) ? (own % threads) + 1 : own;
            deallocate_unchecked(s, p, n);
          } else if (r < 93) {
            release();
          } else if (r < 95) {
            retire(own);
          } else if (r < 97) {
            fail_next(static_cast<int>(rng() % 4), 1);
          } else {
            // Run into the limit: allocate more than is left, which reclaims (device sync).
            try {
              auto const big = std::size_t{3} << 20;
              void* p        = allocate(own, big, 256);
              deallocate_unchecked(own, p, big);
            } catch (pool_host_out_of_memory const&) {
              ++ooms;
            }
          }
        }
        for (auto const& [p, n] : mine) {
          deallocate_unchecked(own, p, n);
        }
      });
    }
    for (auto& th : pool) {
      th.join();
    }
    return ooms.load();
  }

  /**
   * @brief Real threads, a new stream per task: each task allocates a few blocks on a stream
   * of its own and frees them there (one now and then outlives the task: the thread's
   * long-lived stream frees it later), then drops the stream. Most tasks' streams get an
   * identity never used again (as `cuStreamGetId` gives); others are retired and their handle
   * is reused by a later task (the pool sees the same identity, the oracle a new stream);
   * some are retired and dropped. Between tasks the long-lived stream allocates (taking
   * tasks' fenced blocks) and frees; fences complete now and then; faults are injected and
   * the pool released now and then, against a bounded pool: idle slots are retired while
   * other threads use theirs. Runs without the GIL; the oracle records violations.
   * @return allocations that raised out-of-memory
   */
  std::size_t run_stream_churn(int threads, int tasks, std::uint64_t random_state)
  {
    std::atomic<std::size_t> ooms{};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([this, t, tasks, random_state, &ooms] {
        std::mt19937_64 rng(random_state * 1000003 + static_cast<std::uint64_t>(t));
        auto const tt               = static_cast<std::uint64_t>(t);
        std::uint64_t const lasting = 1000 + tt;
        std::vector<std::pair<void*, std::size_t>> held;  // freed later on `lasting`
        auto size         = [&rng] { return churn_size(rng); };
        auto try_allocate = [&](std::uint64_t s, std::size_t n) {
          return allocate_or_count(s, n, ooms);
        };
        for (int i = 0; i < tasks; ++i) {
          bool const reuse = rng() % 4 == 0;
          // A reused handle belongs to this thread alone; a fresh identity is never reused.
          std::uint64_t const s =
            reuse ? 0x10000 + tt * 8 + rng() % 8 : ((tt + 1) << 24) + static_cast<std::uint64_t>(i);
          std::vector<std::pair<void*, std::size_t>> mine;
          auto const blocks = 1 + rng() % 4;
          for (std::uint64_t k = 0; k < blocks; ++k) {
            auto const n = size();
            if (void* p = try_allocate(s, n); p != nullptr) { mine.emplace_back(p, n); }
          }
          for (auto const& [p, n] : mine) {
            if (rng() % 8 == 0) {
              held.emplace_back(p, n);
            } else {
              deallocate_unchecked(s, p, n);
            }
          }
          if (rng() % 2 == 0) {  // one more round on the task's stream: its own blocks
            auto const n = size();
            if (void* p = try_allocate(s, n); p != nullptr) { deallocate_unchecked(s, p, n); }
          }
          if (reuse || rng() % 8 == 0) { retire(s); }
          if (reuse) { destroy_stream(s); }
          auto const r = rng() % 16;
          if (r < 4) {
            auto const n = size();
            if (void* p = try_allocate(lasting, n); p != nullptr) { held.emplace_back(p, n); }
          } else if (r < 8 && !held.empty()) {
            auto const k = rng() % held.size();
            auto const b = held[k];
            held[k]      = held.back();
            held.pop_back();
            deallocate_unchecked(lasting, b.first, b.second);
          } else if (r == 8) {
            complete_all();
          } else if (r == 9) {
            complete(lasting);
          } else if (r == 10 && rng() % 16 == 0) {
            release();
          } else if (r == 11 && rng() % 4 == 0) {
            fail_next(static_cast<int>(rng() % 5), 1);
          }
        }
        for (auto const& [p, n] : held) {
          deallocate_unchecked(lasting, p, n);
        }
      });
    }
    for (auto& th : pool) {
      th.join();
    }
    return ooms.load();
  }

  /**
   * @brief Real threads with graphs: each thread captures on a stream of its own now and then
   * (global, thread-local or relaxed mode; sometimes a second stream forked into the capture),
   * allocates and frees inside the capture, ends it, instantiates and launches the graph then
   * and at later steps, and destroys its executables and the graph at later steps, in either
   * order; between captures it allocates and frees on its long-lived stream, makes short-lived
   * streams (slot sweeps), releases, completes work and runs into the pool's bound. Runs
   * without the GIL; the oracle records violations (a handout of bytes a live graph may
   * replay, a sync while any thread captures).
   * @return allocations that raised out-of-memory
   */
  std::size_t run_graph_churn(int threads, int tasks, std::uint64_t random_state)
  {
    std::atomic<std::size_t> ooms{};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([this, t, tasks, random_state, &ooms] {
        graph_churn_thread(static_cast<std::uint64_t>(t), tasks, random_state, ooms);
      });
    }
    for (auto& th : pool) {
      th.join();
    }
    return ooms.load();
  }

  core_type& core() noexcept { return core_; }
  pool_log& log() noexcept { return *log_; }

  std::vector<std::string> violations()
  {
    std::lock_guard<std::mutex> lock(log_->mutex);
    return log_->violations;
  }

  /// Free blocks as (address, size, owner stream or 0 for shared), from the census.
  std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t>> free_blocks()
  {
    using rmm_fences::mr::detail::pool::block_place;
    std::vector<std::tuple<std::uintptr_t, std::size_t, std::uint64_t>> out;
    rmm_fences::mr::detail::pool::census(core_, [&](auto const& b) {
      if (b.place == block_place::live) { return; }
      auto const shared = b.place == block_place::shared || b.place == block_place::shared_fenced;
      out.emplace_back(reinterpret_cast<std::uintptr_t>(b.ptr), b.size, shared ? 0 : b.owner);
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

  /// One thread of `run_graph_churn`.
  void graph_churn_thread(std::uint64_t t,
                          int tasks,
                          std::uint64_t random_state,
                          std::atomic<std::size_t>& ooms)
  {
    std::mt19937_64 rng(random_state * 1000003 + t);
    std::uint64_t const lasting  = 1000 + t;
    std::uint64_t const capturer = 2000 + t;
    std::uint64_t const branch   = 3000 + t;
    std::uint64_t next_cid       = (t + 1) << 32;
    std::uint64_t next_stream    = (t + 1) << 40;
    std::vector<std::pair<void*, std::size_t>> held;
    std::vector<std::uint64_t> graphs;  // capture ids of graphs not yet destroyed
    auto size         = [&rng] { return churn_size(rng); };
    auto try_allocate = [&](std::uint64_t s, std::size_t n) {
      return allocate_or_count(s, n, ooms);
    };
    auto capture = [&] {
      auto const cid = next_cid++;
      begin_capture(capturer, cid, static_cast<int>(rng() % 3));
      bool const forked = rng() % 4 == 0;
      if (forked) { begin_capture(branch, cid, 0); }
      std::vector<std::pair<void*, std::size_t>> inside;
      for (std::uint64_t k = 0, n = 1 + rng() % 4; k < n; ++k) {
        auto const s = forked && rng() % 2 == 0 ? branch : capturer;
        auto const b = size();
        if (void* p = try_allocate(s, b); p != nullptr) { inside.emplace_back(p, b); }
      }
      for (auto const& [p, n] : inside) {
        if (rng() % 8 == 0) {
          held.emplace_back(p, n);  // outlives the capture: freed later outside it
        } else {
          deallocate_unchecked(forked && rng() % 2 == 0 ? branch : capturer, p, n);
        }
      }
      if (forked) { end_capture(branch); }
      end_capture(capturer);
      if (rng() % 8 == 0) {
        destroy_graph(cid);  // aborted: never instantiated
        return;
      }
      instantiate(cid);
      launch(cid);
      graphs.push_back(cid);
    };
    auto later = [&] {
      if (graphs.empty()) { return; }
      auto const k   = rng() % graphs.size();
      auto const cid = graphs[k];
      auto const r   = rng() % 4;
      if (r < 2) {
        launch(cid);
      } else if (r == 2) {
        if (rng() % 2 == 0) { instantiate(cid); }
        destroy_exec(cid);
      } else {
        destroy_graph(cid);
        while (destroy_exec(cid)) {}
        graphs[k] = graphs.back();
        graphs.pop_back();
      }
    };
    for (int i = 0; i < tasks; ++i) {
      auto const r = rng() % 16;
      if (r < 3) {
        capture();
      } else if (r < 7) {
        later();
      } else if (r < 10) {
        auto const n = size();
        if (void* p = try_allocate(lasting, n); p != nullptr) { held.emplace_back(p, n); }
      } else if (r < 12 && !held.empty()) {
        auto const k = rng() % held.size();
        auto const b = held[k];
        held[k]      = held.back();
        held.pop_back();
        deallocate_unchecked(lasting, b.first, b.second);
      } else if (r == 12) {
        auto const s = next_stream++;
        auto const n = size();
        if (void* p = try_allocate(s, n); p != nullptr) { deallocate_unchecked(s, p, n); }
      } else if (r == 13) {
        complete_all();
      } else if (r == 14 && rng() % 8 == 0) {
        release();
      } else if (r == 15 && rng() % 4 == 0) {
        static constexpr int kinds[] = {0, 1, 3, 4, 5};  // every fault but a device sync
        fail_next(kinds[rng() % 5], 1);
      }
    }
    for (auto const cid : graphs) {
      destroy_graph(cid);
      while (destroy_exec(cid)) {}
    }
    for (auto const& [p, n] : held) {
      deallocate_unchecked(lasting, p, n);
    }
  }

 private:
  /// A block size of the churn runs: mostly 256 B to 8 KiB, one in eight 16 KiB to 256 KiB.
  static std::size_t churn_size(std::mt19937_64& rng)
  { return (rng() % 8 == 0) ? (std::size_t{1} << (14 + rng() % 5)) : 256 * (1 + rng() % 32); }

  /// `allocate`, or nullptr with `ooms` counted when the pool is out of memory.
  void* allocate_or_count(std::uint64_t s, std::size_t n, std::atomic<std::size_t>& ooms)
  {
    try {
      return allocate(s, n, 256);
    } catch (pool_host_out_of_memory const&) {
      ++ooms;
      return nullptr;
    }
  }

  bool drop_graph(std::uint64_t cid, bool exec)
  {
    log_->tick();
    std::vector<std::pair<void (*)(void*), void*>> callbacks;
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      auto& g = log_->graphs[cid];
      if (exec ? g.execs == 0 : (!g.ended || g.destroyed)) { return false; }
      if (exec) {
        --g.execs;
      } else {
        g.destroyed = true;
      }
      callbacks = log_->release_if_gone(cid);
    }
    // As CUDA's user objects: the destructors run outside any call of the pool.
    for (auto const& [fn, ctx] : callbacks) {
      fn(ctx);
    }
    return true;
  }

  std::shared_ptr<pool_log> log_;
  core_type core_;
  std::uint64_t hook_free_clock_{};
  std::vector<growth_census> growths_;
};

}  // namespace rmm_fences::testing
