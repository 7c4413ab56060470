# SPDX-License-Identifier: Apache-2.0
"""allocate + deallocate per chain: from Python (time_) and in the native C++ loop (track_);
what a deferred SyncOnFree and a HazardTrackingResourceAdaptor add to their upstream's pair; the
CUDA calls of a deferred free; the policy cores' own share of a pair."""

from ._common import CHAINS, make, require_gpu, streams

SIZES = [256, 1 << 20, 64 << 20]
PAIRS = 1000  # per timed call: asv re-runs setup before every timed call (asv#966)


class AllocFree:
    params = [list(CHAINS), SIZES]
    param_names = ["chain", "nbytes"]

    def setup(self, chain, nbytes):
        require_gpu()
        self.mr = make(chain)
        _, (self.stream,) = streams()
        self.time_python_pairs(chain, nbytes)  # warm: a fresh chain's first pair grows it

    def time_python_pairs(self, chain, nbytes):
        """PAIRS allocate + deallocate pairs from Python (divide by PAIRS for one pair)."""
        mr, stream = self.mr, self.stream
        for _ in range(PAIRS):
            mr.deallocate(mr.allocate(nbytes, stream), nbytes, stream)

    def track_native_pair_ns(self, chain, nbytes):
        from rmm_fences_bench import alloc_free_ns

        return alloc_free_ns(self.mr, nbytes, 20000, self.stream)

    track_native_pair_ns.unit = "ns"


class DeferredFence:
    """What a deferred free adds over the upstream's own pair of the same size (paired rounds,
    median): below ``max_batch_bytes`` the free is taken back on its own stream, from there
    (64 MiB) each free records its event."""

    params = [["cuda_async", "rmm_pool"], SIZES]
    param_names = ["upstream", "nbytes"]

    def setup(self, upstream, nbytes):
        require_gpu()
        from rmm_fences import SyncOnFreeResourceAdaptor

        self.upstream = make(upstream)
        self.adaptor = SyncOnFreeResourceAdaptor(self.upstream, mode="deferred")

    def track_cost_per_free_ns(self, upstream, nbytes):
        import statistics

        from rmm_fences_bench import alloc_free_ns

        over = [
            alloc_free_ns(self.adaptor, nbytes, 20000) - alloc_free_ns(self.upstream, nbytes, 20000)
            for _ in range(5)
        ]
        self.adaptor.flush()
        return statistics.median(over)

    track_cost_per_free_ns.unit = "ns"


# The upstreams under a tracker (rmm_fences specs).
UPSTREAMS = {
    "cuda_async": "cuda_async",
    "rmm_pool": "rmm_pool(cuda, initial_pool_size=1GiB)",
    "rmm_fences_pool": "pool(cuda, initial_pool_size=1GiB)",
    "sync_on_free_deferred": "sync_on_free(cuda_async, mode=deferred)",
    "naive_cache": "naive_cache(cuda)",
}


class TrackingOverhead:
    """What HazardTrackingResourceAdaptor (on_hazard=record, stacks off) adds to each
    upstream's 1 MiB pair on a created stream: tracked / bare, bare and tracked runs paired in
    rounds (median of 5), natively and from Python. The naive cache is not stream-ordered, so
    the tracker fences every free there."""

    params = [list(UPSTREAMS)]
    param_names = ["upstream"]
    timeout = 300

    def setup(self, upstream):
        require_gpu()
        from rmm_fences import HazardTrackingResourceAdaptor
        from rmm_fences.specs import compose

        from rmm_fences_bench import alloc_free_ns

        self.bare = compose(UPSTREAMS[upstream])
        self.tracked = HazardTrackingResourceAdaptor(self.bare, on_hazard="record")
        _, (self.stream,) = streams()
        for mr in (self.bare, self.tracked):
            alloc_free_ns(mr, 1 << 20, 2000, self.stream)  # warm up

    def _python_us(self, mr, pairs=5000):
        import time

        start = time.perf_counter()
        for _ in range(pairs):
            mr.deallocate(mr.allocate(1 << 20, self.stream), 1 << 20, self.stream)
        return (time.perf_counter() - start) / pairs * 1e6

    def track_native_ratio(self, upstream):
        import statistics

        from rmm_fences_bench import alloc_free_ns

        return statistics.median(
            alloc_free_ns(self.tracked, 1 << 20, 20000, self.stream)
            / alloc_free_ns(self.bare, 1 << 20, 20000, self.stream)
            for _ in range(5)
        )

    track_native_ratio.unit = "tracked/bare"

    def track_python_ratio(self, upstream):
        import statistics

        return statistics.median(
            self._python_us(self.tracked) / self._python_us(self.bare) for _ in range(5)
        )

    track_python_ratio.unit = "tracked/bare"


class FenceCalls:
    """Host ns per call of each CUDA call a deferred free makes, on an idle stream, through the
    runtime and through the driver entry points the resources call
    (rmm_fences_bench.fence_call_ns)."""

    params = [
        [
            "event_record",
            "event_query",
            "stream_is_capturing",
            "cu_event_record",
            "cu_event_query",
            "cu_stream_is_capturing",
            "cu_stream_get_id",
        ]
    ]
    param_names = ["call"]

    def setup(self, call):
        require_gpu()

    def track_call_ns(self, call):
        from rmm_fences_bench import fence_call_ns

        return fence_call_ns()[call]

    track_call_ns.unit = "ns"


class PageCalls:
    """Host ns per call of the driver calls a vmm_pool growth makes when it moves pages: 64
    pages of the device's granularity mapped one by one, given access as one range, unmapped
    one by one, 10 rounds (rmm_fences_bench.page_call_ns; set_access is per range)."""

    params = [["create", "map", "set_access", "unmap", "release"]]
    param_names = ["call"]

    def setup(self, call):
        require_gpu()

    def track_call_ns(self, call):
        from rmm_fences_bench import page_call_ns

        return page_call_ns()[call]

    track_call_ns.unit = "ns"


class CorePairs:
    """Host ns of one allocate + deallocate pair on one stream in a policy core alone (the
    pool's, deferred SyncOnFree's, the tracker's over the pool's) over platforms that make no
    CUDA call
    (rmm_fences_bench.core_pair_ns, median of three loops of a million pairs): what a chain's
    pair costs beyond its CUDA calls and rmm's dispatch. Needs no GPU."""

    params = [["pool", "sync_on_free", "tracking_pool"], SIZES]
    param_names = ["core", "nbytes"]

    def setup(self, core, nbytes):
        pass  # no GPU, nothing to make: each call builds its core

    def measure(self, core, nbytes):
        """``ns`` (the median of three loops) and ``fences_per_pair`` (fences recorded)."""
        import statistics

        from rmm_fences_bench import core_pair_ns

        runs = [core_pair_ns(core, nbytes) for _ in range(3)]
        return {
            "ns": statistics.median(r["ns"] for r in runs),
            "fences_per_pair": runs[-1]["fences"] / 1_000_000,
        }

    def track_core_pair_ns(self, core, nbytes):
        return self.measure(core, nbytes)["ns"]

    track_core_pair_ns.unit = "ns"
