# SPDX-License-Identifier: Apache-2.0
"""CupyAllocator's frees when CuPy's stream object dies in a reference cycle with the arrays
allocated on it (CPU: fake streams, a fake CUDA runtime and a recording resource).

The cyclic garbage collector runs the ``__del__`` of everything it found unreachable in any
order: CuPy's ``Stream.__del__`` may destroy the stream before an array's block is freed on
it. The allocator must never hand a destroyed stream to CUDA or to the resource.
"""

import gc

import pytest

pytest.importorskip("cupy")
cupy_alloc = pytest.importorskip("rmm_fences.allocators.cupy")

CAPTURING = 1


class FakeRuntime:
    streamCaptureStatusNone = 0
    eventDisableTiming = 2

    def __init__(self):
        self.calls, self.destroyed, self.capturing = [], set(), set()

    def _check(self, handle):
        assert handle not in self.destroyed, f"CUDA call on destroyed stream {handle:#x}"

    def streamIsCapturing(self, handle):
        self._check(handle)
        return CAPTURING if handle in self.capturing else 0

    def eventCreateWithFlags(self, flags):
        self.calls.append(("create", flags))
        return 0xE0 + len(self.calls)

    def eventRecord(self, event, handle):
        self._check(handle)
        self.calls.append(("record", event, handle))

    def streamWaitEvent(self, handle, event):
        self.calls.append(("wait", handle, event))

    def deviceSynchronize(self):
        self.calls.append(("sync",))

    def eventDestroy(self, event):
        self.calls.append(("destroy", event))


class FakeStream:
    """A CuPy stream object: destroys its handle in ``__del__``."""

    def __init__(self, runtime, handle):
        self.runtime, self.ptr = runtime, handle

    def __del__(self):
        self.runtime.destroyed.add(self.ptr)
        self.runtime.calls.append(("stream destroyed", self.ptr))


class RecordingMR:
    def __init__(self, runtime):
        self.runtime, self.frees = runtime, []

    def deallocate(self, ptr, nbytes, stream):
        assert stream not in self.runtime.destroyed, f"free of {ptr:#x} on a destroyed stream"
        self.frees.append((ptr, nbytes, stream))
        self.runtime.calls.append(("free", ptr, stream))


@pytest.fixture
def rt(monkeypatch):
    runtime = FakeRuntime()
    monkeypatch.setattr(cupy_alloc, "runtime", runtime)
    monkeypatch.setattr(cupy_alloc, "rmm_stream", lambda handle: handle)  # rmm Stream: the handle
    monkeypatch.setattr(cupy_alloc, "_STREAMS", {})
    gc.collect()
    return runtime


def _blocks(mr, stream, ptrs):
    st = cupy_alloc._stream_of(stream)
    return [cupy_alloc._Block(mr, p, 256, st, stream) for p in ptrs]


@pytest.mark.parametrize("stream_first", [True, False])
def test_cycle_frees_after_a_fence_recorded_before_the_stream_dies(rt, stream_first):
    mr = RecordingMR(rt)
    gc.disable()
    try:
        if stream_first:  # the collector's list keeps creation order: the stream dies first
            stream = FakeStream(rt, 0x5A)
            blocks = _blocks(mr, stream, [0x1000, 0x2000])
        else:
            holder = []
            stream = FakeStream(rt, 0x5A)
            blocks = _blocks(mr, stream, [0x1000, 0x2000])
            holder += blocks
        cycle = {"stream": stream, "blocks": blocks}
        cycle["self"] = cycle  # a traceback holding both does the same
        del stream, blocks, cycle
        if not stream_first:
            del holder
        assert mr.frees == []
        gc.collect()
    finally:
        gc.enable()
    assert sorted(f[0] for f in mr.frees) == [0x1000, 0x2000]
    assert all(stream == 0 for _, _, stream in mr.frees)  # the legacy default stream
    kinds = [c[0] for c in rt.calls]
    record = kinds.index("record")
    fence = rt.calls[record][1]
    assert rt.calls[record][2] == 0x5A and record < kinds.index("stream destroyed")
    for i, call in enumerate(rt.calls):
        if call[0] == "free":  # each free waits on the fence first
            assert ("wait", 0, fence) in rt.calls[:i]
    assert ("destroy", fence) in rt.calls  # the fence goes with the last block
    assert cupy_alloc._STREAMS == {}


def test_stream_dying_by_reference_count_makes_no_cuda_call(rt):
    mr = RecordingMR(rt)
    stream = FakeStream(rt, 0x77)
    [block] = _blocks(mr, stream, [0x3000])
    del block  # freed on its own stream, which is alive
    assert mr.frees == [(0x3000, 256, 0x77)]
    del stream  # destroyed now; _retire sees nothing pending
    assert [c[0] for c in rt.calls] == ["free", "stream destroyed"]
    assert cupy_alloc._STREAMS == {}


def test_stream_dying_while_capturing_syncs_before_the_free(rt):
    mr = RecordingMR(rt)
    gc.disable()
    try:
        stream = FakeStream(rt, 0x99)
        rt.capturing.add(0x99)
        blocks = _blocks(mr, stream, [0x4000])
        cycle = [stream, blocks]
        cycle.append(cycle)
        del stream, blocks, cycle
        gc.collect()
    finally:
        gc.enable()
    assert mr.frees == [(0x4000, 256, 0)]
    kinds = [c[0] for c in rt.calls]
    assert "record" not in kinds and kinds.index("sync") < kinds.index("free")


def test_one_entry_per_stream_object(rt):
    mr = RecordingMR(rt)
    stream = FakeStream(rt, 0x42)
    a = _blocks(mr, stream, [0x10, 0x20])
    assert len(cupy_alloc._STREAMS) == 1 and a[0].stream is a[1].stream
    assert a[0].stream.live == 2
    del a
    assert cupy_alloc._STREAMS and sorted(mr.frees) == [(0x10, 256, 0x42), (0x20, 256, 0x42)]
    del stream
    assert cupy_alloc._STREAMS == {}
