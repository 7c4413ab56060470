# SPDX-License-Identifier: Apache-2.0
"""The stream-ordered pool's C++ policy core on host memory (no GPU).

The core under test is the one StreamOrderedPoolMemoryResource runs on the GPU; the platform
logs every fence record, stream wait and device sync against a clock that advances once per
call, so the model can check each reuse against the fences that ordered it.
"""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from helpers.stateful import REMAP_FRACTIONS, costly_moves, machine_settings
from rmm_fences_testing import HostStreamOrderedPool, pool_growth_chunk

STREAMS = st.sampled_from([0, 1, 2, 3, 4])
GRANULE = 256
MIB = 1 << 20
#: Frees of a new stream that are each fenced (the pool core's `young_frees`).
YOUNG_FREES = 16
#: Chunks from the upstream (0), or a page arena of 4 KiB or 64 KiB pages (growth at the top
#: of one range, complete free pages unmapped to back new ones).
ARENA_PAGES = st.sampled_from([0, 0, 4096, 1 << 16])


def coalesced(blocks):
    """Free blocks (ptr, size, owner), sorted, with touching blocks of one owner merged (how a
    cache lists them, its last frees apart or in its free list, is not what a test compares)."""
    out = []
    for ptr, size, owner in sorted(blocks):
        if out and out[-1][2] == owner and out[-1][0] + out[-1][1] == ptr:
            out[-1] = (out[-1][0], out[-1][1] + size, owner)
        else:
            out.append((ptr, size, owner))
    return out


def grown_up(p, stream):
    """Spends `stream`'s young frees (each covered by a record) on one 256-byte block, which
    stays in its cache."""
    for _ in range(YOUNG_FREES):
        p.deallocate(p.allocate(256, stream=stream), 256, stream=stream)


def rounded(n):
    return max(GRANULE, (n + GRANULE - 1) // GRANULE * GRANULE)


class PoolModel(RuleBasedStateMachine):
    """Random calls, faults and captures against the C++ oracle (no block reaches another
    stream without a wait on a later fence of its freeing stream or a sync after the free; no
    two live blocks overlap; over a page arena, no page is unmapped before the work on its
    bytes is done) and the pool's own counts (live + free == pool)."""

    @initialize(
        initial=st.sampled_from([0, 1 << 16, 1 << 20]),
        maximum=st.none() | st.sampled_from([1 << 20, 3 << 20]),
        arena_page=ARENA_PAGES,
        remap=REMAP_FRACTIONS,
    )
    def setup(self, initial, maximum, arena_page, remap):
        if maximum is not None:
            initial = min(initial, maximum)
        self.p = HostStreamOrderedPool(
            initial, maximum, arena_page_size=arena_page, **costly_moves(remap)
        )
        self.live = {}  # allocation number -> (ptr, requested bytes, rounded size, stream)
        self.allocations = 0
        self.freed = []  # [start, end, stream, clock of the free]
        self.capturing = {}  # stream -> capture id
        self.cids = set()  # every capture id (each names a graph)
        self.dead = []  # (ptr, bytes) freed and not handed out again since

    # --- ordering check (the Python twin of the C++ oracle, user frees only) -------------
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
    @rule(
        nbytes=st.integers(0, 300_000),
        stream=STREAMS,
        alignment=st.sampled_from([256, 256, 512, 4096]),
    )
    def allocate(self, nbytes, stream, alignment):
        try:
            ptr = self.p.allocate(nbytes, stream, alignment)
        except MemoryError:
            return
        size = rounded(nbytes)
        assert ptr % alignment == 0, "alignment not honoured"
        for other, _, osize, _ in self.live.values():
            assert ptr + size <= other or other + osize <= ptr, "live blocks overlap"
        self.claim(ptr, size, stream)
        self.live[self.allocations] = (ptr, nbytes, size, stream)
        self.allocations += 1

    # Draws never depend on addresses or on whether an allocation ran out of memory (host
    # addresses differ between runs): an index drawn first picks among what exists.
    @rule(pick=st.integers(0, 1 << 16), stream=STREAMS)
    def free(self, pick, stream):
        if not self.live:
            return
        ptr, nbytes, size, _ = self.live.pop(sorted(self.live)[pick % len(self.live)])
        self.p.deallocate(ptr, nbytes, stream)
        self.freed.append([ptr, ptr + size, stream, self.p.clock])
        self.dead.append((ptr, nbytes))

    @rule(pick=st.integers(0, 1 << 16), stream=STREAMS)
    def double_free(self, pick, stream):
        if not self.dead:
            return
        ptr, nbytes = self.dead[pick % len(self.dead)]
        if any(p <= ptr < p + n for p, _, n, _ in self.live.values()):
            return  # handed out again since: not a double free now
        before = (sorted(self.p.free_blocks), self.p.stats["current_bytes"])
        with pytest.raises(ValueError, match="double free or foreign pointer"):
            self.p.deallocate(ptr, nbytes, stream)
        assert (sorted(self.p.free_blocks), self.p.stats["current_bytes"]) == before

    @rule(pick=st.integers(0, 1 << 16), stream=STREAMS)
    def free_with_wrong_size(self, pick, stream):
        if not self.live:
            return
        ptr, nbytes, _, _ = self.live[sorted(self.live)[pick % len(self.live)]]
        with pytest.raises(ValueError, match=f"size mismatch: allocated {nbytes} bytes"):
            self.p.deallocate(ptr, nbytes + 1, stream)

    @rule(stream=STREAMS)
    def retire(self, stream):
        self.p.retire_stream(stream)

    @rule(stream=STREAMS)
    def begin_capture(self, stream):
        if stream not in self.capturing:
            self.capturing[stream] = self.p.begin_capture(stream)
            self.cids.add(self.capturing[stream])

    @rule(pick=st.integers(0, 1 << 16), stream=STREAMS)
    def fork_into_capture(self, pick, stream):
        """`stream` joins a capture in progress (an event of a captured stream waited on)."""
        if self.capturing and stream not in self.capturing:
            cid = self.capturing[sorted(self.capturing)[pick % len(self.capturing)]]
            self.capturing[stream] = self.p.begin_capture(stream, capture_id=cid)

    @rule(stream=STREAMS)
    def end_capture(self, stream):
        self.p.end_capture(stream)
        self.capturing.pop(stream, None)

    @rule(kind=st.sampled_from(["record", "stream_wait", "sync_device", "sync_stream"]))
    def fail_next_call(self, kind):
        self.p.fail_next(kind)

    @rule()
    def release(self):
        self.p.release()
        # bytes returned upstream are the upstream's to order (the C++ oracle checks the
        # pool's wait before it returns them, and each new chunk's stream)
        chunks = self.p.chunks
        self.freed = [f for f in self.freed if any(c <= f[0] < c + n for c, n in chunks)]

    # --- invariants ----------------------------------------------------------------------
    @invariant()
    def oracle(self):
        if not hasattr(self, "p"):
            return
        assert self.p.violations == []

    @invariant()
    def accounting(self):
        if not hasattr(self, "p"):
            return
        stats = self.p.stats
        assert stats["current_bytes"] == sum(s for _, _, s, _ in self.live.values())
        assert stats["pool_bytes"] == sum(n for _, n in self.p.chunks) == self.p.pool_size()
        arena = self.p.arena  # its pages: the mapped range and the spare pages
        held = stats["pool_bytes"] if arena is None else arena["physical_bytes"]
        assert stats["physical_bytes"] == held
        if arena is not None:
            assert arena["mapped_bytes"] == stats["pool_bytes"]
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
        for kind in ("record", "stream_wait", "sync_device", "sync_stream"):
            self.p.fail_next(kind, 0)
        for ptr, nbytes, _, stream in self.live.values():
            self.p.deallocate(ptr, nbytes, stream)
        self.live.clear()
        for cid in self.cids:  # the graphs go: their captures' blocks come back
            self.p.destroy_graph(cid)
        # everything free and ordered: coalescing leaves one block per chunk, release returns
        # them all
        assert self.p.synchronize_and_reclaim()
        self.p.release()
        assert self.p.pool_size() == 0 and self.p.chunks == [] and self.p.free_blocks == []
        assert self.p.violations == []


TestPoolModel = PoolModel.TestCase
TestPoolModel.settings = machine_settings(max_examples=600, steps=40)


def test_same_stream_reuse_needs_no_fence():
    p = HostStreamOrderedPool(1 << 20)
    grown_up(p, 1)
    records = p.records
    a = p.allocate(1000, stream=1)
    p.deallocate(a, 1000, stream=1)
    assert p.allocate(1000, stream=1) == a
    assert p.stats["same_stream_reuse"] >= 1 and p.records == records and p.waits == []


def test_a_new_streams_first_frees_are_fenced():
    """A stream that goes away after a few calls (a stream per task) leaves no block whose
    last use no event covers: its first frees are fenced, and reused without a wait."""
    p = HostStreamOrderedPool(1 << 20)
    a = p.allocate(1000, stream=1)
    p.deallocate(a, 1000, stream=1)
    assert p.records == 1 and p.allocate(1000, stream=1) == a and p.waits == []


def test_other_stream_takes_a_block_only_after_waiting_on_its_fence():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(1 << 20, stream=1)  # the whole pool
    with pytest.raises(MemoryError):
        p.allocate(1 << 20, stream=2)  # stream 2 asks: stream 1 fences at its next call
    syncs = len(p.syncs)
    p.deallocate(a, 1 << 20, stream=1)  # asked for: fenced at once and shared
    assert p.records == 1
    b = p.allocate(1 << 20, stream=2)
    assert b == a
    assert p.waits == [(2, 1, p.clock - 1)]  # stream 2 waited on the fence of stream 1
    assert p.stats["cross_stream_reuse"] == 1 and len(p.syncs) == syncs


def test_fences_are_batched():
    p = HostStreamOrderedPool(1 << 24)
    ptrs = [p.allocate(256, stream=1) for _ in range(200)]
    for ptr in ptrs[::2]:  # 100 separate blocks (no neighbour free: no coalescing)
        p.deallocate(ptr, 256, stream=1)
    # one record per young free (it covers the cache; the blocks stay), then one per batch of
    # cached blocks
    assert YOUNG_FREES + 1 <= p.records <= YOUNG_FREES + 100 // 32


def test_a_stream_reusing_its_own_blocks_fences_only_its_first_frees():
    p = HostStreamOrderedPool(1 << 24)
    for _ in range(1000):
        p.deallocate(p.allocate(4096, stream=1), 4096, stream=1)
    assert p.records == YOUNG_FREES and p.stats["same_stream_reuse"] >= 999 - YOUNG_FREES


def test_retired_stream_hands_its_blocks_over_without_a_sync():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    grown_up(p, 3)
    a = p.allocate(4096, stream=3)
    p.deallocate(a, 4096, stream=3)  # small: stays in stream 3's cache
    assert [o for _, _, o in p.free_blocks if o == 3]
    p.retire_stream(3)
    assert not [o for _, _, o in p.free_blocks if o == 3]
    assert p.stats["retired_streams"] == 1
    assert p.stats["stream_slots"] == 0  # the retired slot is given up (its fence is kept)
    p.allocate(1 << 20, stream=4)  # needs stream 3's block back: a wait, no sync
    assert p.syncs == [] and any(w[0] == 4 and w[1] == 3 for w in p.waits)


def test_out_of_memory_never_syncs_the_device():
    """An idle stream's unfenced block cannot be ordered without a device sync: the pool
    raises out-of-memory rather than sync, asks the stream to fence at its next call, and the
    named reclaim frees it."""
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    grown_up(p, 1)
    a = p.allocate(4096, stream=1)
    p.deallocate(a, 4096, stream=1)  # cached on stream 1, unfenced
    with pytest.raises(MemoryError):
        p.allocate(1 << 20, stream=2)  # only possible with stream 1's block
    assert p.syncs == [] and p.stats["reclaim_syncs"] == 0
    assert p.synchronize_and_reclaim() and len(p.syncs) == 1
    b = p.allocate(1 << 20, stream=2)
    assert b and p.stats["reclaim_syncs"] == 1
    with pytest.raises(MemoryError):
        p.allocate(256, stream=2)


def test_a_young_streams_free_reaches_a_stream_that_ran_short_through_a_wait():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    a = p.allocate(4096, stream=1)
    p.deallocate(a, 4096, stream=1)  # a young stream's free: fenced
    assert p.allocate(1 << 20, stream=2)
    assert p.syncs == [] and any(w == 2 and s == 1 for w, s, _ in p.waits)


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


# --- out-of-memory reclaim and release: only what the sync covers loses its fence ----------

HOST_PRIVATE_STREAM = 0xFFFF_FF00  # the host platform's pool-owned stream


def no_violation_on(p, stream):
    return [v for v in p.violations if f"freed on stream {stream} " in v]


def test_reclaim_keeps_the_fence_of_a_block_freed_during_its_sync():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    grown_up(p, 1)
    grown_up(p, 3)
    h = p.allocate(256 << 10, stream=3)
    a = p.allocate(4096, stream=1)
    p.deallocate(a, 4096, stream=1)  # cached on stream 1, unfenced
    with pytest.raises(MemoryError):
        p.allocate(768 << 10, stream=2)  # stream 3 is asked to fence at its next call
    # While the device syncs for the named reclaim, "another thread" frees h on stream 3 (its
    # kernels may still run: the sync does not cover them) and fences it.
    p.free_inside_next_sync(h, 256 << 10, stream=3)
    assert p.synchronize_and_reclaim()
    b = p.allocate(768 << 10, stream=2)  # only possible with h's bytes
    assert b <= h < b + (768 << 10)
    assert any(w == 2 and s == 3 and c >= p.hook_free_clock for w, s, c in p.waits), (
        "stream 2 got bytes freed on stream 3 after the sync without waiting on its fence"
    )
    assert no_violation_on(p, 3) == []


def test_release_returns_a_fenced_chunk_after_a_wait_on_the_pools_own_stream():
    p = HostStreamOrderedPool(1 << 20)  # chunk 1: 1 MiB
    grown_up(p, 2)
    grown_up(p, 3)
    h = p.allocate(256 << 10, stream=3)
    x = p.allocate(1 << 20, stream=2)  # a miss: stream 3 is asked to fence; chunk 2 grows
    p.deallocate(x, 1 << 20, stream=2)
    p.free_inside_next_sync(h, 256 << 10, stream=3)
    assert p.synchronize_and_reclaim()  # h is freed (and fenced) inside the sync
    returned = p.release()
    assert returned == 3 << 20  # both chunks; chunk 1 after a wait on h's fence
    assert any(
        w == HOST_PRIVATE_STREAM and s == 3 and c >= p.hook_free_clock for w, s, c in p.waits
    )
    assert no_violation_on(p, 3) == [] and p.violations == []


def test_release_never_syncs_and_keeps_cached_blocks():
    p = HostStreamOrderedPool(1 << 20)
    grown_up(p, 2)
    a = p.allocate(4096, stream=2)
    p.deallocate(a, 4096, stream=2)  # cached on stream 2, unfenced: its chunk stays
    assert p.release() == 0 and p.syncs == [] and p.stream_syncs[1:] == []
    assert p.pool_size() == 1 << 20 and p.violations == []


def test_failed_sync_puts_caches_and_fences_back():
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    grown_up(p, 1)
    a = p.allocate(4096, stream=1)
    p.deallocate(a, 4096, stream=1)  # in stream 1's cache
    big = p.allocate(512 << 10, stream=3)
    p.deallocate(big, 512 << 10, stream=3)
    p.retire_stream(3)  # fenced, shared with a tag
    before = coalesced(p.free_blocks)
    assert any(owner == 1 for _, _, owner in before)
    p.fail_next("sync_device")
    assert not p.synchronize_and_reclaim()
    assert coalesced(p.free_blocks) == before, "a failed sync changed the lists"
    assert p.stats["reclaim_syncs"] == 0
    c = p.allocate(512 << 10, stream=2)  # stream 3's block: still needs its fence
    assert any(w == 2 and s == 3 for w, s, _ in p.waits)
    assert p.violations == []
    p.deallocate(c, 512 << 10, stream=2)


@pytest.mark.parametrize("arena_page", [0, 1 << 16], ids=["chunks", "page_arena"])
def test_real_threads_keep_the_oracle(arena_page):
    """Eight C++ threads (no GIL) on their own streams: allocations, frees on their own and a
    neighbour's stream, retire, release, out-of-memory reclaims and injected faults."""
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=4 << 20, arena_page_size=arena_page)
    for random_state in range(3):
        p.run_threads(8, 3000, random_state)
        assert p.violations == []
    stats = p.stats
    assert stats["current_bytes"] == 0
    # per-stream balances are settled every 4 MiB: the peak may be off by that per stream
    assert stats["peak_bytes"] <= (4 << 20) + 9 * (4 << 20)
    assert stats["reclaim_syncs"] == 0 and p.syncs == [] and stats["cross_stream_reuse"] > 0
    free = sum(n for _, n, _ in p.free_blocks)
    assert free == stats["pool_bytes"], "bytes lost or doubled"


def test_oracle_catches_two_streams_with_one_identity():
    """The oracle is able to fail: two streams that report one identity share a cache."""
    p = HostStreamOrderedPool(1 << 20)
    p.alias_stream(1, 7)
    p.alias_stream(2, 7)
    a = p.allocate(4096, stream=1)
    p.deallocate(a, 4096, stream=1)
    assert p.allocate(4096, stream=2) == a
    assert any("freed on stream 1" in v for v in p.violations)


# --- growth: on the requesting stream, the rest fenced ------------------------------------


def test_growth_allocates_on_the_requesting_stream_and_fences_the_rest():
    p = HostStreamOrderedPool()
    a = p.allocate(4096, stream=1)  # grows
    ((kind, chunk, size, on, clock),) = p.upstream_calls
    assert kind == "allocate" and on == 1, f"chunk allocated on stream {on}, not 1"
    b = p.allocate(4096, stream=2)  # from the same chunk
    assert chunk <= b < chunk + size and b != a
    assert any(w == 2 and s == 1 and c >= clock for w, s, c in p.waits), (
        "stream 2 got part of a chunk grown on stream 1 without waiting on a fence of stream 1"
    )
    assert p.violations == []


def grown_chunks(maximum_growth_size, requests):
    """Chunk sizes the pool took from the upstream while serving ``requests`` (none freed)."""
    p = HostStreamOrderedPool(maximum_growth_size=maximum_growth_size)
    live = [(p.allocate(n, stream=1), n) for n in requests]
    chunks = [size for kind, _, size, _, _ in p.upstream_calls if kind == "allocate"]
    for ptr, n in live:
        p.deallocate(ptr, n, stream=1)
    assert p.violations == []
    return chunks


def test_growth_doubles_a_small_pool_then_adds_half():
    # from the first request (rounded to 2 MiB), doubling below 64 MiB, then half the pool
    requests = [3 << 20] * 50  # 150 MiB live
    chunks = grown_chunks(None, requests)
    assert chunks == [c << 20 for c in (4, 4, 8, 16, 32, 32, 48, 72)], chunks  # 216 MiB


def test_a_small_request_takes_a_small_first_chunk():
    assert grown_chunks(None, [256]) == [2 << 20]


def test_a_big_request_grows_a_large_pool_by_its_own_size():
    # 240 MiB live in 324 MiB held; 100 MiB is more than 1/8 of the pool: a chunk of 100 MiB,
    # not another 162 (half the pool) or 324 (doubling)
    requests = [3 << 20] * 80 + [100 << 20]
    chunks = grown_chunks(None, requests)
    assert chunks[-1] == 100 << 20 and sum(chunks[:-1]) == 324 << 20, chunks


def test_a_large_pool_grows_by_at_most_512_mib_beyond_the_request():
    # 60 MiB requests: below 1/8 of the pool from 480 MiB on, so the pool grows by half,
    # but never by more than 512 MiB (the last growth's unused part); 2.4 GB live
    requests = [60 << 20] * 40
    chunks = grown_chunks(None, requests)
    assert max(chunks) == 512 << 20, [c >> 20 for c in chunks]
    assert sum(chunks) - sum(requests) < 512 << 20, [c >> 20 for c in chunks]


@pytest.mark.parametrize("path", ["allocate", "allocate_cached_first"])
def test_a_small_request_takes_a_tight_shared_block_before_splitting_a_big_cached_one(path):
    # One stream: its 64 MiB block freed (in its cache), and a 1 MiB block left in the shared
    # list. A 1 MiB request takes the shared one; the 64 MiB block stays whole for the next
    # 64 MiB request, which needs no growth. Splitting the cached block (its own frees first)
    # grew the pool by 64 MiB: GPT-2's training steps held 2.3x their peak live bytes so.
    # "allocate_cached_first" is the Python resource's path (the same-stream path alone first).
    mib = 1 << 20
    p = HostStreamOrderedPool(initial_pool_size=256 * mib)
    a = p.allocate(64 * mib, stream=1)
    b = p.allocate(191 * mib, stream=1)  # 1 MiB of the chunk left in the shared list
    p.deallocate(a, 64 * mib, stream=1)
    c = getattr(p, path)(mib, stream=1)
    assert not a <= c < a + 64 * mib, "the 1 MiB request split the cached 64 MiB block"
    d = p.allocate(64 * mib, stream=1)
    assert d == a
    assert [size for kind, _, size, _, _ in p.upstream_calls if kind == "allocate"] == [256 * mib]
    for ptr, n in ((b, 191 * mib), (c, mib), (d, 64 * mib)):
        p.deallocate(ptr, n, stream=1)
    assert p.violations == []


def test_a_cached_block_twice_the_request_is_loose_however_small():
    # A 256 KiB request, a 1 MiB block in the stream's cache and a 256 KiB one in the shared
    # list: the shared one is taken (splitting the 1 MiB block would leave more than the
    # request). Only splits that left more than 1 MiB counted before: GPT-2's synthetic steps
    # at batch 2 held 1.32x their peak live bytes then, 1.18x now.
    kib, mib = 1 << 10, 1 << 20
    p = HostStreamOrderedPool(initial_pool_size=2 * mib)
    a = p.allocate(mib, stream=1)
    b = p.allocate(mib - 256 * kib, stream=1)  # 256 KiB of the chunk left in the shared list
    p.deallocate(a, mib, stream=1)
    c = p.allocate(256 * kib, stream=1)
    assert not a <= c < a + mib, "the 256 KiB request split the cached 1 MiB block"
    d = p.allocate(mib, stream=1)
    assert d == a
    for ptr, n in ((b, mib - 256 * kib), (c, 256 * kib), (d, mib)):
        p.deallocate(ptr, n, stream=1)
    assert p.violations == []


def test_a_tighter_shared_block_that_needs_a_wait_does_not_replace_the_streams_own():
    # Stream 1's cache holds a 64 MiB block; the shared list's only tighter block was freed on
    # stream 2 (fenced there). A 1 MiB request on stream 1 splits its own block: taking the
    # shared one would add a device-side wait on stream 2 that the own block does not need.
    mib = 1 << 20
    p = HostStreamOrderedPool(initial_pool_size=256 * mib)
    grown_up(p, 1)
    a = p.allocate(64 * mib, stream=1)
    b = p.allocate(mib, stream=2)
    c = p.allocate(191 * mib - 256, stream=1)  # the chunk's rest (grown_up took 256 bytes)
    p.deallocate(b, mib, stream=2)
    p.retire_stream(2)  # fenced on stream 2 and shared
    p.deallocate(a, 64 * mib, stream=1)
    waits_before = len(p.waits)
    d = p.allocate(mib, stream=1)
    assert d != b and a - 256 <= d < a + 64 * mib  # grown_up's block may lie just before a
    assert len(p.waits) == waits_before, p.waits[waits_before:]
    for ptr, n in ((c, 191 * mib - 256), (d, mib)):
        p.deallocate(ptr, n, stream=1)
    assert p.violations == []


def test_a_bounded_pool_takes_all_its_room_rather_than_strand_a_remainder():
    # 16 MiB at most: 12 MiB first. A 12 MiB chunk would leave 4 MiB of room, less than it
    # took; a 12 MiB chunk and a 4 MiB one can never serve 16 MiB, which fits the bound.
    p = HostStreamOrderedPool(maximum_pool_size=16 << 20)
    a = p.allocate(12 << 20, stream=1)
    with pytest.raises(MemoryError):
        p.allocate(8 << 20, stream=1)
    p.deallocate(a, 12 << 20, stream=1)
    b = p.allocate(16 << 20, stream=1)  # the whole bound, in the one chunk
    p.deallocate(b, 16 << 20, stream=1)
    assert [size for kind, _, size, _, _ in p.upstream_calls if kind == "allocate"] == [16 << 20]
    assert p.violations == []


def test_maximum_growth_size_bounds_each_chunk_beyond_the_request():
    requests = [3 << 20] * 40 + [40 << 20]  # 160 MiB live; the last request above the bound
    chunks = grown_chunks(16 << 20, requests)
    assert chunks[:-1] == [16 << 20] * (len(chunks) - 1), chunks
    assert chunks[-1] == 40 << 20, "a request above the bound gets a chunk of its own size"
    # 15 MiB of each 16 MiB chunk holds five 3 MiB blocks: 8 chunks for 40 blocks
    assert sum(chunks) == 8 * (16 << 20) + (40 << 20)
    assert sum(chunks) <= 1.05 * sum(requests)


def test_growth_rule_doubles_a_small_pool_from_the_first_request():
    assert pool_growth_chunk(held=0, need=256) == 2 * MIB  # a multiple of 2 MiB
    assert pool_growth_chunk(held=8 * MIB, need=MIB) == 8 * MIB
    assert pool_growth_chunk(held=8 * MIB, need=12 * MIB) == 12 * MIB  # at least the request


def test_growth_rule_grows_a_large_pool_by_half_or_a_big_request_alone():
    assert pool_growth_chunk(held=128 * MIB, need=2 * MIB) == 64 * MIB
    assert pool_growth_chunk(held=4096 * MIB, need=2 * MIB) == 512 * MIB  # at most 512 MiB
    assert pool_growth_chunk(held=800 * MIB, need=100 * MIB) == 100 * MIB  # 1/8 of the pool


def test_growth_rule_grows_a_large_pool_by_2_mib_for_a_small_request():
    # The CUB temp-storage loop at 256M: a 3 GiB input, then 256 B of temp storage. Growing
    # by half took 512 MiB for it.
    assert pool_growth_chunk(held=3072 * MIB, need=256) == 2 * MIB
    assert pool_growth_chunk(held=128 * MIB, need=MIB) == 2 * MIB  # 1 MiB is still small
    assert pool_growth_chunk(held=128 * MIB, need=MIB + 256) == 64 * MIB  # not small


def test_growth_rule_for_small_requests_stays_geometric_while_they_keep_growing_the_pool():
    # What small requests grew the pool by since the last growth for a larger one: their next
    # growth takes as much again, up to the pool's own rule (half of it, at most 512 MiB).
    assert pool_growth_chunk(held=1024 * MIB, need=256, small_streak=2 * MIB) == 2 * MIB
    assert pool_growth_chunk(held=1024 * MIB, need=256, small_streak=8 * MIB) == 8 * MIB
    assert pool_growth_chunk(held=1024 * MIB, need=256, small_streak=900 * MIB) == 512 * MIB
    # below 64 MiB the pool doubles whatever the request
    assert pool_growth_chunk(held=8 * MIB, need=256) == 8 * MIB
    # maximum_growth_size and capture keep their own rules
    assert pool_growth_chunk(held=1024 * MIB, need=256, maximum_growth_size=16 * MIB) == 16 * MIB
    assert pool_growth_chunk(held=1024 * MIB, need=256, capturing=True) == 2 * MIB


def test_a_pool_grown_by_small_requests_alone_grows_as_before():
    """Only small requests: the streak is every growth, so the pool keeps growing by half
    (a few growths), where a pool grown for a large block takes 2 MiB for a small one."""
    pool = HostStreamOrderedPool()
    blocks = [pool.allocate(512 << 10) for _ in range(2048)]  # 1 GiB of 512 KiB blocks
    held = 0
    for chunk in _grown(pool):  # doubling below 64 MiB, then half the pool
        half = -(-held // 2 // (2 * MIB)) * 2 * MIB  # in whole 2 MiB
        assert chunk == max(2 * MIB, held if held < 64 * MIB else half)
        held += chunk
    assert held == pool.pool_size() <= 1.5 * (1 << 30)
    for p in blocks:
        pool.deallocate(p, 512 << 10)

    big = HostStreamOrderedPool()
    a = big.allocate(3 << 30)
    b = big.allocate(256)
    assert big.pool_size() == (3 << 30) + 2 * MIB  # was 3.5 GiB
    big.deallocate(b, 256)
    big.deallocate(a, 3 << 30)


def test_growth_rule_with_maximum_growth_size():
    assert pool_growth_chunk(held=0, need=MIB, maximum_growth_size=16 * MIB) == 16 * MIB
    assert pool_growth_chunk(held=100 * MIB, need=3 * MIB, maximum_growth_size=16 * MIB) == (
        16 * MIB
    )
    assert pool_growth_chunk(held=0, need=40 * MIB, maximum_growth_size=16 * MIB) == 40 * MIB


def test_growth_rule_in_capture_adds_at_most_64_mib():
    assert pool_growth_chunk(held=1024 * MIB, need=2 * MIB, capturing=True) == 64 * MIB
    assert pool_growth_chunk(held=0, need=100 * MIB, capturing=True) == 100 * MIB


def test_growth_rule_of_a_bounded_pool_takes_all_the_room_rather_than_strand_a_remainder():
    assert pool_growth_chunk(held=0, need=12 * MIB, room=16 * MIB) == 16 * MIB
    assert pool_growth_chunk(held=32 * MIB, need=MIB, room=20 * MIB) == 20 * MIB
    # in capture a growth beyond the request stays small, bound or not
    assert pool_growth_chunk(held=0, need=12 * MIB, room=16 * MIB, capturing=True) == 12 * MIB


def test_growth_during_capture_uses_the_pools_own_stream():
    p = HostStreamOrderedPool()
    p.begin_capture(1)
    a = p.allocate(4096, stream=1)
    ((kind, _, _, on, clock),) = p.upstream_calls
    assert on == HOST_PRIVATE_STREAM, f"growth in capture on stream {on}"
    assert any(s == HOST_PRIVATE_STREAM and c >= clock for s, c in p.stream_syncs)
    p.end_capture(1)
    p.allocate(4096, stream=2)  # the rest: untagged after the sync, no wait
    assert p.violations == []
    p.deallocate(a, 4096, stream=1)


def test_initial_chunk_and_release_use_the_pools_own_stream():
    p = HostStreamOrderedPool(1 << 20)
    ((_, chunk, _, on, _),) = p.upstream_calls
    assert on == HOST_PRIVATE_STREAM and p.stream_syncs
    a = p.allocate(4096, stream=2)
    p.deallocate(a, 4096, stream=2)
    assert p.release() == 1 << 20
    assert (
        p.upstream_calls[-1][0] == "deallocate" and p.upstream_calls[-1][3] == HOST_PRIVATE_STREAM
    )
    assert p.violations == []


# --- capture identity: forked streams of one capture do not share a cache -----------------


def test_streams_forked_into_one_capture_do_not_share_a_cache():
    p = HostStreamOrderedPool(1 << 20)
    cid = p.begin_capture(1)
    p.begin_capture(2, capture_id=cid)  # forked into the same capture
    a = p.allocate(4096, stream=1)
    p.deallocate(a, 4096, stream=1)
    b = p.allocate(4096, stream=2)  # a parallel branch: must not get a
    assert b != a, "a forked branch got the block its sibling freed in the capture"
    assert p.violations == []


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [2**64 - 1, 2**64 - 256, 2**63])
def test_huge_sizes_raise_memory_error(nbytes):
    p = HostStreamOrderedPool(1 << 20)
    with pytest.raises(MemoryError):
        p.allocate(nbytes, stream=1)
    assert p.stats["current_bytes"] == 0 and p.violations == []


@pytest.mark.parametrize("alignment", [0, 3, 768, 2**31, 2**63])
def test_bad_alignment_raises_value_error(alignment):
    p = HostStreamOrderedPool(1 << 20)
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        p.allocate(1000, stream=1, alignment=alignment)


def test_double_free_is_refused_and_changes_nothing():
    p = HostStreamOrderedPool(1 << 20)
    a = p.allocate(1000, stream=1)
    p.deallocate(a, 1000, stream=1)
    before = sorted(p.free_blocks)
    with pytest.raises(ValueError, match="double free or foreign pointer"):
        p.deallocate(a, 1000, stream=1)
    assert sorted(p.free_blocks) == before
    b = p.allocate(1000, stream=1)
    c = p.allocate(1000, stream=1)
    assert b != c, "two live allocations share a block"
    assert p.stats["rejected_frees"] == 1 and p.stats["current_bytes"] == 2 * 1024
    assert p.violations == []


def test_unchecked_double_free_is_counted_and_changes_nothing():
    p = HostStreamOrderedPool(1 << 20)
    a = p.allocate(1000, stream=1)
    p.deallocate_unchecked(a, 1000, stream=1)
    before = sorted(p.free_blocks)
    p.deallocate_unchecked(a, 1000, stream=2)  # the noexcept path (rmm's resource_ref)
    assert sorted(p.free_blocks) == before and p.stats["rejected_frees"] == 1
    assert p.allocate(1000, stream=1) != p.allocate(1000, stream=1)


def test_wrong_size_and_foreign_pointer_are_refused():
    p = HostStreamOrderedPool(1 << 20)
    a = p.allocate(1000, stream=1)
    with pytest.raises(ValueError, match="size mismatch: allocated 1000 bytes, freed with 2000"):
        p.deallocate(a, 2000, stream=1)
    with pytest.raises(ValueError, match="size mismatch: allocated 1000 bytes, freed with 1001"):
        p.deallocate(a, 1001, stream=2)  # found in stream 1's blocks
    with pytest.raises(ValueError, match="double free or foreign pointer"):
        p.deallocate(a + 256, 256, stream=1)  # inside a live block
    with pytest.raises(ValueError, match="double free or foreign pointer"):
        p.deallocate(0x1000, 256, stream=1)
    assert p.stats["rejected_frees"] == 4 and p.stats["current_bytes"] == 1024
    p.deallocate(a, 1000, stream=2)  # the right free, on another stream, still works
    assert p.stats["current_bytes"] == 0


def test_stream_of_another_device_is_refused():
    p = HostStreamOrderedPool(1 << 20)
    p.mark_foreign_stream(9)
    with pytest.raises(ValueError, match="another device"):
        p.allocate(1000, stream=9)
    a = p.allocate(1000, stream=1)
    with pytest.raises(ValueError, match="another device"):
        p.deallocate(a, 1000, stream=9)
    p.deallocate(a, 1000, stream=1)


# --- same-stream reuse of a big block never fences -----------------------------------------


def test_same_stream_reuse_of_a_64_mib_block_fences_only_its_first_frees():
    p = HostStreamOrderedPool(64 << 20, maximum_pool_size=64 << 20)
    for _ in range(100):
        p.deallocate(p.allocate(64 << 20, stream=1), 64 << 20, stream=1)
    stats = p.stats
    assert stats["fences"] == YOUNG_FREES == p.records, f"{stats['fences']} fences"
    assert stats["same_stream_reuse"] >= 99 - YOUNG_FREES


def test_big_frees_are_fenced_once_another_stream_wanted_the_streams_blocks():
    """The ping-pong of the cross-stream race trial: once a stream ran short while the other
    held the block, the other's big frees are fenced for it (each runs short at most once,
    when the other's young frees are spent; no sync)."""
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    short = 0
    held = {}  # stream -> its block
    for i in range(80):
        s, other = (1, 2) if i % 2 == 0 else (2, 1)
        try:
            held[s] = p.allocate(1 << 20, stream=s)
        except MemoryError:
            short += 1
            continue
        assert held[s] == held.get(other, held[s])
        p.deallocate(held[s], 1 << 20, stream=s)
    assert short <= 2 and p.syncs == []
    assert p.stats["cross_stream_reuse"] >= 70
    assert p.violations == []


def test_stream_slots_counts_one_slot_per_stream_in_use():
    # Each stream identity gets a slot (its cache and its fence); below the sweep bound (64
    # slots) a stream destroyed without retire_stream keeps its slot; retire_stream gives one up.
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    assert p.stats["stream_slots"] == 0
    for stream in range(1, 41):
        p.deallocate(p.allocate(4096, stream=stream), 4096, stream=stream)
    assert p.stats["stream_slots"] == 40
    p.retire_stream(7)
    assert p.stats["stream_slots"] == 39 and p.stats["retired_streams"] == 1


# --- capture: the shared list's candidates in best-fit order ---------------------------------


def _tagged_best_fit_before_a_usable_block(usable):
    """An 8 MiB pool (one untagged chunk) whose shared list offers, best fit first, a 1 MiB
    block tagged with a fence of stream 1 whose work is still running, then a block that needs
    no wait: with ``usable="complete"`` a 1 MiB block at a higher address fenced by stream 2,
    whose work ran; with ``usable="untagged"`` the chunk's untagged rest (larger). Allocated
    separators keep the blocks apart. Returns (pool, tagged block, usable block)."""
    p = HostStreamOrderedPool(8 * MIB)
    x = p.allocate(MIB, stream=1)
    p.allocate(256, stream=3)
    if usable == "complete":
        y = p.allocate(MIB, stream=2)
        p.allocate(256, stream=3)
        p.deallocate(y, MIB, stream=2)
        p.retire_stream(2)  # fenced and shared
        p.complete(2)  # its fence queries complete
    else:
        y = x + MIB + 256  # the chunk's rest, listed untagged since the pool was made
    p.deallocate(x, MIB, stream=1)
    p.retire_stream(1)  # fenced and shared; stream 1's work is still running
    assert p.upstream_calls[1:] == []  # one chunk, the initial one
    return p, x, y


@pytest.mark.parametrize("usable", ["complete", "untagged"])
def test_capture_skips_a_tagged_best_fit_for_a_block_needing_no_wait(usable):
    p, x, y = _tagged_best_fit_before_a_usable_block(usable)
    waits_before = len(p.waits)
    p.begin_capture(5)
    z = p.allocate(MIB, stream=5)
    p.end_capture(5)
    assert p.upstream_calls[1:] == [], "the capture grew the pool"
    assert z == y
    assert len(p.waits) == waits_before  # no wait enqueued in capture
    p.deallocate(z, MIB, stream=5)
    assert p.violations == []


def test_outside_capture_the_tagged_best_fit_is_taken_after_a_wait():
    p, x, _ = _tagged_best_fit_before_a_usable_block("complete")
    z = p.allocate(MIB, stream=5)
    assert z == x
    assert p.waits[-1][:2] == (5, 1)  # stream 5 waits on stream 1's fence
    assert p.upstream_calls[1:] == []
    p.deallocate(z, MIB, stream=5)
    assert p.violations == []


# --- captures on new streams (CuPy's cuda_tests/test_graph.py: a new stream per test) -------


def _capture_rounds(p, rounds, complete_between):
    """Per round: a new stream captures a few small blocks (some freed inside the capture),
    the default stream works outside it, and the captured stream is never used again."""
    for r in range(rounds):
        s = 10 + r
        p.begin_capture(s)
        t1 = p.allocate(800, stream=s)
        t2 = p.allocate(800, stream=s)
        p.deallocate(t1, 800, stream=s)
        out = p.allocate(800, stream=s)
        p.deallocate(t2, 800, stream=s)
        p.end_capture(s)
        for _ in range(3):
            o = p.allocate(800, stream=0)
            p.deallocate(o, 800, stream=0)
        p.deallocate(out, 800, stream=s)
        if complete_between:
            p.complete_all()  # the kernels of the round finished before the next test


def _grown(p):
    return [c[2] for c in p.upstream_calls if c[0] == "allocate"]


def test_captures_reuse_blocks_whose_fences_are_complete():
    p = HostStreamOrderedPool()
    a = p.allocate(800, stream=0)
    _capture_rounds(p, 20, complete_between=True)
    # Before: every capture grew the pool (its blocks' neighbours carried fences it could not
    # wait on), doubling it: 64 MiB, 64, 128, ... 16 GiB after 10 captures.
    # Now: the default stream's first chunk, then one growth for the first capture (the
    # default stream's fence is not complete yet); every later capture reuses completed or
    # untagged blocks, whichever of them comes first in best-fit order.
    assert _grown(p) == [2 << 20, 2 << 20], [g >> 20 for g in _grown(p)]
    assert p.violations == []
    p.deallocate(a, 800, stream=0)


def test_growth_in_capture_does_not_double_the_pool():
    p = HostStreamOrderedPool()
    a = p.allocate(256 << 20, stream=0)  # the whole pool, held
    _capture_rounds(p, 12, complete_between=False)  # fences never complete
    # A capture grows by 64 MiB at most (these small requests by 2 MiB), and reuses the
    # untagged rests of earlier captures' chunks.
    in_capture = [c[2] for c in p.upstream_calls if c[0] == "allocate" and c[3] != 0]
    assert in_capture and sum(in_capture) <= 64 << 20, [g >> 20 for g in in_capture]
    assert len(in_capture) < 12
    assert p.violations == []
    p.deallocate(a, 256 << 20, stream=0)


def test_a_one_block_pool_shared_by_two_streams_never_runs_short():
    """The race trial's pattern, past the streams' young frees: each stream frees the pool's
    one block and the other takes it next. Once a stream's fenced block was taken by another,
    its big frees stay fenced, so the other never finds it cached and unfenced."""
    p = HostStreamOrderedPool(1 << 20, maximum_pool_size=1 << 20)
    for i in range(200):
        s = 1 + i % 2
        p.deallocate(p.allocate(1 << 20, stream=s), 1 << 20, stream=s)
    assert p.syncs == [] and p.stats["cross_stream_reuse"] >= 199
    assert p.violations == []
