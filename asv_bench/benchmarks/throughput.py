# SPDX-License-Identifier: Apache-2.0
"""RMM's RANDOM_ALLOCATIONS shape; pairs per second of 1 and 8 threads, on created streams and
on each thread's per-thread default stream; and the driver's stream queries (cuStreamIsCapturing,
cuStreamGetId) a stream-keyed pool makes per call, from 1 and 8 threads."""

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
        from rmm_fences_bench import random_allocations

        return random_allocations(
            self.mr, 100000, random_state=42, max_live_bytes="4GiB", stream=self.stream
        )

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
        from rmm_fences_bench import threaded_alloc_free

        return threaded_alloc_free(self.mr, 1 << 20, 20000, self.cupy_streams)

    track_pairs_per_s.unit = "pairs/s"


# The peers of the per-thread default stream benchmarks.
PEERS = ["rmm_fences_pool", "rmm_pool", "cuda_async"]


class PerThreadDefaultStream:
    """The native 1 MiB pair on the per-thread default stream (cudaStreamPerThread)."""

    params = [PEERS]
    param_names = ["chain"]

    def setup(self, chain):
        require_gpu()
        import cupy

        self.mr = make(chain)
        self.ptds = cupy.cuda.Stream.ptds

    def track_native_pair_ns(self, chain):
        from rmm_fences_bench import alloc_free_ns

        return alloc_free_ns(self.mr, 1 << 20, 20000, self.ptds)

    track_native_pair_ns.unit = "ns"


class ThreadsPerThreadStream:
    """As Threads, each C++ thread on its own per-thread default stream instead of a created
    one."""

    params = [PEERS, [1, 8]]
    param_names = ["chain", "threads"]
    timeout = 300

    def setup(self, chain, threads):
        require_gpu()
        import cupy

        self.mr = make(chain)
        self.ptds = cupy.cuda.Stream.ptds

    def track_pairs_per_s(self, chain, threads):
        from rmm_fences_bench import threaded_alloc_free

        return threaded_alloc_free(self.mr, 1 << 20, 20000, [self.ptds] * threads)

    track_pairs_per_s.unit = "pairs/s"


class DriverQueries:
    """Calls per second over all threads of one driver stream query, each thread on its own
    created stream: how the queries a stream-keyed pool makes per allocation scale."""

    params = [["is_capturing", "get_id"], [1, 8]]
    param_names = ["query", "threads"]

    def setup(self, query, threads):
        require_gpu()
        self.cupy_streams, _ = streams(threads)

    def track_calls_per_s(self, query, threads):
        from rmm_fences_bench import threaded_stream_queries

        return threaded_stream_queries(query, 200000, self.cupy_streams)

    track_calls_per_s.unit = "calls/s"
