# SPDX-License-Identifier: Apache-2.0
"""The ring deque that holds each stream's queue in the deferred free list (C++, no GPU),
checked against a Python list: pushes, pops, erases and inserts on either side of the middle,
across the wrap of the circular array, growth and shrinking."""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from helpers.stateful import machine_settings
from rmm_fences_testing import HostRingDeque

MIN_CAPACITY = 8


class RingDequeModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.d = HostRingDeque()
        self.model = []
        self.next_value = 0

    def value(self):
        self.next_value += 1
        return self.next_value

    @rule(n=st.integers(1, 20))
    def push_back(self, n):
        for _ in range(n):
            v = self.value()
            self.d.push_back(v)
            self.model.append(v)

    @precondition(lambda self: self.model)
    @rule(n=st.integers(1, 20))
    def pop_front(self, n):
        for _ in range(min(n, len(self.model))):
            self.d.pop_front()
            self.model.pop(0)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def erase(self, data):
        i = data.draw(st.integers(0, len(self.model) - 1))
        assert self.d.erase(i) == i  # the position of the element that followed
        del self.model[i]

    @rule(data=st.data())
    def insert(self, data):
        i = data.draw(st.integers(0, len(self.model)))
        v = self.value()
        assert self.d.insert(i, v) == i
        self.model.insert(i, v)

    @rule(kept=st.sampled_from([0, 8, 16, 64]))
    def shrink(self, kept):
        before = self.d.capacity
        self.d.shrink(kept)
        after = self.d.capacity
        n = len(self.model)
        if before <= kept or 4 * n > before:
            assert after == before
        elif n == 0:
            assert after == 0
        else:  # the smallest power of two that holds 2 * n, at least 8, if smaller
            assert after == min(before, max(MIN_CAPACITY, 1 << (2 * n - 1).bit_length()))

    @invariant()
    def same_as_the_list(self):
        assert self.d.values == self.model
        assert len(self.d) == len(self.model)
        cap = self.d.capacity
        assert cap >= len(self.model)
        assert cap == 0 or (cap >= MIN_CAPACITY and cap & (cap - 1) == 0)


TestRingDequeModel = RingDequeModel.TestCase
TestRingDequeModel.settings = machine_settings(max_examples=300, steps=60)


def test_a_queue_that_wraps_keeps_its_storage():
    d = HostRingDeque()
    for v in range(5):
        d.push_back(v)
    for v in range(5, 1000):  # the front moves around the array many times
        d.push_back(v)
        d.pop_front()
        assert d.capacity == MIN_CAPACITY
    assert d.values == list(range(995, 1000))


def test_shrink_gives_back_a_large_array_once_a_quarter_or_less_is_used():
    d = HostRingDeque()
    for v in range(1000):
        d.push_back(v)
    assert d.capacity == 1024
    d.shrink(256)
    assert d.capacity == 1024  # most of it used
    for _ in range(1000 - 200):
        d.pop_front()
    d.shrink(1024)
    assert d.capacity == 1024  # not above what is kept
    d.shrink(256)
    assert d.capacity == 512 and d.values == list(range(800, 1000))
    for _ in range(200):
        d.pop_front()
    d.shrink(256)
    assert d.capacity == 0 and d.values == []  # empty: all of it
    d.push_back(1)
    assert d.capacity == MIN_CAPACITY and d.values == [1]


def test_bad_positions_raise_index_error():
    d = HostRingDeque()
    with pytest.raises(IndexError, match="empty"):
        d.pop_front()
    d.push_back(1)
    with pytest.raises(IndexError, match="index 1 out of range for size 1"):
        d.erase(1)
    with pytest.raises(IndexError, match="index 2 out of range for size 1"):
        d.insert(2, 5)
