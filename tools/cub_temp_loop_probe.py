# SPDX-License-Identifier: Apache-2.0
"""Why do the asv CUB temp-storage loop's `time_` (host wall time of 20 calls + sync) and
`track_` (CUDA events over 50 back-to-back calls) disagree for some chains? Per chain and
size, us per call:
  burst     wall time of 20 calls + stream sync, the chain and loop warm (median of 50 bursts)
  fresh     the same burst right after a fresh chain + loop + one warm-up call (asv's pattern:
            setup runs again before every sample), median of 10
  events    CUDA events around 50 back-to-back calls (median of 3 rounds; the track_ method)
"""

import statistics
import sys
import time

import cupy

from rmm_fences._cli.reduce import cub_temp_loop, cub_temp_loop_us  # rmm-fences reduce's loop
from rmm_fences.specs import compose

CHAINS = {
    "preallocated": None,
    "rmm_fences_pool": "pool(cuda, initial_pool_size=1GiB)",
    "rmm_pool": "rmm_pool(cuda, initial_pool_size=1GiB)",
    "cuda_async": "cuda_async",
    "tracking_pool": "tracking(pool(cuda, initial_pool_size=1GiB), on_hazard=record)",
}
CALLS = 20


def burst(fn, stream):
    t = time.perf_counter()
    for _ in range(CALLS):
        fn()
    stream.synchronize()
    return (time.perf_counter() - t) * 1e6 / CALLS


def main():
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"{'chain':18s} {'n':>9s} {'burst':>8s} {'fresh':>8s} {'events':>8s}  us per call")
    for n in (1 << 20, 16 << 20):
        x = cupy.random.RandomState(n).standard_normal(n, dtype=cupy.float32)
        out = cupy.empty(1, dtype=cupy.float32)
        for name, spec in CHAINS.items():
            mr = compose(spec) if spec else None
            fn = cub_temp_loop(x, out, mr, stream)
            fn()
            stream.synchronize()
            warm = statistics.median(burst(fn, stream) for _ in range(50))
            fresh = []
            for _ in range(10):
                mr2 = compose(spec) if spec else None
                fn2 = cub_temp_loop(x, out, mr2, stream)
                fn2()
                stream.synchronize()
                fresh.append(burst(fn2, stream))
                del fn2, mr2
            ev = cub_temp_loop_us(x, out, mr, stream, 50, 3)
            print(
                f"{name:18s} {n:9d} {warm:8.1f} {statistics.median(fresh):8.1f} {ev:8.1f}",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
