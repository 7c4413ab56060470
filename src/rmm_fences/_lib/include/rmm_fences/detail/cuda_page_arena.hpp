/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism (docs/design.md#layers, CUDA platforms): the stream-ordered pool's page arena
 * on one device (detail/pool/page_arena.hpp says what the pool asks of it). One virtual
 * address range is reserved at construction; each page of it is backed by a physical
 * allocation of its own (`cuMemCreate` of one page, `cuMemMap`), so that any page can be
 * unmapped alone (`cuMemUnmap` takes whole mappings). Unmapped pages stay allocated as spare
 * pages and back the next map; `trim` releases them. Every call comes under the pool's growth
 * lock; the byte counts are atomics so that statistics may read them at any time.
 */
#pragma once

#include <rmm_fences/detail/pool/remap_allowance.hpp>
#include <rmm_fences/detail/vmm_api.hpp>

#include <rmm/cuda_device.hpp>
#include <rmm/error.hpp>
#include <rmm/process_is_exiting.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rmm_fences::mr::detail {

/// Without `reserve_size`, a page arena reserves this many times the device's memory.
inline constexpr std::size_t page_arena_reserve_factor = 4;

class cuda_page_arena {
 public:
  /**
   * @param device the device whose memory backs the pages
   * @param reserve_size bytes of address space to reserve (empty: `page_arena_reserve_factor`
   * times the device's memory); the pool never grows past it
   * @param remap_time_fraction the share of its time the pool may spend moving pages
   * (detail/pool/remap_allowance.hpp)
   * @throws std::invalid_argument for a `remap_time_fraction` outside [0, 1],
   * std::runtime_error when the driver lacks the virtual memory API, or rmm::out_of_memory
   * when the reservation fails
   */
  cuda_page_arena(rmm::cuda_device_id device,
                  std::optional<std::size_t> reserve_size,
                  double remap_time_fraction = pool::default_remap_time_fraction)
    : remap_time_fraction_{pool::validated_remap_time_fraction(remap_time_fraction)},
      api_{vmm_api::for_device(device.value(), prop_, page_)},
      device_{device}
  {
    rmm::cuda_set_device_raii guard{device_};
    access_.location = prop_.location;
    access_.flags    = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    reserved_        = round_up(reserve_size.value_or(default_reserve()));
    CUdeviceptr base{};
    if (api_.address_reserve(&base, reserved_, page_, 0, 0) != CUDA_SUCCESS) {
      throw rmm::out_of_memory("vmm_pool: cuMemAddressReserve of " + std::to_string(reserved_) +
                               " bytes failed");
    }
    base_ = reinterpret_cast<char*>(base);
    handles_.assign(reserved_ / page_, 0);
  }

  cuda_page_arena(cuda_page_arena const&)            = delete;
  cuda_page_arena& operator=(cuda_page_arena const&) = delete;

  /// Frees the spare pages and gives the range back once no page is mapped. Pages the pool
  /// left mapped (those of a graph that may still replay: the pool forgets them at
  /// shutdown) stay mapped, with the range, for the graph's later launches. No CUDA call at
  /// process exit.
  ~cuda_page_arena()
  {
    if (rmm::process_is_exiting()) { return; }
    rmm::cuda_set_device_raii guard{device_};
    trim();
    if (mapped_.load(std::memory_order_relaxed) == 0) {
      (void)api_.address_free(device_ptr(base_), reserved_);
    }
  }

  [[nodiscard]] std::size_t page_size() const noexcept { return page_; }
  [[nodiscard]] char* base() const noexcept { return base_; }
  [[nodiscard]] std::size_t reserved() const noexcept { return reserved_; }
  [[nodiscard]] std::size_t physical_bytes() const noexcept
  { return mapped_.load(std::memory_order_relaxed) + spare_bytes(); }
  [[nodiscard]] std::size_t spare_bytes() const noexcept
  { return spare_count_.load(std::memory_order_relaxed) * page_; }
  [[nodiscard]] std::size_t peak_physical_bytes() const noexcept
  { return peak_.load(std::memory_order_relaxed); }
  [[nodiscard]] double remap_time_fraction() const noexcept { return remap_time_fraction_; }
  /// The clock that bounds the time the pool spends moving pages (steady, nanoseconds).
  [[nodiscard]] std::uint64_t now_ns() const noexcept
  {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
  }

  /**
   * @brief Backs the pages `[p, p + n)` of the range (spare pages first) and makes them
   * readable and writable by the device; on failure nothing stays mapped.
   * @throws rmm::out_of_memory when the device has no page left
   */
  void map(char* p, std::size_t n)
  {
    rmm::cuda_set_device_raii guard{device_};
    auto const first = index(p);
    auto const count = n / page_;
    std::size_t done = 0;
    for (; done < count; ++done) {
      auto const handle = take_page();
      if (handle == 0) { break; }
      if (api_.map(device_ptr(address(first + done)), page_, 0, handle, 0) != CUDA_SUCCESS) {
        put_spare(handle);
        break;
      }
      handles_[first + done] = handle;
    }
    if (done == count && api_.set_access(device_ptr(p), n, &access_, 1) == CUDA_SUCCESS) {
      mapped_.fetch_add(n, std::memory_order_relaxed);
      peak_.store(std::max(peak_.load(std::memory_order_relaxed), physical_bytes()),
                  std::memory_order_relaxed);  // under the growth's lock: one writer
      return;
    }
    unmap_pages(first, done);
    throw rmm::out_of_memory("vmm_pool: no device memory for " + std::to_string(n) +
                             " bytes of pages");
  }

  /// Unmaps the pages `[p, p + n)` at once (their work must be done); they become spare.
  void unmap(char* p, std::size_t n) noexcept
  {
    rmm::cuda_set_device_raii guard{device_};
    unmap_pages(index(p), n / page_);
    mapped_.fetch_sub(n, std::memory_order_relaxed);
  }

  /// Releases the spare pages to the device.
  void trim() noexcept
  {
    for (auto handle : spare_) {
      (void)api_.release(handle);
    }
    spare_.clear();
    spare_count_.store(0, std::memory_order_relaxed);
  }

 private:
  [[nodiscard]] std::size_t round_up(std::size_t n) const noexcept
  { return (n + page_ - 1) / page_ * page_; }

  [[nodiscard]] std::size_t default_reserve() const
  {
    std::size_t free_bytes{};
    std::size_t total_bytes{};
    RMM_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
    return page_arena_reserve_factor * total_bytes;
  }

  [[nodiscard]] std::size_t index(char* p) const noexcept
  { return static_cast<std::size_t>(p - base_) / page_; }
  [[nodiscard]] char* address(std::size_t k) const noexcept { return base_ + k * page_; }
  [[nodiscard]] static CUdeviceptr device_ptr(char* p) noexcept
  { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

  /// A spare page, else a new one; 0 when the device has none.
  CUmemGenericAllocationHandle take_page() noexcept
  {
    if (!spare_.empty()) {
      auto const handle = spare_.back();
      spare_.pop_back();
      spare_count_.fetch_sub(1, std::memory_order_relaxed);
      return handle;
    }
    CUmemGenericAllocationHandle handle{};
    if (api_.create(&handle, page_, &prop_, 0) != CUDA_SUCCESS) { return 0; }
    return handle;
  }

  /// Keeps `handle` as a spare page (released when no host memory lists it).
  void put_spare(CUmemGenericAllocationHandle handle) noexcept
  {
    try {
      spare_.push_back(handle);
      spare_count_.fetch_add(1, std::memory_order_relaxed);
    } catch (...) {
      (void)api_.release(handle);
    }
  }

  /// Unmaps `count` pages from page `first`; their handles become spare.
  void unmap_pages(std::size_t first, std::size_t count) noexcept
  {
    for (std::size_t k = first; k < first + count; ++k) {
      (void)api_.unmap(device_ptr(address(k)), page_);
      put_spare(handles_[k]);
      handles_[k] = 0;
    }
  }

  double remap_time_fraction_;
  // Before `api_`, whose initialization fills them (`vmm_api::for_device`).
  CUmemAllocationProp prop_{};
  std::size_t page_{};
  vmm_api const& api_;
  rmm::cuda_device_id device_;
  CUmemAccessDesc access_{};
  std::size_t reserved_{};
  char* base_{};
  std::vector<CUmemGenericAllocationHandle> handles_;  // page index -> its mapping (0: none)
  std::vector<CUmemGenericAllocationHandle> spare_;
  std::atomic<std::size_t> mapped_{};
  std::atomic<std::size_t> spare_count_{};
  std::atomic<std::size_t> peak_{};
};

}  // namespace rmm_fences::mr::detail
