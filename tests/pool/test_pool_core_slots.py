# SPDX-License-Identifier: Apache-2.0
"""The stream-ordered pool's core on host memory (no GPU): slots and fences of streams that are
gone, and same-stream reuse of big blocks.

A stream per task (created, used, destroyed) must not leave a slot and an event behind for
ever; a handle that a new stream reuses must still wait for the fences of the old one; and a
stream that keeps reusing its own big block must not record a fence per free. The oracle of
the host platform (tests/native/include/rmm_fences_testing/host_pool.hpp) checks every
allocation against the fences, syncs and completed queries that ordered it.
"""

import pytest

from rmm_fences_testing import HostStreamOrderedPool

TASKS = 2000
#: Frees of a new stream that are each fenced (the pool core's `young_frees`).
YOUNG_FREES = 16
#: Blocks a stream takes back in a row, fenced and taken by nobody else, before it stops
#: sharing its big cache on each free (the pool core's `demand_decay`).
DEMAND_DECAY = 16
#: Slots held at most while tasks come and go (the pool retires idle slots once it holds 64;
#: a task's slot is idle from the sweep after its task). Far below one slot per task.
SLOT_BOUND = 160


def grown_up(p, stream):
    """Spends `stream`'s young frees (each covered by a record) on one 256-byte block, which
    stays in its cache."""
    for _ in range(YOUNG_FREES):
        p.deallocate(p.allocate(256, stream=stream), 256, stream=stream)


def task(p, stream, sizes=(4096, 64 << 10)):
    """One task on its own stream: allocate, free, drop the stream."""
    ptrs = [p.allocate(n, stream=stream) for n in sizes]
    for ptr, n in zip(ptrs, sizes):
        p.deallocate(ptr, n, stream=stream)


# --- (a) a stream per task: slots, events and bytes stay bounded ---------------------------


def test_slots_stay_bounded_when_each_task_gets_a_new_stream():
    p = HostStreamOrderedPool(1 << 20)
    peak = 0
    for t in range(TASKS):
        task(p, stream=100 + t)  # a new identity per task, never used again
        peak = max(peak, p.stats["stream_slots"])
    stats = p.stats
    assert peak <= SLOT_BOUND, f"{peak} slots held for {TASKS} dead streams"
    # a new stream's first frees are fenced: the blocks the dead streams freed serve the next
    # tasks after a stream wait (no device sync), rather than grow the pool with every task
    # (68 KiB each)
    assert p.pool_size() <= 32 << 20, f"pool grew to {p.pool_size() >> 20} MiB"
    assert stats["reclaim_syncs"] == 0 and p.syncs == [] and stats["orphan_bytes"] == 0
    assert stats["current_bytes"] == 0
    assert p.violations == []


def test_events_stay_bounded_when_each_task_retires_its_stream():
    # retire_stream fences each task's stream: one recorded event per task. Once their work
    # ran, the fences of gone streams are dropped from the blocks they tagged.
    p = HostStreamOrderedPool(1 << 20)
    peak_fences = peak_slots = 0
    for t in range(TASKS):
        s = 100 + t
        task(p, stream=s)
        p.retire_stream(s)
        if t % 10 == 9:
            p.complete_all()  # the GPU caught up
        peak_fences = max(peak_fences, p.fences_held)
        peak_slots = max(peak_slots, p.stats["stream_slots"])
    stats = p.stats
    assert peak_fences <= 100, f"{peak_fences} events held for {TASKS} retired streams"
    assert stats["fence_events"] == p.fences_held
    assert peak_slots <= 2 and stats["retired_streams"] == TASKS
    # a new stream waits on the few fences that may still be pending, not on every stream gone
    assert len(p.waits) <= 50 * TASKS, f"{len(p.waits)} stream waits"
    assert stats["reclaim_syncs"] == 0 and p.syncs == []
    assert p.violations == []


def test_fences_still_pending_are_kept():
    # Fences of gone streams are dropped only once known complete: with no completion, every
    # block still carries its fence, and a new stream waits on it.
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(1 << 20, stream=7)
    p.deallocate(a, 1 << 20, stream=7)
    p.retire_stream(7)
    for t in range(200):  # enough new streams for several sweeps
        task(p, stream=1000 + t, sizes=(4096,))
        p.retire_stream(1000 + t)
    b = p.allocate(1 << 20, stream=9)
    assert b == a and any(w == 9 and s == 7 for w, s, _ in p.waits)
    assert p.violations == []


def test_failed_fence_query_keeps_the_fence():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)

    def tasks(first, count, complete=False):
        for t in range(first, first + count):
            task(p, stream=100 + t, sizes=(4096,))
            p.retire_stream(100 + t)
            if complete:
                p.complete_all()

    tasks(0, 40)  # nothing completes: every fence is kept
    assert p.fences_held >= 40
    p.complete_all()
    p.fail_next("query", 10**6)  # every query fails: nothing is known complete
    tasks(40, 40)
    assert p.fences_held >= 80
    p.fail_next("query", 0)
    # a block's fences are queried again once they doubled since the failed pruning
    tasks(80, 200, complete=True)
    assert p.fences_held <= 40
    assert p.violations == []


# --- (b) a handle reused by a new stream after its slot was retired ------------------------


def test_a_reused_handle_waits_for_the_fence_of_the_retired_stream():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(512 << 10, stream=5)
    p.deallocate(a, 512 << 10, stream=5)
    p.retire_stream(5)  # fenced and shared; the slot is given up (and reused)
    p.destroy_stream(5)  # the handle now names a new stream: the pool sees identity 5 again
    b = p.allocate(1 << 20, stream=5)  # needs the old stream's bytes
    assert b <= a < b + (1 << 20)
    assert any(s == 5 and w != 5 for w, s, _ in p.waits), "no wait on the old stream's fence"
    assert p.syncs == [] and p.violations == []


def test_a_reused_handle_after_its_idle_slot_was_retired_still_waits():
    p = HostStreamOrderedPool(1 << 30)  # host address space only: the pool writes no byte
    grown_up(p, 5)
    records = p.records
    a = p.allocate(512 << 10, stream=5)
    guard = p.allocate(1 << 20, stream=7)  # keeps a's bytes apart from the rest of the chunk
    p.deallocate(a, 512 << 10, stream=5)  # cached on stream 5
    x = p.allocate(1 << 30, stream=6)  # a miss: stream 5 is asked for its blocks (grows)
    p.deallocate(p.allocate(256, stream=5), 256, stream=5)  # 5 fences and shares them
    assert p.records == records + 1 and p.syncs == []
    for t in range(200):  # new streams (1 MiB each: not a's block) until 5's slot is retired
        task(p, stream=1000 + t, sizes=(1 << 20,))
    assert p.stats["stream_slots"] <= SLOT_BOUND and p.syncs == []
    p.destroy_stream(5)
    b = p.allocate(512 << 10, stream=5)  # a new stream on handle 5 gets the old one's block
    assert a - 256 <= b <= a + 256  # (with grown_up's 256 bytes beside it, maybe in front)
    new_5 = 5 + (1 << 40)  # the oracle's name of the stream that handle 5 names now
    assert any(w == new_5 and s == 5 for w, s, _ in p.waits), "no wait on the old fence"
    assert p.violations == []
    for ptr, n, s in ((b, 512 << 10, 5), (x, 1 << 30, 6), (guard, 1 << 20, 8)):
        p.deallocate(ptr, n, stream=s)  # guard: found among the retired slot 7's live blocks
    assert p.stats["current_bytes"] == 0


def test_a_block_freed_later_on_another_stream_is_found_after_its_slot_was_retired():
    # A block allocated by a task and kept past it: its live entry outlives the task's slot.
    p = HostStreamOrderedPool(1 << 20)
    kept = p.allocate(4096, stream=50)
    for t in range(300):
        task(p, stream=1000 + t, sizes=(4096,))
    with pytest.raises(ValueError, match="size mismatch: allocated 4096 bytes"):
        p.deallocate(kept, 8192, stream=2)
    p.deallocate(kept, 4096, stream=2)
    with pytest.raises(ValueError, match="double free or foreign pointer"):
        p.deallocate(kept, 4096, stream=2)
    assert p.stats["current_bytes"] == 0 and p.violations == []


# --- (c) real threads: retirement while other threads allocate and free --------------------


def test_threads_with_a_stream_per_task_keep_the_oracle():
    """Eight C++ threads (no GIL), a new stream per task, idle slots retired while the others
    work, handles reused after retire_stream, fences completing now and then, faults."""
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=8 << 20)
    for random_state in range(3):
        p.run_stream_churn(8, 2000, random_state)
        assert p.violations == []
    stats = p.stats
    assert stats["current_bytes"] == 0
    assert stats["stream_slots"] <= SLOT_BOUND + 8
    assert stats["cross_stream_reuse"] > 0 and stats["retired_streams"] > 0
    assert stats["fence_events"] == p.fences_held
    free = sum(n for _, n, _ in p.free_blocks)
    assert free == stats["pool_bytes"], "bytes lost or doubled"
    for kind in ("record", "stream_wait", "sync_device", "sync_stream", "query"):
        p.fail_next(kind, 0)  # a fault the threads injected last may still be pending
    p.complete_all()
    assert p.synchronize_and_reclaim()  # the long-lived streams' caches
    p.release()
    assert p.pool_size() == 0 and p.violations == []


# --- same-stream reuse of a big block records no fence per free ----------------------------


def test_same_stream_64_mib_pairs_stop_fencing_soon_after_another_stream_ran_short():
    """Another stream's shortage makes stream 1 share its big cached block on each free (it
    may be wanted again, as in a pipeline's next phase) until it took its own block back
    `DEMAND_DECAY` times in a row: then its pairs record nothing."""
    p = HostStreamOrderedPool(128 << 20, maximum_pool_size=128 << 20)
    grown_up(p, 1)
    a = p.allocate(64 << 20, stream=1)
    p.deallocate(a, 64 << 20, stream=1)  # cached for stream 1
    with pytest.raises(MemoryError):  # runs short: wants stream 1's blocks (no sync)
        p.allocate(96 << 20, stream=2)
    records = p.records
    for _ in range(DEMAND_DECAY + 1):
        p.deallocate(p.allocate(64 << 20, stream=1), 64 << 20, stream=1)
    assert p.records - records <= DEMAND_DECAY + 1
    records = p.records
    for _ in range(100):
        p.deallocate(p.allocate(64 << 20, stream=1), 64 << 20, stream=1)
    assert p.records == records, f"{p.records - records} fences for 100 same-stream pairs"
    assert p.stats["fences"] == p.records
    assert p.violations == []


def test_a_64_mib_block_pushed_out_of_the_recent_frees_is_not_fenced_per_free():
    # Nine small frees between the big block's allocation and its free: it goes to the
    # stream's free list, not to its recent frees.
    p = HostStreamOrderedPool(256 << 20)
    grown_up(p, 1)
    for _ in range(100):
        big = p.allocate(64 << 20, stream=1)
        small = [p.allocate(256 * (k + 1), stream=1) for k in range(9)]
        for k, ptr in enumerate(small):
            p.deallocate(ptr, 256 * (k + 1), stream=1)
        p.deallocate(big, 64 << 20, stream=1)
    assert p.records == YOUNG_FREES, f"{p.records} fences for 100 same-stream rounds"
    assert p.stats["same_stream_reuse"] >= 99 * 10
    assert p.violations == []


def test_a_64_mib_block_reused_without_fences_is_taken_by_another_stream_after_its_fence():
    p = HostStreamOrderedPool(64 << 20, maximum_pool_size=64 << 20)
    for _ in range(YOUNG_FREES + 10):
        p.deallocate(p.allocate(64 << 20, stream=1), 64 << 20, stream=1)
    assert p.records == YOUNG_FREES
    a = p.allocate(64 << 20, stream=1)
    with pytest.raises(MemoryError):
        p.allocate(64 << 20, stream=2)  # stream 1 holds it: asked to fence at its next call
    p.deallocate(a, 64 << 20, stream=1)  # fenced now: another stream asked
    assert p.records == YOUNG_FREES + 1
    b = p.allocate(64 << 20, stream=2)
    assert b == a
    assert p.waits[-1] == (2, 1, p.clock - 1) and p.stats["cross_stream_reuse"] == 1
    p.deallocate(b, 64 << 20, stream=2)
    for _ in range(YOUNG_FREES + 10):  # the new owner reuses it, fencing its young frees only
        p.deallocate(p.allocate(64 << 20, stream=2), 64 << 20, stream=2)
    assert p.records == 2 * YOUNG_FREES + 1 and p.violations == []


def test_a_cached_64_mib_block_reaches_a_stream_that_ran_short_only_through_the_named_reclaim():
    # Stream 1 is idle with the block cached: no fence can be recorded for it, so the stream
    # that ran short gets it only after a device sync the user asks for by name.
    p = HostStreamOrderedPool(64 << 20, maximum_pool_size=64 << 20)
    grown_up(p, 1)
    p.deallocate(p.allocate(64 << 20, stream=1), 64 << 20, stream=1)
    with pytest.raises(MemoryError):
        p.allocate(64 << 20, stream=2)
    assert p.syncs == []
    assert p.synchronize_and_reclaim() and len(p.syncs) == 1
    b = p.allocate(64 << 20, stream=2)
    p.deallocate(b, 64 << 20, stream=2)
    assert p.violations == []


def test_a_young_streams_64_mib_block_reaches_a_stream_that_ran_short_through_a_wait():
    p = HostStreamOrderedPool(64 << 20, maximum_pool_size=64 << 20)
    p.deallocate(p.allocate(64 << 20, stream=1), 64 << 20, stream=1)  # young: fenced
    b = p.allocate(64 << 20, stream=2)
    assert p.syncs == [] and p.waits[-1][:2] == (2, 1)
    p.deallocate(b, 64 << 20, stream=2)
    assert p.violations == []


# --- a young stream's frees: covered by a record, kept in its cache -------------------------


def test_a_young_streams_frees_stay_in_its_cache_covered_by_a_record():
    # The CUB temp-storage loop on a new stream: each free records the stream's fence (so that
    # the block is never lost if the stream goes away) but the block stays in its cache, where
    # the next allocation takes it back without the shared list.
    p = HostStreamOrderedPool(1 << 20)
    ptrs = set()
    for _ in range(YOUNG_FREES):
        ptr = p.allocate(13567, stream=1)
        ptrs.add(ptr)
        p.deallocate(ptr, 13567, stream=1)
        assert [owner for _, n, owner in p.free_blocks if n == 13568] == [1]
    assert len(ptrs) == 1 and p.records == YOUNG_FREES
    stats = p.stats
    assert stats["same_stream_reuse"] == YOUNG_FREES - 1 and stats["cross_stream_reuse"] == 0
    assert p.waits == [] and p.violations == []


def test_a_free_after_the_last_record_is_not_shared_with_the_record():
    # Stream 1 spends its young frees (each covered), then frees a big block: no record covers
    # that free, so when stream 2 runs short the block stays stream 1's (only the named reclaim
    # or stream 1's own fence frees it), while the covered 256 bytes could go.
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    grown_up(p, 1)
    a = p.allocate(512 << 10, stream=1)
    p.deallocate(a, 512 << 10, stream=1)  # the 17th free: not covered
    with pytest.raises(MemoryError):
        p.allocate(1 << 20, stream=2)
    assert any(owner == 1 and n >= 512 << 10 for _, n, owner in p.free_blocks)
    assert p.syncs == [] and p.violations == []
    # stream 1's next free fences and shares its cache (asked while stream 2 ran short)
    p.deallocate(p.allocate(256, stream=1), 256, stream=1)
    b = p.allocate(1 << 20, stream=2)
    assert p.waits[-1][:2] == (2, 1) and p.violations == []
    p.deallocate(b, 1 << 20, stream=2)


def test_a_gone_young_streams_cache_serves_the_next_task_through_a_wait():
    # A task's stream frees and goes away with its blocks cached (covered): the next task's
    # miss shares them tagged with that record and waits on it, instead of growing the pool.
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    task(p, stream=10, sizes=(1 << 20,))
    p.destroy_stream(10)
    b = p.allocate(1 << 20, stream=11)
    assert p.waits[-1][:2] == (11, 10) and p.syncs == []
    p.deallocate(b, 1 << 20, stream=11)
    assert p.pool_size() == 1 << 20 and p.violations == []


def test_release_returns_a_chunk_a_covered_cache_holds_whole():
    p = HostStreamOrderedPool(1 << 20)
    a = p.allocate(1 << 20, stream=2)
    p.deallocate(a, 1 << 20, stream=2)  # young: covered, in stream 2's cache
    assert p.release() == 1 << 20 and p.pool_size() == 0
    assert p.syncs == [] and p.violations == []
    assert p.stats["orphan_bytes"] == 0


def test_the_destructor_needs_no_device_sync_for_covered_caches():
    # A young stream's cache is covered by its record: the pool's destructor can wait on that
    # fence instead of synchronizing the device; a free no record covers needs the sync.
    p = HostStreamOrderedPool(1 << 20)
    p.deallocate(p.allocate(4096, stream=1), 4096, stream=1)
    assert not p.holds_unfenced_blocks()
    grown_up(p, 2)
    p.deallocate(p.allocate(4096, stream=2), 4096, stream=2)  # stream 2's 17th free
    assert p.holds_unfenced_blocks()
    assert p.syncs == [] and p.violations == []
