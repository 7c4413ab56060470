# SPDX-License-Identifier: Apache-2.0
"""The CUB temp-storage loop per chain and size (allocate CUB temp, reduce, free without a sync),
per call of device_sum and through a ReducePlan, with a preallocated temp buffer as the floor;
the device-to-device copy bandwidth its bandwidth compares with; and cupy.sum per CuPy
allocator."""

import statistics

from ._common import CHAINS, make, require_gpu

SIZES = [1 << 10, 1 << 20, 16 << 20, 256 << 20]
# Calls per timed call; the stream is synchronized after them. asv re-runs setup before every
# timed call (asv_runner's setup isolation, asv#966), so setup warms the fresh chain first.
CALLS = 20


class CubTempStorageLoop:
    params = [["preallocated", *CHAINS], SIZES]
    param_names = ["chain", "n"]
    timeout = 300
    plan = False  # rmm_fences.reduce.device_sum per call (True: a ReducePlan made once)

    def setup(self, chain, n):
        require_gpu()
        import cupy

        from rmm_fences_bench import cub_temp_loop

        self.cupy = cupy
        self.mr = None if chain == "preallocated" else make(chain)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.x = cupy.random.RandomState(n).standard_normal(n, dtype=cupy.float32)
        self.out = cupy.empty(1, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        # preallocated: cuda.compute's reducer on a temp buffer allocated once (the floor)
        self.fn = cub_temp_loop(self.x, self.out, self.mr, self.stream, plan=self.plan)
        self.fn()  # warm up (JIT, CUB's temp size)
        self.stream.synchronize()

    def time_loop(self, chain, n):
        for _ in range(CALLS):
            self.fn()
        self.stream.synchronize()

    def track_bandwidth_gbs(self, chain, n):
        from rmm_fences_bench import cub_temp_loop_us

        us = cub_temp_loop_us(self.x, self.out, self.mr, self.stream, 50, 3, plan=self.plan)
        return self.x.nbytes / (us * 1e-6) / 1e9

    track_bandwidth_gbs.unit = "GB/s"


class CubTempStoragePlanLoop(CubTempStorageLoop):
    """The loop of CubTempStorageLoop through a ReducePlan made once in setup (the temp
    storage still allocated and freed per call), over the same chains and sizes; the floor is
    CubTempStorageLoop's "preallocated" row of the same run, and this loop's "preallocated"
    row is the plan over a buffer allocated once (``plan_over_buffer``: the plan's own checks,
    lock and launch, no allocation). track_ratio_to_preallocated: the time per call of the plan
    over the preallocated buffer's, from CUDA events around 200 back-to-back calls of each,
    interleaved: the median of 5 rounds' ratios (a ratio within a round is stable where the
    machine's speed drifts between rounds; docs/performance.md); ``floor_us`` is then the
    median time per call of the preallocated call in those rounds."""

    params = [["preallocated", *CHAINS], SIZES]
    plan = True

    def setup(self, chain, n):
        if chain != "preallocated":
            super().setup(chain, n)
            return
        require_gpu()
        import cupy

        from rmm_fences_bench import plan_over_buffer

        self.cupy, self.mr = cupy, None
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.x = cupy.random.RandomState(n).standard_normal(n, dtype=cupy.float32)
        self.out = cupy.empty(1, dtype=cupy.float32)
        self.fn = plan_over_buffer(self.x, self.out, self.stream)
        self.fn()  # warm up (JIT, CUB's temp size)
        self.stream.synchronize()

    def track_bandwidth_gbs(self, chain, n):
        if chain != "preallocated":
            return super().track_bandwidth_gbs(chain, n)
        from rmm_fences_bench import event_time_us

        return self.x.nbytes / (event_time_us(self.fn, self.stream, 50, 3) * 1e-6) / 1e9

    track_bandwidth_gbs.unit = "GB/s"

    def track_ratio_to_preallocated(self, chain, n):
        import numpy as np

        from rmm_fences_bench import cub_temp_loop, event_time_us

        floor = cub_temp_loop(self.x, self.out, None, self.stream)
        floor()
        ratios, floors = [], []
        for _ in range(5):
            floor_us = event_time_us(floor, self.stream, 200, 1)
            plan_us = event_time_us(self.fn, self.stream, 200, 1)
            ratios.append(plan_us / floor_us)
            floors.append(floor_us)
        self.floor_us = statistics.median(floors)  # the bare call's time, for the native table
        got = float(self.out.get()[0])  # the plan's last sum
        ref = float(self.x.astype(self.cupy.float64).sum().get())
        if not np.isclose(got, ref, rtol=1e-3, atol=1e-2):
            raise AssertionError(f"CUB plan loop over {chain}: wrong sum {got} vs {ref}")
        return statistics.median(ratios)

    track_ratio_to_preallocated.unit = "ratio"


class CopyBandwidth:
    """A device-to-device copy on one stream (cudaMemcpyAsync), GB/s of read + write bytes:
    what the GPU's memory moves, the ceiling for CubTempStorageLoop.track_bandwidth_gbs (which
    counts input bytes only)."""

    params = [[256 << 20, 1 << 30]]
    param_names = ["nbytes"]
    timeout = 300

    def setup(self, nbytes):
        require_gpu()
        import cupy

        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.a = cupy.ones(nbytes // 4, dtype=cupy.float32)
        self.b = cupy.empty_like(self.a)
        cupy.cuda.Device().synchronize()

    def teardown(self, nbytes):
        del self.a, self.b

    def track_copy_gbs(self, nbytes):
        import cupy

        from rmm_fences_bench import event_time_us

        rt, a, b, stream = cupy.cuda.runtime, self.a, self.b, self.stream

        def copy():
            rt.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, rt.memcpyDeviceToDevice, stream.ptr)

        us = event_time_us(copy, stream, 20)
        return 2 * nbytes / (us * 1e-6) / 1e9

    track_copy_gbs.unit = "GB/s"


class CupySum:
    params = [
        [
            "cupy_pool",
            "CupyAllocator(rmm_fences_pool)",
            "CupyAllocator(cuda_async)",
            "rmm_cupy_allocator",
        ]
    ]
    param_names = ["allocator"]

    def setup(self, allocator):
        require_gpu()
        import cupy
        import rmm
        from cupy._core import _accelerator

        from rmm_fences.allocators.cupy import CupyAllocator

        self.cupy = cupy
        self.saved = (
            _accelerator.get_reduction_accelerators(),
            _accelerator.get_routine_accelerators(),
            rmm.mr.get_current_device_resource(),
        )
        _accelerator.set_reduction_accelerators(["cub"])
        _accelerator.set_routine_accelerators(["cub"])
        pool = make("rmm_fences_pool")
        rmm.mr.set_current_device_resource(pool)
        from rmm.allocators.cupy import rmm_cupy_allocator

        self.alloc = {
            "cupy_pool": cupy.cuda.MemoryPool().malloc,
            "CupyAllocator(rmm_fences_pool)": CupyAllocator(pool),
            "CupyAllocator(cuda_async)": CupyAllocator(make("cuda_async")),
            "rmm_cupy_allocator": rmm_cupy_allocator,
        }[allocator]
        self.x = cupy.random.RandomState(6).standard_normal(1 << 20, dtype=cupy.float32)
        self.time_cupy_sum(allocator)  # warm: the first sums grow a fresh pool

    def teardown(self, allocator):
        import rmm
        from cupy._core import _accelerator

        _accelerator.set_reduction_accelerators(self.saved[0])
        _accelerator.set_routine_accelerators(self.saved[1])
        rmm.mr.set_current_device_resource(self.saved[2])

    def time_cupy_sum(self, allocator):
        with self.cupy.cuda.using_allocator(self.alloc):
            for _ in range(CALLS):
                self.x.sum()
        self.cupy.cuda.Device().synchronize()
