# SPDX-License-Identifier: Apache-2.0
"""The hazard tracker's policy core on a simulated device (no GPU).

A model written from the hazard definitions (docs/design.md#hazards, the tracker's docstring)
predicts, for every call, which hazard the core must report; random programs compare the two
record by record. Correct programs (every free ordered after the work that used the block) must
never produce a report.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rmm_fences._hazards import HAZARD_KINDS, describe, hazard_from_fields

from rmm_fences_testing import SimHazardTracker

STREAMS = (1, 3, 5)  # plain streams (2 is the per-thread default stream)
PTDS = SimHazardTracker.PER_THREAD
SIZES = (256, 512, 1024)
THREADS = (5, 6)  # simulated threads


@pytest.fixture(autouse=True)
def own_thread_identity():
    """Every test starts, and leaves the thread, as itself (not a simulated thread)."""
    SimHazardTracker.as_thread(0)
    yield
    SimHazardTracker.as_thread(0)


def brief(fields):
    """(kind, ptr, size, stream, streams) of a hazard field tuple."""
    kind, ptr, size, _tracked, stream, streams, *_ = fields
    return (kind, ptr, size, stream, tuple(streams))


def is_per_thread(key):
    return key & 7 == 2 and key > 7


class Model:
    """The tracker's contract over a simulated device, step by step.

    Streams in the model are keys (a per-thread default stream: its thread's key). Faults are
    sticky per stream: the tracker's records on a stream in ``fr`` fail, queries of its fences
    recorded on a stream in ``fq`` fail, its waits enqueued on a stream in ``fw`` fail. A
    failure never makes a hazard and never hides one silently: each is counted in
    ``unchecked``, which the model bounds (``lo``..``hi``: a range already settled by a poll is
    not tested again).
    """

    def __init__(self, ordered):
        self.t = SimHazardTracker(ordered)
        self.ordered = ordered
        self.live = {}  # ptr -> [[size, alloc key, declared keys], ...], latest allocation first
        self.freed_ptrs = {}  # freed and not handed out again: ptr -> size
        self.freed_ranges = []  # (ptr, size, free key, model fence), free order
        self.cross = []  # (ptr, size, free key, alloc key, fence on alloc, fence on free)
        self.expected = []
        self.upstream_frees = 0
        self.fr, self.fq, self.fw = set(), set(), set()
        self.lo = self.hi = 0  # bounds of stats["unchecked"]

    def key(self, handle):
        return self.t.key(handle)

    def reachable(self, key):
        return not is_per_thread(key) or key == self.key(PTDS)

    def unchecked(self, n=1, maybe=0):
        self.lo += n
        self.hi += n + maybe

    # The device: the model reads the same simulated streams as the core.
    def idle(self, key):
        return self.t.idle(key)

    def poll_model(self):
        """What the core's poll at the start of each call settles."""
        keep = []
        for ptr, size, f, a, fa, ff in self.cross:
            if a in self.fq:
                self.unchecked()
            elif self.t.done(fa):
                pass
            elif f in self.fq:
                self.unchecked()
            elif self.t.done(ff):
                self.expected.append(("cross_stream_free", ptr, size, f, (a,)))
            else:
                keep.append((ptr, size, f, a, fa, ff))
                continue
            self.t.forget(fa)
            self.t.forget(ff)
        self.cross = keep

    def allocate(self, stream, size, strict=False):
        self.poll_model()
        k = self.key(stream)
        out = self.t.allocate(size, stream, strict)
        stopped = out if isinstance(out, tuple) else None
        ptr = stopped[1][1] if stopped else out
        self.freed_ptrs.pop(ptr, None)
        overlapping = [r for r in self.freed_ranges if r[0] < ptr + size and ptr < r[0] + r[1]]
        overlapping.sort(key=lambda r: r[0])  # the core walks ranges by address, then age
        hazard = None
        for _r_ptr, _r_size, r_stream, fence in overlapping:
            if hazard is None and r_stream != k:
                if r_stream in self.fq:  # tested unless a poll settled it (then complete)
                    self.unchecked(0 if self.t.done(fence) else 1, 1 if self.t.done(fence) else 0)
                elif not self.t.done(fence):
                    hazard = ("reuse_before_fence", ptr, size, k, (r_stream,))
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
        if ptr in self.live:
            first = self.live[ptr][0]
            self.expected.append(("allocated_while_live", ptr, size, k, (first[1],)))
            self.live[ptr].insert(0, [size, k, []])
        else:
            self.live[ptr] = [[size, k, []]]
        return ptr

    def deallocate(self, ptr, size, stream, strict=False):
        self.poll_model()
        k = self.key(stream)
        before = self.t.upstream_calls
        stopped = self.t.deallocate(ptr, size, stream, strict)
        after = self.t.upstream_calls
        if ptr not in self.live:
            kind = "double_free" if ptr in self.freed_ptrs else "foreign_free"
            self.expected.append((kind, ptr, size, k, ()))
            assert after == before, "a bad free reached the upstream"
            assert (stopped is not None) == strict
            return
        records = self.live[ptr]
        match = next((r for r in records if r[0] == size), None)
        if match is None:
            self.expected.append(("size_mismatch", ptr, size, k, ()))
            assert after == before, "a wrong-size free reached the upstream"
            assert (stopped is not None) == strict
            return
        _, a, declared = match
        undeclared = a != k and a not in declared
        unchecked = 0
        unreachable, in_flight = [], []
        stopped_expected = None
        if self.ordered and not undeclared and all(d == k for d in declared):
            pass  # no platform call at all
        else:
            for d in declared:
                if d == k:
                    continue
                if not self.reachable(d):
                    unreachable.append(d)
                    continue
                if d in self.fr:
                    unchecked += 1
                    continue
                if not self.ordered:
                    if d in self.fq:
                        unchecked += 1
                    elif not self.idle(d):
                        in_flight.append(d)
                if k in self.fw:
                    unchecked += 1
            if not self.ordered:
                if k in self.fr:
                    unchecked += 1
                elif k in self.fq:
                    unchecked += 1
                elif not self.idle(k):  # its own work, or waits for declared streams
                    in_flight.insert(0, k)
                if undeclared:
                    if not self.reachable(a):
                        unreachable.append(a)
                    elif a in self.fr or a in self.fq:
                        unchecked += 1
                    elif not self.idle(a):
                        in_flight.append(a)
                if in_flight:
                    stopped_expected = ("freed_in_flight", ptr, size, k, tuple(in_flight))
                    self.expected.append(stopped_expected)
        if strict and stopped_expected:
            assert stopped is not None and brief(stopped) == stopped_expected
            assert after == before
            self.unchecked(unchecked)
            return
        assert stopped is None
        assert after[1] == before[1] + 1
        self.upstream_frees += 1
        records.remove(match)
        if not records:
            del self.live[ptr]
        self.freed_ptrs[ptr] = size
        if not self.ordered:
            if unreachable:
                self.expected.append(("cross_stream_free", ptr, size, k, tuple(unreachable)))
                unchecked += len(unreachable)
            if k not in self.fr:
                self.freed_ranges.append((ptr, size, k, self.t.mark(k)))
        else:
            if undeclared and not self.reachable(a):
                unreachable.append(a)
            elif undeclared:
                if a in self.fr or a in self.fq:
                    unchecked += 1
                elif not self.idle(a):
                    if k in self.fr:
                        unchecked += 1
                    else:
                        fa, ff = self.t.mark(a), self.t.mark(k)
                        if k in self.fq:  # settled inside the free itself
                            unchecked += 1
                            self.t.forget(fa)
                            self.t.forget(ff)
                        elif self.t.done(ff):
                            self.expected.append(("cross_stream_free", ptr, size, k, (a,)))
                            self.t.forget(fa)
                            self.t.forget(ff)
                        else:
                            self.cross.append((ptr, size, k, a, fa, ff))
            if unreachable:
                self.expected.append(("cross_stream_free", ptr, size, k, tuple(unreachable)))
                unchecked += len(unreachable)
        self.unchecked(unchecked)

    def record_stream(self, ptr, stream):
        assert self.t.record_stream(ptr, stream) == (ptr in self.live)
        k = self.key(stream)
        for record in self.live.get(ptr, []):
            if k not in record[2]:
                record[2].append(k)

    def fault(self, kind, key, on):
        getattr(self.t, {"fr": "fail_records", "fq": "fail_queries", "fw": "fail_waits"}[kind])(
            key, on
        )
        (getattr(self, kind).add if on else getattr(self, kind).discard)(key)

    def clear_faults(self):
        for kind in ("fr", "fq", "fw"):
            for key in list(getattr(self, kind)):
                self.fault(kind, key, False)

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
        records = [r for recs in self.live.values() for r in recs]
        assert sorted(a[0] for a in self.t.outstanding) == sorted(
            p for p, recs in self.live.items() for _ in recs
        )
        stats = self.t.stats
        assert stats["allocations"] - stats["deallocations"] == len(records)
        assert stats["allocated_bytes"] == sum(r[0] for r in records)
        assert self.lo <= stats["unchecked"] <= self.hi, (self.lo, stats["unchecked"], self.hi)
        acquired, released = self.t.fence_counts
        assert acquired - released == self.t.fences_in_use


ops = st.sampled_from(
    [
        "alloc",
        "alloc",
        "free",
        "free",
        "free_other",
        "bad",
        "launch",
        "launch",
        "step",
        "step",
        "record",
        "order",
        "poll",
    ]
)


@given(ordered=st.booleans(), data=st.data())
@settings(max_examples=400, deadline=None)
def test_core_reports_exactly_the_hazards_of_the_model(ordered, data):
    m = Model(ordered)
    stream = st.sampled_from(STREAMS)
    for _ in range(data.draw(st.integers(1, 60))):
        op = data.draw(ops)
        if op == "alloc":
            m.allocate(
                data.draw(stream),
                data.draw(st.sampled_from(SIZES)),
                strict=data.draw(st.booleans()),
            )
        elif op in ("free", "free_other") and m.live:
            ptr = data.draw(st.sampled_from(sorted(m.live)))
            size, a, _ = m.live[ptr][0]
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
                m.deallocate(ptr, m.live[ptr][0][0] + 256, data.draw(stream), strict)
            else:
                m.deallocate(data.draw(st.integers(1, 1 << 40)) | 1, 256, data.draw(stream), strict)
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
    q = t.allocate(1024, 3)  # the cache hands p to stream 3 at once
    assert q == p
    assert [brief(h) for h in t.hazards] == [
        ("freed_in_flight", p, 1024, 1, (1,)),
        ("reuse_before_fence", p, 1024, 3, (1,)),
    ]


def test_a_fenced_reuse_is_clean():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.step(1)
    t.deallocate(p, 1024, 1)
    assert t.allocate(1024, 3) == p
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
    t.launch(3)
    t.deallocate(p, 1024, 3)
    assert t.hazards == [] and t.pending_checks == 1
    t.step(3)  # the free's fence completes, stream 1 still runs
    t.poll()
    assert [brief(h) for h in t.hazards] == [("cross_stream_free", p, 1024, 3, (1,))]
    assert t.pending_checks == 0


def test_cross_stream_free_ordered_by_the_user_is_clean():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.order(3, 1)
    t.deallocate(p, 1024, 3)
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
        t.deallocate(p, 1024, 3)  # freed on the main stream
        t.poll()
        assert kinds(t) == ([] if declare else ["cross_stream_free"])
        if declare:
            assert t.stats["stream_waits"] == 1
            assert not t.idle(3)  # the main stream now waits for the side stream
            t.step(1)
            assert t.idle(3)


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
    ptr, hazard = t.allocate(1024, 3, strict=True)
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
    b = t.allocate(512, 3)
    assert t.stats["allocated_bytes"] == 1536 and t.stats["peak_bytes"] == 1536
    t.deallocate(a, 1024, 1)
    t.reset()
    assert t.stats["peak_bytes"] == 512
    assert [(x[0], x[1], x[2]) for x in t.outstanding] == [(b, 512, 3)]


def test_every_kind_has_a_message():
    for kind in HAZARD_KINDS:
        assert kind in describe(kind, 0x1000, 256, 512, 1, (2,))
    with pytest.raises(ValueError, match="unknown hazard kind"):
        describe("nope", 0, 0, 0, 0, ())


def _doc_table_kinds(doc, header):
    """The backticked names in the first column of the table under ``header`` in docs/."""
    import re

    from helpers.paths import DOCS

    text = (DOCS / doc).read_text()
    table = text[text.index(header) :].split("\n\n")[0]
    return [m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", table, re.M)]


def test_the_docs_tables_name_every_kind():
    assert HAZARD_KINDS == (
        "freed_in_flight",
        "reuse_before_fence",
        "cross_stream_free",
        "double_free",
        "foreign_free",
        "size_mismatch",
        "leak",
        "allocated_while_live",
    )
    assert sorted(_doc_table_kinds("hazard_tracking.md", "| kind | when |")) == sorted(HAZARD_KINDS)
    assert tuple(_doc_table_kinds("design.md", "| name | meaning |")) == HAZARD_KINDS


def test_many_live_blocks_grow_the_table_and_erase_in_any_order():
    import random

    t = SimHazardTracker(True)
    r = random.Random(5)
    live = {}
    for _round in range(3):
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


# A failed record, query or wait is never "complete" (no silent pass) nor "in flight" (no
# false hazard): it is counted in stats["unchecked"].


def test_a_failed_query_of_the_free_fence_is_unchecked_not_a_hazard():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.fail_queries(1)
    t.deallocate(p, 1024, 1)
    assert t.hazards == [] and t.stats["unchecked"] == 1 and t.stats["fences"] == 1


def test_a_failed_query_never_passes_a_reuse_silently():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.deallocate(p, 1024, 1)  # freed_in_flight; the range is watched
    t.fail_queries(1)
    assert t.allocate(1024, 3) == p  # its fence cannot be tested now
    assert kinds(t) == ["freed_in_flight"]
    assert t.stats["unchecked"] == 1


def test_a_failed_query_settles_a_cross_stream_check_as_unchecked():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.launch(3)
    t.deallocate(p, 1024, 3)
    assert t.pending_checks == 1
    t.fail_queries(1)  # the allocation stream's fence can no longer be tested
    t.step(3)
    t.poll()
    assert t.hazards == [] and t.pending_checks == 0
    assert t.stats["unchecked"] == 1
    assert t.fences_in_use == 0


def test_a_failed_query_of_a_declared_stream_is_unchecked():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.record_stream(p, 3)
    t.launch(3)
    t.fail_queries(3)
    t.deallocate(p, 1024, 1)
    # the wait for stream 3 holds stream 1: the free's own fence is in flight, truthfully
    assert [brief(h) for h in t.hazards] == [("freed_in_flight", p, 1024, 1, (1,))]
    assert t.stats["unchecked"] == 1 and t.stats["stream_waits"] == 1


def test_a_failed_stream_wait_for_a_declared_stream_is_unchecked():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.record_stream(p, 3)
    t.launch(3)
    t.fail_waits(1)
    t.deallocate(p, 1024, 1)
    assert t.stats["stream_waits"] == 0 and t.stats["unchecked"] == 1
    assert t.idle(1)  # nothing orders the free after stream 3


def test_a_failed_record_on_a_declared_stream_is_unchecked():
    for ordered in (True, False):
        t = SimHazardTracker(ordered)
        p = t.allocate(1024, 1)
        t.record_stream(p, 3)
        t.launch(3)
        t.fail_records(3)
        t.deallocate(p, 1024, 1)
        assert t.stats["unchecked"] == 1 and t.stats["stream_waits"] == 0, ordered
        assert t.hazards == [], ordered


def test_a_failed_record_on_the_allocation_stream_is_unchecked():
    for ordered in (True, False):
        t = SimHazardTracker(ordered)
        p = t.allocate(1024, 1)
        t.launch(1)
        t.fail_records(1)
        t.deallocate(p, 1024, 3)
        assert t.hazards == [] and t.stats["unchecked"] == 1, ordered
        assert t.pending_checks == (0 if ordered else 1), ordered  # naive: the range is watched


def test_one_shot_faults_are_counted_too():
    t = SimHazardTracker(False)
    p = t.allocate(1024, 1)
    t.fail_next("record")
    t.deallocate(p, 1024, 1)
    q = t.allocate(1024, 1)
    t.launch(1)
    t.fail_next("query")
    t.deallocate(q, 1024, 1)
    assert t.hazards == [] and t.stats["unchecked"] == 2
    with pytest.raises(ValueError, match="kind must be"):
        t.fail_next("sync")


@pytest.mark.parametrize("ordered", [True, False])
def test_a_capturing_allocation_stream_is_counted_not_skipped_silently(ordered):
    t = SimHazardTracker(ordered)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.begin_capture(1)  # the allocation stream is being captured: no fence on it
    t.deallocate(p, 1024, 3)
    t.end_capture(1)
    assert t.hazards == [] and t.stats["unchecked"] == 1


def test_a_capture_on_an_uninvolved_stream_changes_nothing():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.launch(1)
    t.begin_capture(5)
    t.deallocate(p, 1024, 3)
    assert kinds(t) == ["cross_stream_free"] and t.stats["unchecked"] == 0


# Per-thread default streams: one handle, another stream on every thread.


def test_per_thread_streams_of_two_threads_have_two_keys():
    t = SimHazardTracker(True)
    t.as_thread(5)
    k5 = t.key(PTDS)
    t.as_thread(6)
    assert t.key(PTDS) != k5 and {k5, t.key(PTDS)} == {
        SimHazardTracker.per_thread_key(5),
        SimHazardTracker.per_thread_key(6),
    }
    assert is_per_thread(k5) and not any(is_per_thread(s) for s in STREAMS + (0, 2))


@pytest.mark.parametrize("ordered", [True, False])
def test_a_free_from_another_threads_per_thread_stream_is_reported(ordered):
    t = SimHazardTracker(ordered)
    t.as_thread(5)
    k5 = t.key(PTDS)
    p = t.allocate(1024, PTDS)
    t.launch(PTDS)  # thread 5's kernel still reads p
    t.as_thread(6)
    k6 = t.key(PTDS)
    t.deallocate(p, 1024, PTDS)  # thread 6 frees it on its own per-thread stream
    assert [brief(h) for h in t.hazards] == [("cross_stream_free", p, 1024, k6, (k5,))]
    assert t.stats["unchecked"] == 1
    assert "cannot be ordered" in hazard_from_fields(t.hazards[0]).message
    assert "per-thread default stream of thread 5" in hazard_from_fields(t.hazards[0]).message


def test_a_free_on_the_same_threads_per_thread_stream_is_same_stream():
    t = SimHazardTracker(True)
    t.as_thread(5)
    p = t.allocate(1024, PTDS)
    t.launch(PTDS)
    t.deallocate(p, 1024, PTDS)
    assert t.hazards == [] and t.stats["fences"] == 0 and t.stats["unchecked"] == 0


def test_a_declared_per_thread_stream_of_another_thread_is_reported():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.as_thread(5)
    t.record_stream(p, PTDS)  # thread 5 uses p on its per-thread stream
    k5 = t.key(PTDS)
    t.as_thread(6)
    t.deallocate(p, 1024, 1)  # 1 cannot be made to wait for thread 5's stream from here
    assert [brief(h) for h in t.hazards] == [("cross_stream_free", p, 1024, 1, (k5,))]
    assert t.stats["unchecked"] == 1 and t.stats["stream_waits"] == 0


def test_reuse_across_per_thread_streams_is_checked():
    t = SimHazardTracker(False)
    t.as_thread(5)
    p = t.allocate(1024, PTDS)
    t.launch(PTDS)
    t.deallocate(p, 1024, PTDS)
    k5 = t.key(PTDS)
    t.as_thread(6)
    assert t.allocate(1024, PTDS) == p  # the cache hands it to thread 6's stream
    assert [h[0] for h in t.hazards] == ["freed_in_flight", "reuse_before_fence"]
    assert brief(t.hazards[1])[3:] == (t.key(PTDS), (k5,))


# An upstream that hands out a live address.


def test_an_address_handed_out_while_live_is_reported_and_both_records_kept():
    t = SimHazardTracker(True)
    p = t.allocate(1024, 1)
    t.hand_out_next(p)
    assert t.allocate(512, 3) == p
    [h] = t.hazards
    assert brief(h) == ("allocated_while_live", p, 512, 3, (1,))
    record = hazard_from_fields(h)
    assert record.tracked_size == 1024 and "1024 bytes on stream 0x1" in record.message
    assert sorted((a[0], a[1], a[2]) for a in t.outstanding) == [(p, 512, 3), (p, 1024, 1)]
    stats = t.stats
    assert stats["allocations"] - stats["deallocations"] == 2
    assert stats["allocated_bytes"] == 1536
    t.deallocate(p, 1024, 1)  # the first allocation's free, by its size
    assert [(a[0], a[1]) for a in t.outstanding] == [(p, 512)]
    t.deallocate(p, 512, 3)
    assert t.outstanding == [] and t.stats["allocated_bytes"] == 0
    assert kinds(t) == ["allocated_while_live"] and t.annotations == 0
    assert t.upstream_calls == (2, 2, 0)


def test_allocated_while_live_frees_each_allocation_once():
    t = SimHazardTracker(False)
    p = t.allocate(256, 1)
    t.hand_out_next(p)
    t.allocate(256, 1)
    t.deallocate(p, 256, 1)
    assert [a[0] for a in t.outstanding] == [p]  # one of the two is still live
    t.deallocate(p, 256, 1)
    t.deallocate(p, 256, 1)
    assert kinds(t) == ["allocated_while_live", "double_free"]


# Real threads on one tracker.


@pytest.mark.parametrize("ordered", [True, False])
def test_real_threads_keep_stats_fences_and_reports_consistent(ordered):
    t = SimHazardTracker(ordered)
    run = t.run_threads(4, 12, 300, random_state=7)
    assert run["errors"] == []
    assert run["checks"] == 14  # one between every two phases
    assert run["handed_over"] > 0 and run["foreign"] > 0 and run["allocations"] > 1000
    assert run["busy_frees"] > 0 and run["allocations"] == run["frees"]
    stats = t.stats
    assert stats["allocations"] == stats["deallocations"] == run["allocations"]
    assert t.outstanding == [] and stats["allocated_bytes"] == 0
    busy = kinds(t).count("cross_stream_free" if ordered else "freed_in_flight")
    assert kinds(t).count("cross_stream_free") == run["handed_over"] + (
        run["busy_frees"] if ordered else 0
    )
    assert kinds(t).count("freed_in_flight") == (0 if ordered else run["busy_frees"])
    assert busy > 0 and kinds(t).count("foreign_free") == run["foreign"]
    assert stats["unchecked"] == run["handed_over"] and stats["fences"] > 0
    t.poll()
    t.release_fences()
    acquired, released = t.fence_counts
    assert t.fences_in_use == 0 and acquired == released > 0


# The model as a state machine: every rule on the simulated device, faults and threads
# included; after each step the core's reports, stats and fences must match the model.


class TrackerMachine(RuleBasedStateMachine):
    handles = st.sampled_from(STREAMS + (PTDS,))

    @initialize(ordered=st.booleans())
    def start(self, ordered):
        SimHazardTracker.as_thread(THREADS[0])
        self.m = Model(ordered)

    @rule(stream=handles, size=st.sampled_from(SIZES), strict=st.booleans())
    def allocate(self, stream, size, strict):
        self.m.allocate(stream, size, strict)

    @precondition(lambda self: self.m.live)
    @rule(data=st.data(), same=st.booleans(), strict=st.booleans())
    def free(self, data, same, strict):
        ptr = data.draw(st.sampled_from(sorted(self.m.live)))
        size, a, _ = data.draw(st.sampled_from(self.m.live[ptr]))
        own = {self.m.key(h): h for h in STREAMS + (PTDS,)}
        stream = own[a] if same and a in own else data.draw(self.handles)
        self.m.deallocate(ptr, size, stream, strict)

    @rule(data=st.data(), strict=st.booleans())
    def bad_free(self, data, strict):
        choice = data.draw(st.sampled_from(["double", "foreign", "size"]))
        stream = data.draw(self.handles)
        if choice == "double" and self.m.freed_ptrs:
            ptr = data.draw(st.sampled_from(sorted(self.m.freed_ptrs)))
            if ptr not in self.m.live:
                self.m.deallocate(ptr, self.m.freed_ptrs[ptr], stream, strict)
        elif choice == "size" and self.m.live:
            ptr = data.draw(st.sampled_from(sorted(self.m.live)))
            self.m.deallocate(ptr, 2048, stream, strict)  # no size of SIZES
        else:
            self.m.deallocate(data.draw(st.integers(1, 1 << 40)) | 1, 256, stream, strict)

    @precondition(lambda self: self.m.live)
    @rule(data=st.data(), stream=handles, size=st.sampled_from(SIZES))
    def upstream_hands_out_a_live_block(self, data, stream, size):
        ptr = data.draw(st.sampled_from(sorted(self.m.live)))
        self.m.t.hand_out_next(ptr)
        assert self.m.allocate(stream, size) == ptr

    @rule(stream=handles)
    def launch(self, stream):
        self.m.t.launch(stream)

    @rule(stream=handles)
    def step(self, stream):
        self.m.t.step(stream)

    @precondition(lambda self: self.m.live)
    @rule(data=st.data(), stream=handles)
    def record_stream(self, data, stream):
        self.m.record_stream(data.draw(st.sampled_from(sorted(self.m.live))), stream)

    @rule(waiter=handles, source=handles)
    def order(self, waiter, source):
        self.m.t.order(waiter, source)

    @rule()
    def poll(self):
        self.m.poll()

    @rule(thread=st.sampled_from(THREADS))
    def switch_thread(self, thread):
        SimHazardTracker.as_thread(thread)

    @rule(kind=st.sampled_from(["fr", "fq", "fw"]), stream=handles, on=st.booleans())
    def fault(self, kind, stream, on):
        self.m.fault(kind, self.m.key(stream), on)

    @invariant()
    def matches_the_model(self):
        if hasattr(self, "m"):
            self.m.check()

    def teardown(self):
        if not hasattr(self, "m"):
            return
        m = self.m
        m.clear_faults()
        for thread in THREADS:  # drain every stream, each per-thread one from its thread
            SimHazardTracker.as_thread(thread)
            while any(m.t.step(s) for s in STREAMS + (PTDS,)):
                pass
        for _ in range(2 + len(m.freed_ranges) // 8):
            m.poll()
        m.check()
        assert m.t.pending_checks == 0 and m.cross == []
        assert m.t.fences_in_use == len(m.freed_ranges)  # only the model's own marks remain
        for *_, fence in m.freed_ranges:
            m.t.forget(fence)
        m.t.release_fences()
        acquired, released = m.t.fence_counts
        assert m.t.fences_in_use == 0 and acquired == released
        SimHazardTracker.as_thread(0)


TrackerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
test_tracker_state_machine = TrackerMachine.TestCase
