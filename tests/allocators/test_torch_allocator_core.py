# SPDX-License-Identifier: Apache-2.0
"""The PyTorch allocator's C++ policy core on host memory with a logging platform (no GPU).

The core under test is the one ``rmm_fences.allocators.torch`` runs on the GPU; only the
platform (a log of fence calls instead of CUDA events) and the upstream (byte-limited host
memory) differ. Streams are plain handles; the allocation stream is 1 unless said otherwise.
"""

import pytest

from helpers.threads import run_threads
from rmm_fences_testing import HostTorchAllocator

ALLOC_STREAM = 1


def upstream_frees(h):
    return [e for e in h.events if e[0] == "free"]


def fence_calls(h):
    """The events other than the upstream's alloc and free."""
    return [e for e in h.events if e[0] not in ("alloc", "free")]


def test_a_free_with_no_recorded_stream_goes_upstream_on_the_allocation_stream_without_a_fence():
    h = HostTorchAllocator()
    p = h.allocate(1000, ALLOC_STREAM)
    h.deallocate(p, 1000, ALLOC_STREAM)
    assert h.events == [("alloc", p, ALLOC_STREAM, 1000), ("free", p, ALLOC_STREAM, 1000)]
    s = h.stats
    assert (s["stream_waits"], s["stream_syncs"], s["recorded_frees"]) == (0, 0, 0)
    assert h.upstream_used == 0
    assert h.unsafe_frees == 0


def test_a_recorded_stream_is_waited_on_by_the_allocation_stream_before_the_upstream_free():
    h = HostTorchAllocator()
    p = h.allocate(4096, ALLOC_STREAM)
    assert h.record_stream(p, 7)
    h.clear_events()
    h.deallocate(p, 4096, ALLOC_STREAM)
    (_, fence), *rest = h.events
    assert h.events == [
        ("acquire", fence),
        ("record", fence, 7),  # a fence after stream 7's queued work ...
        ("wait", ALLOC_STREAM, fence),  # ... that the allocation stream waits on ...
        ("release", fence),  # ... released once the wait is enqueued ...
        ("free", p, ALLOC_STREAM, 4096),  # ... then the stream-ordered free
    ]
    s = h.stats
    assert (s["stream_waits"], s["recorded_frees"], s["stream_syncs"]) == (1, 1, 0)
    assert s["record_stream_calls"] == 1
    assert h.live_fences == 0
    assert h.unsafe_frees == 0


def test_each_recorded_stream_gets_its_own_wait_and_a_stream_recorded_twice_one():
    h = HostTorchAllocator()
    p = h.allocate(256, ALLOC_STREAM)
    for stream in (7, 8, 7, 9, 8):
        assert h.record_stream(p, stream)
    h.clear_events()
    h.deallocate(p, 256, ALLOC_STREAM)
    recorded = [e[2] for e in h.events if e[0] == "record"]
    waits = [e for e in h.events if e[0] == "wait"]
    assert sorted(recorded) == [7, 8, 9]
    assert all(w[1] == ALLOC_STREAM for w in waits) and len(waits) == 3
    assert h.events[-1] == ("free", p, ALLOC_STREAM, 256)
    s = h.stats
    assert (s["stream_waits"], s["recorded_frees"], s["record_stream_calls"]) == (3, 1, 5)


def test_recording_the_allocation_stream_adds_no_wait():
    h = HostTorchAllocator()
    p = h.allocate(256, ALLOC_STREAM)
    assert h.record_stream(p, ALLOC_STREAM)
    h.clear_events()
    h.deallocate(p, 256, ALLOC_STREAM)
    assert h.events == [("free", p, ALLOC_STREAM, 256)]
    s = h.stats
    assert (s["record_stream_calls"], s["recorded_frees"], s["stream_waits"]) == (1, 0, 0)


def test_a_free_on_another_stream_waits_for_the_allocation_stream():
    h = HostTorchAllocator()
    p = h.allocate(256, ALLOC_STREAM)
    h.clear_events()
    h.deallocate(p, 256, 5)
    (_, fence), *_ = h.events
    assert h.events == [
        ("acquire", fence),
        ("record", fence, ALLOC_STREAM),
        ("wait", 5, fence),
        ("release", fence),
        ("free", p, 5, 256),
    ]
    assert h.unsafe_frees == 0


@pytest.mark.parametrize("sync_fails", [False, True])
@pytest.mark.parametrize("fault", ["record", "wait", "acquire"])
def test_when_no_fence_orders_the_free_the_host_syncs_the_stream_else_the_block_leaks(
    fault, sync_fails
):
    h = HostTorchAllocator()
    p = h.allocate(512, ALLOC_STREAM)
    h.record_stream(p, 7)
    h.clear_events()
    h.fail_next(fault)
    if sync_fails:
        h.fail_next("sync")
    h.deallocate(p, 512, ALLOC_STREAM)
    events = h.events
    assert not [e for e in events if e[0] == "wait"]
    assert h.live_fences == 0  # a fence that failed is released all the same
    assert h.live_count == 0
    s = h.stats
    assert (s["current_bytes"], s["frees"], s["stream_waits"]) == (0, 1, 0)
    if not sync_fails:
        assert events[-2:] == [("sync", 7), ("free", p, ALLOC_STREAM, 512)]
        assert (s["stream_syncs"], s["leaked_blocks"]) == (1, 0)
        assert h.upstream_used == 0
        assert h.unsafe_frees == 0
    else:
        # never freed upstream: PyTorch let go of it, but reuse would be unsafe
        assert upstream_frees(h) == []
        assert events[-1] == ("sync_failed", 7)
        assert (s["stream_syncs"], s["leaked_blocks"], s["leaked_bytes"]) == (0, 1, 512)
        assert h.upstream_used == 512


def test_the_first_recorded_stream_that_cannot_be_ordered_stops_the_free():
    h = HostTorchAllocator()
    p = h.allocate(512, ALLOC_STREAM)
    h.record_stream(p, 7)
    h.record_stream(p, 8)
    h.clear_events()
    h.fail_next("record")
    h.fail_next("sync")
    h.deallocate(p, 512, ALLOC_STREAM)
    assert upstream_frees(h) == []
    assert [e[0] for e in h.events] == ["acquire", "record_failed", "release", "sync_failed"]
    assert h.events[1][2] == 7  # stream 8 is never tried: the block is leaked anyway
    assert h.stats["leaked_blocks"] == 1


@pytest.mark.parametrize(
    "case",
    ["double_free", "foreign", "size_mismatch"],
)
def test_bad_frees_are_rejected_and_never_reach_the_upstream(case, capfd):
    h = HostTorchAllocator()
    p = h.allocate(1000, ALLOC_STREAM)
    h.record_stream(p, 7)
    if case == "double_free":
        h.deallocate(p, 1000, ALLOC_STREAM)
        h.clear_events()
        h.deallocate(p, 1000, ALLOC_STREAM)
        expected_live, expected_used = 0, 0
    elif case == "foreign":
        h.clear_events()
        h.deallocate(p + 4096, 1000, ALLOC_STREAM)
        expected_live, expected_used = 1, 1000
    else:
        h.clear_events()
        h.deallocate(p, 999, ALLOC_STREAM)
        expected_live, expected_used = 1, 1000
    assert h.events == []  # no fence, no upstream call
    assert h.stats["rejected_frees"] == 1
    assert h.live_count == expected_live
    assert h.upstream_used == expected_used
    assert h.upstream_bad_frees == 0
    err = capfd.readouterr().err
    assert "torch allocator rejected the free" in err
    assert ("size mismatch" in err) == (case == "size_mismatch")
    if case == "size_mismatch":  # the block is still live and frees correctly afterwards
        h.deallocate(p, 1000, ALLOC_STREAM)
        assert upstream_frees(h) == [("free", p, ALLOC_STREAM, 1000)]
        assert h.unsafe_frees == 0


def test_record_stream_on_an_unknown_pointer_is_counted_and_changes_nothing():
    h = HostTorchAllocator()
    p = h.allocate(256, ALLOC_STREAM)
    h.deallocate(p, 256, ALLOC_STREAM)
    h.clear_events()
    assert not h.record_stream(p, 7)
    assert not h.record_stream(0, 7)
    s = h.stats
    assert (s["unknown_record_streams"], s["record_stream_calls"]) == (2, 0)
    assert h.events == []


def test_out_of_memory_is_counted_rethrown_and_leaves_nothing_live():
    h = HostTorchAllocator(upstream_limit=4096)
    p = h.allocate(4000, ALLOC_STREAM)
    with pytest.raises(MemoryError):
        h.allocate(200, ALLOC_STREAM)
    s = h.stats
    assert s["num_ooms"] == 1
    assert (s["allocations"], s["current_allocations"], s["current_bytes"]) == (1, 1, 4000)
    assert h.live_count == 1
    h.deallocate(p, 4000, ALLOC_STREAM)
    assert h.live_count == 0
    assert h.allocate(200, ALLOC_STREAM)  # room again
    assert h.stats["num_ooms"] == 1


def test_try_allocate_gives_null_on_out_of_memory_counts_it_and_leaves_nothing_live():
    """The MemPool route: PyTorch's native allocator takes nullptr as out of memory."""
    h = HostTorchAllocator(upstream_limit=4096)
    p = h.try_allocate(4000, ALLOC_STREAM)
    assert p and h.events == [("alloc", p, ALLOC_STREAM, 4000)]
    assert h.try_allocate(200, ALLOC_STREAM) == 0
    s = h.stats
    assert s["num_ooms"] == 1
    assert (s["allocations"], s["current_allocations"], s["current_bytes"]) == (1, 1, 4000)
    assert h.live_count == 1 and h.upstream_used == 4000
    h.deallocate(p, 4000, ALLOC_STREAM)
    q = h.try_allocate(200, ALLOC_STREAM)  # room again
    assert q and h.live_count == 1
    h.deallocate(q, 200, ALLOC_STREAM)
    assert h.upstream_used == 0 and h.stats["num_ooms"] == 1


def test_a_zero_byte_request_goes_to_the_upstream_as_is():
    h = HostTorchAllocator()
    p = h.allocate(0, ALLOC_STREAM)
    assert h.events == [("alloc", p, ALLOC_STREAM, 0)]
    h.deallocate(p, 0, ALLOC_STREAM)
    assert upstream_frees(h) == [("free", p, ALLOC_STREAM, 0)]
    assert h.stats["rejected_frees"] == 0


def test_counters_and_peaks():
    h = HostTorchAllocator()
    a = h.allocate(100, ALLOC_STREAM)
    b = h.allocate(300, 2)
    c = h.allocate(50, ALLOC_STREAM)
    h.deallocate(b, 300, 2)
    s = h.stats
    assert s["allocations"] == 3 and s["frees"] == 1
    assert (s["allocated_bytes"], s["freed_bytes"], s["current_bytes"]) == (450, 300, 150)
    assert (s["peak_bytes"], s["current_allocations"], s["peak_allocations"]) == (450, 2, 3)
    h.reset_peak()
    s = h.stats
    assert (s["peak_bytes"], s["peak_allocations"]) == (150, 2)
    d = h.allocate(1000, ALLOC_STREAM)
    for ptr, n in ((a, 100), (c, 50), (d, 1000)):
        h.deallocate(ptr, n, ALLOC_STREAM)
    s = h.stats
    assert (s["peak_bytes"], s["peak_allocations"]) == (1150, 3)
    assert (s["current_bytes"], s["current_allocations"]) == (0, 0)
    assert s["allocated_bytes"] == s["freed_bytes"] == 1450
    assert (s["allocations"], s["frees"]) == (4, 4)


@pytest.mark.parametrize("random_state", [1, 2, 3])
def test_real_threads_allocating_recording_and_freeing_under_faults(random_state):
    h = HostTorchAllocator(upstream_limit=8 << 20)
    r = h.run_threads(workers=8, iterations=3000, random_state=random_state)
    s = h.stats
    assert r["unsafe_frees"] == 0  # every recorded stream was ordered before each release
    assert r["upstream_bad_frees"] == 0
    assert r["live_count"] == 0 and r["live_fences"] == 0
    assert s["allocations"] == r["allocations"] == s["frees"] == r["frees"]
    assert s["current_bytes"] == 0 and s["current_allocations"] == 0
    assert s["allocated_bytes"] == s["freed_bytes"]
    assert s["record_stream_calls"] == r["records"]
    assert s["unknown_record_streams"] == r["unknown_records"]
    assert s["num_ooms"] == r["ooms"]
    assert s["stream_waits"] == r["waits_ok"]
    assert s["stream_syncs"] == r["syncs_ok"]
    assert r["upstream_used"] == s["leaked_bytes"]  # what the upstream holds is what leaked
    assert s["recorded_frees"] > 0 and s["stream_waits"] > 0
    assert s["rejected_frees"] == 0


def test_interleaved_python_threads_keep_the_counters_consistent():
    h = HostTorchAllocator()
    n_threads, rounds = 8, 400

    def worker(t):
        own = 100 + t
        for i in range(rounds):
            p = h.allocate(64 + i, own)
            h.record_stream(p, 100 + (t + 1) % n_threads)
            h.deallocate(p, 64 + i, own)

    errors = run_threads(n_threads, worker)
    assert errors == []
    s = h.stats
    total = n_threads * rounds
    assert (s["allocations"], s["frees"], s["recorded_frees"], s["stream_waits"]) == (
        total,
        total,
        total,
        total,
    )
    assert s["current_bytes"] == 0 and h.upstream_used == 0 and h.unsafe_frees == 0
    assert len(fence_calls(h)) == 4 * total  # acquire, record, wait, release per free
