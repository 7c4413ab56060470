# SPDX-License-Identifier: Apache-2.0
"""The stream-ordered pool's C++ policy core on host memory (no GPU).

The core under test is the one StreamOrderedPoolMemoryResource runs on the GPU; the platform
logs every fence record, stream wait and device sync against a clock that advances once per
call, so the model can check each reuse against the fences that ordered it.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rmm_fences._lib._testing import HostStreamOrderedPool

STREAMS = st.sampled_from([0, 1, 2, 3, 4])
GRANULE = 256


def rounded(n):
    return max(GRANULE, (n + GRANULE - 1) // GRANULE * GRANULE)


class PoolModel(RuleBasedStateMachine):
    @initialize(
        initial=st.sampled_from([0, 1 << 16, 1 << 20]),
        maximum=st.none() | st.sampled_from([1 << 20, 3 << 20]),
    )
    def setup(self, initial, maximum):
        if maximum is not None:
            initial = min(initial, maximum)
        self.p = HostStreamOrderedPool(initial, maximum)
        self.live = {}  # allocation number -> (ptr, rounded size, stream)
        self.allocations = 0
        self.freed = []  # [start, end, stream, clock of the free]
        self.capturing = set()

    # --- ordering check ----------------------------------------------------------------
    def ordered_after(self, waiter, stream, clock):
        """True when `waiter` is ordered after `stream`'s work up to `clock`."""
        if any(s >= clock for s in self.p.syncs):
            return True
        return any(w == waiter and s == stream and c >= clock for w, s, c in self.p.waits)

    def claim(self, ptr, size, stream):
        """A new allocation: check it against every earlier free that it overlaps."""
        end = ptr + size
        kept = []
        for start, stop, owner, clock in self.freed:
            if stop <= ptr or start >= end:
                kept.append([start, stop, owner, clock])
                continue
            if owner != stream:
                assert self.ordered_after(stream, owner, clock), (
                    f"stream {stream} got bytes freed on stream {owner} at {clock} "
                    "without waiting on a later fence of it"
                )
            if start < ptr:
                kept.append([start, ptr, owner, clock])
            if stop > end:
                kept.append([end, stop, owner, clock])
        self.freed = kept

    # --- rules ---------------------------------------------------------------------------
    @rule(nbytes=st.integers(0, 300_000), stream=STREAMS,
          alignment=st.sampled_from([256, 256, 512, 4096]))
    def allocate(self, nbytes, stream, alignment):
        try:
            ptr = self.p.allocate(nbytes, stream, alignment)
        except MemoryError:
            return
        size = rounded(nbytes)
        assert ptr % alignment == 0, "alignment not honoured"
        for other, osize, _ in self.live.values():
            assert ptr + size <= other or other + osize <= ptr, "live blocks overlap"
        self.claim(ptr, size, stream)
        self.live[self.allocations] = (ptr, size, stream)
        self.allocations += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS)
    def free(self, data, stream):
        ptr, size, _ = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.p.deallocate(ptr, size, stream)
        self.freed.append([ptr, ptr + size, stream, self.p.clock])

    @rule(stream=STREAMS)
    def retire(self, stream):
        self.p.retire_stream(stream)

    @rule(stream=STREAMS)
    def begin_capture(self, stream):
        self.p.begin_capture(stream)
        self.capturing.add(stream)

    @rule(stream=STREAMS)
    def end_capture(self, stream):
        self.p.end_capture(stream)
        self.capturing.discard(stream)

    @rule()
    def release(self):
        self.p.release()

    # --- invariants ----------------------------------------------------------------------
    @invariant()
    def accounting(self):
        if not hasattr(self, "p"):
            return
        stats = self.p.stats
        assert stats["current_bytes"] == sum(s for _, s, _ in self.live.values())
        assert stats["pool_bytes"] == sum(n for _, n in self.p.chunks) == self.p.pool_size()
        free = sum(n for _, n, _ in self.p.free_blocks)
        assert free + stats["current_bytes"] == stats["pool_bytes"], "bytes lost or doubled"

    @invariant()
    def free_blocks_inside_chunks_and_disjoint(self):
        if not hasattr(self, "p"):
            return
        chunks = self.p.chunks
        blocks = sorted(self.p.free_blocks)
        for (a, n, _), (b, _, _) in zip(blocks, blocks[1:]):
            assert a + n <= b, "free blocks overlap"
        for a, n, _ in blocks:
            assert a % GRANULE == 0 and n % GRANULE == 0
            assert any(c <= a and a + n <= c + cn for c, cn in chunks)

    def teardown(self):
        if not hasattr(self, "p"):
            return
        for s in list(self.capturing):
            self.end_capture(s)
        for ptr, size, stream in self.live.values():
            self.p.deallocate(ptr, size, stream)
        self.live.clear()
        # with everything free, coalescing leaves one block per chunk: release returns them all
        self.p.release()
        assert self.p.pool_size() == 0 and self.p.chunks == [] and self.p.free_blocks == []


TestPoolModel = PoolModel.TestCase
TestPoolModel.settings = settings(
    max_examples=1000, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_same_stream_reuse_needs_no_fence():
    p = HostStreamOrderedPool(1 << 20)
    a = p.allocate(1000, stream=1)
    p.deallocate(a, 1000, stream=1)
    assert p.allocate(1000, stream=1) == a
    assert p.stats["same_stream_reuse"] == 1 and p.records == 0 and p.waits == []


def test_other_stream_takes_a_block_only_after_waiting_on_its_fence():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(1 << 20, stream=1)  # the whole pool
    p.deallocate(a, 1 << 20, stream=1)  # big free: fenced at once and shared
    assert p.records == 1
    b = p.allocate(1 << 20, stream=2)
    assert b == a
    assert p.waits == [(2, 1, p.clock - 1)]  # stream 2 waited on the fence of stream 1
    assert p.stats["cross_stream_reuse"] == 1 and p.syncs == []


def test_fences_are_batched():
    p = HostStreamOrderedPool(1 << 24)
    ptrs = [p.allocate(256, stream=1) for _ in range(200)]
    for ptr in ptrs[::2]:  # 100 separate blocks (no neighbour free: no coalescing)
        p.deallocate(ptr, 256, stream=1)
    assert 1 <= p.records <= 100 // 32  # one record per batch of cached blocks


def test_a_stream_reusing_its_own_blocks_never_fences():
    p = HostStreamOrderedPool(1 << 24)
    for _ in range(1000):
        p.deallocate(p.allocate(4096, stream=1), 4096, stream=1)
    assert p.records == 0 and p.stats["same_stream_reuse"] == 999


def test_retired_stream_hands_its_blocks_over_without_a_sync():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(4096, stream=3)
    p.deallocate(a, 4096, stream=3)  # small: stays in stream 3's cache
    assert [o for _, _, o in p.free_blocks if o == 3]
    p.retire_stream(3)
    assert not [o for _, _, o in p.free_blocks if o == 3]
    assert p.stats["retired_streams"] == 1
    p.allocate(1 << 20, stream=4)  # needs stream 3's block back: a wait, no sync
    assert p.syncs == [] and any(w[0] == 4 and w[1] == 3 for w in p.waits)


def test_out_of_memory_reclaims_other_caches_through_one_sync():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(4096, stream=1)
    p.deallocate(a, 4096, stream=1)  # cached on stream 1, unfenced
    b = p.allocate(1 << 20, stream=2)  # only possible with stream 1's block
    assert b and len(p.syncs) == 1 and p.stats["reclaim_syncs"] == 1
    with pytest.raises(MemoryError):
        p.allocate(256, stream=2)


def test_capture_takes_no_fence_and_no_wait():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(1 << 20, stream=1)
    p.begin_capture(1)
    p.deallocate(a, 1 << 20, stream=1)
    assert p.records == 0  # no fence recorded during capture
    assert p.allocate(1 << 20, stream=1) == a  # same-stream reuse works in capture
    p.end_capture(1)


def test_alignment_above_the_granule():
    p = HostStreamOrderedPool(1 << 20)
    for alignment in (512, 4096, 65536):
        ptr = p.allocate(1000, stream=1, alignment=alignment)
        assert ptr % alignment == 0
