# SPDX-License-Identifier: Apache-2.0
"""On the GPU host: where the host time of the CUB temp-storage loop goes.

``python tools/profile_reduce.py``: cProfile of ``device_sum`` (3000 calls at 1K).
``python tools/profile_reduce.py --plan [--n N]``: a ``ReducePlan`` call against the floor (the
reducer on a preallocated temp) and the parts the plan adds, each timed alone in this process
(wall time per call, median of 7 rounds of 20 000 calls; and the plan and the floor with CUDA
events): the allocate + deallocate pair through the plan's bound methods, the launch lock,
the argument checks. One JSON line per part.
"""

import argparse
import cProfile
import json
import pstats
import statistics
import time

import cupy
import numpy as np
import rmm

from rmm_fences import StreamOrderedPoolMemoryResource
from rmm_fences._cli.reduce import cub_temp_loop, event_time_us  # rmm-fences reduce's loop
from rmm_fences.reduce import ReducePlan, device_sum


def wall_us(fn, calls=20_000, rounds=7):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) * 1e6 / calls)
    return statistics.median(times)


def plan_parts(n):
    mr = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.random.default_rng(0).random(n, dtype=cupy.float32)
    out = cupy.empty(1, dtype=cupy.float32)
    plan = ReducePlan(x, out, "sum", np.zeros(1, dtype=np.float32), mr=mr, stream=s)
    floor = cub_temp_loop(x, out, None, s)
    state = plan._state
    allocate, deallocate, nbytes, rs, acquire, release = state[5:11]

    def pair():
        deallocate(allocate(nbytes, rs), nbytes, rs)

    def lock():
        acquire()
        release()

    def checks():  # the plan's fast checks, as in ReducePlan.__call__
        return (
            type(x) is not cupy.ndarray
            or x.dtype is not state[1]
            or x.size != n
            or not x._c_contiguous
            or x.data.device_id != state[3]
            or out.dtype is not state[4]
            or not out.size
            or not out._c_contiguous
            or out.data.device_id != state[3]
        )

    def call_plan():
        plan(x, out)

    for f in (floor, call_plan):
        f()
    s.synchronize()
    rows = {
        "floor_event_us": event_time_us(floor, s, 2000, 7),
        "plan_event_us": event_time_us(call_plan, s, 2000, 7),
        "floor_wall_us": wall_us(floor),
        "plan_wall_us": wall_us(call_plan),
        "pair_wall_us": wall_us(pair),
        "lock_wall_us": wall_us(lock),
        "checks_wall_us": wall_us(checks),
    }
    s.synchronize()
    got, ref = float(out.get()[0]), float(x.astype(cupy.float64).sum().get())
    if not np.isclose(got, ref, rtol=1e-3):
        raise AssertionError(f"wrong sum {got} vs {ref}")
    rows["plan_over_floor_event"] = rows["plan_event_us"] / rows["floor_event_us"]
    rows["plan_minus_floor_wall_us"] = rows["plan_wall_us"] - rows["floor_wall_us"]
    print(json.dumps(dict(n=n, **rows)))


def device_sum_profile():
    mr = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "256MiB")
    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(1024, dtype=cupy.float32)
    out = cupy.empty(1, dtype=cupy.float32)
    for _ in range(200):
        device_sum(x, out, mr=mr, stream=s)
    s.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        device_sum(x, out, mr=mr, stream=s)
    prof.disable()
    s.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="a ReducePlan call, part by part")
    parser.add_argument("--n", type=int, default=1 << 20, help="float32 items (with --plan)")
    args = parser.parse_args()
    plan_parts(args.n) if args.plan else device_sum_profile()
