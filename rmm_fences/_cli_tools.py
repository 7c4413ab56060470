# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences reduce`` and ``rmm-fences bench``: the CUB temp-storage loop and alloc+free
costs for
resource specs given on the command line."""

from __future__ import annotations

import statistics


def reduce_loop(spec: str, n: int, iters: int) -> int:
    """The CUB temp-storage loop over ``spec``: us per call, GB/s, ratio to a preallocated
    buffer."""
    import cupy

    from rmm_fences._reduce_bench import cub_temp_loop_us
    from rmm_fences.compose import compose

    mr = compose(spec)
    stream = cupy.cuda.Stream(non_blocking=True)
    x = cupy.random.RandomState(1).standard_normal(n, dtype=cupy.float32)
    out = cupy.empty(1, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    floor = cub_temp_loop_us(cupy, stream, x, out, None, iters)
    us = cub_temp_loop_us(cupy, stream, x, out, mr, iters)
    gbs = x.nbytes / (us * 1e-6) / 1e9
    print(f"{spec}: sum of {n} float32, {iters} calls: {us:.2f} us per call, {gbs:.1f} GB/s, "
          f"{us / floor:.2f}x the preallocated temp buffer ({floor:.2f} us)")
    return 0


def bench(specs: list[str], nbytes: int, iters: int) -> int:
    """allocate + deallocate per pair for each spec, from Python and in the native loop."""
    import cupy
    import rmm

    from rmm_fences._pool_bench import python_round_trip_us
    from rmm_fences.bench import alloc_free_ns
    from rmm_fences.compose import compose

    stream = rmm.pylibrmm.stream.Stream(cupy.cuda.Stream(non_blocking=True))
    width = max(len(s) for s in specs)
    print(f"{'resource':<{width}}  {'python us':>10}  {'native ns':>10}   ({nbytes} bytes)")
    for spec in specs:
        mr = compose(spec)
        py = python_round_trip_us(mr, stream, nbytes=nbytes, iterations=max(iters // 20, 100))
        native = statistics.median(alloc_free_ns(mr, nbytes, iters, stream) for _ in range(3))
        print(f"{spec:<{width}}  {py:>10.3f}  {native:>10.1f}")
    return 0
