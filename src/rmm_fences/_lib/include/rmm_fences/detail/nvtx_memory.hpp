/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism (docs/design.md#layers, CUDA platforms): NVTX memory annotations, so that
 * compute-sanitizer's memcheck checks accesses inside sub-allocations of a pool.
 *
 * Each allocation is registered as a region of a sub-allocator heap. The heap is the device
 * allocation that contains it (`cuMemGetAddressRange`: a pool's chunk), registered the first
 * time a live block lies in it and unregistered when its last live block is freed, so memory
 * the upstream gives back never stays marked. Without a tool attached the first heap
 * registration returns no handle and nothing is called after it.
 */
#pragma once

#include <rmm_fences/detail/driver_api.hpp>

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace rmm_fences::mr::detail {

/// Not thread-safe: the caller serializes (the tracker calls it under its lock).
class nvtx_memory_annotator {
 public:
  explicit nvtx_memory_annotator(bool enabled) noexcept : enabled_{enabled} {}

  nvtx_memory_annotator(nvtx_memory_annotator const&)            = delete;
  nvtx_memory_annotator& operator=(nvtx_memory_annotator const&) = delete;

  ~nvtx_memory_annotator() = default;

  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  /// Whether a tool took the annotations (known after the first allocation).
  [[nodiscard]] bool tool_attached() const noexcept { return tool_attached_; }

  void on_allocate(void* ptr, std::size_t bytes) noexcept
  {
    if (!enabled_ || bytes == 0) { return; }
    if (!initialized_) {
      initialized_ = true;
      domain_      = nvtxDomainCreateA("rmm_fences");  // null (the default domain) is valid
    }
    auto const range = driver_api::get().mem_get_address_range;
    if (range == nullptr) {
      enabled_ = false;
      return;
    }
    CUdeviceptr base{};
    std::size_t size{};
    if (range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) { return; }
    try {
      auto& heap = heaps_[base];
      if (heap.handle == nullptr) {
        nvtxMemVirtualRangeDesc_t desc{size, reinterpret_cast<void const*>(base)};
        nvtxMemHeapDesc_t heap_desc{};
        heap_desc.extCompatID          = NVTX_EXT_COMPATID_MEM;
        heap_desc.structSize           = sizeof(heap_desc);
        heap_desc.usage                = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
        heap_desc.type                 = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
        heap_desc.typeSpecificDescSize = sizeof(desc);
        heap_desc.typeSpecificDesc     = &desc;
        heap.handle                    = nvtxMemHeapRegister(domain_, &heap_desc);
        // No tool: NVTX's stub returns null (NVTX_MEM_HEAP_HANDLE_NO_TOOL, -1, is documented)
        if (heap.handle == nullptr || reinterpret_cast<std::intptr_t>(heap.handle) == -1) {
          heaps_.erase(base);
          enabled_ = false;  // no tool attached: annotations cost nothing from now on
          return;
        }
        tool_attached_ = true;
      }
      heap.live += 1;
      regions_[reinterpret_cast<std::uintptr_t>(ptr)] = base;
      nvtxMemVirtualRangeDesc_t region{bytes, ptr};
      nvtxMemRegionsRegisterBatch_t batch{};
      batch.extCompatID           = NVTX_EXT_COMPATID_MEM;
      batch.structSize            = sizeof(batch);
      batch.regionType            = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
      batch.heap                  = heap.handle;
      batch.regionCount           = 1;
      batch.regionDescElementSize = sizeof(region);
      batch.regionDescElements    = &region;
      nvtxMemRegionsRegister(domain_, &batch);
    } catch (...) {
      // out of host memory: this block goes unannotated
    }
  }

  void on_free(void* ptr) noexcept
  {
    if (!enabled_) { return; }
    auto const region = regions_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (region == regions_.end()) { return; }
    nvtxMemRegionRef_t ref{};
    ref.pointer = ptr;
    nvtxMemRegionsUnregisterBatch_t batch{};
    batch.extCompatID    = NVTX_EXT_COMPATID_MEM;
    batch.structSize     = sizeof(batch);
    batch.refType        = NVTX_MEM_REGION_REF_TYPE_POINTER;
    batch.refCount       = 1;
    batch.refElementSize = sizeof(ref);
    batch.refElements    = &ref;
    nvtxMemRegionsUnregister(domain_, &batch);
    auto const heap = heaps_.find(region->second);
    regions_.erase(region);
    if (heap != heaps_.end() && --heap->second.live == 0) {
      nvtxMemHeapUnregister(domain_, heap->second.handle);
      heaps_.erase(heap);
    }
  }

 private:
  struct heap_entry {
    nvtxMemHeapHandle_t handle{};
    std::size_t live{};
  };

  bool enabled_;
  bool initialized_{};
  bool tool_attached_{};
  nvtxDomainHandle_t domain_{};
  std::unordered_map<CUdeviceptr, heap_entry> heaps_;
  std::unordered_map<std::uintptr_t, CUdeviceptr> regions_;
};

}  // namespace rmm_fences::mr::detail
