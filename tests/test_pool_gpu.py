# SPDX-License-Identifier: Apache-2.0
"""StreamOrderedPoolMemoryResource on a real GPU."""

import threading

import numpy as np
import pytest
import rmm

from rmm_fences import StreamOrderedPoolMemoryResource

pytestmark = pytest.mark.gpu


def rs(s):
    return rmm.pylibrmm.stream.Stream(s)


def test_cross_stream_reuse_while_a_slow_kernel_reads(scenarios, rng):
    # The pool holds exactly one 4 MiB block: s2 can only get the block s1 just freed,
    # through a wait on s1's fence enqueued on s2 (no host sync).
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "4MiB", "4MiB")
    res = scenarios.race(pool, trials=200, rng=rng)
    stats = pool.stats
    print(f"\npool race: {res.corrupted}/{res.trials} corrupted, same address "
          f"{res.same_address}, median free {res.median_free_us:.1f} us, {stats}")
    assert res.same_address == res.trials  # the in-flight block was reused by s2 every time
    assert res.corrupted == 0
    assert stats["cross_stream_reuse"] >= res.trials and stats["reclaim_syncs"] == 0


def test_cross_stream_take_does_not_block_the_host(cupy, scenarios, rng):
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "4MiB", "4MiB")
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    count = (4 << 20) // 4
    host = rng.standard_normal(count, dtype=np.float32)
    a = pool.allocate(4 << 20, rs(s1))
    scenarios.as_array(a, count, np.float32).set(host, stream=s1)
    out = cupy.zeros(1, dtype=cupy.float64)
    s1.synchronize()
    scenarios.slow_checksum(a, count, 200, out, s1)
    pool.deallocate(a, 4 << 20, rs(s1))
    b = pool.allocate(4 << 20, rs(s2))
    assert b == a and not s1.done, "the host waited for the slow kernel"
    scenarios.fill(b, count, seed=9, stream=s2)
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
    failures = []

    def worker(tid):
        rng = np.random.default_rng(2000 + tid)
        live = []
        try:
            for _ in range(20_000):
                if live and (len(live) > 32 or rng.random() < 0.5):
                    ptr, nbytes, s, seed = live.pop(int(rng.integers(len(live))))
                    scenarios.check(ptr, nbytes // 4, seed, errors, streams[s])
                    t = int(rng.integers(8))
                    if t != s:  # free on another stream, ordered after the check
                        streams[t].wait_event(streams[s].record())
                    pool.deallocate(ptr, nbytes, rstreams[t])
                else:
                    nbytes = int(rng.integers(1, 1 << 16)) * 4
                    s = int(rng.integers(8))
                    seed = int(rng.integers(1, 2**32))
                    ptr = pool.allocate(nbytes, rstreams[s])
                    scenarios.fill(ptr, nbytes // 4, seed, streams[s])
                    live.append((ptr, nbytes, s, seed))
            for ptr, nbytes, s, seed in live:
                scenarios.check(ptr, nbytes // 4, seed, errors, streams[s])
                pool.deallocate(ptr, nbytes, rstreams[s])
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    for s in streams:
        s.synchronize()
    assert int(errors.get()[0]) == 0
    stats = pool.stats
    print(f"\n8x8x20k: {stats}")
    assert stats["current_bytes"] == 0
    assert stats["cross_stream_reuse"] > 0 and stats["same_stream_reuse"] > 0
    pool.release()  # everything free: every chunk goes back whole
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
    scenarios.fill(a, (1 << 20) // 4, seed=11, stream=s)
    scenarios.check(a, (1 << 20) // 4, seed=11, errors=errors, stream=s)
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
    scenarios.fill(a, (64 << 10) // 4, seed=1, stream=s3)
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
        scenarios.fill(a, (1 << 20) // 4, seed=5, stream=cs)
        scenarios.check(a, (1 << 20) // 4, seed=5, errors=errors, stream=cs)
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
