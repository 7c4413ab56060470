# SPDX-License-Identifier: Apache-2.0
"""SyncOnFreeResourceAdaptor on a real GPU: the seed's race observed, then fixed."""

import threading

import numpy as np
import pytest
import rmm

from rmm_fences import SyncOnFreeResourceAdaptor
from rmm_fences.unsafe import NaiveCachingMemoryResource

pytestmark = pytest.mark.gpu

MODES = ("device", "stream", "deferred")


def rmm_stream(cupy_stream):
    return rmm.pylibrmm.stream.Stream(cupy_stream)


def test_race_corrupts_through_the_naive_cache(scenarios, rng):
    mr = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    res = scenarios.race(mr, trials=50, rng=rng)
    print(f"\nnaive_cache(cuda): {res.corrupted}/{res.trials} corrupted ({res.rate:.0%}), "
          f"same address {res.same_address}/{res.trials}")
    assert res.same_address == res.trials  # the cache handed the block to s2 at once
    assert res.corrupted >= 1, "the hazard was not observed"


@pytest.mark.parametrize("mode", MODES)
def test_sync_on_free_fixes_the_race(scenarios, rng, mode):
    mr = SyncOnFreeResourceAdaptor(NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()),
                                   mode=mode)
    res = scenarios.race(mr, trials=200, rng=rng)
    print(f"\nsync_on_free(naive_cache(cuda), mode={mode}): {res.corrupted}/{res.trials} "
          f"corrupted, median free {res.median_free_us:.1f} us, "
          f"same address {res.same_address}")
    assert res.corrupted == 0
    mr.flush()
    assert mr.pending_count == 0 and mr.pending_bytes == 0
    if mode == "deferred":
        assert mr.stats["deferred"] >= 2 * res.trials
        assert mr.stats["syncs"] == 0  # never blocked in deallocate
    else:
        assert mr.stats["syncs"] >= 2 * res.trials


def test_deferred_free_does_not_block(cupy, scenarios, rng):
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = SyncOnFreeResourceAdaptor(naive, mode="deferred")
    s1 = cupy.cuda.Stream(non_blocking=True)
    count = 1 << 20
    host = rng.standard_normal(count, dtype=np.float32)
    a = mr.allocate(count * 4, rmm_stream(s1))
    scenarios.as_array(a, count, np.float32).set(host, stream=s1)
    out = cupy.zeros(1, dtype=cupy.float64)
    s1.synchronize()
    scenarios.slow_checksum(a, count, 200, out, s1)
    mr.deallocate(a, count * 4, rmm_stream(s1))
    assert not s1.done, "deallocate waited for the kernel"
    assert mr.pending_count == 1 and naive.cached_bytes == 0  # not upstream yet
    s1.synchronize()
    mr.flush()
    assert naive.cached_bytes == count * 4 and mr.pending_count == 0
    assert np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)


def test_oom_drains_pending_frees_then_retries(cupy, scenarios, rng):
    limit = 64 << 20
    nbytes = 48 << 20
    limiting = rmm.mr.LimitingResourceAdaptor(rmm.mr.CudaMemoryResource(), limit)
    mr = SyncOnFreeResourceAdaptor(limiting, mode="deferred")
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    count = nbytes // 4
    host = rng.standard_normal(count, dtype=np.float32)
    a = mr.allocate(nbytes, rmm_stream(s1))
    scenarios.as_array(a, count, np.float32).set(host, stream=s1)
    out = cupy.zeros(1, dtype=cupy.float64)
    s1.synchronize()
    scenarios.slow_checksum(a, count, 50, out, s1)
    mr.deallocate(a, nbytes, rmm_stream(s1))
    assert mr.pending_bytes == nbytes and limiting.get_allocated_bytes() == nbytes
    b = mr.allocate(nbytes, rmm_stream(s2))  # over the limit until the drain
    assert mr.stats["oom_retries"] == 1 and mr.pending_count == 0
    errors = cupy.zeros(1, dtype=cupy.uint64)
    scenarios.fill(b, count, seed=7, stream=s2)
    scenarios.check(b, count, seed=7, errors=errors, stream=s2)
    s2.synchronize()
    assert int(errors.get()[0]) == 0
    # the slow kernel read A before it was reused
    assert np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
    with pytest.raises(MemoryError):
        mr.allocate(nbytes, rmm_stream(s2))  # nothing pending to drain: a real OOM
    mr.deallocate(b, nbytes, rmm_stream(s2))
    mr.flush()
    assert limiting.get_allocated_bytes() == 0


def test_max_pending_bytes_caps_the_pending_total(cupy, scenarios):
    # A preallocated pool upstream: no cudaMalloc, whose implicit syncs could retire fences.
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=64 << 20)
    mr = SyncOnFreeResourceAdaptor(pool, max_pending_bytes="3MiB")
    s1 = cupy.cuda.Stream(non_blocking=True)
    out = cupy.zeros(1, dtype=cupy.float64)
    for _ in range(8):
        a = mr.allocate(1 << 20, rmm_stream(s1))
        scenarios.fill(a, (1 << 20) // 4, seed=3, stream=s1)
        scenarios.slow_checksum(a, 16, 20, out, s1, grid=1)
        mr.deallocate(a, 1 << 20, rmm_stream(s1))
        assert mr.pending_bytes <= 3 << 20
    # 8 frees of 1 MiB behind 20 ms kernels: the 4th and later had to wait for the oldest
    assert mr.stats["syncs"] >= 5
    assert mr.stats["peak_pending_bytes"] == 3 << 20  # the cap is enforced before the peak is noted
    mr.flush()
    assert mr.pending_bytes == 0


def test_many_threads_and_streams_over_rmm_pool(cupy, scenarios):
    """8 threads x 4 streams x 10k random alloc/free; every block filled by a kernel and
    verified by another before its free; nothing pending or leaked at the end."""
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
    stats = rmm.mr.StatisticsResourceAdaptor(pool)
    mr = SyncOnFreeResourceAdaptor(stats, mode="deferred")
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(4)]
    rstreams = [rmm_stream(s) for s in streams]
    errors = cupy.zeros(1, dtype=cupy.uint64)
    failures = []

    def worker(tid):
        rng = np.random.default_rng(1000 + tid)
        live = []
        try:
            for i in range(10_000):
                if live and (len(live) > 16 or rng.random() < 0.5):
                    ptr, nbytes, s, seed = live.pop(int(rng.integers(len(live))))
                    scenarios.check(ptr, nbytes // 4, seed, errors, streams[s])
                    mr.deallocate(ptr, nbytes, rstreams[s])
                else:
                    nbytes = int(rng.integers(1, 1 << 18)) * 4
                    s = int(rng.integers(4))
                    seed = int(rng.integers(1, 2**32))
                    ptr = mr.allocate(nbytes, rstreams[s])
                    scenarios.fill(ptr, nbytes // 4, seed, streams[s])
                    live.append((ptr, nbytes, s, seed))
            for ptr, nbytes, s, seed in live:
                scenarios.check(ptr, nbytes // 4, seed, errors, streams[s])
                mr.deallocate(ptr, nbytes, rstreams[s])
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
    mr.flush()
    assert int(errors.get()[0]) == 0
    assert mr.pending_count == 0
    assert stats.allocation_counts.current_bytes == 0  # everything went back upstream
    print(f"\n8x4x10k: {mr.stats}")


def test_stream_capture_parks_the_free(cupy, scenarios):
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = SyncOnFreeResourceAdaptor(naive, mode="deferred")
    s = cupy.cuda.Stream(non_blocking=True)
    a = mr.allocate(1 << 20, rmm_stream(s))
    s.begin_capture()
    scenarios.fill(a, (1 << 20) // 4, seed=5, stream=s)
    mr.deallocate(a, 1 << 20, rmm_stream(s))
    graph = s.end_capture()
    assert mr.stats["parked"] == 1 and mr.pending_count == 1 and naive.cached_bytes == 0
    graph.launch(stream=s)
    b = mr.allocate(256, rmm_stream(s))  # outside capture: arms the parked block's fence
    s.synchronize()
    mr.deallocate(b, 256, rmm_stream(s))
    mr.flush()
    assert mr.pending_count == 0 and naive.cached_bytes == (1 << 20) + 256


def test_sync_modes_have_the_right_surface():
    up = rmm.mr.CudaMemoryResource()
    mr = SyncOnFreeResourceAdaptor(up, mode="stream", max_pending_bytes="1KiB")
    assert mr.mode == "stream" and mr.max_pending_bytes == 1024
    assert mr.get_upstream() is up
    assert set(mr.stats) >= {"syncs", "deferred", "released", "oom_retries"}
    assert "SyncOnFreeResourceAdaptor(CudaMemoryResource(), mode='stream'" in repr(mr)
