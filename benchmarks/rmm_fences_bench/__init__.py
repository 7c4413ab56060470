# SPDX-License-Identifier: Apache-2.0
"""Timing and stress helpers for any rmm ``DeviceMemoryResource``: the benchmarks' library.

Never installed: ``make install`` builds its native loops (``_loops``, CMake option
RMM_FENCES_BUILD_BENCHMARKS) in place, beside these sources; the asv suite, tools/ and the
tests put benchmarks/ on ``sys.path`` to import it. The CUB temp-storage loop is the one
``rmm-fences reduce`` times (:mod:`rmm_fences._cli.reduce`), re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import rmm  # noqa: F401

from rmm_fences._cli.reduce import cub_temp_loop, cub_temp_loop_us, event_time_us

from rmm_fences_bench._loops import (
    FootprintMeter,
    alloc_free_ns,
    core_pair_ns,
    fence_call_ns,
    footprint_layer,
    page_call_ns,
    random_allocations,
    replay,
    threaded_alloc_free,
    threaded_stream_queries,
)
from rmm_fences_bench._loops import stress as _native_stress
from rmm_fences_bench.alloc_log import Trace, read_allocation_log, write_allocation_log

__all__ = [
    "STRESS_KERNELS",
    "FootprintMeter",
    "Trace",
    "alloc_free_ns",
    "core_pair_ns",
    "cub_temp_loop",
    "cub_temp_loop_us",
    "event_time_us",
    "fence_call_ns",
    "page_call_ns",
    "footprint_layer",
    "python_pair_us",
    "random_allocations",
    "read_allocation_log",
    "replay",
    "plan_over_buffer",
    "stress",
    "threaded_alloc_free",
    "threaded_stream_queries",
    "with_footprint",
    "write_allocation_log",
]

#: The fill and check kernels of :func:`stress` (CUDA C++, compiled with NVRTC through CuPy).
#: Word ``i`` of a block with key ``k`` holds ``fmix32(k ^ (i * 0x9E3779B9))``: no two blocks
#: and no two words of one block share a pattern, and zero is no valid fill.
STRESS_KERNELS = r"""
__device__ __forceinline__ unsigned int stress_word(unsigned int key, unsigned long long i)
{
    unsigned int h = key ^ (unsigned int)(i * 0x9E3779B9ull) ^ (unsigned int)(i >> 32);
    h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
    return h;
}

extern "C" __global__ void stress_fill(unsigned int* a, unsigned long long n, unsigned int key)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        a[i] = stress_word(key, i);
    }
}

extern "C" __global__ void stress_check(const unsigned int* a, unsigned long long n,
                                        unsigned int key, unsigned long long* errors,
                                        unsigned long long delay_ns)
{
    // Wait before reading, so the block stays in use for a while after its free is queued:
    // a resource that hands it to another stream too early is then caught in the act.
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < delay_ns);
    unsigned long long bad = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        bad += (a[i] != stress_word(key, i));
    }
    if (bad) { atomicAdd(errors, bad); }
}
"""


def python_pair_us(mr, nbytes: int, stream, pairs: int = 1000, rounds: int = 5) -> float:
    """Microseconds of one ``mr.deallocate(mr.allocate(nbytes, stream), nbytes, stream)``
    called from Python: the median over ``rounds`` of the mean of ``pairs`` pairs, after one
    untimed pair (the host cost from Python, beside :func:`alloc_free_ns`'s native loop)."""
    import statistics
    import time

    mr.deallocate(mr.allocate(nbytes, stream), nbytes, stream)
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(pairs):
            mr.deallocate(mr.allocate(nbytes, stream), nbytes, stream)
        means.append((time.perf_counter() - start) / pairs * 1e6)
    return statistics.median(means)


def plan_over_buffer(x, out, stream):
    """``plan(x, out)`` of a :class:`rmm_fences.reduce.ReducePlan` (sum into ``out`` on
    ``stream``, a CuPy stream) whose temp storage is a buffer allocated once, as a function of
    no argument: the plan's call without an allocation or a free (its checks of the arrays, its
    lock and the launch), which is the floor of the CUB temp-storage loop through a plan over
    any resource. The plan's allocate and free are replaced by two Python functions that hand
    out the buffer and do nothing (the current device resource, which the plan binds, sees no
    call); the buffer lives as long as the function."""
    import cupy
    import numpy as np

    from rmm_fences.reduce import ReducePlan

    init = np.zeros(1, dtype=out.dtype)
    plan = ReducePlan(x, out, "sum", init, stream=stream)  # binds the current resource
    buffer = cupy.empty(max(plan._nbytes, 1), dtype=cupy.uint8)
    ptr = buffer.data.ptr
    state = list(plan._state)
    if state[5:7] != [plan._mr.allocate, plan._mr.deallocate]:
        raise RuntimeError("ReducePlan's state no longer holds allocate and deallocate at 5, 6")
    state[5] = lambda nbytes, stream: ptr  # the plan's allocate
    state[6] = lambda ptr, nbytes, stream: None  # and its deallocate
    plan._state = tuple(state)
    fn = functools.partial(plan, x, out)  # as cub_temp_loop(plan=True) calls a plan
    fn.buffer = buffer
    return fn


def with_footprint(spec) -> str:
    """``spec`` (a str or a ``Spec``, see :mod:`rmm_fences.specs`) with an rmm
    ``StatisticsResourceAdaptor`` (``statistics``) between its leaf resource and the rest: the
    layer where :func:`replay` reads the chain's footprint (:func:`footprint_layer`), e.g.
    ``"pool(cuda)"`` -> ``"pool(statistics(cuda))"``. A spec whose leaf is ``cuda_async`` or
    ``vmm_pool``, or whose leaf already has a statistics adaptor over it, comes back as it is
    (the replay reads the CUDA memory pool of a ``cuda_async`` leaf, the pages a ``vmm_pool``
    held)."""
    from rmm_fences.specs import Spec, parse_spec

    tree = spec if isinstance(spec, Spec) else parse_spec(spec)

    def wrap(node):
        if node.inner is None:
            if node.name in ("cuda_async", "vmm_pool"):  # measured by the pool itself
                return node
            return Spec("statistics", node)
        if node.name == "statistics" and node.inner.inner is None:
            return node
        return dataclasses.replace(node, inner=wrap(node.inner))

    return str(wrap(tree))


@functools.cache
def _stress_kernels(device: int):
    import cupy

    with cupy.cuda.Device(device):
        module = cupy.RawModule(code=STRESS_KERNELS)
        fill, check = module.get_function("stress_fill"), module.get_function("stress_check")
        # RawKernel.kernel is a cupy.cuda.function.Function; .ptr is its CUfunction (loaded
        # in the device's primary context, which the stress threads make current)
        return fill, check, fill.kernel.ptr, check.kernel.ptr


def stress(
    mr,
    streams: int | list[Any] = 8,
    seconds: float = 5.0,
    *,
    max_bytes: int | str = "4MiB",
    max_live: int = 32,
    random_state: int = 0,
    check_delay_ns: int = 20000,
) -> dict:
    """Multi-threaded data-checking stress of ``mr`` (needs CuPy and a GPU).

    One C++ thread per stream runs for ``seconds`` without the GIL: random allocations on its
    stream, each filled by a kernel with a pattern of its own, some kept live across
    iterations, every block checked by a kernel before it is freed (on its own stream, or on
    another thread's stream after an event wait), out-of-memory counted and answered by freeing
    half of the thread's live blocks. Another Python thread may call into ``mr`` meanwhile
    (``release()`` of a pool, for instance).

    Parameters
    ----------
    mr : DeviceMemoryResource
        The resource under test.
    streams : int or list
        A number of new non-blocking CuPy streams to create, or the streams themselves (rmm,
        CuPy, cuda.core or ``__cuda_stream__``); one thread each.
    seconds, max_bytes, max_live, random_state, check_delay_ns
        As in ``rmm_fences_bench._loops.stress`` (``random_state`` starts the random generator
        of the sizes, choices and patterns).

    Returns the native counters (``iterations``, ``allocations``, ``bytes``,
    ``cross_stream_frees``, ``out_of_memory``, ``checks``, ``seconds``) and ``errors``: the
    words the check kernels found wrong. Any value but 0 means two users shared memory.
    """
    if isinstance(streams, bool) or not isinstance(streams, (int, list, tuple)):
        raise TypeError(
            f"streams must be a number of streams or a list of streams, "
            f"got {type(streams).__name__}"
        )
    if isinstance(streams, int) and streams < 1:
        raise ValueError(f"streams must be at least 1, got {streams}")
    import cupy

    if isinstance(streams, int):
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(streams)]
    _, _, fill, check = _stress_kernels(cupy.cuda.runtime.getDevice())
    errors = cupy.zeros(1, dtype=cupy.uint64)
    cupy.cuda.Device().synchronize()  # the counter is zero before any stream uses it
    stats = _native_stress(
        mr,
        list(streams),
        seconds,
        fill_kernel=fill,
        check_kernel=check,
        errors=errors.data.ptr,
        max_bytes=max_bytes,
        max_live=max_live,
        random_state=random_state,
        check_delay_ns=check_delay_ns,
    )
    stats["errors"] = int(errors.get()[0])
    return stats
