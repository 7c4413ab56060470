# SPDX-License-Identifier: Apache-2.0
"""Null-pointer frees on the host harness and the CuPy allocator (no GPU).

A free of address 0 (any size, any stream) is a no-op for the stream-ordered pool's core, as
for rmm's resources: nothing counted, no stats changed, no slot made, nothing cached or handed
to the upstream. The address -> value map under the pool, the tracker and the allocators never
treats address 0 as present: 0 marks its empty slots.
"""

import gc
import subprocess
import sys

import pytest

from helpers.children import child_env
from rmm_fences_testing import HostPointerMap, HostStreamOrderedPool

NBYTES = 4096


def snapshot(pool):
    """Everything a free could change: counters, free blocks, upstream calls, fences, waits."""
    return (
        pool.stats,
        pool.free_blocks,
        pool.upstream_calls,
        pool.records,
        pool.waits,
        pool.syncs,
        pool.violations,
    )


def null_frees(pool, nbytes):
    pool.deallocate(0, nbytes, 1)  # the checked free (the Python resource's): no ValueError
    pool.deallocate_unchecked(0, nbytes, 1)  # the noexcept free (rmm's resource_ref)
    pool.deallocate(0, nbytes, 2)  # a stream the pool has not seen: no slot made for it
    pool.mark_foreign_stream(3)
    pool.deallocate(0, nbytes, 3)  # a stream of another device: not refused either


@pytest.mark.parametrize("nbytes", [0, NBYTES])
def test_null_free_changes_nothing(nbytes):
    pool = HostStreamOrderedPool()
    live = [pool.allocate(NBYTES, 1) for _ in range(8)]
    for ptr in live[:4]:  # cached free blocks on stream 1
        pool.deallocate(ptr, NBYTES, 1)
    before = snapshot(pool)
    null_frees(pool, nbytes)
    assert snapshot(pool) == before
    assert pool.stats["rejected_frees"] == 0
    # Nothing of address 0 was cached: every later block is a real one.
    again = [pool.allocate(n, 1) for n in (0, 1, 256, NBYTES) for _ in range(4)]
    assert 0 not in again
    for ptr in live[4:]:
        pool.deallocate(ptr, NBYTES, 1)
    for ptr, n in zip(again, [n for n in (0, 1, 256, NBYTES) for _ in range(4)], strict=True):
        pool.deallocate(ptr, n, 1)
    stats = pool.stats
    assert stats["current_bytes"] == 0 and stats["rejected_frees"] == 0
    assert pool.violations == []


@pytest.mark.parametrize("nbytes", [0, NBYTES])
def test_null_free_on_an_empty_pool_changes_nothing(nbytes):
    pool = HostStreamOrderedPool()
    before = snapshot(pool)
    for _ in range(64):
        null_frees(pool, nbytes)
    assert snapshot(pool) == before
    assert pool.stats["stream_slots"] == 0 and pool.stats["current_bytes"] == 0


# 64 live blocks on stream 1 fill half of its live map (128 slots); 64 null frees, then 64 more
# blocks. A map that counted each null free as an erase believes it holds 64 and never grows:
# its 128 slots are all taken, and the cross-stream free (stream 1 looks for a block of stream 2
# among its own) probes for ever with the slot lock held. A child process, so that such a hang
# fails the test at the timeout instead of stopping the run.
HANG_SEQUENCE = """
from rmm_fences_testing import HostStreamOrderedPool
pool = HostStreamOrderedPool()
live = [pool.allocate(4096, 1) for _ in range(64)]
for _ in range(64):
    pool.deallocate_unchecked(0, 0, 1)
live += [pool.allocate(4096, 1) for _ in range(64)]
other = pool.allocate(4096, 2)
pool.deallocate(other, 4096, 1)
for ptr in live:
    pool.deallocate(ptr, 4096, 1)
print("current_bytes", pool.stats["current_bytes"], "violations", len(pool.violations))
"""


def test_cross_stream_free_returns_after_null_frees_among_128_live_blocks():
    try:
        res = subprocess.run(
            [sys.executable, "-P", "-c", HANG_SEQUENCE],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),  # the host test harness, as this process imports it
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the cross-stream free after 64 null frees did not return within 60 s")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split() == ["current_bytes", "0", "violations", "0"], res.stdout


def test_pointer_map_never_finds_address_zero():
    m = HostPointerMap()
    assert m.find(0) is None and m.find_index(0) is None
    m.insert(0x10, 7)  # every key below 256 has slot 0 as its home
    assert m.find(0) is None and m.find_index(0) is None
    assert m.find(0x10) == 7 and m.find_index(0x10) is not None
    assert len(m) == 1


def test_pointer_map_refuses_key_zero():
    m = HostPointerMap()
    with pytest.raises(ValueError, match="key 0"):
        m.insert(0, 1)
    assert len(m) == 0 and m.find(0) is None


def test_pointer_map_count_stays_right_when_zero_is_taken():
    m = HostPointerMap(64)  # 128 slots
    keys = [(i + 1) << 12 for i in range(128)]
    for i, k in enumerate(keys[:64]):
        m.insert(k, i)
    for _ in range(64):
        assert m.take(0) == 0
    assert len(m) == 64
    for i, k in enumerate(keys[64:], 64):
        m.insert(k, i)
    assert len(m) == 128
    assert m.find(1 << 40) is None  # an absent key: the probe ends at an empty slot
    assert [m.find(k) for k in keys] == list(range(128))
    assert [m.take(k) for k in keys] == list(range(128))
    assert len(m) == 0


def test_cupy_allocator_asks_no_resource_for_0_bytes():
    pytest.importorskip("cupy", reason="the CuPy allocator test needs cupy")
    import rmm

    from rmm_fences.allocators.cupy import CupyAllocator

    up = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    before = up.allocation_counts
    alloc = CupyAllocator(up, device=0)
    mems = [alloc(0) for _ in range(4)]  # no allocation, so no null free when they die
    assert [(m.ptr, m.mem.size, m.device_id) for m in mems] == [(0, 0, 0)] * 4
    del mems
    gc.collect()
    assert up.allocation_counts == before


def test_pointer_map_fills_an_inserted_slot_in_place_and_never_a_present_one():
    """find_or_insert (the tracker's ledger fills a new record in place): an absent key gets a
    slot holding the empty value, also a slot emptied by a take or moved by a rehash; a present
    key gets its own value back; key 0 is refused."""
    m = HostPointerMap(4)  # 8 slots: the inserts below rehash twice
    keys = [(i + 1) << 20 for i in range(12)]
    assert [m.find_or_insert(k, i + 1) for i, k in enumerate(keys)] == [0] * 12
    assert [m.find(k) for k in keys] == list(range(1, 13)) and len(m) == 12
    assert m.find_or_insert(keys[3], 99) == 4 and m.find(keys[3]) == 4  # present: unchanged
    assert m.take(keys[3]) == 4
    assert m.find_or_insert(keys[3], 5) == 0 and m.find(keys[3]) == 5  # its slot was emptied
    with pytest.raises(ValueError, match="key 0"):
        m.find_or_insert(0, 1)
    assert len(m) == 12
