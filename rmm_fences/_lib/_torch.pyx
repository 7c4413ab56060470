# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""The native half of :mod:`rmm_fences.allocators.torch` (_torch.hpp).

This extension module exports the C entry points that PyTorch's ``CUDAPluggableAllocator``
finds with ``ctypes.CDLL`` on this very file: ``rmm_fences_torch_alloc``,
``rmm_fences_torch_free`` and ``rmm_fences_torch_record_stream``. They forward to one
process-global core, installed once by :func:`install_core` and never destroyed.
"""

from libc.stdint cimport uintptr_t
from libcpp cimport bool as cbool
from libcpp.optional cimport optional

from rmm.librmm.memory_resource cimport device_async_resource_ref
from rmm.pylibrmm.memory_resource._memory_resource cimport DeviceMemoryResource

from rmm_fences._lib._cores cimport torch_allocator_stats


cdef extern from "_torch.hpp" namespace "rmm_fences::torch" nogil:
    void c_install "rmm_fences::torch::install"(
        optional[device_async_resource_ref] mr, int device) except +
    cbool c_is_installed "rmm_fences::torch::is_installed"()
    torch_allocator_stats c_stats "rmm_fences::torch::stats"() except +
    void c_reset_peak "rmm_fences::torch::reset_peak"() except +
    uintptr_t c_alloc_address "rmm_fences::torch::alloc_address"()
    uintptr_t c_free_address "rmm_fences::torch::free_address"()
    uintptr_t c_record_stream_address "rmm_fences::torch::record_stream_address"()


#: The entry points' symbol names in this module.
ALLOC_FN = "rmm_fences_torch_alloc"
FREE_FN = "rmm_fences_torch_free"
RECORD_STREAM_FN = "rmm_fences_torch_record_stream"

# The installed resource, kept alive for the rest of the process: the core refers to it.
_resource = None


def install_core(DeviceMemoryResource mr, int device) -> None:
    """Install the process-global core over ``mr`` (serving ``device`` only) or, with ``mr``
    None, over rmm's current resource of each device, looked up on every call.

    Once per process: RuntimeError on a second call. Makes no CUDA call.
    """
    global _resource
    cdef optional[device_async_resource_ref] ref
    if mr is not None:
        ref = mr.get_mr()
    try:
        c_install(ref, device)
    except Exception as e:  # std::logic_error arrives as RuntimeError
        raise RuntimeError(str(e)) from None
    _resource = mr


def is_installed() -> bool:
    """Whether :func:`install_core` ran in this process."""
    return c_is_installed()


def _check_installed():
    if not c_is_installed():
        raise RuntimeError(
            "no rmm_fences torch allocator core is installed in this process "
            "(rmm_fences.allocators.torch.install() installs one)")


def stats() -> dict:
    """The installed core's counters (RuntimeError when none is installed)."""
    _check_installed()
    return c_stats()


def reset_peak() -> None:
    """Restart the installed core's peaks from the current values."""
    _check_installed()
    c_reset_peak()


def entry_points() -> dict:
    """The addresses of the three entry points: ``{"alloc": int, "free": int,
    "record_stream": int}`` (the same ``ctypes.CDLL(__file__)`` finds)."""
    return {
        "alloc": c_alloc_address(),
        "free": c_free_address(),
        "record_stream": c_record_stream_address(),
    }
