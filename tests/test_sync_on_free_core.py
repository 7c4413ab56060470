# SPDX-License-Identifier: Apache-2.0
"""SyncOnFree's C++ policy core on host memory with hand-signalled fences (no GPU).

The core under test is the one SyncOnFreeResourceAdaptor runs on the GPU; only the platform
differs (a fence board instead of CUDA events, a byte-limited host allocator as upstream).
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rmm_fences._lib._testing import HostSyncOnFree

STREAMS = st.sampled_from([1, 2, 3])
MODES = ("device", "stream", "deferred")


class SyncOnFreeModel(RuleBasedStateMachine):
    """Random allocate / free / signal / capture / flush sequences against a model."""

    @initialize(
        mode=st.sampled_from(MODES),
        cap=st.none() | st.integers(0, 6000),
        limit=st.sampled_from([1 << 40, 12000]),
    )
    def setup(self, mode, cap, limit):
        self.mode, self.cap, self.limit = mode, cap, limit
        self.h = HostSyncOnFree(mode, cap, limit)
        self.live = {}  # allocation number -> (ptr, size); numbers keep draws reproducible
        self.allocations = 0
        self.pending = {}  # ptr -> {size, stream, fence, parked}
        self.capturing = set()
        self.seen = 0
        self.last_fence = {}  # stream -> last released fence id (FIFO check)
        self.may_block = cap is not None  # a cap makes the core wait on old fences

    # --- helpers -------------------------------------------------------------------------
    def absorb(self):
        """Check every block the upstream got back since the last step."""
        releases = self.h.releases
        for ptr, nbytes, _stream, signalled in releases[self.seen:]:
            assert signalled, "a block reached the upstream before its fence signalled"
            assert ptr in self.pending, "the upstream got a block that was never freed"
            rec = self.pending.pop(ptr)
            assert rec["size"] == nbytes
            if rec["parked"]:
                assert rec["capture_ended"], "a parked block left before its capture ended"
            if rec["fence"] is not None:
                last = self.last_fence.get(rec["stream"], -1)
                assert rec["fence"] > last, "blocks of one stream left out of FIFO order"
                self.last_fence[rec["stream"]] = rec["fence"]
        self.seen = len(releases)

    def fenced_pending_bytes(self):
        return sum(r["size"] for r in self.pending.values() if not r["parked"])

    # --- rules ---------------------------------------------------------------------------
    @rule(size=st.integers(1, 3000), stream=STREAMS)
    def allocate(self, size, stream):
        before = self.h.stats["oom_retries"]
        try:
            ptr = self.h.allocate(size, stream)
        except MemoryError:
            self.absorb()
            self.may_block = True
            assert self.h.upstream_used + size > self.limit
            if stream not in self.capturing:
                # every fenced block was waited on and returned before giving up
                assert self.fenced_pending_bytes() == 0
            return
        self.absorb()
        if self.h.stats["oom_retries"] > before:
            self.may_block = True
            assert self.fenced_pending_bytes() == 0
        assert ptr not in self.pending
        assert all(p != ptr for p, _ in self.live.values())
        self.live[self.allocations] = (ptr, size)
        self.allocations += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS)
    def free(self, data, stream):
        ptr, size = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        parked = stream in self.capturing
        fence = self.h.deallocate(ptr, size, stream)
        if self.mode == "deferred" and not parked:
            assert fence is not None
        else:
            assert fence is None
        self.pending[ptr] = {"size": size, "stream": stream, "fence": fence, "parked": parked,
                             "capture_ended": False}
        self.absorb()
        if self.mode != "deferred" and not parked:
            assert ptr not in self.pending, "a synchronizing mode kept the block"
        if self.cap is not None and self.mode == "deferred" and not parked:
            assert self.fenced_pending_bytes() <= self.cap

    @precondition(lambda self: self.h.fence_count > 0)
    @rule(data=st.data())
    def signal(self, data):
        fence = data.draw(st.integers(0, self.h.fence_count - 1))
        if self.h.fence(fence)["recorded"]:
            self.h.signal(fence)

    @rule(stream=STREAMS)
    def begin_capture(self, stream):
        self.h.begin_capture(stream)
        self.capturing.add(stream)

    @rule(stream=STREAMS)
    def end_capture(self, stream):
        self.h.end_capture(stream)
        self.capturing.discard(stream)
        for rec in self.pending.values():
            if rec["stream"] == stream:
                rec["capture_ended"] = True

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS)
    def free_when_recording_fails(self, data, stream):
        """No fence can be recorded: the free falls back to a stream sync, nothing is lost."""
        ptr, size = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        parked = stream in self.capturing
        self.h.fail_next_record()
        fence = self.h.deallocate(ptr, size, stream)
        assert fence is None
        self.pending[ptr] = {"size": size, "stream": stream, "fence": None, "parked": parked,
                             "capture_ended": False}
        self.absorb()
        if self.mode == "deferred" and not parked:
            assert ptr not in self.pending, "a block without a fence stayed listed"
            self.may_block = True
        self.h.clear_fail_next_record()

    @rule()
    def flush(self):
        self.may_block = True
        self.h.flush()
        self.absorb()
        if self.capturing:
            assert all(r["parked"] for r in self.pending.values())
        else:
            assert not self.pending, "flush() left blocks pending"

    # --- invariants ----------------------------------------------------------------------
    @invariant()
    def accounting(self):
        if not hasattr(self, "h"):
            return
        assert self.h.pending_bytes == sum(r["size"] for r in self.pending.values())
        assert self.h.pending_count == len(self.pending)
        assert self.h.stats["peak_pending_bytes"] >= self.h.pending_bytes

    @invariant()
    def deferred_mode_never_blocks(self):
        if hasattr(self, "h") and self.mode == "deferred" and not self.may_block:
            assert self.h.forced_waits == 0

    def teardown(self):
        if not hasattr(self, "h"):
            return
        for s in (1, 2, 3):
            self.end_capture(s)
        self.h.flush()
        self.absorb()
        assert not self.pending
        for ptr, size in self.live.values():
            self.h.deallocate(ptr, size, 1)
        self.h.flush()
        assert self.h.pending_count == 0


TestSyncOnFreeModel = SyncOnFreeModel.TestCase
TestSyncOnFreeModel.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_block_waits_for_its_fence_then_goes_upstream():
    h = HostSyncOnFree("deferred")
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
    h = HostSyncOnFree("deferred")
    ptrs = [h.allocate(100, stream=1) for _ in range(4)]
    fences = [h.deallocate(p, 100, stream=1) for p in ptrs]
    h.signal(fences[1])  # stream order: signals fences 0 and 1
    h.allocate(8, stream=3)
    assert [r[0] for r in h.releases] == ptrs[:2]
    assert h.pending_count == 2


def test_cap_waits_for_the_oldest_fences():
    h = HostSyncOnFree("deferred", max_pending_bytes=250)
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


def test_capture_parks_until_a_call_outside_capture():
    h = HostSyncOnFree("deferred")
    ptr = h.allocate(64, stream=1)
    h.begin_capture(1)
    assert h.deallocate(ptr, 64, stream=1) is None
    assert h.stats["parked"] == 1 and h.fence_count == 0  # no fence recorded in capture
    h.flush()  # a capture is under way: parked blocks stay
    assert h.pending_count == 1
    h.end_capture(1)
    h.allocate(8, stream=1)  # arms the parked block with a fence on stream 1
    assert h.fence_count == 1 and h.pending_count == 1
    h.signal_stream(1)
    h.allocate(8, stream=1)
    assert h.pending_count == 0 and h.releases[-1][0] == ptr


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
