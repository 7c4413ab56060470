# SPDX-License-Identifier: Apache-2.0
"""SyncOnFree's C++ policy core on host memory with hand-signalled fences (no GPU).

The core under test is the one SyncOnFreeResourceAdaptor runs on the GPU; only the platform
differs (a fence board instead of CUDA events, a byte-limited host allocator as upstream).
"""

import math

import pytest
import rmm
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rmm_fences import SyncOnFreeResourceAdaptor

from helpers.stateful import machine_settings
from rmm_fences_testing import HostSyncOnFree

STREAMS = st.sampled_from([1, 2, 3])  # 2: the per-thread default stream of each thread
MODES = ("device", "stream", "deferred")
FAULTS = ("query", "wait", "sync_device", "sync_stream", "record", "stream_id")
# One fence per free, fences tested on every call: the rules that do not depend on batching,
# checked call by call.
PER_FREE = {"max_batch_frees": 1}


class SyncOnFreeModel(RuleBasedStateMachine):
    """Random allocate / free / bad free / signal / capture / fault / flush sequences.

    Batches of every size (one fence per free up to the default), with a byte limit or none,
    and fences recycled as CUDA's event pool recycles events (a fence recorded again elsewhere
    once the core gave it back) or not.

    Invariants: no block reaches the upstream before the work that used it completed (its
    fence signalled, or a successful wait or sync covered it); no pending block is handed out
    again but to the very stream that used it last, outside capture (same-stream reuse), or
    once that work completed; every freed block is either pending, released exactly once or
    handed out again; no bad free reaches the upstream or changes anything;
    the syncs counted are the syncs that succeeded, the fences counted the records made; no
    identity query on a capturing stream; no fence tested, waited on or recorded after the
    core gave it back.
    """

    @initialize(
        mode=st.sampled_from(MODES),
        cap=st.none() | st.integers(0, 6000),
        limit=st.sampled_from([1 << 40, 12000]),
        # 16 twice: the default drawn more often, so that batches closed by their byte limit
        # meet captures and reused handles (free_a_large_block_then_allocate_another_size)
        batch_frees=st.sampled_from([1, 2, 3, 16, 16]),
        batch_bytes=st.sampled_from([None, 1500, 1 << 26]),
        recycle=st.booleans(),
        reuse=st.booleans(),
    )
    def setup(self, mode, cap, limit, batch_frees, batch_bytes, recycle, reuse):
        HostSyncOnFree.set_thread(0)
        self.thread = 0
        self.mode, self.cap, self.limit = mode, cap, limit
        self.h = HostSyncOnFree(
            mode,
            cap,
            limit,
            max_batch_frees=batch_frees,
            max_batch_bytes=batch_bytes,
            reuse_on_stream=reuse,
        )
        self.h.recycle_fences = recycle
        self.live = {}  # allocation number -> (ptr, size); numbers keep draws reproducible
        self.allocations = 0
        self.pending = {}  # ptr -> (allocation number, size)
        self.released = {}  # allocation number -> ptr, for blocks returned upstream
        self.seen = 0

    # --- helpers -------------------------------------------------------------------------
    def absorb(self):
        """Check every block the upstream got back since the last step."""
        releases = self.h.releases
        for ptr, nbytes, _stream, work_done in releases[self.seen :]:
            assert work_done, "a block reached the upstream before the work using it ended"
            assert ptr in self.pending, "the upstream got a block that was not pending"
            num, size = self.pending.pop(ptr)
            assert size == nbytes
            self.released[num] = ptr
        self.seen = len(releases)

    # --- rules ---------------------------------------------------------------------------
    @rule(size=st.integers(1, 3000), stream=STREAMS)
    def allocate(self, size, stream):
        try:
            ptr = self.h.allocate(size, stream)
        except MemoryError:
            self.absorb()
            assert self.h.upstream_used + size > self.limit
            return
        self.absorb()
        if ptr in self.pending:  # taken back by the stream that freed it
            _, pending_size = self.pending.pop(ptr)
            assert pending_size == size and self.h.reuses["unsafe"] == 0
        assert all(p != ptr for p, _ in self.live.values())
        self.live[self.allocations] = (ptr, size)
        self.allocations += 1

    @rule(size=st.integers(1, 1000), stream=STREAMS, count=st.integers(2, 8))
    def allocate_many(self, size, stream, count):
        for _ in range(count):
            self.allocate(size, stream)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS)
    def free(self, data, stream):
        num = data.draw(st.sampled_from(sorted(self.live)))
        ptr, size = self.live.pop(num)
        fence = self.h.deallocate(ptr, size, stream)
        self.pending[ptr] = (num, size)
        self.absorb()
        if fence is not None:
            assert ptr in self.pending

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS, then=st.none() | STREAMS)
    def free_then_allocate_its_size(self, data, stream, then):
        """The CUB temp-storage loop (a free, then an allocation of its size on the same
        stream: `then` None), or the allocation on another stream, which must not get the
        block early."""
        num = data.draw(st.sampled_from(sorted(self.live)))
        ptr, size = self.live.pop(num)
        self.h.deallocate(ptr, size, stream)
        self.pending[ptr] = (num, size)
        self.absorb()
        self.allocate(size, stream if then is None else then)

    @rule(
        size=st.integers(1500, 3000),
        stream=STREAMS,
        between=st.sampled_from(["nothing", "capture", "new_handle", "other_thread"]),
    )
    def free_a_large_block_then_allocate_another_size(self, size, stream, between):
        """A free that fills a batch's byte limit (1500 where one is drawn), then an allocation
        of another size; in between, the freeing stream may start a capture, its handle may go
        to a new stream, or the allocation may come from another thread (another per-thread
        default stream)."""
        before = self.allocations
        self.allocate(size, stream)
        if self.allocations == before:
            return  # out of memory
        num = before
        ptr, size = self.live.pop(num)
        self.h.deallocate(ptr, size, stream)
        self.pending[ptr] = (num, size)
        self.absorb()
        if between == "capture":
            self.h.begin_capture(stream)
        elif between == "new_handle" and stream != 2:
            self.h.end_capture(stream)
            self.h.reuse_handle(stream)
        elif between == "other_thread":
            self.switch_thread(1 - self.thread)
        self.allocate(size + 1, stream)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), stream=STREAMS)
    def allocate_the_size_of_a_pending_block(self, data, stream):
        """Whatever came between (a handle given to a new stream, a capture, another thread,
        signals), an allocation of a pending block's size: only its own stream, outside
        capture, may get it back before its work ended."""
        sizes = sorted({size for _, size in self.pending.values()})
        self.allocate(data.draw(st.sampled_from(sizes)), stream)

    @precondition(lambda self: len(self.live) > 1)
    @rule(stream=STREAMS)
    def free_all_on_one_stream(self, stream):
        """A run of consecutive frees on one stream: batches fill up."""
        for num in sorted(self.live):
            ptr, size = self.live.pop(num)
            self.h.deallocate(ptr, size, stream)
            self.pending[ptr] = (num, size)
            self.absorb()

    @precondition(lambda self: self.pending or self.released)
    @rule(data=st.data(), stream=STREAMS)
    def double_free(self, data, stream):
        # by allocation number: addresses differ between runs, numbers do not
        nums = {n: ptr for ptr, (n, _) in self.pending.items()}
        nums.update(self.released)
        ptr = nums[data.draw(st.sampled_from(sorted(nums)))]
        if ptr not in self.pending and any(p == ptr for p, _ in self.live.values()):
            return  # the address was handed out again: freeing it is legal
        size = self.pending[ptr][1] if ptr in self.pending else 64
        before = (self.h.pending_count, len(self.h.releases), self.h.stats["rejected_frees"])
        with pytest.raises(ValueError, match="double free|not a live block"):
            self.h.deallocate(ptr, size, stream)
        after = (self.h.pending_count, len(self.h.releases), self.h.stats["rejected_frees"])
        assert after == (before[0], before[1], before[2] + 1), "a bad free changed something"

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS)
    def free_with_wrong_size(self, data, stream):
        ptr, size = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        with pytest.raises(ValueError, match="does not match"):
            self.h.deallocate(ptr, size + 1, stream)
        self.absorb()

    @precondition(lambda self: self.h.fence_count > 0)
    @rule(data=st.data())
    def signal(self, data):
        self.h.signal(data.draw(st.integers(0, self.h.fence_count - 1)))

    @rule(stream=STREAMS)
    def signal_stream(self, stream):
        self.h.signal_stream(stream)

    @rule(stream=STREAMS)
    def begin_capture(self, stream):
        self.h.begin_capture(stream)

    @rule(stream=STREAMS)
    def end_capture(self, stream):
        self.h.end_capture(stream)

    @rule(stream=st.sampled_from([1, 3]))
    def reuse_handle(self, stream):
        """The stream behind the handle is destroyed, a new one gets the handle."""
        self.h.end_capture(stream)
        self.h.reuse_handle(stream)

    @rule(thread=st.integers(0, 1))
    def switch_thread(self, thread):
        HostSyncOnFree.set_thread(thread)
        self.thread = thread

    @rule(kind=st.sampled_from(FAULTS), count=st.integers(1, 3))
    def fail_next(self, kind, count):
        self.h.fail_next(kind, count)

    @rule()
    def toggle_global_capture(self):
        self.h.global_capture = not self.h.global_capture

    @rule()
    def flush(self):
        self.h.flush()
        self.absorb()

    # --- invariants ----------------------------------------------------------------------
    @invariant()
    def accounting(self):
        if not hasattr(self, "h"):
            return
        self.absorb()
        assert self.h.pending_bytes == sum(size for _, size in self.pending.values())
        assert self.h.pending_count == len(self.pending)
        assert self.h.live_count == len(self.live)
        assert self.h.stats["peak_pending_bytes"] >= self.h.pending_bytes
        assert self.h.upstream_bad_frees == 0, "a bad free reached the upstream"
        assert self.h.reuses["unsafe"] == 0, "a pending block went to another stream early"

    @invariant()
    def syncs_counted_are_syncs_that_succeeded(self):
        if not hasattr(self, "h"):
            return
        counts = self.h.board_counts
        assert self.h.stats["syncs"] == counts["waits_ok"] + counts["syncs_ok"]
        assert self.h.stats["fences"] == counts["records"]
        assert counts["invalidated_captures"] == 0, "identity query on a capturing stream"
        assert counts["released_fence_use"] == 0, "a fence was used after it was given back"

    def teardown(self):
        if not hasattr(self, "h"):
            return
        self.h.global_capture = False
        for kind in FAULTS:
            self.h.fail_next(kind, 0)
        for t in (0, 1):
            HostSyncOnFree.set_thread(t)
            for s in (1, 2, 3):
                self.h.end_capture(s)
        HostSyncOnFree.set_thread(0)
        self.h.flush()
        self.absorb()
        assert not self.pending, "flush() without faults or captures left blocks pending"
        for num, (ptr, size) in self.live.items():
            self.h.deallocate(ptr, size, 1)
            self.pending[ptr] = (num, size)
        self.h.flush()
        self.absorb()
        assert self.h.pending_count == 0 and self.h.upstream_used == 0, "a block was lost"


TestSyncOnFreeModel = SyncOnFreeModel.TestCase
TestSyncOnFreeModel.settings = machine_settings(max_examples=300, steps=50)


def test_block_waits_for_its_fence_then_goes_upstream():
    h = HostSyncOnFree("deferred", **PER_FREE)
    ptr = h.allocate(1000, stream=1)
    fence = h.deallocate(ptr, 1000, stream=1)
    assert fence is not None and h.pending_bytes == 1000 and h.releases == []
    h.allocate(8, stream=2)  # polls: fence not signalled, nothing released
    assert h.releases == []
    h.signal(fence)
    h.allocate(8, stream=2)
    assert [r[0] for r in h.releases] == [ptr]
    assert h.pending_bytes == 0 and h.stats["released"] == 1 and h.forced_waits == 0


def test_fifo_per_stream_stops_at_first_unsignalled():
    h = HostSyncOnFree("deferred", **PER_FREE)
    ptrs = [h.allocate(100, stream=1) for _ in range(4)]
    fences = [h.deallocate(p, 100, stream=1) for p in ptrs]
    h.signal(fences[1])  # stream order: signals fences 0 and 1
    h.allocate(8, stream=3)
    assert [r[0] for r in h.releases] == ptrs[:2]
    assert h.pending_count == 2


def test_cap_waits_for_the_oldest_fences():
    h = HostSyncOnFree("deferred", max_pending_bytes=250, **PER_FREE)
    ptrs = [h.allocate(100, stream=s) for s in (1, 2, 3)]
    for p, s in zip(ptrs, (1, 2, 3)):
        h.deallocate(p, 100, stream=s)
    assert h.pending_bytes == 200
    assert [r[0] for r in h.releases] == [ptrs[0]]  # the oldest, waited for
    assert h.forced_waits == 1 and h.stats["syncs"] == 1


def test_oom_drains_pending_then_retries_once():
    h = HostSyncOnFree("deferred", upstream_limit=1000)
    a = h.allocate(800, stream=1)
    h.deallocate(a, 800, stream=1)  # pending, its fence not signalled
    b = h.allocate(800, stream=2)  # upstream full: drain (wait), then retry
    assert b and h.stats["oom_retries"] == 1 and h.pending_count == 0
    with pytest.raises(MemoryError):
        h.allocate(800, stream=2)  # nothing left to drain: raises
    assert h.stats["oom_retries"] == 1


def test_capture_parks_until_a_call_on_the_same_stream_outside_capture():
    h = HostSyncOnFree("deferred", **PER_FREE)
    warm = h.allocate(64, stream=1)
    h.deallocate(warm, 64, stream=1)  # stream 1 seen outside capture: its identity is known
    h.signal_stream(1)
    ptr = h.allocate(64, stream=1)
    fences = h.fence_count
    h.begin_capture(1)
    assert h.deallocate(ptr, 64, stream=1) is None
    assert h.stats["parked"] == 1 and h.fence_count == fences  # no fence recorded in capture
    h.flush()  # a capture is under way: parked blocks stay
    assert h.pending_count == 1
    h.end_capture(1)
    h.allocate(8, stream=1)  # arms the parked block with a fence on stream 1
    assert h.fence_count == fences + 1 and h.pending_count == 1
    h.signal_stream(1)
    h.allocate(8, stream=1)
    assert h.pending_count == 0 and h.releases[-1][0] == ptr and h.releases[-1][3]
    assert h.board_counts["identity_queries"] == 2  # at the first free, and when arming


def test_capture_on_a_stream_never_seen_waits_for_a_device_sync():
    h = HostSyncOnFree("deferred")
    ptr = h.allocate(64, stream=1)
    h.begin_capture(1)
    h.deallocate(ptr, 64, stream=1)
    h.end_capture(1)
    h.allocate(8, stream=1)
    h.signal_stream(1)
    h.allocate(8, stream=1)
    assert h.pending_count == 1  # identity unknown at the free: not armed
    h.flush()  # a device sync covers it
    assert h.pending_count == 0 and h.releases[-1][0] == ptr and h.releases[-1][3]


@pytest.mark.parametrize("mode", ["device", "stream"])
def test_synchronizing_modes_release_at_once(mode):
    h = HostSyncOnFree(mode)
    ptr = h.allocate(64, stream=2)
    assert h.deallocate(ptr, 64, stream=2) is None
    assert h.releases[-1][0] == ptr and h.pending_count == 0 and h.stats["syncs"] == 1


def test_failed_fence_record_falls_back_to_a_stream_sync():
    h = HostSyncOnFree("deferred")
    ptr = h.allocate(64, stream=2)
    h.fail_next_record()
    assert h.deallocate(ptr, 64, stream=2) is None
    assert h.releases[-1][0] == ptr and h.stats["syncs"] == 1 and h.stats["deferred"] == 0


# --- batches: consecutive frees on a stream share one fence -------------------------------


def test_consecutive_frees_on_one_stream_share_a_fence():
    h = HostSyncOnFree("deferred")  # the defaults: 16 frees per fence
    n, k = 100, 16
    for _ in range(n):
        h.deallocate(h.allocate(64, stream=1), 64, stream=1)
    assert h.fence_count <= math.ceil(n / k)


@pytest.mark.parametrize("k", [1, 2, 5, 16])
@pytest.mark.parametrize("n", [1, 7, 48, 100])
def test_n_frees_record_at_most_ceil_n_over_k_fences(n, k):
    h = HostSyncOnFree("deferred", max_batch_frees=k, max_batch_bytes=None, reuse_on_stream=False)
    for _ in range(n):
        h.deallocate(h.allocate(64, stream=1), 64, stream=1)
        h.allocate(8, stream=1)  # allocations test fences, never record one
    records = h.board_counts["records"]
    assert records <= math.ceil(n / k)
    assert h.stats["fences"] == records and h.stats["deferred"] == n
    assert h.stats["released"] + h.pending_count == n
    h.signal_stream(1)
    for _ in range(k):
        h.allocate(8, stream=1)  # one call in k tests the fences
    assert h.pending_count <= k - 1  # only the batch without a fence yet waits


def test_byte_limit_records_the_fence_of_a_batch():
    h = HostSyncOnFree(
        "deferred", max_batch_frees=1000, max_batch_bytes=1000, reuse_on_stream=False
    )
    for _ in range(21):
        h.deallocate(h.allocate(300, stream=1), 300, stream=1)
    # the stream's first free is fenced alone; then every 4th free (1200 >= 1000 bytes)
    assert h.stats["fences"] == 1 + 5


def test_a_batched_block_waits_for_a_fence_recorded_after_its_free():
    h = HostSyncOnFree("deferred", max_batch_frees=4, max_batch_bytes=None)
    ptrs = [h.allocate(100, stream=1) for _ in range(5)]
    first = h.deallocate(ptrs[0], 100, stream=1)  # a new stream: fenced alone
    assert first is not None
    for p in ptrs[1:4]:
        assert h.deallocate(p, 100, stream=1) is None  # batched: no fence yet
    h.signal(first)  # completes the stream's work up to the first fence only
    for _ in range(8):
        h.allocate(8, stream=3)  # polls (one call in 4)
    assert [r[0] for r in h.releases] == [ptrs[0]], "released on a fence recorded before its free"
    fence = h.deallocate(ptrs[4], 100, stream=1)  # the 4th of the batch: its fence is recorded
    assert fence is not None and all(h.fence_of(p) == fence for p in ptrs[1:])
    assert h.fence(fence)["stream"] == 1 and h.stats["fences"] == 2
    for _ in range(8):
        h.allocate(8, stream=3)
    assert len(h.releases) == 1
    h.signal(fence)
    for _ in range(8):
        h.allocate(8, stream=3)
    assert sorted(r[0] for r in h.releases) == sorted(ptrs) and work_done_everywhere(h)
    assert h.forced_waits == 0 and h.stats["syncs"] == 0


def test_out_of_memory_fences_the_calling_streams_batch_and_waits_for_it():
    h = HostSyncOnFree("deferred", upstream_limit=1000, max_batch_frees=16)
    first = h.allocate(100, stream=1)
    h.deallocate(first, 100, stream=1)  # fenced alone (a new stream)
    ptrs = [h.allocate(200, stream=1) for _ in range(4)]
    for p in ptrs:
        assert h.deallocate(p, 200, stream=1) is None  # batched, work still queued
    records = h.board_counts["records"]
    b = h.allocate(800, stream=1)  # needs memory: the batch gets its fence, waited on
    assert b and h.stats["oom_retries"] == 1 and h.pending_count == 0
    assert h.board_counts["records"] == records + 1
    assert h.board_counts["syncs_ok"] == 0, "synchronized the device for a live stream's batch"
    assert work_done_everywhere(h) and h.forced_waits >= 1


def test_out_of_memory_on_another_stream_synchronizes_the_device_for_a_batch():
    """A batch's fence is recorded only on its own stream, which may be gone: an allocation on
    another stream that needs its memory synchronizes the device instead."""
    h = HostSyncOnFree("deferred", upstream_limit=1000, max_batch_frees=16)
    h.deallocate(h.allocate(100, stream=1), 100, stream=1)
    ptrs = [h.allocate(200, stream=1) for _ in range(4)]
    for p in ptrs:
        h.deallocate(p, 200, stream=1)
    records = h.board_counts["records"]
    assert h.allocate(800, stream=3)
    assert h.board_counts["records"] == records, "recorded on a stream it was not called with"
    assert h.board_counts["syncs_ok"] == 1 and h.stats["oom_retries"] == 1
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_out_of_memory_during_a_global_capture_keeps_the_batch_and_raises():
    h = HostSyncOnFree("deferred", upstream_limit=1000, max_batch_frees=16)
    h.deallocate(h.allocate(100, stream=1), 100, stream=1)
    ptrs = [h.allocate(200, stream=1) for _ in range(4)]
    for p in ptrs:
        h.deallocate(p, 200, stream=1)
    h.global_capture = True  # queries, waits and device syncs fail
    with pytest.raises(MemoryError):
        h.allocate(900, stream=3)
    assert h.releases == [] and h.pending_count == 5
    assert h.stats["syncs"] == 0 and h.stats["failed_syncs"] == 2  # the wait, the device sync
    h.global_capture = False
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_flush_fences_the_default_streams_batch_without_a_device_sync():
    h = HostSyncOnFree("deferred", max_batch_frees=16)
    for _ in range(5):
        h.deallocate(h.allocate(64, stream=0), 64, stream=0)
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)
    assert h.board_counts["syncs_ok"] == 0 and h.stats["fences"] == 2


def test_cap_fences_the_calling_streams_batch_and_waits_for_the_oldest():
    h = HostSyncOnFree("deferred", max_pending_bytes=250, max_batch_frees=16, reuse_on_stream=False)
    for _ in range(10):
        h.deallocate(h.allocate(100, stream=1), 100, stream=1)
        assert h.pending_bytes <= 250
    assert h.stats["peak_pending_bytes"] <= 250
    assert h.stats["syncs"] == h.forced_waits >= 1 and work_done_everywhere(h)
    assert h.stats["released"] + h.pending_count == 10


def test_cap_holds_across_streams_with_batches():
    """The calling stream's batch is fenced when the total goes over the cap: the batches of
    other streams, built while the total was under the cap, never keep it above."""
    h = HostSyncOnFree("deferred", max_pending_bytes=450, max_batch_frees=16)
    for i in range(60):
        stream = (1, 3, 5, 3, 1)[i % 5]
        size = 50 + 37 * (i % 4)
        h.deallocate(h.allocate(size, stream=stream), size, stream=stream)
        assert h.pending_bytes <= 450
    assert h.stats["peak_pending_bytes"] <= 450 and work_done_everywhere(h)
    assert h.stats["syncs"] == h.forced_waits >= 1


def test_batches_are_per_stream():
    h = HostSyncOnFree("deferred", max_batch_frees=3, max_batch_bytes=None)
    blocks = {1: [], 3: []}
    for i in range(12):
        stream = 1 if i % 2 else 3
        p = h.allocate(64, stream=stream)
        h.deallocate(p, 64, stream=stream)
        blocks[stream].append(p)
    for stream, ptrs in blocks.items():
        for p in ptrs:
            fence = h.fence_of(p)
            assert fence is None or h.fence(fence)["stream"] == stream
    assert h.stats["fences"] <= 2 * math.ceil(6 / 3)
    h.signal_stream(1)
    for _ in range(6):
        h.allocate(8, stream=1)
    assert work_done_everywhere(h)
    assert not set(blocks[3]) & {r[0] for r in h.releases}, "stream 3's work is still queued"


def test_a_reused_handle_does_not_fence_the_old_streams_batch():
    h = HostSyncOnFree("deferred", max_batch_frees=4, max_batch_bytes=None)
    h.deallocate(h.allocate(64, stream=5), 64, stream=5)  # the stream's identity is noted
    old = [h.allocate(64, stream=5) for _ in range(2)]
    for p in old:
        h.deallocate(p, 64, stream=5)  # batched on the old stream, its work queued
    h.reuse_handle(5)  # destroyed; a new stream gets the handle
    new = [h.allocate(64, stream=5) for _ in range(2)]
    for p in new:
        h.deallocate(p, 64, stream=5)  # the 4th of the batch: a fence on the new stream
    assert all(h.fence_of(p) is None for p in old), "the new stream's fence covers old blocks"
    h.signal_stream(5)  # the new stream completes
    for _ in range(8):
        h.allocate(8, stream=5)
    assert not set(old) & {r[0] for r in h.releases} and work_done_everywhere(h)
    h.flush()  # a device synchronization covers the old stream's blocks
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_another_threads_per_thread_stream_does_not_fence_a_batch():
    h = HostSyncOnFree("deferred", max_batch_frees=3, max_batch_bytes=None)
    try:
        HostSyncOnFree.set_thread(1)
        mine = [h.allocate(64, stream=2) for _ in range(3)]
        for p in mine[:2]:
            h.deallocate(p, 64, stream=2)  # the first fenced alone, the second batched
        HostSyncOnFree.set_thread(2)  # same handle, another thread's stream
        for _ in range(6):
            h.deallocate(h.allocate(64, stream=2), 64, stream=2)
        h.signal_stream(2)  # thread 2's stream completes
        for _ in range(6):
            h.allocate(8, stream=2)
        assert mine[1] not in {r[0] for r in h.releases}
        assert h.fence_of(mine[1]) is None
        HostSyncOnFree.set_thread(1)
        h.deallocate(mine[2], 64, stream=2)
        h.flush()
        assert h.pending_count == 0 and work_done_everywhere(h)
    finally:
        HostSyncOnFree.set_thread(0)


def test_one_identity_query_per_batch_not_per_free():
    h = HostSyncOnFree("deferred", max_batch_frees=10, max_batch_bytes=None, reuse_on_stream=False)
    for _ in range(41):
        h.deallocate(h.allocate(64, stream=1), 64, stream=1)
    # the first free, then one per batch record (it covers frees of earlier calls)
    assert h.board_counts["identity_queries"] == 1 + 4 == h.stats["fences"]


# The calls of steady-state allocate + free pairs (default batch limits, no work on the
# stream), per batch of max_batch_frees = 16 pairs. A fence recorded in a call is pending during
# that call (a device processes a record after the call that made it) and complete from the next
# call on (or, the other model, complete at once): either way each fence is tested once, by a
# later call, and found complete.
PAIR_CALLS_PER_BATCH = {
    # 16 frees fill a batch (16 MiB < max_batch_bytes): one record, covering frees of earlier
    # calls, so one identity query
    1 << 20: {
        "stream_id": 1,
        "acquire_fence": 1,
        "record": 1,
        "ready": 1,
        "ready_complete": 1,
        "release_fence": 1,
    },
    # every free fills max_batch_bytes: one record per free, covering only the block of its
    # call, so no identity query
    64 << 20: {
        "stream_id": 0,
        "acquire_fence": 16,
        "record": 16,
        "ready": 16,
        "ready_complete": 16,
        "release_fence": 16,
    },
}


@pytest.mark.parametrize("nbytes", sorted(PAIR_CALLS_PER_BATCH))
@pytest.mark.parametrize("fences", ["complete_next_call", "complete_at_record"])
def test_steady_state_pair_calls(nbytes, fences):
    h = HostSyncOnFree("deferred", reuse_on_stream=False)
    h.recycle_fences = True
    h.run_pairs(nbytes, 3 * 16, fences=fences)  # warm-up: the stream's identity, a few batches
    batches = 4
    calls = h.run_pairs(nbytes, batches * 16, fences=fences)
    expected = {k: v * batches for k, v in PAIR_CALLS_PER_BATCH[nbytes].items()}
    expected.update(
        upstream_allocate=16 * batches,
        upstream_deallocate=16 * batches,
        host_wait=0,
        sync_stream=0,
        sync_device=0,
    )
    assert {k: calls[k] for k in expected} == expected, calls
    # a capture test (and a stream key) per free, and per allocate that tests fences: one call
    # in max_batch_frees at most
    for name in ("is_capturing", "key"):
        assert 16 * batches <= calls[name] <= 17 * batches, calls
    assert h.stats["syncs"] == 0 and h.board_counts["released_fence_use"] == 0
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


@pytest.mark.parametrize("lag", [0, 3])
def test_a_recording_free_tests_earlier_fences_before_its_record(lag):
    # Every 64 MiB free fills max_batch_bytes and records a fence of its own, as one fence per
    # free did. The free tests the fences of earlier frees before it records: the fence found
    # complete goes back to the pool and is the one recorded, so the pairs keep the fences of
    # the last lag + 1 pairs and no more (a test after the record keeps one more fence, and
    # records each fence while the previous one of the stream is still unobserved).
    h = HostSyncOnFree("deferred", reuse_on_stream=False)
    h.recycle_fences = True
    h.run_pairs(64 << 20, 3 * 16, lag=lag)  # warm-up: the stream's identity, the fence pool
    calls = h.run_pairs(64 << 20, 4 * 16, lag=lag)
    per_pair = {k: calls[k] for k in ("acquire_fence", "record", "ready_complete", "release_fence")}
    assert per_pair == dict.fromkeys(per_pair, 4 * 16), calls
    # with fences pending, each free also finds the next fence pending; an allocate tests one
    # call in max_batch_frees
    tests_per_free = 1 if lag == 0 else 2
    assert 4 * 16 * tests_per_free <= calls["ready"] <= 4 * (16 * tests_per_free + 1), calls
    assert h.fence_count == lag + 1, (h.fence_count, calls)
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


# Fences pending in the steady state: none between calls (complete at record), the one recorded
# in a call (complete from the next call), or those of the last `lag` pairs (a device that trails
# the host: several batches pending at once).
PAIR_FENCES = {
    "complete_at_record": {"fences": "complete_at_record"},
    "complete_next_call": {"fences": "complete_next_call"},
    "pending_40_pairs": {"fences": "complete_next_call", "lag": 40},
}


@pytest.mark.parametrize("cap_blocks", [None, 8])
@pytest.mark.parametrize("pending", sorted(PAIR_FENCES))
@pytest.mark.parametrize("nbytes", [256, 1 << 20, 64 << 20])
def test_steady_state_pairs_make_no_heap_allocation(nbytes, pending, cap_blocks):
    # cap_blocks: max_pending_bytes of that many blocks, so that frees wait for the oldest
    # fences (with fences pending)
    cap = None if cap_blocks is None else cap_blocks * nbytes
    h = HostSyncOnFree("deferred", max_pending_bytes=cap, reuse_on_stream=False)
    h.recycle_fences = True
    # warm-up: the stream's queue, its identity, fence slots and the scratch storage of
    # releases grow to what the steady state needs; counted, which shows the count works
    warm = h.run_pairs(nbytes, 32 * 16, **PAIR_FENCES[pending])
    assert warm["heap_allocations"] > 0, warm
    calls = h.run_pairs(nbytes, 16 * 16, **PAIR_FENCES[pending])
    heap = {k: calls[k] for k in ("heap_allocations", "heap_frees")}
    assert heap == {"heap_allocations": 0, "heap_frees": 0}, calls
    # the pairs did free blocks and record fences (no vacuous run)
    assert calls["upstream_deallocate"] > 0 and calls["record"] > 0, calls
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("fail_every", [1, 2, 3, 7])
@pytest.mark.parametrize("nbytes", [256, 64 << 20])
def test_host_allocations_that_fail_lose_no_block(nbytes, fail_every, reuse):
    # every fail_every-th heap allocation of the core fails, from a fresh core (its queue, fence
    # slots and buffers cannot grow): frees fall back to a fence waited on at once, or stay
    # listed for a later call; a block taken back that cannot be tracked is freed again; none
    # is lost or released early
    h = HostSyncOnFree("deferred", reuse_on_stream=reuse)
    h.recycle_fences = True
    calls = h.run_pairs(nbytes, 8 * 16, lag=5, fail_heap_every=fail_every)
    # (taking blocks back, the loop needs no heap once its first pairs ran)
    assert calls["heap_failures"] > 0 or reuse, calls
    assert calls["upstream_deallocate"] > 0 or reuse, calls
    assert work_done_everywhere(h)
    assert h.upstream_used == h.pending_bytes  # no block lost (allocation failures freed none)
    h.flush()
    assert h.pending_count == 0 and h.upstream_used == 0 and work_done_everywhere(h)


def test_run_pairs_lag_needs_fences_complete_next_call():
    h = HostSyncOnFree("deferred")
    with pytest.raises(ValueError, match="lag=3 needs fences='complete_next_call'"):
        h.run_pairs(256, 1, fences="complete_at_record", lag=3)


def test_a_fence_shared_by_a_batch_is_recycled_once_after_its_last_block():
    h = HostSyncOnFree("deferred", max_batch_frees=4, max_pending_bytes=150, reuse_on_stream=False)
    h.recycle_fences = True
    for _ in range(40):
        h.deallocate(h.allocate(100, stream=1), 100, stream=1)
        h.allocate(8, stream=1)
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)
    assert h.board_counts["released_fence_use"] == 0
    assert h.fence_count < h.stats["fences"]  # events were reused


# --- batches and CUDA errors ------------------------------------------------------------------


def new_batch(h, count, free=None, stream=1):
    """Fences `stream`'s first free (a stream's first free is fenced alone), then allocates
    `count` blocks of 64 bytes on it and frees the first `free` of them (all by default): they
    wait in the stream's batch. Returns the blocks."""
    h.deallocate(h.allocate(64, stream=stream), 64, stream=stream)
    ptrs = [h.allocate(64, stream=stream) for _ in range(count)]
    for p in ptrs[:free]:
        h.deallocate(p, 64, stream=stream)
    return ptrs


def test_failed_batch_record_synchronizes_the_stream_and_frees_the_batch():
    h = HostSyncOnFree("deferred", max_batch_frees=4, max_batch_bytes=None)
    ptrs = new_batch(h, 4, free=3)
    h.fail_next("record")
    assert h.deallocate(ptrs[3], 64, stream=1) is None
    assert set(ptrs) <= {r[0] for r in h.releases} and work_done_everywhere(h)
    assert h.stats["syncs"] == 1 and h.stats["deferred"] == 4  # the last free blocked


def test_failed_batch_record_and_sync_park_the_batch_until_a_device_sync():
    h = HostSyncOnFree("deferred", max_batch_frees=4, max_batch_bytes=None)
    ptrs = new_batch(h, 4, free=3)
    n = len(h.releases)  # host memory reuses addresses: look only at later releases
    h.fail_next("record")
    h.fail_next("sync_stream")
    assert h.deallocate(ptrs[3], 64, stream=1) is None
    assert not set(ptrs) & {r[0] for r in h.releases[n:]}
    assert h.stats["parked"] == 4 and h.stats["failed_syncs"] == 1 and h.stats["syncs"] == 0
    for _ in range(4):  # later fences on the stream do not cover them: parked, unverifiable
        h.deallocate(h.allocate(64, stream=1), 64, stream=1)
    h.signal_stream(1)
    for _ in range(8):
        h.allocate(8, stream=1)
    assert not set(ptrs) & {r[0] for r in h.releases[n:]}
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_failed_query_keeps_a_batch_pending():
    h = HostSyncOnFree("deferred", max_batch_frees=2, max_batch_bytes=None)
    new_batch(h, 2)
    h.signal_stream(1)
    h.fail_next("query", 100)
    for _ in range(8):
        h.allocate(8, stream=3)
    assert h.releases == [] and h.pending_count == 3
    h.fail_next("query", 0)
    for _ in range(4):
        h.allocate(8, stream=3)
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_failed_wait_on_a_shared_fence_keeps_its_whole_batch_pending():
    h = HostSyncOnFree("deferred", max_batch_frees=3, max_batch_bytes=None)
    first = h.allocate(64, stream=1)
    h.deallocate(first, 64, stream=1)
    h.signal_stream(1)
    ptrs = [h.allocate(64, stream=1) for _ in range(3)]
    for p in ptrs:
        h.deallocate(p, 64, stream=1)
    h.fail_next("wait")
    h.fail_next("sync_device")
    h.flush()  # the batch's one fence: one wait, which fails; then the device sync fails
    assert [r[0] for r in h.releases] == [first]
    assert h.stats["failed_syncs"] == 2 and h.stats["syncs"] == 0
    assert h.pending_count == 3
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_failed_identity_query_fences_only_the_block_of_the_call():
    h = HostSyncOnFree("deferred", max_batch_frees=3, max_batch_bytes=None)
    ptrs = new_batch(h, 4, free=2)
    h.fail_next("stream_id")
    h.deallocate(ptrs[2], 64, stream=1)  # cannot verify the stream: only its own block
    assert h.fence_of(ptrs[0]) is None and h.fence_of(ptrs[1]) is None
    assert h.fence_of(ptrs[2]) is not None
    h.deallocate(ptrs[3], 64, stream=1)  # verified now: the earlier blocks get this fence
    assert h.fence_of(ptrs[0]) == h.fence_of(ptrs[1]) == h.fence_of(ptrs[3]) is not None
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_a_free_in_capture_does_not_join_the_batch():
    h = HostSyncOnFree("deferred", max_batch_frees=3, max_batch_bytes=None)
    h.deallocate(h.allocate(64, stream=1), 64, stream=1)  # the stream's identity is noted
    before = h.allocate(64, stream=1)
    h.deallocate(before, 64, stream=1)  # batched
    captured = h.allocate(64, stream=1)
    h.begin_capture(1)
    h.deallocate(captured, 64, stream=1)  # parked: its work runs when the graph is launched
    records = h.board_counts["records"]
    h.allocate(8, stream=1)
    h.end_capture(1)
    assert h.board_counts["records"] == records and h.stats["parked"] == 1
    h.launch(1)  # the graph's launch, on the stream
    h.deallocate(h.allocate(64, stream=1), 64, stream=1)
    h.deallocate(h.allocate(64, stream=1), 64, stream=1)  # the batch is full: one fence
    assert h.fence_of(before) == h.fence_of(captured) is not None
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


# --- CUDA errors never count as work done ----------------------------------------------------


def work_done_everywhere(h):
    return all(r[3] for r in h.releases)


def test_failed_wait_in_flush_keeps_the_block_pending():
    h = HostSyncOnFree("deferred")
    ptr = h.allocate(1000, stream=1)
    h.deallocate(ptr, 1000, stream=1)
    h.global_capture = True  # another thread captures in the global mode: waits/syncs fail
    h.flush()
    assert h.releases == [] and h.pending_count == 1, "flush released a block it never waited on"
    assert h.stats["syncs"] == 0 and h.stats["failed_syncs"] >= 1
    h.global_capture = False
    h.flush()
    assert [r[0] for r in h.releases] == [ptr] and work_done_everywhere(h)
    assert h.stats["syncs"] == 1


def test_failed_wait_at_the_cap_keeps_the_block_pending():
    h = HostSyncOnFree("deferred", max_pending_bytes=100)
    a = h.allocate(100, stream=1)
    b = h.allocate(100, stream=1)
    h.deallocate(a, 100, stream=1)
    h.fail_next("wait")
    h.deallocate(b, 100, stream=1)  # over the cap: waits on a's fence, which fails
    assert h.releases == [] and h.pending_count == 2
    assert h.stats["syncs"] == 0 and h.stats["failed_syncs"] == 1
    h.flush()
    assert work_done_everywhere(h) and h.pending_count == 0


def test_failed_waits_in_the_oom_drain_release_nothing():
    h = HostSyncOnFree("deferred", upstream_limit=1000)
    a = h.allocate(800, stream=1)
    h.deallocate(a, 800, stream=1)
    h.global_capture = True
    with pytest.raises(MemoryError):
        h.allocate(800, stream=2)  # the drain's wait and device sync fail: nothing to retry
    assert h.releases == [] and h.pending_count == 1 and h.stats["oom_retries"] == 0
    h.global_capture = False
    assert h.allocate(800, stream=2)
    assert h.stats["oom_retries"] == 1 and work_done_everywhere(h)


def test_failed_query_is_not_ready():
    h = HostSyncOnFree("deferred", **PER_FREE)
    ptr = h.allocate(64, stream=1)
    fence = h.deallocate(ptr, 64, stream=1)
    h.signal(fence)
    h.fail_next("query", 1)
    h.allocate(8, stream=2)  # polls: the query fails
    assert h.releases == []
    h.allocate(8, stream=2)
    assert [r[0] for r in h.releases] == [ptr]


@pytest.mark.parametrize("mode", ["device", "stream"])
def test_failed_sync_falls_back_to_a_fence(mode):
    h = HostSyncOnFree(mode)
    ptr = h.allocate(64, stream=1)
    h.global_capture = True  # the sync fails; a record (relaxed mode) still works
    fence = h.deallocate(ptr, 64, stream=1)
    h.global_capture = False
    assert h.releases == [], "freed upstream without any wait"
    assert fence is not None and h.pending_count == 1
    assert h.stats["syncs"] == 0 and h.stats["failed_syncs"] == 1 and h.stats["deferred"] == 1
    h.allocate(8, stream=2)
    assert h.releases == []
    h.signal(fence)
    h.allocate(8, stream=2)
    assert [r[0] for r in h.releases] == [ptr] and work_done_everywhere(h)


@pytest.mark.parametrize("mode", MODES)
def test_no_sync_and_no_fence_parks_until_a_device_sync(mode):
    h = HostSyncOnFree(mode)
    ptr = h.allocate(64, stream=1)
    h.global_capture = True
    h.fail_next("record")
    assert h.deallocate(ptr, 64, stream=1) is None
    assert h.releases == [] and h.pending_count == 1 and h.stats["parked"] == 1
    assert h.stats["syncs"] == 0
    h.global_capture = False
    h.signal_stream(1)  # the stream's later work ends: still no fence of this block
    h.deallocate(h.allocate(8, stream=1), 8, stream=1)
    assert ptr not in [r[0] for r in h.releases]
    h.flush()  # a device sync covers it
    assert ptr in [r[0] for r in h.releases] and work_done_everywhere(h)


def test_failed_sync_stream_after_a_failed_record_parks():
    h = HostSyncOnFree("deferred")
    ptr = h.allocate(64, stream=1)
    h.fail_next("record")
    h.fail_next("sync_stream")
    h.deallocate(ptr, 64, stream=1)
    assert h.releases == [] and h.stats["syncs"] == 0 and h.stats["failed_syncs"] == 1
    h.flush()
    assert work_done_everywhere(h) and h.pending_count == 0


def test_flush_releases_only_what_its_device_sync_covered():
    """A block parked by another thread right after flush's device sync is not covered."""
    h = HostSyncOnFree("deferred")
    first = h.allocate(64, stream=1)
    h.begin_capture(1)
    h.deallocate(first, 64, stream=1)
    h.end_capture(1)
    other = h.allocate(64, stream=3)
    h.free_in_capture_after_next_device_sync(other, 64, stream=3)
    h.flush()  # releases `first`; `other` is freed (in capture) after the sync returned
    assert [r[0] for r in h.releases] == [first]
    assert h.pending_count == 1 and work_done_everywhere(h)
    h.flush()
    assert h.pending_count == 0 and work_done_everywhere(h)


def test_syncs_counted_are_syncs_that_succeeded():
    h = HostSyncOnFree("stream")
    for fail in (False, True, False, True):
        h.global_capture = fail
        h.deallocate(h.allocate(64, stream=1), 64, stream=1)
    h.global_capture = False
    h.flush()
    counts = h.board_counts
    assert h.stats["syncs"] == counts["waits_ok"] + counts["syncs_ok"]
    assert h.stats["failed_syncs"] == 2 and work_done_everywhere(h)


# --- parked blocks: stream identity ----------------------------------------------------------


def test_another_threads_per_thread_stream_does_not_arm_a_parked_block():
    h = HostSyncOnFree("deferred", **PER_FREE)
    HostSyncOnFree.set_thread(1)
    try:
        h.deallocate(h.allocate(64, stream=2), 64, stream=2)  # thread 1's stream: identity known
        h.signal_stream(2)
        ptr = h.allocate(64, stream=2)
        h.launch(2)  # work on thread 1's stream that uses ptr and is still running
        n = len(h.releases)  # host memory reuses addresses: look only at later releases
        h.begin_capture(2)  # thread 1's per-thread default stream
        h.deallocate(ptr, 64, stream=2)
        h.end_capture(2)
        HostSyncOnFree.set_thread(2)  # another thread, same handle, another stream
        h.deallocate(h.allocate(8, stream=2), 8, stream=2)
        h.signal_stream(2)  # thread 2's stream completes
        h.allocate(8, stream=2)
        assert ptr not in [r[0] for r in h.releases[n:]], "armed on another thread's stream"
        HostSyncOnFree.set_thread(1)
        h.allocate(8, stream=2)  # thread 1, outside capture: arms on its own stream
        h.signal_stream(2)
        h.allocate(8, stream=2)
        assert ptr in [r[0] for r in h.releases[n:]] and work_done_everywhere(h)
    finally:
        HostSyncOnFree.set_thread(0)


def test_a_reused_handle_does_not_arm_a_parked_block():
    h = HostSyncOnFree("deferred")
    h.deallocate(h.allocate(64, stream=5), 64, stream=5)  # identity of stream 5 known
    h.signal_stream(5)
    ptr = h.allocate(64, stream=5)
    n = len(h.releases)  # host memory reuses addresses: look only at later releases
    h.begin_capture(5)
    h.deallocate(ptr, 64, stream=5)
    h.end_capture(5)
    h.reuse_handle(5)  # stream destroyed (its work still queued); a new one gets the handle
    h.allocate(8, stream=5)
    h.signal_stream(5)  # the new stream completes
    h.allocate(8, stream=5)
    assert ptr not in [r[0] for r in h.releases[n:]], "armed on a new stream with a reused handle"
    assert h.pending_count == 1
    h.flush()
    assert ptr in [r[0] for r in h.releases[n:]] and work_done_everywhere(h)


def test_failed_record_while_arming_keeps_the_block_parked():
    h = HostSyncOnFree("deferred", **PER_FREE)
    h.deallocate(h.allocate(64, stream=1), 64, stream=1)
    h.signal_stream(1)
    ptr = h.allocate(64, stream=1)
    h.begin_capture(1)
    h.deallocate(ptr, 64, stream=1)
    h.end_capture(1)
    h.fail_next("record")
    h.allocate(8, stream=1)  # polls: arming fails, the block stays parked
    h.signal_stream(1)
    h.allocate(8, stream=1)  # arms it now, behind the stream's queued work
    assert h.pending_count == 1
    other = h.allocate(64, stream=1)
    h.fail_next("record")
    assert h.deallocate(other, 64, stream=1) is None  # no fence: a stream sync frees it
    h.signal_stream(1)
    h.allocate(8, stream=1)
    assert h.pending_count == 0 and work_done_everywhere(h) and h.forced_waits == 0


def test_one_identity_query_per_stream_not_per_free():
    h = HostSyncOnFree("deferred", **PER_FREE, reuse_on_stream=False)
    for _ in range(50):
        h.deallocate(h.allocate(64, stream=1), 64, stream=1)
    assert h.board_counts["identity_queries"] == 1


def test_no_identity_query_on_a_capturing_stream():
    h = HostSyncOnFree("deferred")
    ptrs = [h.allocate(64, stream=1) for _ in range(3)]
    h.begin_capture(1)
    for p in ptrs:
        h.deallocate(p, 64, stream=1)
        h.allocate(8, stream=1)
    h.flush()
    h.end_capture(1)
    assert h.board_counts["invalidated_captures"] == 0


# --- bad frees --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_double_free_of_a_pending_block_is_rejected(mode):
    h = HostSyncOnFree(mode)
    ptr = h.allocate(256, stream=1)
    h.global_capture = True  # keeps the block pending in every mode
    h.deallocate(ptr, 256, stream=1)
    h.global_capture = False
    with pytest.raises(ValueError, match="double free"):
        h.deallocate(ptr, 256, stream=1)
    assert h.pending_count == 1 and h.stats["rejected_frees"] == 1
    h.flush()
    a, b = h.allocate(256, stream=1), h.allocate(256, stream=1)
    assert a != b and h.upstream_bad_frees == 0


def test_double_free_after_release_is_rejected():
    h = HostSyncOnFree("stream")
    ptr = h.allocate(256, stream=1)
    h.deallocate(ptr, 256, stream=1)
    with pytest.raises(ValueError, match="not a live block"):
        h.deallocate(ptr, 256, stream=1)
    a, b = h.allocate(256, stream=1), h.allocate(256, stream=1)
    assert a != b and h.upstream_bad_frees == 0 and len(h.releases) == 1


def test_foreign_pointer_and_size_mismatch_are_rejected():
    h = HostSyncOnFree("deferred")
    ptr = h.allocate(256, stream=1)
    with pytest.raises(ValueError, match="not a live block"):
        h.deallocate(ptr + 64, 128, stream=1)
    with pytest.raises(ValueError, match=r"nbytes=100 does not match.*nbytes=256"):
        h.deallocate(ptr, 100, stream=1)
    assert h.stats["rejected_frees"] == 2 and h.pending_count == 0 and h.fence_count == 0
    h.deallocate(ptr, 256, stream=1)  # the right free still works
    assert h.pending_count == 1


def test_unchecked_bad_free_is_counted_and_reported(capfd):
    h = HostSyncOnFree("deferred")
    ptr = h.allocate(256, stream=1)
    h.deallocate(ptr, 256, stream=1)
    h.deallocate_unchecked(ptr, 256, stream=1)
    err = capfd.readouterr().err
    assert "rejected the free" in err and "double free" in err and err.count("\n") == 1
    assert h.stats["rejected_frees"] == 1 and h.pending_count == 1 and h.fence_count == 1


def test_null_and_zero_size_pass_through_untracked():
    h = HostSyncOnFree("stream")
    h.deallocate_unchecked(0, 0, stream=1)
    ptr = h.allocate(0, stream=1)
    assert h.live_count == 0
    h.deallocate(ptr, 0, stream=1)
    assert h.stats["rejected_frees"] == 0 and h.upstream_bad_frees == 0


# --- real threads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, batch_frees",
    [("device", 16), ("stream", 16), ("deferred", 1), ("deferred", 4), ("deferred", 16)],
)
def test_threads_race_frees_polls_flushes_captures_and_faults(mode, batch_frees):
    h = HostSyncOnFree(
        mode,
        max_pending_bytes=64 << 10 if mode == "deferred" else None,
        upstream_limit=4 << 20,
        max_batch_frees=batch_frees,
    )
    h.recycle_fences = True
    r = h.run_threads(workers=4, iterations=3000, random_state=7)
    assert r["frees"] > 1000
    assert r["unsafe_releases"] == 0, r
    assert r["unsafe_reuses"] == 0, r
    assert r["reuses"] > 0 or h.stats["same_stream_reuse"] == 0, r
    assert r["upstream_bad_frees"] == 0, r
    assert r["pending_after_flush"] == 0 and r["lost"] == 0, r
    assert r["syncs_counted"] == r["syncs_succeeded"], r
    assert r["invalidated_captures"] == 0, r
    assert r["released_fence_use"] == 0, r
    assert h.stats["failed_syncs"] > 0  # the faults were hit
    assert h.upstream_used == 0 and h.live_count == 0


# --- same-stream reuse: a block freed lately on a stream, taken back by that stream --------


def warm(h, stream):
    """The first free on a stream records its fence and notes its identity."""
    h.deallocate(h.allocate(64, stream), 64, stream)


def test_the_cub_loop_takes_its_block_back_without_a_fence_or_the_upstream():
    h = HostSyncOnFree("deferred")
    warm(h, 1)
    p = h.allocate(4096, 1)
    h.deallocate(p, 4096, 1)
    records, upstream = h.board_counts["records"], len(h.releases)
    for _ in range(100):
        q = h.allocate(4096, 1)  # the temp storage of one step
        assert q == p
        h.deallocate(q, 4096, 1)
    assert h.board_counts["records"] == records, "no event recorded in the loop"
    assert len(h.releases) == upstream and h.upstream_used == 4096 + 64
    assert h.stats["same_stream_reuse"] == 100
    assert h.reuses == {"reuses": 100, "unsafe": 0}


def freed_on_stream_1(h, nbytes=4096):
    warm(h, 1)
    p = h.allocate(nbytes, 1)
    h.deallocate(p, nbytes, 1)
    return p


@pytest.mark.parametrize(
    "between, stream",
    [
        (lambda h: None, 3),  # another stream
        (lambda h: h.reuse_handle(1), 1),  # the handle given to a new stream
        (lambda h: h.begin_capture(1), 1),  # the stream captures: its work runs later
    ],
    ids=["another_stream", "handle_reused", "capturing"],
)
def test_only_the_stream_that_freed_it_outside_capture_takes_it_back(between, stream):
    h = HostSyncOnFree("deferred")
    p = freed_on_stream_1(h)
    between(h)
    q = h.allocate(4096, stream)
    h.end_capture(1)
    assert q != p
    assert h.reuses == {"reuses": 0, "unsafe": 0} and h.stats["same_stream_reuse"] == 0
    assert h.pending_count == 2  # the warm-up's block and p, both still waiting


def test_another_threads_per_thread_default_stream_does_not_take_it_back():
    h = HostSyncOnFree("deferred")
    HostSyncOnFree.set_thread(0)
    try:
        warm(h, 2)
        p = h.allocate(4096, 2)
        h.deallocate(p, 4096, 2)
        HostSyncOnFree.set_thread(1)
        assert h.allocate(4096, 2) != p
    finally:
        HostSyncOnFree.set_thread(0)
    assert h.reuses == {"reuses": 0, "unsafe": 0}


def test_the_latest_block_of_its_size_and_alignment_among_the_last_16_frees():
    h = HostSyncOnFree("deferred")
    warm(h, 1)
    a, b = h.allocate(4096, 1), h.allocate(8192, 1)
    h.deallocate(a, 4096, 1)
    h.deallocate(b, 8192, 1)
    assert h.allocate(8192, 1, alignment=512) != b, "another alignment"
    assert h.allocate(4096, 1) == a, "freed before b: still among the last 16"
    c = h.allocate(2048, 1)
    h.deallocate(c, 2048, 1)
    later = [(h.allocate(3072 + 256 * i, 1), 3072 + 256 * i) for i in range(16)]
    for ptr, nbytes in later:
        h.deallocate(ptr, nbytes, 1)
    assert h.allocate(2048, 1) != c, "17 frees back: not looked at"
    assert h.reuses == {"reuses": 1, "unsafe": 0}


def test_a_fenced_block_taken_back_gives_its_fence_back_once():
    h = HostSyncOnFree("deferred", max_batch_frees=1)  # each free records a fence
    h.recycle_fences = True
    warm(h, 1)
    for _ in range(50):
        p = h.allocate(4096, 1)
        h.deallocate(p, 4096, 1)
        assert h.fence_of(p) is not None
    h.signal_all()
    h.flush()
    assert h.stats["same_stream_reuse"] == 49
    assert h.board_counts["released_fence_use"] == 0, "a fence used after it was given back"
    assert h.pending_count == 0 and h.upstream_used == 0


@pytest.mark.parametrize("mode", ["device", "stream"])
def test_synchronizing_modes_and_reuse_off_never_take_a_block_back(mode):
    for h in (HostSyncOnFree(mode), HostSyncOnFree("deferred", reuse_on_stream=False)):
        warm(h, 1)
        p = h.allocate(4096, 1)
        h.deallocate(p, 4096, 1)
        h.allocate(4096, 1)
        assert h.stats["same_stream_reuse"] == 0 and h.reuses["reuses"] == 0


def test_reuse_on_stream_must_be_a_bool():
    with pytest.raises(TypeError, match="reuse_on_stream must be True or False, got int"):
        SyncOnFreeResourceAdaptor(rmm.mr.CudaMemoryResource(), reuse_on_stream=1)
    mr = SyncOnFreeResourceAdaptor(rmm.mr.CudaMemoryResource(), mode="stream")
    assert mr.reuse_on_stream is False, "only the deferred mode takes blocks back"
