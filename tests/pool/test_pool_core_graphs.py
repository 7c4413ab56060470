# SPDX-License-Identifier: Apache-2.0
"""Graphs as actors of the stream-ordered pool's policy core (host memory, no GPU).

A block freed while its stream is captured belongs to the capture's graph: every launch of an
executable graph instantiated from it replays the capture's kernels on those bytes, long after
the capture ended. The host platform models the whole life of a graph (capture in any mode and
any stream, forked branches, instantiation, launches, destruction of the graph and of its
executables in any order) and runs the callbacks of the user objects the pool retains into a
capture once the graph and its executables are gone. The oracle lets no other stream, and no
later use of the same stream outside the capture, have such bytes before that; and it counts as
a violation any device sync, or host sync of another stream than the pool's own, issued while a
capture is live anywhere (it would invalidate a global-mode capture in another thread).
"""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from helpers.stateful import REMAP_FRACTIONS, costly_moves, machine_settings
from rmm_fences_testing import HostStreamOrderedPool

KiB = 1 << 10
MiB = 1 << 20
MODES = st.sampled_from(["global", "thread_local", "relaxed"])
STREAMS = st.sampled_from([0, 1, 2, 3])
GRANULE = 256


def rounded(n):
    return max(GRANULE, (n + GRANULE - 1) // GRANULE * GRANULE)


def short_lived_streams(p, count, nbytes=256, first=1 << 20):
    """`count` streams, each making one allocate/free pair and never used again (a stream per
    task); returns the next free stream number."""
    for s in range(first, first + count):
        p.deallocate(p.allocate(nbytes, s), nbytes, s)
    return first + count


def captured_temporary(p, stream, nbytes, mode="relaxed"):
    """A capture on `stream` that allocates, uses and frees one block; the graph is
    instantiated and launched once. Returns (capture id, address of the block)."""
    cid = p.begin_capture(stream, mode=mode)
    ptr = p.allocate(nbytes, stream)
    p.deallocate(ptr, nbytes, stream)
    p.end_capture(stream)
    assert p.instantiate(cid) and p.launch(cid)
    return cid, ptr


# --- the three findings, each as the shortest sequence that shows it ---------------------


@pytest.mark.parametrize("streams", [30, 300])
def test_a_graphs_temporary_never_reaches_another_stream_while_the_graph_may_replay(streams):
    """300 short-lived streams make the pool sweep its slots, the capture's among them; its
    freed block must stay the graph's, however short the pool runs."""
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    cid, graph_block = captured_temporary(p, stream=1, nbytes=640 * KiB)
    short_lived_streams(p, streams)
    ptr = p.allocate(640 * KiB, stream=2)
    assert p.launch(cid)  # the graph replays: it writes its temporary again
    assert p.violations == []
    assert ptr != graph_block
    assert p.stats["reclaim_syncs"] == 0 and p.syncs == []


def test_a_graphs_blocks_come_back_once_the_graph_and_its_executables_are_destroyed():
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    cid, graph_block = captured_temporary(p, stream=1, nbytes=640 * KiB)
    assert p.stats["graph_bytes"] >= 640 * KiB
    assert p.instantiate(cid)  # a second executable graph
    assert p.destroy_graph(cid) and p.destroy_exec(cid)
    assert not p.graph_released(cid)  # one executable graph is left: it may still launch
    ptr = p.allocate(640 * KiB, stream=2)
    assert ptr != graph_block and p.stats["upstream_growths"] == 1
    p.deallocate(ptr, 640 * KiB, 2)
    assert p.launch(cid) and p.destroy_exec(cid) and p.graph_released(cid)
    short_lived_streams(p, 100)
    assert p.stats["graph_bytes"] == 0
    ptr = p.allocate(640 * KiB, stream=3)  # the graph's bytes serve it: the pool does not grow
    assert abs(ptr - graph_block) < 640 * KiB and p.stats["upstream_growths"] == 1
    assert p.violations == []


def test_stats_hand_back_a_gone_graphs_blocks_without_a_miss():
    # A stream that only reuses its own cached block never reaches allocate's slower path; the
    # graph's blocks must not stay counted as held for it once it is gone.
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    cid, _ = captured_temporary(p, stream=1, nbytes=640 * KiB)
    p.deallocate(p.allocate(256, stream=2), 256, stream=2)  # stream 2's cached block
    assert p.destroy_graph(cid) and p.destroy_exec(cid) and p.graph_released(cid)
    p.deallocate(p.allocate(256, stream=2), 256, stream=2)  # a same-stream hit: no miss
    assert p.stats["graph_bytes"] == 0
    assert p.violations == []


def test_an_aborted_capture_gives_its_blocks_back():
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    cid = p.begin_capture(1, mode="global")
    ptr = p.allocate(640 * KiB, 1)
    p.deallocate(ptr, 640 * KiB, 1)
    p.end_capture(1)
    assert p.destroy_graph(cid) and p.graph_released(cid)  # never instantiated
    assert p.allocate(640 * KiB, stream=2) == ptr
    assert p.violations == []


def test_without_a_user_object_the_graphs_blocks_stay_held():
    """When no user object can be retained into the capture, the pool cannot learn when the
    graph goes: the blocks it freed stay held (the pool grows instead)."""
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    p.fail_next("retain")
    cid, graph_block = captured_temporary(p, stream=1, nbytes=640 * KiB)
    assert p.destroy_exec(cid) and p.destroy_graph(cid)
    short_lived_streams(p, 100)
    assert p.allocate(640 * KiB, stream=2) != graph_block
    assert p.violations == []


def orphaned_quarter(p, first=1 << 20):
    """Streams that each free a 16 KiB block into their cache and go away (no retire_stream):
    enough of them (200 in a 4 MiB pool) that slot sweeps leave half the pool in blocks of
    streams that went away."""
    for s in range(first, first + 200):
        p.deallocate(p.allocate(16 * KiB, s), 16 * KiB, s)


def test_an_allocation_never_syncs_the_device_while_another_thread_captures():
    p = HostStreamOrderedPool(initial_pool_size=4 * MiB)
    orphaned_quarter(p)
    p.begin_capture(9, mode="global")  # another thread's capture
    p.allocate(1 * MiB, stream=2)  # misses the cache: the pool grows, it does not sync
    p.end_capture(9)
    assert p.violations == [] and p.syncs == []


def test_release_never_syncs_the_device_while_another_thread_captures():
    p = HostStreamOrderedPool(initial_pool_size=4 * MiB)
    orphaned_quarter(p)
    p.begin_capture(9, mode="global")
    p.release()
    p.end_capture(9)
    assert p.violations == [] and p.syncs == []


def test_out_of_memory_never_syncs_the_device_while_another_thread_captures():
    p = HostStreamOrderedPool(initial_pool_size=4 * MiB, maximum_pool_size=4 * MiB)
    orphaned_quarter(p)
    p.begin_capture(9, mode="global")
    try:
        p.allocate(1 * MiB, stream=2)  # more than the pool has free
    except MemoryError:
        pass
    p.end_capture(9)
    assert p.violations == [] and p.syncs == []


def test_null_frees_change_nothing():
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    live = [p.allocate(4 * KiB, 1) for _ in range(128)]
    before = (p.stats, sorted(p.free_blocks))
    for _ in range(64):
        p.deallocate(0, 0, 1)
        p.deallocate(0, 4 * KiB, 2)
        p.deallocate_unchecked(0, 0, 1)
    assert (p.stats, sorted(p.free_blocks)) == before
    for ptr in live:
        p.deallocate(ptr, 4 * KiB, 2)  # cross-stream frees find every block
    assert p.stats["current_bytes"] == 0 and p.stats["rejected_frees"] == 0


# --- a model that replays graphs ---------------------------------------------------------


class GraphPoolModel(RuleBasedStateMachine):
    """Streams, captures in every mode and their graphs, short-lived streams (slot sweeps),
    growth (from upstream chunks or a page arena), out-of-memory, release and faults, against
    the C++ oracle and the pool's counts."""

    graphs = Bundle("graphs")

    @initialize(
        initial=st.sampled_from([0, 256 * KiB, 1 * MiB]),
        maximum=st.none() | st.sampled_from([1 * MiB, 2 * MiB]),
        arena_page=st.sampled_from([0, 0, 4 * KiB, 64 * KiB]),
        remap=REMAP_FRACTIONS,
    )
    def setup(self, initial, maximum, arena_page, remap):
        if maximum is not None:
            initial = min(initial, maximum)
        self.p = HostStreamOrderedPool(
            initial, maximum, arena_page_size=arena_page, **costly_moves(remap)
        )
        self.live = {}  # allocation number -> (ptr, bytes, size)
        self.allocations = 0
        self.capturing = {}  # stream -> capture id
        self.cids = set()  # every capture id
        self.next_stream = 1 << 20

    @rule(nbytes=st.integers(0, 400 * KiB), stream=STREAMS)
    def allocate(self, nbytes, stream):
        try:
            ptr = self.p.allocate(nbytes, stream)
        except MemoryError:
            return
        self.live[self.allocations] = (ptr, nbytes, rounded(nbytes))
        self.allocations += 1

    @rule(pick=st.integers(0, 1 << 16), stream=STREAMS)
    def free(self, pick, stream):
        if self.live:
            ptr, nbytes, _ = self.live.pop(sorted(self.live)[pick % len(self.live)])
            self.p.deallocate(ptr, nbytes, stream)

    @rule(stream=STREAMS, nbytes=st.sampled_from([0, 4 * KiB]))
    def null_free(self, stream, nbytes):
        self.p.deallocate(0, nbytes, stream)

    @rule(target=graphs, stream=STREAMS, mode=MODES)
    def begin_capture(self, stream, mode):
        if stream in self.capturing:
            return self.capturing[stream]
        cid = self.p.begin_capture(stream, mode=mode)
        self.capturing[stream] = cid
        self.cids.add(cid)
        return cid

    @rule(pick=st.integers(0, 1 << 16), stream=STREAMS)
    def fork_into_capture(self, pick, stream):
        """`stream` joins a capture in progress (it waited on an event of a captured one)."""
        if self.capturing and stream not in self.capturing:
            cid = self.capturing[sorted(self.capturing)[pick % len(self.capturing)]]
            self.capturing[stream] = self.p.begin_capture(stream, capture_id=cid)

    @rule(stream=STREAMS)
    def end_capture(self, stream):
        if self.capturing.pop(stream, None) is not None:
            self.p.end_capture(stream)

    @rule(cid=graphs)
    def instantiate(self, cid):
        self.p.instantiate(cid)

    @rule(cid=graphs)
    def launch(self, cid):
        self.p.launch(cid)

    @rule(cid=graphs)
    def destroy_exec(self, cid):
        self.p.destroy_exec(cid)

    @rule(cid=consumes(graphs))
    def destroy_graph(self, cid):
        self.p.destroy_graph(cid)

    @rule(count=st.integers(1, 150), nbytes=st.sampled_from([256, 16 * KiB]))
    def short_lived_streams(self, count, nbytes):
        try:
            self.next_stream = short_lived_streams(self.p, count, nbytes, self.next_stream)
        except MemoryError:
            self.next_stream += count

    @rule(stream=STREAMS)
    def retire(self, stream):
        self.p.retire_stream(stream)

    @rule()
    def release(self):
        self.p.release()

    @rule()
    def complete_all(self):
        self.p.complete_all()

    @rule(kind=st.sampled_from(["record", "stream_wait", "sync_stream", "query", "retain"]))
    def fail_next_call(self, kind):
        self.p.fail_next(kind)

    @invariant()
    def oracle(self):
        if hasattr(self, "p"):
            assert self.p.violations == []

    @invariant()
    def accounting(self):
        if not hasattr(self, "p"):
            return
        stats = self.p.stats
        assert stats["current_bytes"] == sum(s for _, _, s in self.live.values())
        free = sum(n for _, n, _ in self.p.free_blocks)
        assert free + stats["current_bytes"] == stats["pool_bytes"], "bytes lost or doubled"

    def teardown(self):
        if not hasattr(self, "p"):
            return
        for s in list(self.capturing):
            self.end_capture(s)
        for kind in ("record", "stream_wait", "sync_stream", "query", "retain"):
            self.p.fail_next(kind, 0)
        for cid in self.cids:
            while self.p.destroy_exec(cid):
                pass
            self.p.destroy_graph(cid)
        for ptr, nbytes, _ in self.live.values():
            self.p.deallocate(ptr, nbytes, 0)
        self.p.complete_all()
        self.short_lived_streams(150, 256)  # sweeps hand back the captures' slots
        self.p.release()
        assert self.p.violations == []


TestGraphPoolModel = GraphPoolModel.TestCase
TestGraphPoolModel.settings = machine_settings(max_examples=400, steps=30)


@pytest.mark.parametrize("arena_page", [0, 64 * KiB], ids=["chunks", "page_arena"])
def test_native_threads_with_graphs_keep_the_oracle(arena_page):
    """Real threads without the GIL: each captures on its own stream in every mode, launches
    and destroys its graphs at later steps, churns short-lived streams, releases and runs out
    of memory, while the others allocate; no handout overlaps bytes a live graph may replay
    (nor an unmap bytes whose work may still run) and no sync is issued while a capture is
    live."""
    p = HostStreamOrderedPool(
        initial_pool_size=1 * MiB, maximum_pool_size=8 * MiB, arena_page_size=arena_page
    )
    ooms = p.run_graph_churn(threads=8, tasks=400, random_state=7)
    assert p.violations == []
    assert ooms < 8 * 400
    assert p.stats["current_bytes"] == 0
