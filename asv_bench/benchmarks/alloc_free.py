# SPDX-License-Identifier: Apache-2.0
"""allocate + deallocate per chain: from Python (time_) and in the native C++ loop (track_)."""

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
        from rmm_fences.bench import alloc_free_ns

        return alloc_free_ns(self.mr, nbytes, 20000, self.stream)

    track_native_pair_ns.unit = "ns"


class DeferredFence:
    """What a deferred free adds over the upstream's own pair (paired rounds, median)."""

    params = [["cuda_async", "rmm_pool"]]
    param_names = ["upstream"]

    def setup(self, upstream):
        require_gpu()
        from rmm_fences import SyncOnFreeResourceAdaptor

        self.upstream = make(upstream)
        self.adaptor = SyncOnFreeResourceAdaptor(self.upstream, mode="deferred")

    def track_cost_per_free_ns(self, upstream):
        import statistics

        from rmm_fences.bench import alloc_free_ns

        over = [alloc_free_ns(self.adaptor, 1 << 20, 20000)
                - alloc_free_ns(self.upstream, 1 << 20, 20000) for _ in range(5)]
        self.adaptor.flush()
        return statistics.median(over)

    track_cost_per_free_ns.unit = "ns"
