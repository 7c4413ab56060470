# SPDX-License-Identifier: Apache-2.0
"""The hazard tracker's policy core on a simulated device (no GPU).

A model written from the hazard definitions (DESIGN.md, the tracker's docstring) predicts, for
every call, which hazard the core must report; random programs compare the two record by
record. Correct programs (every free ordered after the work that used the block) must never
produce a report.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmm_fences._hazards import HAZARD_KINDS, describe, hazard_from_fields
from rmm_fences._lib._testing import SimHazardTracker

STREAMS = (1, 2, 3)
SIZES = (256, 512, 1024)


def brief(fields):
    """(kind, ptr, size, stream, streams) of a hazard field tuple."""
    kind, ptr, size, _tracked, stream, streams, *_ = fields
    return (kind, ptr, size, stream, tuple(streams))


class Model:
    """The tracker's contract over a simulated device, step by step."""

    def __init__(self, ordered):
        self.t = SimHazardTracker(ordered)
        self.ordered = ordered
        self.live = {}  # ptr -> [size, alloc stream, declared streams (ordered list)]
        self.freed_ptrs = {}  # freed and not handed out again: ptr -> size
        self.freed_ranges = []  # (ptr, size, free stream, model fence), free order
        self.cross = []  # (ptr, size, free stream, alloc stream, fence on alloc, fence on free)
        self.expected = []
        self.upstream_frees = 0

    # The device: the model reads the same simulated streams as the core.
    def idle(self, s):
        return self.t.idle(s)

    def poll_model(self):
        """What the core's poll at the start of each call settles."""
        keep = []
        for ptr, size, f, a, fa, ff in self.cross:
            if self.t.done(fa):
                self.t.forget(fa)
                self.t.forget(ff)
            elif self.t.done(ff):
                self.expected.append(("cross_stream_free", ptr, size, f, (a,)))
                self.t.forget(fa)
                self.t.forget(ff)
            else:
                keep.append((ptr, size, f, a, fa, ff))
        self.cross = keep

    def allocate(self, stream, size, strict=False):
        self.poll_model()
        out = self.t.allocate(size, stream, strict)
        stopped = out if isinstance(out, tuple) else None
        ptr = stopped[1][1] if stopped else out
        self.freed_ptrs.pop(ptr, None)
        overlapping = [r for r in self.freed_ranges if r[0] < ptr + size and ptr < r[0] + r[1]]
        overlapping.sort(key=lambda r: r[0])  # the core walks ranges by address, then age
        hazard = None
        for r_ptr, r_size, r_stream, fence in overlapping:
            if hazard is None and r_stream != stream and not self.t.done(fence):
                hazard = ("reuse_before_fence", ptr, size, stream, (r_stream,))
            self.t.forget(fence)
        self.freed_ranges = [r for r in self.freed_ranges if r not in overlapping]
        if hazard:
            self.expected.append(hazard)
        if stopped:
            assert strict and hazard and brief(stopped[1]) == hazard
            self.freed_ptrs[ptr] = size  # handed back to the upstream
            self.upstream_frees += 1
            return None
        assert not (strict and hazard)
        self.live[ptr] = [size, stream, []]
        return ptr

    def deallocate(self, ptr, size, stream, strict=False):
        self.poll_model()
        before = self.t.upstream_calls
        stopped = self.t.deallocate(ptr, size, stream, strict)
        after = self.t.upstream_calls
        if ptr not in self.live:
            kind = "double_free" if ptr in self.freed_ptrs else "foreign_free"
            self.expected.append((kind, ptr, size, stream, ()))
            assert after == before, "a bad free reached the upstream"
            assert (stopped is not None) == strict
            return
        b_size, a, declared = self.live[ptr]
        if b_size != size:
            self.expected.append(("size_mismatch", ptr, size, stream, ()))
            assert after == before, "a wrong-size free reached the upstream"
            assert (stopped is not None) == strict
            return
        others = [d for d in declared if d != stream]
        undeclared = a != stream and a not in declared
        stopped_expected = None
        if not self.ordered:
            busy_declared = [d for d in others if not self.idle(d)]
            free_busy = not self.idle(stream) or bool(busy_declared)
            in_flight = ([stream] if free_busy else []) + busy_declared
            if undeclared and not self.idle(a):
                in_flight.append(a)
            if in_flight:
                stopped_expected = ("freed_in_flight", ptr, size, stream, tuple(in_flight))
                self.expected.append(stopped_expected)
        if strict and stopped_expected:
            assert stopped is not None and brief(stopped) == stopped_expected
            assert after == before
            return
        assert stopped is None
        assert after[1] == before[1] + 1
        self.upstream_frees += 1
        del self.live[ptr]
        self.freed_ptrs[ptr] = size
        if not self.ordered:
            self.freed_ranges.append((ptr, size, stream, self.t.mark(stream)))
        elif undeclared and not self.idle(a):
            fa, ff = self.t.mark(a), self.t.mark(stream)
            if self.t.done(ff):  # settled inside the free itself
                self.expected.append(("cross_stream_free", ptr, size, stream, (a,)))
                self.t.forget(fa)
                self.t.forget(ff)
            else:
                self.cross.append((ptr, size, stream, a, fa, ff))

    def record_stream(self, ptr, stream):
        assert self.t.record_stream(ptr, stream) == (ptr in self.live)
        if ptr in self.live and stream not in self.live[ptr][2]:
            self.live[ptr][2].append(stream)

    def poll(self):
        self.poll_model()
        self.t.poll()

    def check(self):
        got = [brief(h) for h in self.t.hazards]
        assert got == self.expected
        calls = self.t.upstream_calls
        assert calls[2] == 0, "the upstream got a block it never handed out"
        assert calls[1] == self.upstream_frees
        assert self.t.annotations == len(self.live)
        assert sorted(a[0] for a in self.t.outstanding) == sorted(self.live)


ops = st.sampled_from(
    ["alloc", "alloc", "free", "free", "free_other", "bad", "launch", "launch", "step",
     "step", "record", "order", "poll"]
)


@given(ordered=st.booleans(), data=st.data())
@settings(max_examples=400, deadline=None)
def test_core_reports_exactly_the_hazards_of_the_model(ordered, data):
    m = Model(ordered)
    stream = st.sampled_from(STREAMS)
    for _ in range(data.draw(st.integers(1, 60))):
        op = data.draw(ops)
        if op == "alloc":
            m.allocate(data.draw(stream), data.draw(st.sampled_from(SIZES)),
                       strict=data.draw(st.booleans()))
        elif op in ("free", "free_other") and m.live:
            ptr = data.draw(st.sampled_from(sorted(m.live)))
            size, a, _ = m.live[ptr]
            s = a if op == "free" else data.draw(stream)
            m.deallocate(ptr, size, s, strict=data.draw(st.booleans()))
        elif op == "bad":
            choice = data.draw(st.sampled_from(["double", "foreign", "size"]))
            strict = data.draw(st.booleans())
            if choice == "double" and m.freed_ptrs:
                ptr = data.draw(st.sampled_from(sorted(m.freed_ptrs)))
                m.deallocate(ptr, m.freed_ptrs[ptr], data.draw(stream), strict)
            elif choice == "size" and m.live:
                ptr = data.draw(st.sampled_from(sorted(m.live)))
                m.deallocate(ptr, m.live[ptr][0] + 256, data.draw(stream), strict)
            else:
                m.deallocate(data.draw(st.integers(1, 1 << 40)) | 1, 256, data.draw(stream),
                             strict)
        elif op == "launch":
            m.t.launch(data.draw(stream))
        elif op == "step":
            m.t.step(data.draw(stream))
        elif op == "record" and m.live:
            m.record_stream(data.draw(st.sampled_from(sorted(m.live))), data.draw(stream))
        elif op == "order":
            m.t.order(data.draw(stream), data.draw(stream))
        elif op == "poll":
            m.poll()
        m.check()
    # Drain the device: every deferred check settles and every fence comes back.
    while any(m.t.step(s) for s in STREAMS):
        pass
    for _ in range(1 + len(m.freed_ranges) // 8):
        m.poll()
    m.check()
    assert m.t.pending_checks == 0
    assert m.cross == []
    assert m.t.fences_in_use == len(m.freed_ranges)  # only the model's own marks remain


@given(ordered=st.booleans(), data=st.data())
@settings(max_examples=300, deadline=None)
def test_correct_programs_never_report(ordered, data):
    """Blocks used on several streams, each free ordered after every user (or, over an
    upstream that is not stream-ordered, after the device finished their work)."""
    t = SimHazardTracker(ordered)
    live = {}  # ptr -> (size, users)
    stream = st.sampled_from(STREAMS)
    for _ in range(data.draw(st.integers(1, 60))):
        op = data.draw(st.sampled_from(["alloc", "use", "free", "step", "launch"]))
        if op == "alloc":
            s, size = data.draw(stream), data.draw(st.sampled_from(SIZES))
            live[t.allocate(size, s)] = (size, {s})
        elif op == "use" and live:
            ptr = data.draw(st.sampled_from(sorted(live)))
            s = data.draw(stream)
            t.launch(s)
            live[ptr][1].add(s)
            if data.draw(st.booleans()):
                t.record_stream(ptr, s)
        elif op == "free" and live:
            ptr = data.draw(st.sampled_from(sorted(live)))
            size, users = live.pop(ptr)
            f = data.draw(stream)
            if ordered:
                for u in users - {f}:
                    t.order(f, u)
            else:
                while any(t.step(u) for u in users | {f}):
                    pass
            t.deallocate(ptr, size, f)
        elif op == "step":
            t.step(data.draw(stream))
        elif op == "launch":
            t.launch(data.draw(stream))
        assert t.hazards == []
    while any(t.step(s) for s in STREAMS):
        pass
    t.poll()
    assert t.hazards == []


# Each kind, produced on purpose.


def kinds(t):
    return [h[0] for h in t.hazards]


def test_freed_in_flight_and_reuse_before_fence_over_a_naive_cache():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.launch(1)  # a kernel reads p
    t.deallocate(p, 1024, 1)
    q = t.allocate(1024, 2)  # the cache hands p to stream 2 at once
    assert q == p
    assert [brief(h) for h in t.hazards] == [
        ("freed_in_flight", p, 1024, 1, (1,)),
        ("reuse_before_fence", p, 1024, 2, (1,)),
    ]


def test_a_fenced_reuse_is_clean():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.step(1)
    t.deallocate(p, 1024, 1)
    assert t.allocate(1024, 2) == p
    assert t.hazards == []


def test_same_stream_reuse_is_never_a_hazard():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.deallocate(p, 1024, 1)
    t.launch(1)
    assert t.allocate(1024, 1) == p
    assert t.hazards == []


def test_cross_stream_free_is_reported_once_the_free_fence_overtakes_the_work():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.launch(2)
    t.deallocate(p, 1024, 2)
    assert t.hazards == [] and t.pending_checks == 1
    t.step(2)  # the free's fence completes, stream 1 still runs
    t.poll()
    assert [brief(h) for h in t.hazards] == [("cross_stream_free", p, 1024, 2, (1,))]
    assert t.pending_checks == 0


def test_cross_stream_free_ordered_by_the_user_is_clean():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.order(2, 1)
    t.deallocate(p, 1024, 2)
    t.poll()
    t.step(1)
    t.poll()
    assert t.hazards == [] and t.pending_checks == 0


def test_record_stream_orders_the_free_and_clears_the_report():
    for declare in (False, True):
        t = SimHazardTracker(True)
        p = t.allocate(1024, 1)  # allocated and used on a side stream
        t.launch(1)
        if declare:
            assert t.record_stream(p, 1)
        t.deallocate(p, 1024, 2)  # freed on the main stream
        t.poll()
        assert kinds(t) == ([] if declare else ["cross_stream_free"])
        if declare:
            assert t.stats["stream_waits"] == 1
            assert not t.idle(2)  # the main stream now waits for the side stream
            t.step(1)
            assert t.idle(2)


def test_bad_frees_never_reach_the_upstream_and_keep_the_block():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.deallocate(p + 256, 1024, 1)
    t.deallocate(p, 512, 1)
    assert t.upstream_calls == (1, 0, 0)
    assert [a[0] for a in t.outstanding] == [p]
    t.deallocate(p, 1024, 1)
    t.deallocate(p, 1024, 1)
    assert t.upstream_calls == (1, 1, 0)
    assert kinds(t) == ["foreign_free", "size_mismatch", "double_free"]
    size_mismatch = hazard_from_fields(t.hazards[1])
    assert size_mismatch.tracked_size == 1024 and "allocated with 1024" in size_mismatch.message


def test_strict_calls_stop_before_the_upstream():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.launch(1)
    stopped = t.deallocate(p, 1024, 1, strict=True)
    assert stopped[0] == "freed_in_flight" and stopped[-1] is True  # raised
    assert t.upstream_calls == (1, 0, 0) and [a[0] for a in t.outstanding] == [p]
    t.step(1)
    assert t.deallocate(p, 1024, 1, strict=True) is None
    # reuse before the fence, strict: the block goes back, nothing is lost
    q = t.allocate(1024, 1)
    t.launch(1)
    t.deallocate(q, 1024, 1)
    ptr, hazard = t.allocate(1024, 2, strict=True)
    assert ptr is None and hazard[0] == "reuse_before_fence"
    assert t.outstanding == [] and t.upstream_calls[1] == t.upstream_calls[0]


def test_capture_skips_checks_and_counts_them():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.begin_capture(1)
    t.deallocate(p, 1024, 1)
    t.end_capture(1)
    assert t.hazards == [] and t.stats["unchecked"] == 1 and t.stats["fences"] == 0


def test_accounting_per_stream_and_peak():
    t = SimHazardTracker(True)
    a = t.allocate(1024, 1)
    b = t.allocate(512, 2)
    assert t.stats["allocated_bytes"] == 1536 and t.stats["peak_bytes"] == 1536
    t.deallocate(a, 1024, 1)
    t.reset()
    assert t.stats["peak_bytes"] == 512
    assert [(x[0], x[1], x[2]) for x in t.outstanding] == [(b, 512, 2)]


def test_every_kind_has_a_message():
    for kind in HAZARD_KINDS:
        assert kind in describe(kind, 0x1000, 256, 512, 1, (2,))
    with pytest.raises(ValueError, match="unknown hazard kind"):
        describe("nope", 0, 0, 0, 0, ())


def test_many_live_blocks_grow_the_table_and_erase_in_any_order():
    import random

    t = SimHazardTracker(True)
    r = random.Random(5)
    live = {}
    for round_ in range(3):
        for _ in range(5000):
            size = r.choice(SIZES)
            live[t.allocate(size, r.choice(STREAMS))] = size
        order = list(live)
        r.shuffle(order)
        for ptr in order[: len(order) * 2 // 3]:
            t.deallocate(ptr, live.pop(ptr), r.choice(STREAMS))
        assert sorted(a[0] for a in t.outstanding) == sorted(live)
        assert t.stats["allocated_bytes"] == sum(live.values())
    for ptr, size in live.items():
        t.deallocate(ptr, size, 1)
    assert t.outstanding == [] and t.hazards == []
