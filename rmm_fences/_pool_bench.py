# SPDX-License-Identifier: Apache-2.0
"""``python -m rmm_fences pool-bench``: StreamOrderedPoolMemoryResource against its peers.

The Python round trip, the native allocate + deallocate pair, random allocations, and threads
on their own streams. Every peer runs in the same process; the table reports ratios.
"""

from __future__ import annotations

import statistics
import time

import rmm

from rmm_fences import StreamOrderedPoolMemoryResource
from rmm_fences.bench import (
    alloc_free_ns,
    random_allocations,
    threaded_alloc_free,
    threaded_stream_queries,
)

MiB = 1 << 20


def _resources():
    return {
        "rmm_fences_pool": StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "2GiB"),
        "rmm_pool": rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(),
                                              initial_pool_size=2 << 30),
        "cuda_async": rmm.mr.CudaAsyncMemoryResource(),
    }


def python_round_trip_us(mr, stream, nbytes=MiB, iterations=20000, rounds=5) -> float:
    """Median over rounds of the mean microseconds of ``deallocate(allocate())`` from Python."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iterations):
            mr.deallocate(mr.allocate(nbytes, stream), nbytes, stream)
        times.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(times)


def measure() -> dict:
    import cupy

    resources = _resources()
    stream = rmm.pylibrmm.stream.Stream(cupy.cuda.Stream(non_blocking=True))
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(8)]
    out = {name: {} for name in resources}
    for name, mr in resources.items():
        python_round_trip_us(mr, stream, iterations=2000, rounds=1)  # warm up
        out[name]["python_us"] = python_round_trip_us(mr, stream)
        out[name]["native_ns_default"] = statistics.median(
            alloc_free_ns(mr, MiB, 200000) for _ in range(5))
        out[name]["native_ns_stream"] = statistics.median(
            alloc_free_ns(mr, MiB, 200000, stream) for _ in range(5))
        out[name]["random_ops"] = random_allocations(mr, 200000, random_state=42, stream=stream)
        out[name]["threads_1"] = threaded_alloc_free(mr, MiB, 100000, streams[:1])
        out[name]["threads_8"] = threaded_alloc_free(mr, MiB, 100000, streams)
        # each C++ thread's own per-thread default stream: no cuStreamGetId per call
        ptds = [cupy.cuda.Stream.ptds]
        out[name]["native_ns_ptds"] = statistics.median(
            alloc_free_ns(mr, MiB, 200000, ptds[0]) for _ in range(5))
        out[name]["threads_1_ptds"] = threaded_alloc_free(mr, MiB, 100000, ptds)
        out[name]["threads_8_ptds"] = threaded_alloc_free(mr, MiB, 100000, ptds * 8)
    out["driver"] = {
        f"{q}_{n}": threaded_stream_queries(q, 200000, streams[:n])
        for q in ("is_capturing", "get_id") for n in (1, 8)
    }
    cupy.cuda.Device().synchronize()
    return out


def run() -> int:
    m = measure()
    ours, pool, asy = m["rmm_fences_pool"], m["rmm_pool"], m["cuda_async"]
    rows = [
        ("Python alloc+free 1 MiB (us)", "python_us", "<= 0.8x cuda_async, <= 0.35x rmm_pool"),
        ("native pair, default stream (ns)", "native_ns_default", "<= 100 ns, >= 5x rmm_pool"),
        ("native pair, created stream (ns)", "native_ns_stream", "<= 100 ns, >= 5x rmm_pool"),
        ("random allocations (ops/s)", "random_ops", ">= 2x rmm_pool"),
        ("1 thread (pairs/s)", "threads_1", ""),
        ("8 threads, 8 streams (pairs/s)", "threads_8", ">= 4x one thread"),
        ("native pair, per-thread stream (ns)", "native_ns_ptds", ""),
        ("1 thread, per-thread stream", "threads_1_ptds", ""),
        ("8 threads, per-thread streams", "threads_8_ptds", ""),
    ]
    header = (f"{'benchmark':<40} {'rmm_fences':>12} {'rmm_pool':>12} {'cuda_async':>12}"
              f" {'vs pool':>8} {'vs async':>8}")
    print(header)
    print("-" * len(header))
    for label, key, _target in rows:
        vs_pool = ours[key] / pool[key]
        vs_async = ours[key] / asy[key]
        print(f"{label:<40} {ours[key]:>12.4g} {pool[key]:>12.4g} {asy[key]:>12.4g}"
              f" {vs_pool:>7.3f}x {vs_async:>7.3f}x")
    print()
    print("targets: Python pair ours/async <= 0.8 and ours/pool <= 0.35; native pair <= 100 ns")
    print("         and pool/ours >= 5; random allocations ours/pool >= 2; 8 threads / 1 thread")
    print("         >= 4 (each resource below)")
    for name, r in ((k, v) for k, v in m.items() if k != "driver"):
        print(f"  thread scaling {name:<16} created streams "
              f"{r['threads_8'] / r['threads_1']:.2f}x, per-thread default streams "
              f"{r['threads_8_ptds'] / r['threads_1_ptds']:.2f}x")
    d = m["driver"]
    print("driver queries a stream-keyed pool makes per call, aggregate calls/s (1 -> 8 threads):")
    for q in ("is_capturing", "get_id"):
        print(f"  cuStream{'IsCapturing' if q == 'is_capturing' else 'GetId':<12} "
              f"{d[q + '_1']:.3g} -> {d[q + '_8']:.3g} ({d[q + '_8'] / d[q + '_1']:.2f}x)")
    print(f"  native pair rmm_pool / rmm_fences: default "
          f"{pool['native_ns_default'] / ours['native_ns_default']:.1f}x, created stream "
          f"{pool['native_ns_stream'] / ours['native_ns_stream']:.1f}x")
    return 0
