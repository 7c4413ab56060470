/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * An allocation that fails because this process has no usable GPU says so.
 *
 * rmm's resources report any failed cudaMalloc as `rmm::bad_alloc` (`MemoryError` in Python),
 * also when the cause is no NVIDIA driver, a driver too old for the CUDA runtime, or no device:
 * that reads as out of memory. The resources of rmm_fences rethrow such a failure as
 * `no_usable_gpu`, an `rmm::cuda_error` (a `std::runtime_error`: `RuntimeError` in Python)
 * that names what is missing. A CUDA call of the resource itself that fails for the same
 * reason (`rmm::cuda_error`, already a `RuntimeError`) gets the same message. Out of memory
 * (`rmm::out_of_memory`) and every failure on a machine with a usable GPU pass through
 * unchanged.
 */
#pragma once

#include <rmm/error.hpp>

#include <cuda_runtime_api.h>

#include <string>

namespace rmm_fences::mr::detail {

/// What `cudaGetDeviceCount` says is missing (no driver, too old a driver, no device), or
/// nullptr when a GPU is usable. `status` is set to the CUDA error that says so.
inline char const* missing_gpu(cudaError_t& status) noexcept
{
  int count = 0;
  status    = cudaGetDeviceCount(&count);
  switch (status) {
    case cudaSuccess:
      if (count > 0) { return nullptr; }
      status = cudaErrorNoDevice;
      return "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES)";
    case cudaErrorNoDevice:
      return "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES)";
    case cudaErrorInsufficientDriver:
      return "no NVIDIA driver was found, or it is older than this CUDA runtime";
    case cudaErrorStubLibrary:
      return "the CUDA driver library found is a stub, not an NVIDIA driver";
    case cudaErrorSystemDriverMismatch:
      return "the NVIDIA kernel driver and the user-mode driver differ in version";
    case cudaErrorCompatNotSupportedOnDevice:
      return "the CUDA forward-compatibility driver does not support this GPU";
    case cudaErrorDevicesUnavailable:
      return "every CUDA device is busy or unavailable (exclusive compute mode)";
    case cudaErrorSystemNotReady:
      return "the NVIDIA driver is not ready (fabric manager or persistence daemon)";
    default: return nullptr;  // a GPU may be usable: the original error stands
  }
}

/// The error of an allocation that failed for want of a usable GPU (a `std::runtime_error`).
struct no_usable_gpu : rmm::cuda_error {
  using rmm::cuda_error::cuda_error;
};

/**
 * @brief Rethrows the exception being handled; an `rmm::bad_alloc` that is not out of memory,
 * or an `rmm::cuda_error`, thrown where no GPU is usable becomes `no_usable_gpu` naming what is
 * missing (once: an upstream's `no_usable_gpu` passes through).
 *
 * Call only inside a `catch` block of an allocation by `resource` (its Python name).
 */
[[noreturn]] inline void rethrow_allocation_error(char const* resource)
{
  auto explain = [resource](char const* what) {
    cudaError_t status{};
    char const* missing = missing_gpu(status);
    if (missing == nullptr) { return; }
    throw no_usable_gpu{std::string{resource} + ": no usable GPU: " + missing + " (" +
                        cudaGetErrorName(status) + ": " + cudaGetErrorString(status) +
                        "); the allocation failed with: " + what};
  };
  try {
    throw;
  } catch (rmm::out_of_memory const&) {
    throw;
  } catch (no_usable_gpu const&) {
    throw;
  } catch (rmm::bad_alloc const& e) {
    explain(e.what());
    throw;
  } catch (rmm::cuda_error const& e) {
    explain(e.what());
    throw;
  }
}

}  // namespace rmm_fences::mr::detail
