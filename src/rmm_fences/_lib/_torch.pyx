# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""The native half of :mod:`rmm_fences.allocators.torch` (_torch.hpp).

This extension module exports the C entry points that PyTorch's ``CUDAPluggableAllocator``
finds with ``ctypes.CDLL`` on this very file: ``rmm_fences_torch_alloc``,
``rmm_fences_torch_free`` and ``rmm_fences_torch_record_stream`` forward to one process-global
core, installed once by :func:`install_core` (``install()``); ``rmm_fences_torch_pool_alloc``
and ``rmm_fences_torch_pool_free`` (the segments of ``torch.cuda.MemPool``) forward to a
second one, the pool core, installed once by :func:`install_pool_core` (``mem_pool()``).
Neither is ever destroyed.
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
    void c_install_pool "rmm_fences::torch::install_pool"(
        optional[device_async_resource_ref] mr, int device) except +
    cbool c_is_pool_installed "rmm_fences::torch::is_pool_installed"()
    torch_allocator_stats c_pool_stats "rmm_fences::torch::pool_stats"() except +
    void c_reset_pool_peak "rmm_fences::torch::reset_pool_peak"() except +
    uintptr_t c_pool_alloc_address "rmm_fences::torch::pool_alloc_address"()
    uintptr_t c_pool_free_address "rmm_fences::torch::pool_free_address"()


#: The entry points' symbol names in this module.
ALLOC_FN = "rmm_fences_torch_alloc"
FREE_FN = "rmm_fences_torch_free"
RECORD_STREAM_FN = "rmm_fences_torch_record_stream"
POOL_ALLOC_FN = "rmm_fences_torch_pool_alloc"
POOL_FREE_FN = "rmm_fences_torch_pool_free"

# The installed resources, kept alive for the rest of the process: the cores refer to them.
_resource = None
_pool_resource = None


cdef optional[device_async_resource_ref] _ref(DeviceMemoryResource mr):
    cdef optional[device_async_resource_ref] ref
    if mr is not None:
        ref = mr.get_mr()
    return ref


def install_core(DeviceMemoryResource mr, int device) -> None:
    """Install the process-global core over ``mr`` (serving ``device`` only) or, with ``mr``
    None, over rmm's current resource of each device, looked up on every call.

    Once per process: RuntimeError on a second call. Makes no CUDA call.
    """
    global _resource
    try:
        c_install(_ref(mr), device)
    except Exception as e:  # std::logic_error arrives as RuntimeError
        raise RuntimeError(str(e)) from None
    _resource = mr


def install_pool_core(DeviceMemoryResource mr, int device) -> None:
    """Install the process-global pool core (the ``rmm_fences_torch_pool_*`` entry points)
    over ``mr`` (serving ``device`` only) or, with ``mr`` None, over rmm's current resource of
    each device, looked up on every call.

    Once per process, separate from :func:`install_core`: RuntimeError on a second call. Makes
    no CUDA call.
    """
    global _pool_resource
    try:
        c_install_pool(_ref(mr), device)
    except Exception as e:
        raise RuntimeError(str(e)) from None
    _pool_resource = mr


def is_pool_installed() -> bool:
    """Whether :func:`install_pool_core` ran in this process."""
    return c_is_pool_installed()


def is_installed() -> bool:
    """Whether :func:`install_core` ran in this process."""
    return c_is_installed()


def _check(cbool installed, str core, str installer):
    if not installed:
        raise RuntimeError(
            f"no rmm_fences torch {core} is installed in this process "
            f"(rmm_fences.allocators.torch.{installer}() installs one)")


def stats() -> dict:
    """The installed core's counters (RuntimeError when none is installed)."""
    _check(c_is_installed(), "allocator core", "install")
    return c_stats()


def reset_peak() -> None:
    """Restart the installed core's peaks from the current values."""
    _check(c_is_installed(), "allocator core", "install")
    c_reset_peak()


def pool_stats() -> dict:
    """The pool core's counters (RuntimeError when none is installed)."""
    _check(c_is_pool_installed(), "pool core", "mem_pool")
    return c_pool_stats()


def reset_pool_peak() -> None:
    """Restart the pool core's peaks from the current values."""
    _check(c_is_pool_installed(), "pool core", "mem_pool")
    c_reset_pool_peak()


def entry_points() -> dict:
    """The addresses of the five entry points: ``{"alloc": int, "free": int,
    "record_stream": int, "pool_alloc": int, "pool_free": int}`` (the same
    ``ctypes.CDLL(__file__)`` finds)."""
    return {
        "alloc": c_alloc_address(),
        "free": c_free_address(),
        "record_stream": c_record_stream_address(),
        "pool_alloc": c_pool_alloc_address(),
        "pool_free": c_pool_free_address(),
    }
