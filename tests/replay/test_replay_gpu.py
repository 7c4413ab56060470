# SPDX-License-Identifier: Apache-2.0
"""rmm_fences_bench.replay's footprint on a real GPU: read at a statistics adaptor over the
chain's leaf (``with_footprint``), or at a CudaAsync leaf's memory pool, and checked against what
each pool says it holds and against rmm's own statistics counters."""

import numpy as np
import pytest
import rmm

from rmm_fences.specs import compose

from rmm_fences_bench import FootprintMeter, Trace, footprint_layer, replay, with_footprint

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def mixed_trace(threads=3, per_thread=300, seed=0):
    """Each thread allocates blocks of 256 B to 48 MiB on its own stream and frees them a few
    events later, some on the next thread (a cross-thread free); at most 8 blocks live per
    thread; a few left live at the end. Recorded stream handles that the replay replaces by
    new streams (not 0, 1, 2: those stay the default streams)."""
    rng = np.random.default_rng(seed)
    events, live, next_id = [], {th: [] for th in range(threads)}, 0
    for _ in range(per_thread):
        for th in range(threads):
            if live[th] and (len(live[th]) >= 8 or rng.random() < 0.45):
                events.append((th, "free", live[th].pop(0), None, th))
                continue
            size = int(rng.choice([256, 4096, 1 << 16, MiB, 7 * MiB, 48 * MiB]))
            size += int(rng.integers(0, 256))
            events.append((th, "allocate", next_id, size, th))
            live[(th + 1) % threads if next_id % 5 == 0 else th].append(next_id)
            next_id += 1
    return Trace.from_events(events, streams=[0x1000 * (k + 1) for k in range(threads)])


def check(stats, trace, source, repeat=1):
    assert stats["errors"] == 0 and stats["skipped_frees"] == 0
    assert stats["allocations"] == repeat * trace.allocations
    assert stats["frees"] == repeat * trace.frees
    assert stats["footprint_source"] == source
    assert stats["trace_peak_live_bytes"] == trace.peak_live_bytes > 0
    # the chain held every block live at once in the replay; free-running, the trace's own peak
    # may be higher or lower (the threads replay their events in their own order, not the
    # recorded interleaving)
    assert stats["footprint_bytes"] >= stats["peak_live_bytes"] > 0
    assert stats["fragmentation"] == pytest.approx(stats["footprint_bytes"] / trace.peak_live_bytes)


def stats_layer(mr):
    source, layer = footprint_layer(mr)
    assert source == "statistics"
    return layer


def test_footprint_of_rmm_pool_is_its_pool_size():
    t = mixed_trace()
    mr = compose(with_footprint("rmm_pool(cuda, initial_pool_size=0)"))
    stats = replay(mr, t)
    check(stats, t, "statistics")
    assert stats["footprint_bytes"] == mr.pool_size()  # rmm's pool never gives chunks back
    counts = stats_layer(mr).allocation_counts
    assert counts.peak_bytes == stats["footprint_bytes"]  # rmm's own counter agrees
    # the replay's counter frame was popped: only the adaptor's base frame is left
    with pytest.raises((IndexError, RuntimeError)):
        stats_layer(mr).pop_counters()
    # a second replay reuses the pool: what it held before counts, nothing more is drawn
    again = replay(mr, t, repeat=2)
    check(again, t, "statistics", repeat=2)
    assert again["footprint_bytes"] >= stats["footprint_bytes"]
    assert again["footprint_bytes"] == mr.pool_size()


@pytest.mark.parametrize("initial", [None, 512 * MiB])
def test_footprint_of_rmm_fences_pool_is_its_pool_bytes(initial):
    t = mixed_trace(seed=1)
    spec = "pool(cuda)" if initial is None else f"pool(cuda, initial_pool_size={initial})"
    mr = compose(with_footprint(spec))
    stats = replay(mr, t)
    check(stats, t, "statistics")
    assert stats["footprint_bytes"] == mr.stats["pool_bytes"]
    assert stats["footprint_bytes"] == stats_layer(mr).allocation_counts.peak_bytes
    if initial is not None:  # held before the replay: counted
        assert stats["footprint_bytes"] >= initial


def test_footprint_under_adaptors_is_read_at_the_leaf():
    t = mixed_trace(seed=2)
    mr = compose(with_footprint("sync_on_free(rmm_pool(cuda, initial_pool_size=0), mode=deferred)"))
    stats = replay(mr, t)
    check(stats, t, "statistics")
    assert stats["footprint_bytes"] == mr.get_upstream().pool_size()
    tracker = compose(with_footprint("tracking(pool(cuda), on_hazard=record)"))
    stats = replay(tracker, t)
    check(stats, t, "statistics")
    assert stats["footprint_bytes"] == tracker.get_upstream().stats["pool_bytes"]
    assert tracker.hazards == []


def test_footprint_of_cuda_async_is_its_memory_pool():
    t = mixed_trace(seed=3)
    for spec in ("cuda_async", "statistics(cuda_async)"):
        mr = compose(with_footprint(spec))
        stats = replay(mr, t)
        check(stats, t, "cuda_async_pool")
        # the pool reserves in chunks of at least 2 MiB: never less than the live bytes, and
        # a device's worth at most
        _, total = rmm.mr.available_device_memory()
        assert stats["footprint_bytes"] <= total


@pytest.mark.parametrize(
    "spec", ["cuda_async", "pool(cuda)", "rmm_pool(cuda, initial_pool_size=0)"]
)
def test_footprint_meter_sees_a_peak_between_start_and_peak(spec):
    """The meter of the dataframe benchmarks: a 96 MiB block allocated and freed between start()
    and peak() counts (on top of what the chain held before); a second measurement, with
    nothing new allocated, reports no more than the first."""
    mr = compose(with_footprint(spec))
    meter = FootprintMeter(mr)
    assert meter.source in ("cuda_async_pool", "statistics")
    stream = rmm.pylibrmm.stream.Stream()
    meter.start()
    small = mr.allocate(1 << 20, stream)
    big = mr.allocate(96 << 20, stream)
    mr.deallocate(big, 96 << 20, stream)
    first = meter.peak()
    assert first >= 97 << 20, (spec, first)
    _, total = rmm.mr.available_device_memory()
    assert first <= total
    meter.start()
    mr.deallocate(small, 1 << 20, stream)
    stream.synchronize()
    second = meter.peak()
    # pools keep what they took (the 97 MiB are still held); cuda_async may give memory back
    assert second <= first + (2 << 20), (spec, first, second)
    assert FootprintMeter(rmm.mr.CudaMemoryResource()).peak() is None


def test_footprint_meter_over_a_vmm_pool_is_exact_or_says_it_cannot_tell():
    """Over a vmm_pool leaf the meter reads the pages' high-water mark, which cannot be reset:
    a rise above the mark of start() is exact, and so is a measurement started at the mark;
    one started below it (pages released since) that stays below it reports None, not 0."""
    from rmm_fences import VmmPoolMemoryResource

    mr = VmmPoolMemoryResource()
    meter = FootprintMeter(mr)
    assert meter.source == "vmm_pool"
    with pytest.raises(RuntimeError, match="before start"):
        meter.peak()
    stream = rmm.pylibrmm.stream.Stream()
    meter.start()
    big = mr.allocate(96 << 20, stream)
    mr.deallocate(big, 96 << 20, stream)
    first = meter.peak()
    assert first == mr.stats["peak_physical_bytes"] >= 96 << 20
    meter.start()  # at the mark: the pages are still held
    assert meter.peak() == first
    assert mr.synchronize_and_reclaim()
    assert mr.release() > 0 and mr.stats["physical_bytes"] < first
    meter.start()  # below the mark
    small = mr.allocate(2 << 20, stream)
    assert meter.peak() is None
    bigger = mr.allocate(first + (32 << 20), stream)
    assert meter.peak() >= first + (34 << 20)
    mr.deallocate(bigger, first + (32 << 20), stream)
    mr.deallocate(small, 2 << 20, stream)


def test_no_footprint_without_a_layer_to_read():
    t = mixed_trace(per_thread=50, seed=4)
    stats = replay(rmm.mr.CudaMemoryResource(), t)
    assert stats["footprint_source"] == "none"
    assert stats["footprint_bytes"] is None and stats["fragmentation"] is None
    assert stats["trace_peak_live_bytes"] == t.peak_live_bytes
    assert stats["errors"] == 0


def test_ordered_replay_of_the_mixed_trace_keeps_the_trace_s_peak():
    t = mixed_trace(seed=5)
    mr = compose(with_footprint("pool(cuda)"))
    stats = replay(mr, t, ordered=True, repeat=2)
    check(stats, t, "statistics", repeat=2)
    # the calls in recorded order: the replayed peak of live bytes is the trace's, and the pool
    # held every block live at that peak
    assert stats["peak_live_bytes"] == stats["trace_peak_live_bytes"] == t.peak_live_bytes
    assert stats["footprint_bytes"] >= t.peak_live_bytes
    assert stats["fragmentation"] >= 1.0
    assert stats["footprint_bytes"] == mr.stats["pool_bytes"]
    # free-running on the same chain afterwards: every call made, nothing failed
    free = replay(mr, t)
    check(free, t, "statistics")
