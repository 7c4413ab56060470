# SPDX-License-Identifier: Apache-2.0
"""Reuse across streams: blocks freed on one stream taken on another (each take costs a
stream-ordered pool a wait on a fence), and a short-lived stream per task (each new stream
gets a slot in rmm_fences' pool; once 64 are held, slots unused since the last sweep are
retired, and their cached blocks are reclaimed by a device sync)."""

from ._common import make, require_gpu, streams

_POOLS = ["rmm_fences_pool", "rmm_pool", "cuda_async"]
_TASKS = 2000


class CrossStream:
    """Native allocate on one stream + free on another: the allocations reuse blocks freed
    on the other stream (``rmm_fences_bench.alloc_free_ns`` with ``free_stream``)."""

    params = [_POOLS, [1 << 20, 64 << 20]]
    param_names = ["chain", "nbytes"]

    def setup(self, chain, nbytes):
        require_gpu()
        self.mr = make(chain)
        _, self.streams = streams(2)

    def track_pair_ns(self, chain, nbytes):
        from rmm_fences_bench import alloc_free_ns

        return alloc_free_ns(self.mr, nbytes, 20000, self.streams[0], free_stream=self.streams[1])

    track_pair_ns.unit = "ns"

    def track_same_stream_pair_ns(self, chain, nbytes):
        """The same pairs on one stream, for the ratio."""
        from rmm_fences_bench import alloc_free_ns

        return alloc_free_ns(self.mr, nbytes, 20000, self.streams[0])

    track_same_stream_pair_ns.unit = "ns"


def _tasks(mr, count=_TASKS, nbytes=1 << 20):
    """``count`` tasks, each on a new non-blocking stream: allocate, free, drop the stream.
    Returns microseconds per task (stream creation and destruction included)."""
    import time

    import cupy
    import rmm

    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(count):
        s = cupy.cuda.Stream(non_blocking=True)
        rs = rmm.pylibrmm.stream.Stream(s)
        mr.deallocate(mr.allocate(nbytes, rs), nbytes, rs)
        del rs, s  # the stream is destroyed here
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / count * 1e6


class StreamPerTask:
    params = [_POOLS]
    param_names = ["chain"]
    number = 1
    repeat = 3

    def setup(self, chain):
        require_gpu()
        self.mr = make(chain)
        _tasks(self.mr, 50)  # warm up: CuPy's stream machinery, the pool's first chunk

    def track_task_us(self, chain):
        return _tasks(self.mr)

    track_task_us.unit = "us"


class StreamSlots:
    """rmm_fences' pool after a stream per task: slots held (each with its cache and event)
    and bytes held from the upstream; both stay bounded however many streams went away."""

    def setup(self):
        require_gpu()
        self.mr = make("rmm_fences_pool")
        _tasks(self.mr)

    def track_stream_slots(self):
        return self.mr.stats["stream_slots"]

    track_stream_slots.unit = "slots"

    def track_pool_mib(self):
        return self.mr.stats["pool_bytes"] / 2**20

    track_pool_mib.unit = "MiB"
