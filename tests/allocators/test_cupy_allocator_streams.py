# SPDX-License-Identifier: Apache-2.0
"""CupyAllocator's frees when CuPy's stream object dies in a reference cycle with the arrays
allocated on it (CPU: fake stream objects and a recording resource).

The cyclic garbage collector runs the ``__del__`` of everything it found unreachable in any
order: CuPy's ``Stream.__del__`` may destroy the stream before an array's block is freed on
it. The allocator must never hand a destroyed stream to the resource.
"""

import gc

import pytest

pytest.importorskip("cupy")
cupy_alloc = pytest.importorskip("rmm_fences.allocators.cupy")


class Log:
    def __init__(self):
        self.calls, self.destroyed = [], set()


class FakeStream:
    """A CuPy stream object: destroys its handle in ``__del__``."""

    def __init__(self, log, handle):
        self.log, self.ptr = log, handle

    def __del__(self):
        self.log.destroyed.add(self.ptr)
        self.log.calls.append(("stream destroyed", self.ptr))


class RecordingMR:
    def __init__(self, log, fail=()):
        self.log, self.fail = log, set(fail)

    def deallocate(self, ptr, nbytes, stream):
        assert stream not in self.log.destroyed, f"free of {ptr:#x} on destroyed {stream:#x}"
        if ptr in self.fail:
            raise RuntimeError(f"free of {ptr:#x} failed")
        self.log.calls.append(("free", ptr, stream))


@pytest.fixture
def log(monkeypatch):
    monkeypatch.setattr(cupy_alloc, "rmm_stream", lambda handle: handle)  # rmm Stream: handle
    monkeypatch.setattr(cupy_alloc, "_STREAMS", {})
    gc.collect()
    return Log()


def _blocks(mr, stream, ptrs):
    st = cupy_alloc._stream_of(stream)
    return [cupy_alloc._Block(mr, p, 256, st, stream) for p in ptrs]


def _frees(log):
    return sorted((c[1], c[2]) for c in log.calls if c[0] == "free")


@pytest.mark.parametrize("stream_first", [True, False])
def test_cycle_frees_on_the_stream_before_it_is_destroyed(log, stream_first):
    mr = RecordingMR(log)
    gc.disable()
    try:
        if stream_first:  # the collector's list keeps creation order: Stream.__del__ first
            stream = FakeStream(log, 0x5A)
            blocks = _blocks(mr, stream, [0x1000, 0x2000])
        else:  # a block older than the stream: its __del__ comes first
            old = cupy_alloc._Block.__new__(cupy_alloc._Block)
            stream = FakeStream(log, 0x5A)
            old.__init__(mr, 0x1000, 256, cupy_alloc._stream_of(stream), stream)
            blocks = [old, *_blocks(mr, stream, [0x2000])]
            del old
        cycle = {"stream": stream, "blocks": blocks}
        cycle["self"] = cycle  # a traceback holding both does the same
        del stream, blocks, cycle
        assert log.calls == []
        gc.collect()
    finally:
        gc.enable()
    # Each block freed once, on its own stream, before CuPy destroyed it (the fake resource
    # asserts the stream is alive at every free).
    assert _frees(log) == [(0x1000, 0x5A), (0x2000, 0x5A)]
    assert [c[0] for c in log.calls][-1] == "stream destroyed"
    assert cupy_alloc._STREAMS == {}


def test_stream_dying_by_reference_count_frees_nothing_twice(log):
    mr = RecordingMR(log)
    stream = FakeStream(log, 0x77)
    [block] = _blocks(mr, stream, [0x3000])
    del block  # freed on its own stream, which is alive
    del stream  # destroyed now; _retire finds nothing pending
    assert log.calls == [("free", 0x3000, 0x77), ("stream destroyed", 0x77)]
    assert cupy_alloc._STREAMS == {}


def test_one_entry_per_stream_object(log):
    mr = RecordingMR(log)
    stream = FakeStream(log, 0x42)
    a = _blocks(mr, stream, [0x10, 0x20])
    assert len(cupy_alloc._STREAMS) == 1 and a[0].stream is a[1].stream
    assert set(a[0].stream.blocks) == {0x10, 0x20}
    del a
    assert cupy_alloc._STREAMS and _frees(log) == [(0x10, 0x42), (0x20, 0x42)]
    del stream
    assert cupy_alloc._STREAMS == {}


def test_a_failed_free_at_retirement_frees_the_others_then_raises(log):
    mr = RecordingMR(log, fail={0x10})
    stream = FakeStream(log, 0x43)
    blocks = _blocks(mr, stream, [0x10, 0x20, 0x30])
    st = blocks[0].stream
    with pytest.raises(RuntimeError, match="free of 0x10 failed"):
        st._retire(None)
    assert _frees(log) == [(0x20, 0x43), (0x30, 0x43)]
    del blocks  # their own __del__ does not free them again
    assert _frees(log) == [(0x20, 0x43), (0x30, 0x43)]
    del stream


def test_a_block_that_cannot_be_registered_is_freed_at_once(log, monkeypatch):
    class FailingDict(dict):
        def __setitem__(self, key, value):
            raise MemoryError("no host memory")

    mr = RecordingMR(log)
    mr.allocate = lambda nbytes, stream: 0x9000
    current = [FakeStream(log, 0x44)]
    monkeypatch.setattr(cupy_alloc.cupy.cuda, "get_current_stream", lambda: current[0])
    cupy_alloc._stream_of(current[0]).blocks = FailingDict()
    alloc = cupy_alloc.CupyAllocator.__new__(cupy_alloc.CupyAllocator)
    alloc.mr, alloc.device = mr, 0
    with pytest.raises(MemoryError):
        alloc(4096)
    assert _frees(log) == [(0x9000, 0x44)]  # freed once, on its stream
    current.clear()
