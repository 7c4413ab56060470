# SPDX-License-Identifier: Apache-2.0
"""StreamOrderedPoolMemoryResource on a real GPU."""

import numpy as np
import pytest
import rmm

from rmm_fences import StreamOrderedPoolMemoryResource

from helpers.fill_check import fill_check
from helpers.threads import run_threads

pytestmark = pytest.mark.gpu
#: Blocks a stream takes back in a row, fenced and taken by nobody else, before it stops
#: sharing its big cache on each free (the pool core's `demand_decay`).
DEMAND_DECAY = 16


def rs(s):
    return rmm.pylibrmm.stream.Stream(s)


def test_cross_stream_reuse_while_a_slow_kernel_reads(scenarios, rng):
    # The pool holds exactly one 4 MiB block: s2 can only get the block s1 just freed,
    # through a wait on s1's fence enqueued on s2 (no host sync).
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "4MiB", "4MiB")
    res = scenarios.race(pool, trials=200, rng=rng)
    stats = pool.stats
    print(
        f"\npool race: {res.corrupted}/{res.trials} corrupted, same address "
        f"{res.same_address}, median free {res.median_free_us:.1f} us, {stats}"
    )
    assert res.same_address == res.trials  # the in-flight block was reused by s2 every time
    assert res.corrupted == 0
    # A stream's last exact-size frees are fenced only once another stream wanted its blocks:
    # the first round of each direction reclaims through one device sync, then every free is
    # fenced and taken with a stream wait.
    assert stats["reclaim_syncs"] <= 2
    assert stats["cross_stream_reuse"] >= res.trials - 2


def test_cross_stream_take_does_not_block_the_host(cupy, scenarios, rng):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "4MiB", "4MiB")
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    count = (4 << 20) // 4
    host = rng.standard_normal(count, dtype=np.float32)
    a = pool.allocate(4 << 20, rs(s1))
    with pytest.raises(MemoryError):  # s2 wants memory: s1's next big free is fenced for it
        pool.allocate(4 << 20, rs(s2))
    scenarios.as_array(a, count, np.float32).set(host, stream=s1)
    out = cupy.zeros(1, dtype=cupy.float64)
    s1.synchronize()
    scenarios.slow_checksum(a, count, 200, out, s1)
    pool.deallocate(a, 4 << 20, rs(s1))
    b = pool.allocate(4 << 20, rs(s2))
    assert b == a and not s1.done, "the host waited for the slow kernel"
    scenarios.fill(b, count, pattern=9, stream=s2)
    s2.synchronize()
    assert np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
    pool.deallocate(b, 4 << 20, rs(s2))


def test_threads_and_streams_with_real_kernels(cupy, scenarios):
    """8 threads x 8 streams x 20k random ops; blocks filled and verified by kernels, some
    freed on another stream after an event wait; no corruption and no leak."""
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "256MiB")
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(8)]
    rstreams = [rs(s) for s in streams]
    errors = cupy.zeros(1, dtype=cupy.uint64)

    def worker(tid):
        fill_check(
            pool,
            scenarios,
            streams,
            rstreams,
            errors,
            seed=2000 + tid,
            ops=20_000,
            max_live=32,
            max_words=1 << 16,
            free_elsewhere=True,  # some freed on another stream after an event wait
        )

    failures = run_threads(8, worker)
    assert not failures
    for s in streams:
        s.synchronize()
    assert int(errors.get()[0]) == 0
    stats = pool.stats
    print(f"\n8x8x20k: {stats}")
    assert stats["current_bytes"] == 0
    assert stats["cross_stream_reuse"] > 0 and stats["same_stream_reuse"] > 0
    # everything free: after the named device sync, every chunk goes back whole (release alone
    # never waits, so it keeps what the streams cached last, unfenced)
    assert pool.synchronize_and_reclaim()
    pool.release()
    assert pool.pool_size() == 0


def test_maximum_pool_size_raises_memory_error(cupy):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), maximum_pool_size="16MiB")
    s = rs(cupy.cuda.Stream(non_blocking=True))
    a = pool.allocate(12 << 20, s)
    with pytest.raises(MemoryError):
        pool.allocate(8 << 20, s)
    pool.deallocate(a, 12 << 20, s)
    b = pool.allocate(16 << 20, s)  # the freed block coalesces back into the whole pool
    pool.deallocate(b, 16 << 20, s)
    assert pool.pool_size() <= 16 << 20


def test_allocate_and_free_inside_stream_capture(cupy, scenarios):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "8MiB")
    s = cupy.cuda.Stream(non_blocking=True)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    s.begin_capture()
    a = pool.allocate(1 << 20, rs(s))  # from the untagged pool: no fence wait, no CUDA call
    scenarios.fill(a, (1 << 20) // 4, pattern=11, stream=s)
    scenarios.check(a, (1 << 20) // 4, pattern=11, errors=errors, stream=s)
    pool.deallocate(a, 1 << 20, rs(s))
    b = pool.allocate(1 << 20, rs(s))  # same capture: reuses the block freed in it
    pool.deallocate(b, 1 << 20, rs(s))
    graph = s.end_capture()
    assert b == a
    stats = pool.stats
    assert stats["fences"] == 0 and stats["stream_waits"] == 0 and stats["reclaim_syncs"] == 0
    for _ in range(3):
        graph.launch(stream=s)
    s.synchronize()
    assert int(errors.get()[0]) == 0
    c = pool.allocate(1 << 20, rs(s))  # after the capture the pool works as before
    pool.deallocate(c, 1 << 20, rs(s))


def test_retired_stream_gives_its_blocks_back_without_a_sync(cupy, scenarios):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "8MiB", "8MiB")
    s1 = cupy.cuda.Stream(non_blocking=True)
    s3 = cupy.cuda.Stream(non_blocking=True)
    a = pool.allocate(64 << 10, rs(s3))
    scenarios.fill(a, (64 << 10) // 4, pattern=1, stream=s3)
    pool.deallocate(a, 64 << 10, rs(s3))  # small: kept for s3 alone
    pool.retire_stream(s3)
    del s3  # destroyed after retirement: safe
    b = pool.allocate(8 << 20, rs(s1))  # needs s3's block: a fence wait, not a device sync
    stats = pool.stats
    assert stats["retired_streams"] == 1 and stats["reclaim_syncs"] == 0
    assert stats["stream_waits"] >= 1
    pool.deallocate(b, 8 << 20, rs(s1))


def test_default_and_per_thread_streams(cupy, scenarios):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "8MiB")
    legacy = rmm.pylibrmm.stream.Stream(cupy.cuda.Stream.null)
    per_thread = rmm.pylibrmm.stream.Stream(cupy.cuda.Stream.ptds)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    for s, cs in ((legacy, cupy.cuda.Stream.null), (per_thread, cupy.cuda.Stream.ptds)):
        a = pool.allocate(1 << 20, s)
        scenarios.fill(a, (1 << 20) // 4, pattern=5, stream=cs)
        scenarios.check(a, (1 << 20) // 4, pattern=5, errors=errors, stream=cs)
        pool.deallocate(a, 1 << 20, s)
        assert pool.allocate(1 << 20, s) == a  # same-stream reuse under both identities
        pool.deallocate(a, 1 << 20, s)
    cupy.cuda.Device().synchronize()
    assert int(errors.get()[0]) == 0


def test_pool_as_current_device_resource_with_cupy(cupy, rng):
    from rmm.allocators.cupy import rmm_cupy_allocator

    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaAsyncMemoryResource(), "64MiB")
    previous = rmm.mr.get_current_device_resource()
    previous_cupy = cupy.cuda.get_allocator()
    rmm.mr.set_current_device_resource(pool)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        x = rng.standard_normal(3_000_001)
        total = float(cupy.asarray(x).sum())
        assert np.isclose(total, x.sum(), rtol=1e-12)
        buf = rmm.DeviceBuffer.to_device(x.tobytes())
        assert np.array_equal(np.frombuffer(buf.tobytes(), dtype=np.float64), x)
        del buf
    finally:
        cupy.cuda.set_allocator(previous_cupy)
        rmm.mr.set_current_device_resource(previous)
    cupy.cuda.Device().synchronize()
    assert pool.stats["current_bytes"] == 0


_SLOW_KERNELS = r"""
extern "C" __global__ void slow_write(unsigned int* a, unsigned long long n, long long spin,
                                      unsigned int value)
{
    // Spin first: the owner frees the block while this kernel has yet to write it.
    long long start = clock64();
    while (clock64() - start < spin) { }
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        a[i] = value;
    }
}

extern "C" __global__ void slow_check(const unsigned int* a, unsigned long long n,
                                      long long spin, unsigned int pattern,
                                      unsigned long long* errors)
{
    // Spin first, then compare with the pattern of scenarios.fill (fill_pattern).
    long long start = clock64();
    while (clock64() - start < spin) { }
    unsigned long long bad = 0;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        bad += (a[i] != ((unsigned int)(i * 2654435761ull) ^ pattern));
    }
    if (bad) { atomicAdd(errors, bad); }
}
"""


@pytest.fixture(scope="module")
def slow_kernels(cupy):
    module = cupy.RawModule(code=_SLOW_KERNELS)
    return module.get_function("slow_write"), module.get_function("slow_check")


def test_growth_over_a_shared_stream_ordered_upstream(cupy, scenarios, slow_kernels):
    """rmm's pool, bounded to 96 MiB, is shared with another user whose slow kernel still
    writes a 64 MiB block it freed on its own non-blocking stream. The pool grows on another
    non-blocking stream: the upstream hands it that block, ordered only on the requesting
    stream (rmm's pool waits on the other stream's event there). Growing on the legacy stream
    left the new chunk unordered: the old kernel overwrote it after the pool's fill."""
    slow_write, _ = slow_kernels
    upstream = rmm.mr.PoolMemoryResource(
        rmm.mr.CudaMemoryResource(), initial_pool_size=96 << 20, maximum_pool_size=96 << 20
    )
    pool = StreamOrderedPoolMemoryResource(upstream)
    other = cupy.cuda.Stream(non_blocking=True)
    s = cupy.cuda.Stream(non_blocking=True)
    nbytes, count = 64 << 20, (64 << 20) // 4
    spin = np.int64(scenarios.spin_cycles(30))
    errors = cupy.zeros(1, dtype=cupy.uint64)
    corrupted = 0
    for trial in range(20):
        x = upstream.allocate(nbytes, rs(other))
        slow_write(
            (scenarios.grid_for(count),),
            (256,),
            (x, np.uint64(count), spin, np.uint32(0xDEAD0000 + trial)),
            stream=other,
        )
        upstream.deallocate(x, nbytes, rs(other))  # freed while the kernel has yet to write
        p = pool.allocate(nbytes, rs(s))  # grows: the upstream can only give x's bytes
        assert pool.stats["upstream_growths"] == trial + 1
        pattern = 1000 + trial
        scenarios.fill(p, count, pattern, stream=s)
        other.synchronize()
        s.synchronize()
        before = int(errors.get()[0])
        scenarios.check(p, count, pattern, errors, stream=s)
        s.synchronize()
        corrupted += int(errors.get()[0]) > before
        pool.deallocate(p, nbytes, rs(s))
        pool.retire_stream(rs(s))  # fenced and shared: release needs no sync to return it
        assert pool.release() == nbytes  # the chunk goes back: the next trial grows again
    print(f"\ngrowth over a shared rmm pool: {corrupted}/20 corrupted, {pool.stats}")
    assert corrupted == 0


def test_stream_forked_into_a_capture_does_not_get_its_parents_block(cupy, scenarios, slow_kernels):
    """In one capture, the parent frees a block that its slow check still reads; a stream
    forked into the capture (event record/wait) allocates the same size and fills it in a
    parallel branch. Sharing one cache (one capture id) gave the branch the parent's block
    with no edge: every graph launch corrupted the check."""
    _, slow_check = slow_kernels
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "8MiB")
    parent = cupy.cuda.Stream(non_blocking=True)
    branch = cupy.cuda.Stream(non_blocking=True)
    nbytes, count = 4 << 20, (4 << 20) // 4
    errors = cupy.zeros(1, dtype=cupy.uint64)
    spin = np.int64(scenarios.spin_cycles(20))
    fork = cupy.cuda.Event(disable_timing=True)  # created outside the capture
    join = cupy.cuda.Event(disable_timing=True)
    parent.begin_capture()
    a = pool.allocate(nbytes, rs(parent))
    scenarios.fill(a, count, pattern=21, stream=parent)
    fork.record(parent)
    branch.wait_event(fork)  # the branch joins the capture
    slow_check(
        (scenarios.grid_for(count),),
        (256,),
        (a, np.uint64(count), spin, np.uint32(21), errors),
        stream=parent,
    )
    pool.deallocate(a, nbytes, rs(parent))
    b = pool.allocate(nbytes, rs(branch))  # a parallel branch
    scenarios.fill(b, count, pattern=22, stream=branch)
    join.record(branch)
    parent.wait_event(join)  # and rejoins the parent before the capture ends
    pool.deallocate(b, nbytes, rs(parent))
    graph = parent.end_capture()
    assert b != a, "the forked branch got the block its parent freed in the capture"
    for _ in range(3):
        graph.launch(stream=parent)
    parent.synchronize()
    assert int(errors.get()[0]) == 0


def test_bad_sizes_and_frees_are_refused(cupy):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "8MiB")
    s = rs(cupy.cuda.Stream(non_blocking=True))
    with pytest.raises(MemoryError):
        pool.allocate(2**64 - 1, s)
    a = pool.allocate(1000, s)
    with pytest.raises(ValueError, match="size mismatch: allocated 1000 bytes, freed with 999"):
        pool.deallocate(a, 999, s)
    pool.deallocate(a, 1000, s)
    with pytest.raises(ValueError, match="double free or foreign pointer"):
        pool.deallocate(a, 1000, s)
    b = pool.allocate(1000, s)
    c = pool.allocate(1000, s)
    assert b != c, "two live allocations share a block"
    stats = pool.stats
    assert stats["rejected_frees"] == 2 and stats["current_bytes"] == 2 * 1024
    pool.deallocate(b, 1000, s)
    pool.deallocate(c, 1000, s)


def test_same_stream_reuse_of_a_64_mib_block_fences_only_its_first_frees(cupy, scenarios):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "64MiB", "64MiB")
    cs = cupy.cuda.Stream(non_blocking=True)
    s = rs(cs)
    nbytes, count = 64 << 20, (64 << 20) // 4
    errors = cupy.zeros(1, dtype=cupy.uint64)
    for i in range(100):
        p = pool.allocate(nbytes, s)
        scenarios.fill(p, count, pattern=i, stream=cs)
        scenarios.check(p, count, pattern=i, errors=errors, stream=cs)
        pool.deallocate(p, nbytes, s)
    cs.synchronize()
    stats = pool.stats
    assert int(errors.get()[0]) == 0
    assert stats["fences"] == 16, f"{stats['fences']} fences"  # a new stream's young frees
    assert stats["same_stream_reuse"] >= 99 - 16


def test_growth_during_capture_of_a_blocking_stream(cupy, scenarios):
    """An empty pool over CudaAsync grows while a blocking stream is captured: the chunk comes
    on the pool's own non-blocking stream (synchronized), never on the legacy stream (whose
    work would invalidate the capture of a blocking stream) nor on the captured stream (an
    allocation node in the graph)."""
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaAsyncMemoryResource())
    s = cupy.cuda.Stream()  # blocking
    errors = cupy.zeros(1, dtype=cupy.uint64)
    nbytes, count = 1 << 20, (1 << 20) // 4
    s.synchronize()
    s.begin_capture()
    a = pool.allocate(nbytes, rs(s))  # grows
    scenarios.fill(a, count, pattern=3, stream=s)
    scenarios.check(a, count, pattern=3, errors=errors, stream=s)
    graph = s.end_capture()
    assert pool.stats["upstream_growths"] == 1
    for _ in range(3):
        graph.launch(stream=s)
    s.synchronize()
    assert int(errors.get()[0]) == 0
    pool.deallocate(a, nbytes, rs(s))
    pool.release()  # back upstream on the pool's own stream
    assert pool.pool_size() == 0


def test_native_pairs_freed_on_another_stream_are_cross_stream_reuse(cupy):
    # rmm_fences_bench.alloc_free_ns(..., free_stream=) (the asv CrossStream benchmark):
    # allocations on s1 reuse blocks freed on s2, through fences and waits. s2 fences its cache
    # only once another stream ran short, so the first shortage costs one growth (never more).
    from rmm_fences_bench import alloc_free_ns

    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 26)
    s1, s2 = (rmm.pylibrmm.stream.Stream(cupy.cuda.Stream(non_blocking=True)) for _ in range(2))
    ns = alloc_free_ns(pool, 1 << 20, 2000, s1, warmup=0, free_stream=s2)
    stats = pool.stats
    print(f"\ncross-stream native pair: {ns:.0f} ns, {stats}")
    assert ns > 0 and stats["current_bytes"] == 0 and stats["rejected_frees"] == 0
    assert stats["cross_stream_reuse"] > 0 and stats["stream_waits"] > 0
    assert stats["upstream_growths"] <= 1  # then 1 MiB blocks circulate in the pool


def test_same_stream_64_mib_reuse_after_another_stream_ran_short_stops_fencing(cupy, scenarios):
    # s2 runs short while s1, past its young frees, caches its 64 MiB block unfenced: the pool
    # raises MemoryError rather than synchronize the device, and asks s1 to fence; s1's next
    # free is fenced, then its big frees are fenced for others until s1 took back, 16 times in
    # a row (the core's demand_decay), a block it fenced that nobody took; then its pairs record
    # nothing. Before the demand rule, every later same-stream free recorded an event.
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "128MiB", "128MiB")
    c1, c2 = (cupy.cuda.Stream(non_blocking=True) for _ in range(2))
    s1, s2 = rs(c1), rs(c2)
    for _ in range(16):  # s1's young frees (each fenced)
        pool.deallocate(pool.allocate(256, s1), 256, s1)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    nbytes, count = 64 << 20, (64 << 20) // 4
    a = pool.allocate(nbytes, s1)
    scenarios.fill(a, count, pattern=1, stream=c1)
    pool.deallocate(a, nbytes, s1)
    with pytest.raises(MemoryError):
        pool.allocate(96 << 20, s2)  # runs short: needs s1's cached, unfenced block
    assert pool.stats["reclaim_syncs"] == 0
    fences = pool.stats["fences"]
    settled = None
    for i in range(100):
        if i == DEMAND_DECAY + 1:
            settled = pool.stats["fences"]
        p = pool.allocate(nbytes, s1)
        scenarios.fill(p, count, pattern=10 + i, stream=c1)
        scenarios.check(p, count, pattern=10 + i, errors=errors, stream=c1)
        pool.deallocate(p, nbytes, s1)
    loop_fences = pool.stats["fences"] - fences
    settled_fences = pool.stats["fences"] - settled
    pool.retire_stream(s1)  # fenced and shared
    b = pool.allocate(96 << 20, s2)  # s1's block, after a wait on its fence
    scenarios.fill(b, (96 << 20) // 4, pattern=2, stream=c2)
    scenarios.check(b, (96 << 20) // 4, pattern=2, errors=errors, stream=c2)
    pool.deallocate(b, 96 << 20, s2)
    c1.synchronize()
    c2.synchronize()
    stats = pool.stats
    print(f"\n64 MiB same-stream reuse after a shortage: {stats}")
    assert int(errors.get()[0]) == 0
    assert stats["reclaim_syncs"] == 0 and stats["cross_stream_reuse"] >= 1
    assert loop_fences <= DEMAND_DECAY + 1, f"{loop_fences} fences for 100 pairs"
    assert settled_fences == 0, f"{settled_fences} fences for the last {99 - DEMAND_DECAY} pairs"
    assert stats["same_stream_reuse"] >= 98


def test_stream_per_task_keeps_slots_and_events_bounded(cupy, scenarios, slow_kernels):
    """2000 tasks, each on a new non-blocking stream: fill two blocks, check them, and free
    them while a slow check of the first still runs, then drop the stream (every fourth task
    retires it first). Later tasks' streams may get those bytes only after the old stream's
    fence or a device sync: an early reuse overwrites the block under the slow check. The
    slots, events and chunks the pool holds stay bounded (before: one slot per task, and the
    pool grew by every dead stream's cached blocks)."""
    _, slow_check = slow_kernels
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "64MiB")
    errors = cupy.zeros(1, dtype=cupy.uint64)
    spin = np.int64(scenarios.spin_cycles(0.2))
    big, small = 1 << 20, 64 << 10
    tasks, peak_slots, peak_events = 2000, 0, 0
    for t in range(tasks):
        stream = cupy.cuda.Stream(non_blocking=True)
        r = rs(stream)
        a = pool.allocate(big, r)
        b = pool.allocate(small, r)
        pattern = 2 * t + 1
        scenarios.fill(a, big // 4, pattern, stream=stream)
        scenarios.fill(b, small // 4, pattern + 1, stream=stream)
        scenarios.check(b, small // 4, pattern + 1, errors=errors, stream=stream)
        slow_check(
            (scenarios.grid_for(big // 4),),
            (256,),
            (a, np.uint64(big // 4), spin, np.uint32(pattern), errors),
            stream=stream,
        )
        pool.deallocate(b, small, r)
        pool.deallocate(a, big, r)  # the slow check still reads it
        if t % 4 == 0:
            pool.retire_stream(r)
        del r, stream  # destroyed with its work still queued
        stats = pool.stats
        peak_slots = max(peak_slots, stats["stream_slots"])
        peak_events = max(peak_events, stats["fence_events"])
    cupy.cuda.Device().synchronize()
    stats = pool.stats
    print(f"\nstream per task: peak slots {peak_slots}, peak events {peak_events}, {stats}")
    assert int(errors.get()[0]) == 0
    assert peak_slots <= 160, f"{peak_slots} slots for {tasks} streams"
    assert peak_events <= 400, f"{peak_events} events for {tasks} streams"
    assert stats["current_bytes"] == 0 and stats["retired_streams"] == tasks // 4
    # the tasks' bytes did move between streams, through fences (a new stream's first frees
    # are fenced), never through a device sync
    assert stats["cross_stream_reuse"] > 0 and stats["reclaim_syncs"] == 0
    assert pool.pool_size() <= 512 << 20, f"pool grew to {pool.pool_size() >> 20} MiB"


def test_a_global_capture_in_another_thread_survives_new_streams_and_handovers(
    cupy, scenarios, rng, capture_elsewhere
):
    """While another thread holds a global-mode capture, the pool meets streams it has not
    seen (each identity is queried: cuStreamIsCapturing, then cuStreamGetId, outside any
    capture-mode exchange) and hands its only block from each stream to the next (a retire
    records a fence, the next stream waits on it). No query, record or wait may invalidate the
    other thread's capture, and no stream may overwrite the block while the previous stream's
    slow kernel still checks it."""
    trials, nbytes, spin_ms = 8, 4 << 20, 20.0
    count = nbytes // 4
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "4MiB", "4MiB")
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(trials)]
    patterns = [int(x) for x in rng.integers(1, 2**32, size=trials)]
    spin = cupy.asarray(rng.standard_normal(16, dtype=np.float32))
    spun = cupy.zeros(trials, dtype=cupy.float64)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    scenarios.slow_checksum(spin.data.ptr, 16, 0.01, spun[:1], streams[0], grid=1)  # loads
    cupy.cuda.Device().synchronize()
    spun.fill(0)
    taken = []
    with capture_elsewhere() as result:
        for i, s in enumerate(streams):
            a = pool.allocate(nbytes, rs(s))  # a stream the pool has not seen
            taken.append(a)
            scenarios.fill(a, count, patterns[i], s)
            scenarios.slow_checksum(spin.data.ptr, 16, spin_ms, spun[i : i + 1], s, grid=1)
            scenarios.check(a, count, patterns[i], errors, s)  # after the spin
            pool.deallocate(a, nbytes, rs(s))
            pool.retire_stream(s)  # the block is shared behind this stream's fence
    cupy.cuda.Device().synchronize()
    stats = pool.stats
    print(f"\npool with a global capture elsewhere: {stats}, capture: {result}")
    assert "error" not in result, f"the other thread's capture failed: {result['error']!r}"
    assert result["errors"] == 0
    assert int(errors.get()[0]) == 0, "a stream overwrote the block before the check ran"
    assert len(set(taken)) == 1  # the one block went from stream to stream
    assert stats["stream_waits"] >= trials - 1 and stats["reclaim_syncs"] == 0
    np.testing.assert_allclose(
        spun.get(), np.full(trials, spin.get().astype(np.float64).sum()), rtol=1e-12
    )
