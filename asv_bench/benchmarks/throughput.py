# SPDX-License-Identifier: Apache-2.0
"""RMM's RANDOM_ALLOCATIONS shape, and pairs per second of 8 threads on 8 streams."""

from ._common import CHAINS, make, require_gpu, streams


class RandomAllocations:
    params = [list(CHAINS)]
    param_names = ["chain"]
    timeout = 300

    def setup(self, chain):
        require_gpu()
        self.mr = make(chain)
        _, (self.stream,) = streams()

    def track_ops_per_s(self, chain):
        from rmm_fences.bench import random_allocations

        return random_allocations(self.mr, 100000, random_state=42, max_live_bytes="4GiB",
                                  stream=self.stream)

    track_ops_per_s.unit = "ops/s"


class Threads:
    params = [list(CHAINS), [1, 8]]
    param_names = ["chain", "threads"]
    timeout = 300

    def setup(self, chain, threads):
        require_gpu()
        self.mr = make(chain)
        self.cupy_streams, _ = streams(threads)

    def track_pairs_per_s(self, chain, threads):
        from rmm_fences.bench import threaded_alloc_free

        return threaded_alloc_free(self.mr, 1 << 20, 20000, self.cupy_streams)

    track_pairs_per_s.unit = "pairs/s"
