/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * CUDA mechanism (docs/design.md#layers, CUDA platforms): the driver's virtual memory management
 * entry points, obtained through the runtime (no link against libcuda at build time).
 */
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>

namespace rmm_fences::mr::detail {

/// The VMM entry points; `complete()` is false where the driver lacks one.
struct vmm_api {
  CUresult (*address_reserve)(
    CUdeviceptr*, std::size_t, std::size_t, CUdeviceptr, unsigned long long){};
  CUresult (*address_free)(CUdeviceptr, std::size_t){};
  CUresult (*create)(CUmemGenericAllocationHandle*,
                     std::size_t,
                     CUmemAllocationProp const*,
                     unsigned long long){};
  CUresult (*release)(CUmemGenericAllocationHandle){};
  CUresult (*map)(
    CUdeviceptr, std::size_t, std::size_t, CUmemGenericAllocationHandle, unsigned long long){};
  CUresult (*unmap)(CUdeviceptr, std::size_t){};
  CUresult (*set_access)(CUdeviceptr, std::size_t, CUmemAccessDesc const*, std::size_t){};
  CUresult (*granularity)(std::size_t*,
                          CUmemAllocationProp const*,
                          CUmemAllocationGranularity_flags){};

  [[nodiscard]] bool complete() const noexcept
  {
    return address_reserve && address_free && create && release && map && unmap && set_access &&
           granularity;
  }

  static vmm_api const& get() noexcept
  {
    static vmm_api const api = load();
    return api;
  }

  /// The driver's API, when complete (std::runtime_error otherwise), with the properties of
  /// pinned memory on `device` and its minimum allocation granularity (the page size).
  static vmm_api const& for_device(int device, CUmemAllocationProp& prop, std::size_t& page)
  {
    auto const& api = get();
    if (!api.complete()) {
      throw std::runtime_error("the CUDA driver does not provide the virtual memory API");
    }
    prop               = CUmemAllocationProp{};
    prop.type          = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id   = device;
    if (api.granularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        page == 0) {
      throw std::runtime_error("cuMemGetAllocationGranularity failed");
    }
    return api;
  }

 private:
  template <typename Fn>
  static void entry(Fn& fn, char const* name) noexcept
  {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) ==
          cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<Fn>(p);
    } else {
      (void)cudaGetLastError();
    }
  }

  static vmm_api load() noexcept
  {
    vmm_api api;
    entry(api.address_reserve, "cuMemAddressReserve");
    entry(api.address_free, "cuMemAddressFree");
    entry(api.create, "cuMemCreate");
    entry(api.release, "cuMemRelease");
    entry(api.map, "cuMemMap");
    entry(api.unmap, "cuMemUnmap");
    entry(api.set_access, "cuMemSetAccess");
    entry(api.granularity, "cuMemGetAllocationGranularity");
    return api;
  }
};

}  // namespace rmm_fences::mr::detail
