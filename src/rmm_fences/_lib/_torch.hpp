/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// The CUDA side of rmm_fences.allocators.torch (the _torch extension): the platform and upstream
// of `torch_allocator_core`, two process-global cores (install()'s, and mem_pool()'s "pool
// core"), and the C entry points PyTorch's CUDAPluggableAllocator calls. Not a public header,
// and not installed with the package.
//
// Include it in one translation unit only: it defines the extern "C" entry points.

#include <rmm_fences/detail/cuda_events.hpp>
#include <rmm_fences/detail/driver_api.hpp>
#include <rmm_fences/detail/torch_allocator_core.hpp>
#include <rmm_fences/mr/stats.hpp>

#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rmm_fences::torch {

/**
 * @brief The core's CUDA platform: pooled events of the current device as fences.
 *
 * The entry points make the allocation's device current before calling the core, so a fence is
 * an event of the block's device. A stream of another device recorded on the block cannot take
 * such an event: the record fails and the core falls back to a host sync of that stream.
 * Event pools are made per device on first use and never destroyed (the core lives until the
 * process exits).
 */
class torch_cuda_platform : public rmm_fences::mr::detail::cuda_platform_base {
 public:
  using stream_type   = cuda::stream_ref;
  using out_of_memory = rmm::out_of_memory;

  /// An event and the device whose pool it returns to.
  struct fence_type {
    cudaEvent_t event{};
    int device{};
  };

  [[nodiscard]] fence_type acquire_fence()
  {
    rmm_fences::mr::detail::relaxed_capture_scope relaxed;
    auto const device = rmm::get_current_cuda_device().value();
    return {pool(device).acquire(), device};
  }

  void release_fence(fence_type f) noexcept
  {
    auto* p = find_pool(f.device);
    if (p != nullptr) {
      p->release(f.event);
    } else {
      (void)cudaEventDestroy(f.event);
    }
  }

  static bool record(fence_type f, cuda::stream_ref stream) noexcept
  { return cuda_platform_base::record(f.event, stream); }

  static bool device_wait(cuda::stream_ref waiter, fence_type f) noexcept
  { return cuda_platform_base::device_wait(waiter, f.event); }

 private:
  rmm_fences::mr::detail::event_pool& pool(int device)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device < 0) { throw std::invalid_argument("rmm_fences torch allocator: no device"); }
    if (static_cast<std::size_t>(device) >= pools_.size()) {
      pools_.resize(static_cast<std::size_t>(device) + 1);
    }
    auto& p = pools_[static_cast<std::size_t>(device)];
    if (!p) {
      p = std::make_unique<rmm_fences::mr::detail::event_pool>(rmm::cuda_device_id{device});
    }
    return *p;
  }

  rmm_fences::mr::detail::event_pool* find_pool(int device) noexcept
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device < 0 || static_cast<std::size_t>(device) >= pools_.size()) { return nullptr; }
    return pools_[static_cast<std::size_t>(device)].get();
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<rmm_fences::mr::detail::event_pool>> pools_;
};

/**
 * @brief The core's upstream: a given resource, or rmm's resource of the current device looked
 * up on every call (as rmm's own `rmm_torch_allocator` does).
 *
 * With the per-device lookup, a block goes back to the resource current at its free: change
 * rmm's resource of a device only while PyTorch holds no block of it.
 */
class torch_upstream {
 public:
  explicit torch_upstream(std::optional<rmm::device_async_resource_ref> mr) : mr_{mr} {}

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment)
  { return resource().allocate(stream, bytes, alignment); }

  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment) noexcept
  {
    try {
      resource().deallocate(stream, ptr, bytes, alignment);
    } catch (std::exception const& e) {
      std::fprintf(stderr,
                   "rmm_fences: torch allocator could not free %p (%zu bytes): %s; the block is "
                   "leaked\n",
                   ptr,
                   bytes,
                   e.what());
    } catch (...) {
    }
  }

 private:
  [[nodiscard]] rmm::device_async_resource_ref resource() const
  {
    if (mr_.has_value()) { return *mr_; }
    return rmm::mr::get_per_device_resource_ref(rmm::get_current_cuda_device());
  }

  std::optional<rmm::device_async_resource_ref> mr_;
};

using core_type = rmm_fences::mr::detail::torch_allocator_core<torch_cuda_platform, torch_upstream>;
static_assert(core_type::alignment == rmm::CUDA_ALLOCATION_ALIGNMENT);

/// The installed core and the device it serves (-1: every device, rmm's resource of each).
struct installation {
  installation(std::optional<rmm::device_async_resource_ref> mr, int device)
    : core{torch_upstream{mr}}, device{device}
  {
  }
  core_type core;
  int device;
};

/// The process-global installation of install(); never destroyed (PyTorch may free tensors at
/// teardown).
inline std::atomic<installation*>& installed() noexcept
{
  static std::atomic<installation*> instance{nullptr};
  return instance;
}

/// The process-global installation of mem_pool() (the pool core, a second core over its own
/// resource); never destroyed either (a MemPool may release its segments at teardown).
inline std::atomic<installation*>& pool_installed() noexcept
{
  static std::atomic<installation*> instance{nullptr};
  return instance;
}

/**
 * @brief Installs a process-global core in `slot` over `mr` (serving `device` only) or, when
 * `mr` is empty, over rmm's resource of each device (`device` is then ignored). Once per slot
 * and process: the caller keeps `mr`'s resource alive for the rest of the process.
 */
inline void install_in(std::atomic<installation*>& slot,
                       std::optional<rmm::device_async_resource_ref> mr,
                       int device,
                       char const* already)
{
  auto owned             = std::make_unique<installation>(mr, mr.has_value() ? device : -1);
  installation* expected = nullptr;
  if (!slot.compare_exchange_strong(expected, owned.get())) { throw std::logic_error(already); }
  (void)owned.release();  // leaked on purpose: lives until the process exits
}

/// install()'s core.
inline void install(std::optional<rmm::device_async_resource_ref> mr, int device)
{ install_in(installed(), mr, device, "rmm_fences torch allocator: a core is already installed"); }

/// mem_pool()'s core (the pool core).
inline void install_pool(std::optional<rmm::device_async_resource_ref> mr, int device)
{
  install_in(
    pool_installed(), mr, device, "rmm_fences torch allocator: a pool core is already installed");
}

[[nodiscard]] inline bool is_installed() noexcept { return installed().load() != nullptr; }

[[nodiscard]] inline bool is_pool_installed() noexcept
{ return pool_installed().load() != nullptr; }

/// The installation in `slot`; std::logic_error with `missing` when there is none.
inline installation& installed_in(std::atomic<installation*>& slot, char const* missing)
{
  auto* i = slot.load();
  if (i == nullptr) { throw std::logic_error(missing); }
  return *i;
}

inline installation& current()
{
  return installed_in(
    installed(),
    "rmm_fences torch allocator: PyTorch asked for memory but no resource is installed; call "
    "rmm_fences.allocators.torch.install() before the first CUDA allocation");
}

inline installation& current_pool()
{
  return installed_in(
    pool_installed(),
    "rmm_fences torch allocator: a MemPool asked for memory but no pool core is installed "
    "(rmm_fences.allocators.torch.mem_pool() installs it)");
}

/// Throws unless `inst` serves `device`.
inline void check_device(installation const& inst, int device)
{
  if (inst.device >= 0 && device != inst.device) {
    throw std::invalid_argument("rmm_fences torch allocator: set up for device " +
                                std::to_string(inst.device) + ", asked for memory of device " +
                                std::to_string(device) +
                                "; mr=None serves every device from rmm's resource");
  }
}

/// `inst`'s free of a block PyTorch hands back on `device`; never throws. A null free is a
/// no-op.
inline void free_block(
  installation* inst, void* ptr, std::size_t size, int device, void* stream) noexcept
{
  if (ptr == nullptr) { return; }
  if (inst == nullptr) {
    std::fprintf(stderr,
                 "rmm_fences: torch allocator asked to free %p (%zu bytes) with no resource "
                 "installed; nothing was freed\n",
                 ptr,
                 size);
    return;
  }
  try {
    rmm::cuda_set_device_raii with_device{rmm::cuda_device_id{device}};
    inst->core.deallocate(ptr, size, cuda::stream_ref{static_cast<cudaStream_t>(stream)});
  } catch (std::exception const& e) {
    std::fprintf(stderr,
                 "rmm_fences: torch allocator could not free %p (%zu bytes): %s; the block is "
                 "leaked\n",
                 ptr,
                 size,
                 e.what());
  } catch (...) {
  }
}

inline rmm_fences::mr::torch_allocator_stats stats() { return current().core.stats(); }

inline void reset_peak() { current().core.reset_peak(); }

inline rmm_fences::mr::torch_allocator_stats pool_stats() { return current_pool().core.stats(); }

inline void reset_pool_peak() { current_pool().core.reset_peak(); }

}  // namespace rmm_fences::torch

// The entry points PyTorch calls (CUDAPluggableAllocator, set_record_stream_fn), found by
// ctypes.CDLL on this extension module. The stream is a cudaStream_t passed as void* (the ABI
// of PyTorch's CUstream_st*, as rmm's _torch_allocator.cpp declares it).
#define RMM_FENCES_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

/// `void* alloc(size_t size, int device, cudaStream_t stream)`; throws on failure (PyTorch
/// raises RuntimeError), std::logic_error when nothing is installed.
RMM_FENCES_TORCH_EXPORT void* rmm_fences_torch_alloc(std::size_t size, int device, void* stream)
{
  auto& inst = rmm_fences::torch::current();
  rmm_fences::torch::check_device(inst, device);
  rmm::cuda_set_device_raii with_device{rmm::cuda_device_id{device}};
  return inst.core.allocate(cuda::stream_ref{static_cast<cudaStream_t>(stream)}, size);
}

/// `void free(void* ptr, size_t size, int device, cudaStream_t stream)`: size, device and stream
/// of the allocation. Never throws.
RMM_FENCES_TORCH_EXPORT void rmm_fences_torch_free(void* ptr,
                                                   std::size_t size,
                                                   int device,
                                                   void* stream)
{ rmm_fences::torch::free_block(rmm_fences::torch::installed().load(), ptr, size, device, stream); }

/// The MemPool route's `void* alloc(size_t size, int device, cudaStream_t stream)`, called by
/// PyTorch's native caching allocator for a new segment of a MemPool (raw_alloc). Never
/// throws: nullptr on out of memory (PyTorch frees its cache, retries, then raises
/// torch.cuda.OutOfMemoryError), and nullptr plus one line on stderr on any other failure
/// (PyTorch reports that as out of memory too).
RMM_FENCES_TORCH_EXPORT void* rmm_fences_torch_pool_alloc(std::size_t size,
                                                          int device,
                                                          void* stream) noexcept
{
  try {
    auto& inst = rmm_fences::torch::current_pool();
    rmm_fences::torch::check_device(inst, device);
    rmm::cuda_set_device_raii with_device{rmm::cuda_device_id{device}};
    return inst.core.try_allocate(cuda::stream_ref{static_cast<cudaStream_t>(stream)}, size);
  } catch (std::exception const& e) {
    std::fprintf(stderr,
                 "rmm_fences: torch mem_pool could not allocate %zu bytes on device %d: %s; "
                 "PyTorch sees it as out of memory\n",
                 size,
                 device,
                 e.what());
  } catch (...) {
    std::fprintf(stderr,
                 "rmm_fences: torch mem_pool could not allocate %zu bytes on device %d (unknown "
                 "exception); PyTorch sees it as out of memory\n",
                 size,
                 device);
  }
  return nullptr;
}

/// The MemPool route's `void free(void* ptr, size_t size, int device, cudaStream_t stream)`
/// (raw_delete of a segment: size, device and stream of its allocation). Never throws.
RMM_FENCES_TORCH_EXPORT void rmm_fences_torch_pool_free(void* ptr,
                                                        std::size_t size,
                                                        int device,
                                                        void* stream) noexcept
{
  rmm_fences::torch::free_block(
    rmm_fences::torch::pool_installed().load(), ptr, size, device, stream);
}

/// `void record_stream(void* ptr, cudaStream_t stream)` (Tensor.record_stream); `ptr` is what
/// `rmm_fences_torch_alloc` returned. Ignored when nothing is installed.
RMM_FENCES_TORCH_EXPORT void rmm_fences_torch_record_stream(void* ptr, void* stream)
{
  if (auto* inst = rmm_fences::torch::installed().load(); inst != nullptr) {
    (void)inst->core.record_stream(ptr, cuda::stream_ref{static_cast<cudaStream_t>(stream)});
  }
}

/// The entry points' addresses (what ctypes finds in this module), for the binding.
namespace rmm_fences::torch {
inline std::uintptr_t alloc_address() noexcept
{ return reinterpret_cast<std::uintptr_t>(&rmm_fences_torch_alloc); }
inline std::uintptr_t free_address() noexcept
{ return reinterpret_cast<std::uintptr_t>(&rmm_fences_torch_free); }
inline std::uintptr_t record_stream_address() noexcept
{ return reinterpret_cast<std::uintptr_t>(&rmm_fences_torch_record_stream); }
inline std::uintptr_t pool_alloc_address() noexcept
{ return reinterpret_cast<std::uintptr_t>(&rmm_fences_torch_pool_alloc); }
inline std::uintptr_t pool_free_address() noexcept
{ return reinterpret_cast<std::uintptr_t>(&rmm_fences_torch_pool_free); }
}  // namespace rmm_fences::torch
