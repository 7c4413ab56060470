# SPDX-License-Identifier: Apache-2.0
"""SyncOnFreeResourceAdaptor on a real GPU: free while in flight observed, then fixed."""

import gc
import math
import threading

import numpy as np
import pytest
import rmm

from rmm_fences import SyncOnFreeResourceAdaptor
from rmm_fences.unsafe import NaiveCachingMemoryResource

from helpers.fill_check import fill_check
from helpers.threads import dump_stacks, run_threads

pytestmark = pytest.mark.gpu

MODES = ("device", "stream", "deferred")


def rmm_stream(cupy_stream):
    return rmm.pylibrmm.stream.Stream(cupy_stream)


def test_race_corrupts_through_the_naive_cache(scenarios, rng):
    mr = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    res = scenarios.race(mr, trials=50, rng=rng)
    print(
        f"\nnaive_cache(cuda): {res.corrupted}/{res.trials} corrupted ({res.rate:.0%}), "
        f"same address {res.same_address}/{res.trials}"
    )
    assert res.same_address == res.trials  # the cache handed the block to s2 at once
    assert res.corrupted >= 1, "the hazard was not observed"


@pytest.mark.parametrize("mode", MODES)
def test_sync_on_free_fixes_the_race(scenarios, rng, mode):
    mr = SyncOnFreeResourceAdaptor(
        NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()), mode=mode
    )
    res = scenarios.race(mr, trials=200, rng=rng)
    before_flush = mr.stats
    print(
        f"\nsync_on_free(naive_cache(cuda), mode={mode}): {res.corrupted}/{res.trials} "
        f"corrupted, median free {res.median_free_us:.1f} us, "
        f"same address {res.same_address}, {before_flush}"
    )
    assert res.corrupted == 0
    mr.flush()
    assert mr.pending_count == 0 and mr.pending_bytes == 0
    if mode == "deferred":
        assert before_flush["deferred"] >= 2 * res.trials
        assert before_flush["syncs"] == 0  # never blocked in deallocate
        # frees on s1 and s2 share events: one per 16 frees on a stream, and the first free on
        # each stream fenced alone
        assert before_flush["fences"] <= 2 * (1 + math.ceil(res.trials / 16))
    else:
        assert mr.stats["syncs"] >= 2 * res.trials


def test_the_freeing_stream_takes_its_block_back_without_an_event(scenarios, rng):
    """The race, with the next allocation on the freeing stream itself: it gets the block
    back at once (same address, no event, no upstream call) and overwrites it while the slow
    kernel may still read it; the stream runs the overwrite after the kernel, so every
    checksum matches its float64 reference."""
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = SyncOnFreeResourceAdaptor(naive)
    res = scenarios.race(mr, trials=100, rng=rng, scenario="same_stream_reuse")
    stats = mr.stats
    print(f"\nsame-stream reuse: {res.corrupted}/{res.trials} corrupted, {stats}")
    assert res.corrupted == 0
    # The stream's first free is fenced alone, before its identity is known: from the second
    # trial on, every allocation takes back the block freed just before it.
    assert res.same_address == res.trials - 1
    assert stats["same_stream_reuse"] == 2 * res.trials - 2
    assert stats["fences"] <= 1 and naive.misses <= 2
    mr.flush()
    assert mr.pending_count == 0


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
    scenarios.fill(b, count, pattern=7, stream=s2)
    scenarios.check(b, count, pattern=7, errors=errors, stream=s2)
    s2.synchronize()
    assert int(errors.get()[0]) == 0
    # the slow kernel read A before it was reused
    assert np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
    with pytest.raises(MemoryError):
        mr.allocate(nbytes, rmm_stream(s2))  # nothing pending to drain: a real OOM
    mr.deallocate(b, nbytes, rmm_stream(s2))
    mr.flush()
    assert limiting.get_allocated_bytes() == 0


def test_frees_on_one_stream_share_events_and_no_block_goes_early(cupy, scenarios, rng):
    """24 blocks freed on s1 while slow kernels still read them; after each free the next
    block of that size is taken on s2 and overwritten there (the naive cache hands a released
    block out at once). Frees on s1 share events (max_batch_frees=4): at most ceil(24 / 4)
    are recorded. A block released before its kernel ended would be overwritten under it:
    every checksum must match its float64 reference."""
    trials, k, nbytes, spin_ms = 24, 4, 1 << 20, 2.0
    count = nbytes // 4
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    # Batches alone: the blocks are not taken back on s1 (reuse_on_stream=False).
    mr = SyncOnFreeResourceAdaptor(
        naive, max_batch_frees=k, max_batch_bytes=None, reuse_on_stream=False
    )
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    r1, r2 = rmm_stream(s1), rmm_stream(s2)
    outs = cupy.zeros(trials, dtype=cupy.float64)
    warm = cupy.zeros(1, dtype=cupy.float64)
    probe = mr.allocate(nbytes, r1)  # loads the kernels' module before the timed part
    scenarios.slow_checksum(probe, 16, 0.01, warm, s1, grid=1)
    s1.synchronize()
    mr.deallocate(probe, nbytes, r1)  # s1's first free: fenced alone
    s1.synchronize()
    refs, freed, taken = [], [], []
    for i in range(trials):
        host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
        refs.append(host.astype(np.float64).sum())
        a = mr.allocate(nbytes, r1)
        scenarios.as_array(a, count, np.float32).set(host, stream=s1)
        scenarios.slow_checksum(a, count, spin_ms, outs[i : i + 1], s1)
        mr.deallocate(a, nbytes, r1)
        freed.append(a)
        b = mr.allocate(nbytes, r2)
        scenarios.fill(b, count, int(rng.integers(1, 2**32)), s2)
        taken.append(b)
    stats = mr.stats
    s1.synchronize()
    s2.synchronize()
    got = outs.get()
    corrupted = sum(not np.isclose(g, r, rtol=1e-9, atol=1e-6) for g, r in zip(got, refs))
    reused = sum(b in set(freed) for b in taken)
    print(f"\nshared events: {corrupted}/{trials} corrupted, {reused} blocks reused, {stats}")
    assert corrupted == 0, f"{corrupted}/{trials} checksums corrupted"
    assert 1 + 1 <= stats["fences"] <= 1 + math.ceil(trials / k)  # the probe's, then batches
    assert stats["deferred"] == trials + 1 and stats["syncs"] == 0
    for b in taken:
        mr.deallocate(b, nbytes, r2)
    mr.flush()
    assert mr.pending_count == 0 and naive.cached_bytes == naive.misses * nbytes


def test_out_of_memory_fences_a_live_streams_batch_or_synchronizes_the_device(cupy, scenarios, rng):
    """Blocks freed on s1 while slow kernels read them, most without an event yet (a batch).
    An allocation on s2 that needs their memory cannot record on s1 (it may be gone): the
    adaptor waits for the event it has and synchronizes the device. An allocation on s1
    itself records the batch's event there and waits for it. Either way the retried
    allocation is overwritten at once, and every kernel's checksum must match."""
    nbytes, limit, spin_ms = 16 << 20, 64 << 20, 20.0
    count = nbytes // 4
    limiting = rmm.mr.LimitingResourceAdaptor(rmm.mr.CudaMemoryResource(), limit)
    mr = SyncOnFreeResourceAdaptor(limiting)  # the defaults: 16 frees per event
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    r1, r2 = rmm_stream(s1), rmm_stream(s2)
    outs = cupy.zeros(6, dtype=cupy.float64)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    refs = []

    def free_three_in_flight(first):
        blocks = [mr.allocate(nbytes, r1) for _ in range(3)]
        for j, a in enumerate(blocks):
            host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
            refs.append(host.astype(np.float64).sum())
            scenarios.as_array(a, count, np.float32).set(host, stream=s1)
            scenarios.slow_checksum(a, count, spin_ms, outs[first + j : first + j + 1], s1)
        for a in blocks:
            mr.deallocate(a, nbytes, r1)

    free_three_in_flight(0)  # s1's first free is fenced alone; the other two wait in a batch
    assert mr.stats["fences"] == 1 and mr.pending_bytes == 3 * nbytes
    b = mr.allocate(2 * nbytes, r2)  # over the limit until the pending blocks went upstream
    scenarios.fill(b, 2 * count, pattern=7, stream=s2)
    scenarios.check(b, 2 * count, pattern=7, errors=errors, stream=s2)
    assert mr.stats["oom_retries"] == 1 and mr.pending_count == 0
    assert mr.stats["fences"] == 1  # nothing recorded on s1 by a call on s2
    mr.deallocate(b, 2 * nbytes, r2)  # s2's first free: fenced alone
    s2.synchronize()
    mr.flush()
    assert mr.pending_count == 0 and limiting.get_allocated_bytes() == 0

    fences = mr.stats["fences"]
    free_three_in_flight(3)  # s1 known now: all three wait in a batch, no event
    assert mr.stats["fences"] == fences and mr.pending_bytes == 3 * nbytes
    c = mr.allocate(2 * nbytes, r1)  # on s1: the batch's event is recorded, then waited for
    scenarios.fill(c, 2 * count, pattern=9, stream=s2)  # overwritten on another stream
    scenarios.check(c, 2 * count, pattern=9, errors=errors, stream=s2)
    assert mr.stats["oom_retries"] == 2 and mr.pending_count == 0
    assert mr.stats["fences"] == fences + 1
    s1.synchronize()
    s2.synchronize()
    got = outs.get()
    print(f"\nout of memory with batches: {got.tolist()} vs {refs}, {mr.stats}")
    assert all(np.isclose(g, r, rtol=1e-9, atol=1e-6) for g, r in zip(got, refs))
    assert int(errors.get()[0]) == 0
    mr.deallocate(c, 2 * nbytes, r1)
    mr.flush()
    assert limiting.get_allocated_bytes() == 0


def test_max_pending_bytes_caps_the_pending_total(cupy, scenarios):
    # A preallocated pool upstream: no cudaMalloc, whose implicit syncs could retire fences.
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=64 << 20)
    # The cap alone: s1 does not take its block back (reuse_on_stream=False).
    mr = SyncOnFreeResourceAdaptor(pool, max_pending_bytes="3MiB", reuse_on_stream=False)
    s1 = cupy.cuda.Stream(non_blocking=True)
    out = cupy.zeros(1, dtype=cupy.float64)
    for _ in range(8):
        a = mr.allocate(1 << 20, rmm_stream(s1))
        scenarios.fill(a, (1 << 20) // 4, pattern=3, stream=s1)
        scenarios.slow_checksum(a, 16, 20, out, s1, grid=1)
        mr.deallocate(a, 1 << 20, rmm_stream(s1))
        assert mr.pending_bytes <= 3 << 20
    # 8 frees of 1 MiB under a 3 MiB cap: at least 5 blocks left the list before the end,
    # and with 20 ms kernels behind them at least one had to be waited for. (How many were
    # waited for and how many had already completed depends on the host's speed: under load,
    # 12 test processes on one H200, it was 4 of 5.)
    assert mr.stats["released"] >= 5
    assert mr.stats["syncs"] >= 1
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

    def worker(tid):
        fill_check(
            mr,
            scenarios,
            streams,
            rstreams,
            errors,
            seed=1000 + tid,
            ops=10_000,
            max_live=16,
            max_words=1 << 18,
        )

    failures = run_threads(8, worker)
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
    scenarios.fill(a, (1 << 20) // 4, pattern=5, stream=s)
    mr.deallocate(a, 1 << 20, rmm_stream(s))
    graph = s.end_capture()
    assert mr.stats["parked"] == 1 and mr.pending_count == 1 and naive.cached_bytes == 0
    graph.launch(stream=s)
    b = mr.allocate(256, rmm_stream(s))
    s.synchronize()
    mr.deallocate(b, 256, rmm_stream(s))
    # s was never seen outside capture before its capture: its identity is unknown, so only a
    # device synchronization releases the parked block
    mr.flush()
    assert mr.pending_count == 0 and naive.cached_bytes == (1 << 20) + 256


def test_sync_modes_have_the_right_surface():
    up = rmm.mr.CudaMemoryResource()
    mr = SyncOnFreeResourceAdaptor(up, mode="stream", max_pending_bytes="1KiB")
    assert mr.mode == "stream" and mr.max_pending_bytes == 1024
    assert mr.max_batch_frees == 16 and mr.max_batch_bytes == 64 << 20
    assert mr.get_upstream() is up
    assert set(mr.stats) >= {"syncs", "deferred", "released", "oom_retries", "fences"}
    assert "SyncOnFreeResourceAdaptor(CudaMemoryResource(), mode='stream'" in repr(mr)
    other = SyncOnFreeResourceAdaptor(up, max_batch_frees=3, max_batch_bytes=None)
    assert other.max_batch_frees == 3 and other.max_batch_bytes is None
    assert "max_batch_frees=3, max_batch_bytes=None" in repr(other)


@pytest.mark.parametrize("mode", MODES)
def test_global_capture_in_another_thread_never_releases_a_block_in_use(
    cupy, scenarios, rng, mode, capture_elsewhere
):
    """While another thread holds a global-mode capture, CUDA queries and syncs from this
    thread fail unless made in relaxed mode. A failure must never release a block: free a block
    read by a slow kernel, let another stream take the next block of that size and overwrite
    it; every checksum must match its float64 reference, and the other thread's capture must
    end without error (the adaptor must not invalidate it)."""
    trials, nbytes, spin_ms = 20, 4 << 20, 20.0
    count = nbytes // 4
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = SyncOnFreeResourceAdaptor(naive, mode=mode)
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    r1, r2 = rmm_stream(s1), rmm_stream(s2)
    # Everything that could allocate or synchronize runs before the capture opens: the blocks
    # under test, spare blocks of the same size in the naive cache (so no cudaMalloc runs
    # during the capture), the data, the kernels' module load, and the adaptor's events.
    blocks = [mr.allocate(nbytes, r1) for _ in range(trials)]
    spares = [mr.allocate(nbytes, r2) for _ in range(trials)]
    for p in spares:
        mr.deallocate(p, nbytes, r2)
    mr.flush()
    assert naive.cached_bytes == trials * nbytes
    outs = cupy.zeros(trials, dtype=cupy.float64)
    warm = cupy.zeros(1, dtype=cupy.float64)
    scenarios.fill(blocks[0], 16, 1, s1)  # loads the kernels' module before the capture
    scenarios.slow_checksum(blocks[0], 16, 0.01, warm, s1, grid=1)
    refs = []
    for a in blocks:
        host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
        scenarios.as_array(a, count, np.float32).set(host, stream=s1)
        refs.append(host.astype(np.float64).sum())
    patterns = [int(x) for x in rng.integers(1, 2**32, size=trials)]
    cupy.cuda.Device().synchronize()

    taken = []
    with capture_elsewhere() as result:
        for i, a in enumerate(blocks):
            scenarios.slow_checksum(a, count, spin_ms, outs[i : i + 1], s1)
            mr.deallocate(a, nbytes, r1)
            b = mr.allocate(nbytes, r2)
            scenarios.fill(b, count, patterns[i], s2)
            taken.append(b)
    s1.synchronize()
    s2.synchronize()
    got = outs.get()
    corrupted = sum(not np.isclose(g, r, rtol=1e-9, atol=1e-6) for g, r in zip(got, refs))
    same = sum(b in blocks for b in taken)
    print(
        f"\nsync_on_free(naive_cache(cuda), mode={mode}) with a global capture elsewhere: "
        f"{corrupted}/{trials} corrupted, {same} blocks reused, {mr.stats}"
    )
    assert corrupted == 0, f"{corrupted}/{trials} checksums corrupted"
    if mode == "device":
        # A device synchronization conflicts with any capture under way, in every capture mode
        # (cudaFree's own sync does too): the attempt invalidates the other thread's capture.
        # The block stays safe: the failed sync falls back to a fence.
        assert mr.stats["failed_syncs"] == trials
        assert "error" not in result or "StreamCaptureInvalidated" in repr(result["error"])
    else:
        assert "error" not in result, f"the other thread's capture failed: {result['error']!r}"
        assert result["errors"] == 0
    for b in taken:
        mr.deallocate(b, nbytes, r2)
    mr.flush()
    assert mr.pending_count == 0
    stats = mr.stats
    assert stats["rejected_frees"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_double_free_raises_and_the_next_two_allocations_differ(cupy, scenarios, mode):
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = SyncOnFreeResourceAdaptor(naive, mode=mode)
    s = cupy.cuda.Stream(non_blocking=True)
    r = rmm_stream(s)
    nbytes = 1 << 20
    a = mr.allocate(nbytes, r)
    scenarios.fill(a, nbytes // 4, 3, s)
    mr.deallocate(a, nbytes, r)
    with pytest.raises(ValueError, match="double free|not a live block"):
        mr.deallocate(a, nbytes, r)
    assert mr.stats["rejected_frees"] == 1
    mr.flush()
    x = mr.allocate(nbytes, r)
    y = mr.allocate(nbytes, r)
    assert x != y, "two live allocations share a block"
    errors = cupy.zeros(1, dtype=cupy.uint64)
    scenarios.fill(x, nbytes // 4, 11, s)
    scenarios.fill(y, nbytes // 4, 12, s)
    scenarios.check(x, nbytes // 4, 11, errors, s)
    scenarios.check(y, nbytes // 4, 12, errors, s)
    s.synchronize()
    assert int(errors.get()[0]) == 0
    mr.deallocate(x, nbytes, r)
    mr.deallocate(y, nbytes, s)  # a CuPy stream is accepted, as rmm's resources accept it
    mr.flush()
    assert mr.pending_count == 0 and naive.cached_bytes == 2 * nbytes


def test_size_mismatch_and_foreign_pointer_raise_and_change_nothing(cupy):
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = SyncOnFreeResourceAdaptor(naive, mode="deferred")
    nbytes = 1 << 20
    a = mr.allocate(nbytes)
    with pytest.raises(ValueError, match=r"nbytes=524288 does not match.*nbytes=1048576"):
        mr.deallocate(a, nbytes // 2)
    with pytest.raises(ValueError, match="not a live block"):
        mr.deallocate(a + 256, 256)
    assert mr.stats["rejected_frees"] == 2 and mr.pending_count == 0
    assert naive.cached_bytes == 0  # nothing reached the upstream
    mr.deallocate(a, nbytes)
    mr.flush()
    assert naive.cached_bytes == nbytes and mr.pending_count == 0


def test_parked_free_on_a_per_thread_stream_is_not_released_by_another_thread(cupy, scenarios, rng):
    """Thread A frees a block in a capture of its per-thread default stream while a slow kernel
    on that stream still reads it. Thread B then uses its own per-thread default stream (the
    same handle value, another stream): its calls must not fence and release A's block, so the
    block B allocates and overwrites is never A's."""
    # Resources of earlier tests left in reference cycles are finalized here, on this thread,
    # not at a random allocation inside thread A or B (their destructors synchronize).
    gc.collect()
    trials, nbytes, spin_ms = 5, 4 << 20, 100.0
    count = nbytes // 4
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = SyncOnFreeResourceAdaptor(naive, mode="deferred")
    ptds = cupy.cuda.Stream.ptds
    rptds = rmm.pylibrmm.stream.PER_THREAD_DEFAULT_STREAM
    outs = cupy.zeros(trials, dtype=cupy.float64)
    scratch = cupy.empty(1024, dtype=cupy.uint32)
    cupy.cuda.Device().synchronize()
    refs, taken, failures = [], [], []

    for i in range(trials):
        host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
        refs.append(host.astype(np.float64).sum())
        parked, done = threading.Event(), threading.Event()

        def thread_a(i=i, host=host, parked=parked, done=done):
            try:
                a = mr.allocate(nbytes, rptds)
                scenarios.as_array(a, count, np.float32).set(host, stream=ptds)
                scenarios.slow_checksum(a, count, spin_ms, outs[i : i + 1], ptds)
                ptds.begin_capture()
                try:
                    scenarios.fill(scratch.data.ptr, scratch.size, 5, ptds)
                    mr.deallocate(a, nbytes, rptds)  # parked: A's stream is capturing
                finally:
                    ptds.end_capture()
                taken.append(("a", a))
            except Exception as exc:  # reported below
                failures.append(exc)
            finally:
                parked.set()
            # A lives until B is done and leaves its stream idle: once a process has used
            # cudaMallocAsync (CuPy's or rmm's async pools), a thread that exits while a kernel
            # still runs on its per-thread default stream makes other threads' next CUDA calls
            # block for good (docs/index.md, stream rules; docs/data/trust/ptds_exit_hang.txt).
            done.wait(30)
            ptds.synchronize()

        def thread_b(i=i, parked=parked, done=done):
            try:
                parked.wait(30)
                small = mr.allocate(256, rptds)  # B's per-thread stream, outside capture
                mr.deallocate(small, 256, rptds)
                ptds.synchronize()  # B's stream is idle: a fence recorded on it completes
                mr.deallocate(mr.allocate(256, rptds), 256, rptds)  # polls
                b = mr.allocate(nbytes, rptds)
                scenarios.fill(b, count, int(i) + 1000, ptds)
                ptds.synchronize()
                taken.append(("b", b))
                mr.deallocate(b, nbytes, rptds)
            except Exception as exc:  # reported below
                failures.append(exc)
            finally:
                done.set()

        # Daemon threads: one left blocked must not keep the test process from exiting.
        ta = threading.Thread(target=thread_a, daemon=True)
        tb = threading.Thread(target=thread_b, daemon=True)
        ta.start()
        tb.start()
        ta.join(30)
        tb.join(30)
        if ta.is_alive() or tb.is_alive():
            dump_stacks(f"trial {i}: a thread is still blocked after 30 s")
        assert not ta.is_alive() and not tb.is_alive(), (
            f"trial {i}: thread {'A' if ta.is_alive() else 'B'} still blocked after 30 s"
        )
        cupy.cuda.Device().synchronize()
    assert not failures, failures
    got = outs.get()
    corrupted = sum(not np.isclose(g, r, rtol=1e-9, atol=1e-6) for g, r in zip(got, refs))
    a_blocks = {p for kind, p in taken if kind == "a"}
    reused = sum(1 for kind, p in taken if kind == "b" and p in a_blocks)
    print(
        f"\nper-thread stream capture: {corrupted}/{trials} corrupted, {reused} of A's blocks "
        f"taken by B, {mr.stats}"
    )
    assert corrupted == 0, f"{corrupted}/{trials} checksums corrupted"
    mr.flush()
    assert mr.pending_count == 0
