# SPDX-License-Identifier: Apache-2.0
# cython: language_level=3
"""The C++ side of rmm_fences.memory_resource: the public resource classes of
include/rmm_fences/*.hpp (``rmm_fences::mr``), as rmm's librmm/memory_resource.pxd declares
rmm's. The bindings call only these classes; the policy cores' enums and structs come from
_cores.pxd (host-only headers, shared with the host test harness).
"""

from libc.stddef cimport size_t
from libc.stdint cimport uint64_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.optional cimport optional
from libcpp.pair cimport pair
from libcpp.string cimport string
from libcpp.vector cimport vector

from rmm.librmm.cuda_stream_ref cimport stream_ref
from rmm.librmm.memory_resource cimport (
    any_resource,
    device_accessible,
    device_async_resource_ref,
)
from rmm.librmm.per_device_resource cimport cuda_device_id
from rmm.pylibrmm.stream cimport Stream

from rmm_fences._lib._cores cimport (
    allocation_record,
    free_result,
    hazard_record,
    hazard_tracker_stats,
    stream_ordered_pool_stats,
    sync_mode,
    sync_on_free_stats,
)


cdef extern from "rmm/aligned.hpp" namespace "rmm" nogil:
    const size_t CUDA_ALLOCATION_ALIGNMENT


ctypedef void (*hazard_hook_fn)(const hazard_record&, void*) noexcept
ctypedef cbool (*python_stack_fn)(string&) noexcept


cdef extern from "rmm_fences/sync_on_free_resource_adaptor.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass sync_on_free_resource_adaptor:
        sync_on_free_resource_adaptor(
            any_resource[device_accessible] upstream,
            sync_mode mode,
            optional[size_t] max_pending_bytes,
            size_t max_batch_frees,
            optional[size_t] max_batch_bytes,
            cbool reuse_on_stream,
        ) except +
        void* allocate(stream_ref stream, size_t nbytes, size_t alignment) except +
        free_result deallocate_checked(stream_ref stream, void* ptr, size_t nbytes) noexcept
        void flush() except +
        size_t max_batch_frees() noexcept
        optional[size_t] max_batch_bytes() noexcept
        cbool reuse_on_stream() noexcept
        size_t pending_bytes() except +
        size_t pending_count() except +
        sync_on_free_stats stats() except +


cdef extern from "rmm_fences/naive_caching_memory_resource.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass naive_caching_memory_resource:
        naive_caching_memory_resource(any_resource[device_accessible] upstream) except +
        void release()
        size_t cached_bytes() except +
        uint64_t hits() except +
        uint64_t misses() except +


cdef extern from "rmm_fences/stream_ordered_pool_memory_resource.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass device_pages_tag "rmm_fences::mr::detail::device_pages_tag":
        device_pages_tag()

    cdef cppclass stream_ordered_pool_memory_resource:
        stream_ordered_pool_memory_resource(
            any_resource[device_accessible] upstream,
            size_t initial_pool_size,
            optional[size_t] maximum_pool_size,
            optional[size_t] maximum_growth_size,
        ) except +
        stream_ordered_pool_memory_resource(
            device_pages_tag,
            size_t initial_pool_size,
            optional[size_t] maximum_pool_size,
            optional[size_t] reserve_size,
            double remap_time_fraction,
        ) except +
        size_t physical_bytes()
        void* try_allocate_cached(stream_ref stream, size_t nbytes) except +
        void* allocate(stream_ref stream, size_t nbytes, size_t alignment) except +
        int deallocate_checked(stream_ref stream, void* ptr, size_t nbytes,
                               size_t* allocated_bytes) noexcept
        void retire_stream(stream_ref stream) except +
        size_t release() except +
        cbool synchronize_and_reclaim() except +
        size_t pool_size()
        stream_ordered_pool_stats stats()


cdef extern from "rmm_fences/hazard_tracking_resource_adaptor.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass hazard_tracking_resource_adaptor:
        hazard_tracking_resource_adaptor(
            any_resource[device_accessible] upstream,
            cbool upstream_stream_ordered,
            cbool nvtx,
        ) except +
        void* allocate_checked(stream_ref stream, size_t nbytes, size_t alignment,
                               hazard_record* stopped) except +
        cbool deallocate_checked(stream_ref stream, void* ptr, size_t nbytes, size_t alignment,
                                 hazard_record* stopped) except +
        cbool record_stream(void* ptr, stream_ref stream) except +
        void poll() except +
        vector[allocation_record] outstanding() except +
        vector[hazard_record] hazards() except +
        void reset() except +
        hazard_tracker_stats stats() except +
        vector[pair[uintptr_t, size_t]] stream_bytes() except +
        size_t pending_checks() except +
        void set_hazard_hook(hazard_hook_fn hook, void* context)
        void set_capture_stacks(cbool on, python_stack_fn python)
        cbool nvtx_active()


cdef extern from "rmm_fences/unmapping_vmm_memory_resource.hpp" \
        namespace "rmm_fences::mr" nogil:
    cdef cppclass unmapping_vmm_memory_resource:
        unmapping_vmm_memory_resource(size_t reserve_size, cuda_device_id device) except +
        size_t granularity()
        size_t reserve_size()
        size_t mapped_bytes() except +


# rmm declares the template of make_device_async_resource_ref (librmm/memory_resource.pxd);
# these are its overloads for our resources.
cdef extern from *:
    optional[device_async_resource_ref] make_device_async_resource_ref(
        sync_on_free_resource_adaptor&) except +
    optional[device_async_resource_ref] make_device_async_resource_ref(
        naive_caching_memory_resource&) except +
    optional[device_async_resource_ref] make_device_async_resource_ref(
        stream_ordered_pool_memory_resource&) except +
    optional[device_async_resource_ref] make_device_async_resource_ref(
        hazard_tracking_resource_adaptor&) except +
    optional[device_async_resource_ref] make_device_async_resource_ref(
        unmapping_vmm_memory_resource&) except +


# The stream argument of the native calls (None: the default stream), shared with the benchmarks'
# native loops (benchmarks/rmm_fences_bench/_loops.pyx).
cdef Stream as_stream(object stream)
