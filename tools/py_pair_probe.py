# SPDX-License-Identifier: Apache-2.0
"""Why is an allocate+deallocate pair from Python slow for some chains? Median ns per pair of a
plain Python loop, on a created stream and on the default stream, per chain."""

import pathlib
import statistics
import sys
import time

import cupy
import rmm

from rmm_fences.specs import compose

# the benchmarks' library (never installed; `make install` builds its native loops in place)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from rmm_fences_bench import alloc_free_ns  # noqa: E402

CHAINS = [
    "pool(cuda, initial_pool_size=1GiB)",
    "rmm_pool(cuda, initial_pool_size=1GiB)",
    "cuda_async",
    "sync_on_free(naive_cache(cuda), mode=deferred)",
]


def py_ns(mr, stream, n=2000, nbytes=1 << 20):
    out = []
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n):
            mr.deallocate(mr.allocate(nbytes, stream), nbytes, stream)
        out.append((time.perf_counter_ns() - t) / n)
    return statistics.median(out)


for spec in CHAINS:
    mr = compose(spec)
    created = rmm.pylibrmm.stream.Stream(cupy.cuda.Stream(non_blocking=True))
    default = rmm.pylibrmm.stream.DEFAULT_STREAM
    print(
        f"{spec:50s} python created {py_ns(mr, created):9.0f} ns  default "
        f"{py_ns(mr, default):9.0f} ns  native created "
        f"{alloc_free_ns(mr, 1 << 20, 20000, created):9.0f} ns",
        flush=True,
    )
