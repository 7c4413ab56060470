# SPDX-License-Identifier: Apache-2.0
# UnmappingVmmMemoryResource: included by memory_resource.pyx (one extension module).

from rmm.librmm.per_device_resource cimport cuda_device_id


cdef extern from "rmm_fences/unmapping_vmm_memory_resource.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass unmapping_vmm_memory_resource_impl \
            "rmm_fences::mr::detail::unmapping_vmm_memory_resource_impl":
        size_t granularity()
        size_t reserve_size()
        size_t mapped_bytes() except +

    cdef cppclass unmapping_vmm_memory_resource:
        unmapping_vmm_memory_resource(size_t reserve_size, cuda_device_id device) except +
        unmapping_vmm_memory_resource_impl& get()


cdef extern from *:
    optional[device_async_resource_ref] make_device_async_resource_ref(
        unmapping_vmm_memory_resource&) except +


cdef class _UnmappingVmmMemoryResource(DeviceMemoryResource):
    cdef unique_ptr[unmapping_vmm_memory_resource] c_obj
    cdef readonly int device

    def __cinit__(self, size_t reserve_size, int device):
        self.device = device
        with nogil:
            self.c_obj.reset(new unmapping_vmm_memory_resource(
                reserve_size, cuda_device_id(device)))
        self.c_ref = make_device_async_resource_ref(deref(self.c_obj))

    @property
    def granularity(self) -> int:
        """The device's allocation granularity: every block is a multiple of it."""
        return deref(self.c_obj).get().granularity()

    @property
    def reserve_size(self) -> int:
        """Bytes of virtual address range reserved at construction."""
        return deref(self.c_obj).get().reserve_size()

    @property
    def mapped_bytes(self) -> int:
        """Bytes of physical memory mapped now (live blocks, rounded to the granularity)."""
        return deref(self.c_obj).get().mapped_bytes()


class UnmappingVmmMemoryResource(_UnmappingVmmMemoryResource):
    """UNSAFE ON PURPOSE: CUDA virtual memory whose free unmaps the physical memory at once.

    Reserves one virtual address range at construction (``cuMemAddressReserve``); each
    allocation takes a piece of it, in multiples of the device's allocation granularity, and
    maps fresh physical memory there (``cuMemCreate``, ``cuMemMap``, ``cuMemSetAccess``). A
    free unmaps and releases that memory at once and keeps the range, so a kernel still
    reading the block faults: illegal address (error 700), and the CUDA context is lost.
    Wrap it in ``SyncOnFreeResourceAdaptor(mr, mode="deferred")`` to make it safe.

    Parameters
    ----------
    reserve_size : int or str
        Virtual address range reserved once (``"64GiB"`` accepted; default 64 GiB). Costs no
        physical memory.
    device : int, optional
        The device whose memory backs the allocations (default: the current device).

    Raises
    ------
    MemoryError
        From ``allocate`` when the range or the device's memory is exhausted.
    """

    def __new__(cls, reserve_size="64GiB", device=None):
        nbytes = parse_bytes(reserve_size, "reserve_size")
        if nbytes == 0:
            raise ValueError("reserve_size must be positive, got 0")
        if device is None:
            from rmm_fences._cuda import current_device

            device = current_device()
        elif not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValueError(f"device must be None or a device ordinal >= 0, got {device!r}")
        return super().__new__(cls, nbytes, device)

    def __init__(self, reserve_size="64GiB", device=None):
        pass

    def __repr__(self):
        return (f"{type(self).__name__}(reserve_size={self.reserve_size}, "
                f"device={self.device})")
