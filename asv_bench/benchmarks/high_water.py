# SPDX-License-Identifier: Apache-2.0
"""Device memory each chain takes from CUDA during a workload: a tracking adaptor at the
bottom of the chain records the high-water of what the chain holds."""

from ._common import require_gpu

# The chains with a tracker between them and CUDA.
TRACKED = {
    "rmm_fences_pool": "pool(tracking(cuda, on_hazard=record))",
    "rmm_pool": "rmm_pool(tracking(cuda, on_hazard=record))",
    "sync_on_free_deferred": (
        "sync_on_free(naive_cache(tracking(cuda, on_hazard=record)), mode=deferred)"
    ),
    "cuda": "tracking(cuda, on_hazard=record)",
}


class HighWater:
    params = [list(TRACKED)]
    param_names = ["chain"]
    timeout = 300

    def setup(self, chain):
        require_gpu()

    def track_peak_device_bytes(self, chain):
        import cupy

        from rmm_fences.reduce import device_sum
        from rmm_fences.specs import compose

        mr = compose(TRACKED[chain])
        tracker = mr
        while not hasattr(tracker, "peak_bytes"):
            tracker = tracker.get_upstream()
        s = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
        xs = [
            cupy.random.RandomState(k).standard_normal(n, dtype=cupy.float32)
            for k, n in enumerate((1 << 16, 1 << 20, 16 << 20))
        ]
        out = cupy.empty(len(xs) * 100, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        for i in range(100 * len(xs)):  # the CUB temp-storage loop on two streams
            device_sum(xs[i % len(xs)], out[i : i + 1], mr=mr, stream=s[i % 2])
        held = [mr.allocate(1 << 20) for _ in range(64)]  # plus 64 MiB held at once
        for p in held:
            mr.deallocate(p, 1 << 20)
        cupy.cuda.Device().synchronize()
        if hasattr(mr, "flush"):
            mr.flush()
        return tracker.peak_bytes

    track_peak_device_bytes.unit = "bytes"
