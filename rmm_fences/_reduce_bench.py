# SPDX-License-Identifier: Apache-2.0
"""``python -m rmm_fences reduce-bench``: the CUB temp-storage loop per chain and ``cupy.sum``
per CuPy allocator, every peer in the same process.

The CUB temp-storage loop: each call allocates CUB's temp storage from the chain (its size,
queried once, is cached like the reducer), launches the reduce and frees it on the stream
without a sync; "preallocated" launches cuda.compute's reducer directly with a buffer allocated
once (the floor: no wrapper, no allocation). Time per call: CUDA events around K back-to-back
calls on one stream (so a host-bound loop shows as such), median of rounds. Bandwidth: input
bytes per call over time per call, against a device-to-device copy measured in the same run
(read + write bytes).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import rmm

from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences.unsafe import NaiveCachingMemoryResource

SIZES = {"1K": 1 << 10, "1M": 1 << 20, "16M": 16 << 20, "256M": 256 << 20}
ITERS = {"1K": 2000, "1M": 1000, "16M": 200, "256M": 30}


def _chains():
    cuda = rmm.mr.CudaMemoryResource()

    def naive():
        return NaiveCachingMemoryResource(cuda)

    pool = StreamOrderedPoolMemoryResource(cuda, "1GiB")
    return {
        "preallocated": None,
        "cuda (cudaFree syncs)": cuda,
        "cuda_async": rmm.mr.CudaAsyncMemoryResource(),
        "rmm_pool": rmm.mr.PoolMemoryResource(cuda, initial_pool_size=1 << 30),
        "rmm_fences_pool": pool,
        "sync_on_free deferred(naive)": SyncOnFreeResourceAdaptor(naive(), mode="deferred"),
        "sync_on_free stream(naive)": SyncOnFreeResourceAdaptor(naive(), mode="stream"),
        "sync_on_free device(naive)": SyncOnFreeResourceAdaptor(naive(), mode="device"),
        "tracking(rmm_fences_pool)": HazardTrackingResourceAdaptor(
            StreamOrderedPoolMemoryResource(cuda, "1GiB"), on_hazard="record"),
    }


def _time_calls(cupy, stream, fn, iters, rounds=5):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    out = []
    for _ in range(rounds):
        start.record(stream)
        for _ in range(iters):
            fn()
        stop.record(stream)
        stop.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / iters)  # us per call
    return statistics.median(out)


def copy_bandwidth(cupy, stream, nbytes=1 << 30):
    """GB/s of a device-to-device copy (read + write bytes)."""
    a = cupy.ones(nbytes // 4, dtype=cupy.float32)
    b = cupy.empty_like(a)
    cupy.cuda.Device().synchronize()
    rt = cupy.cuda.runtime

    def copy():
        rt.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, rt.memcpyDeviceToDevice, stream.ptr)

    us = _time_calls(cupy, stream, copy, 20)
    return 2 * nbytes / (us * 1e-6) / 1e9


def cub_temp_loop_fn(cupy, stream, x, out, mr):
    """One call of the CUB temp-storage loop on ``stream``, as a function of no argument
    (``mr=None``: the floor, the reducer called directly on a buffer allocated once)."""
    from rmm_fences import reduce as rf
    from rmm_fences._streams import StreamHandle

    n = x.size
    if mr is None:
        init = np.zeros(1, dtype=out.dtype)
        reducer, op = rf._reducer(x, out, "sum", init, x.dtype, out.dtype)
        reducer = reducer.fn  # the floor calls cuda.compute directly
        cc_stream = StreamHandle(stream.ptr)
        nbytes = reducer(temp_storage=None, d_in=x, d_out=out, num_items=n, op=op, h_init=init,
                         stream=cc_stream)
        pre = cupy.empty(max(nbytes, 1), dtype=cupy.uint8)
        tmp = rf.TempStorage(pre.data.ptr, max(nbytes, 1))

        def fn():
            reducer(temp_storage=tmp, d_in=x, d_out=out, num_items=n, op=op, h_init=init,
                    stream=cc_stream)

        fn.buffer = pre  # the preallocated temp lives as long as the function
        return fn
    return lambda: rf.device_sum(x, out, mr=mr, stream=stream)


def cub_temp_loop_us(cupy, stream, x, out, mr, iters, rounds=5) -> float:
    """Microseconds per call of the CUB temp-storage loop on ``stream`` (``mr=None``: the floor)."""
    fn = cub_temp_loop_fn(cupy, stream, x, out, mr)
    fn()  # warm up (and JIT)
    stream.synchronize()
    us = _time_calls(cupy, stream, fn, iters, rounds)
    got, ref = float(out.get()[0]), float(x.astype(cupy.float64).sum().get())
    if not np.isclose(got, ref, rtol=1e-3, atol=1e-2):
        raise AssertionError(f"CUB temp-storage loop over {mr!r}: wrong sum {got} vs {ref}")
    return us


def loop_per_chain(cupy):
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = cupy.random.RandomState(5)
    results = {}
    for label, n in SIZES.items():
        x = rng.standard_normal(n, dtype=cupy.float32)
        out = cupy.empty(1, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        for name, mr in _chains().items():
            results[(label, name)] = cub_temp_loop_us(cupy, stream, x, out, mr, ITERS[label])
        del x
    return results


def cupy_sum_per_allocator(cupy, n=1 << 20, iters=3000, rounds=5):
    from cupy._core import _accelerator
    from rmm.allocators.cupy import rmm_cupy_allocator

    from rmm_fences.allocators.cupy import CupyAllocator

    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "1GiB")
    allocators = {
        "cupy MemoryPool": cupy.cuda.MemoryPool().malloc,
        "CupyAllocator(rmm_fences_pool)": CupyAllocator(pool),
        "CupyAllocator(cuda_async)": CupyAllocator(rmm.mr.CudaAsyncMemoryResource()),
        "rmm_cupy_allocator (rmm_fences_pool)": rmm_cupy_allocator,
    }
    saved = (_accelerator.get_reduction_accelerators(), _accelerator.get_routine_accelerators())
    _accelerator.set_reduction_accelerators(["cub"])
    _accelerator.set_routine_accelerators(["cub"])
    previous = rmm.mr.get_current_device_resource()
    rmm.mr.set_current_device_resource(pool)
    x = cupy.random.RandomState(6).standard_normal(n, dtype=cupy.float32)
    ref = float(x.astype(cupy.float64).sum().get())
    out = {}
    try:
        for name, alloc in allocators.items():
            with cupy.cuda.using_allocator(alloc):
                got = float(x.sum().get())
                if not np.isclose(got, ref, rtol=1e-3):
                    raise AssertionError(f"cupy.sum with {name}: wrong sum {got} vs {ref}")
                times = []
                for _ in range(rounds):
                    cupy.cuda.Device().synchronize()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        x.sum()
                    cupy.cuda.Device().synchronize()
                    times.append((time.perf_counter() - t0) / iters * 1e6)
                out[name] = statistics.median(times)
    finally:
        _accelerator.set_reduction_accelerators(saved[0])
        _accelerator.set_routine_accelerators(saved[1])
        rmm.mr.set_current_device_resource(previous)
    return out


def run() -> int:
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    bw_copy = copy_bandwidth(cupy, stream)
    r5 = loop_per_chain(cupy)
    names = list(_chains())
    print(f"the CUB temp-storage loop, float32 sum, us per call (ratio to preallocated); "
          f"device-to-device copy {bw_copy:.0f} GB/s")
    header = f"{'chain':<30}" + "".join(f"{label:>18}" for label in SIZES)
    print(header)
    print("-" * len(header))
    for name in names:
        cells = []
        for label in SIZES:
            us, floor = r5[(label, name)], r5[(label, "preallocated")]
            cells.append(f"{us:>9.1f} ({us / floor:>5.2f}x)")
        print(f"{name:<30}" + "".join(f"{c:>18}" for c in cells))
    n = SIZES["256M"]
    print("256M bandwidth (GB/s, % of copy): " + ", ".join(
        f"{name} {n * 4 / (r5[('256M', name)] * 1e-6) / 1e9:.0f} "
        f"({n * 4 / (r5[('256M', name)] * 1e-6) / 1e9 / bw_copy:.0%})"
        for name in ("preallocated", "rmm_fences_pool", "sync_on_free deferred(naive)")))
    print("targets at 1M: rmm_fences_pool <= 1.05x, sync_on_free deferred <= 1.10x; at 256M "
          ">= 95% of the copy's bandwidth")
    print()
    r6 = cupy_sum_per_allocator(cupy)
    base = r6["cupy MemoryPool"]
    print("cupy.sum of 1M float32 with CUB, us per call (ratio to CuPy's MemoryPool)")
    for name, us in r6.items():
        print(f"  {name:<40} {us:>8.2f} us  {us / base:>5.2f}x")
    print("target: CupyAllocator(rmm_fences_pool) <= 1.15x CuPy's MemoryPool")
    return 0
