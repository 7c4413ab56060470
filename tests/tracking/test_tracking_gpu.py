# SPDX-License-Identifier: Apache-2.0
"""HazardTrackingResourceAdaptor on a real GPU: free-while-in-flight hazards reported as they
happen, and never on the safe chains."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
import rmm

from rmm_fences import (
    HazardError,
    HazardTrackingResourceAdaptor,
    HazardWarning,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences.unsafe import NaiveCachingMemoryResource

from helpers.children import child_env
from helpers.paths import SANITIZER_CHILD
from helpers.threads import run_threads

pytestmark = pytest.mark.gpu


def rmm_stream(s):
    return rmm.pylibrmm.stream.Stream(s)


def test_free_in_flight_over_the_naive_cache_is_reported_with_pointer_and_streams(
    cupy, scenarios, rng
):
    mr = HazardTrackingResourceAdaptor(
        NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()),
        on_hazard="record",
        capture_stacks=True,
    )
    assert mr.upstream_stream_ordered is False
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    count, nbytes = 1 << 20, 4 << 20
    out = cupy.empty(1, dtype=cupy.float64)
    corrupted, trials = 0, 20
    for trial in range(trials):
        host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
        a = mr.allocate(nbytes, s1)
        scenarios.as_array(a, count, np.float32).set(host, stream=s1)
        with s1:
            out.fill(0.0)
        scenarios.slow_checksum(a, count, 20, out, s1)  # long enough for stack capture
        mr.deallocate(a, nbytes, s1)  # free while in flight: no sync before the free
        b = mr.allocate(nbytes, s2)
        scenarios.fill(b, count, pattern=trial + 1, stream=s2)
        s1.synchronize()
        s2.synchronize()
        corrupted += not np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
        mr.deallocate(b, nbytes, s2)
        got = [(h.kind, h.pointer, h.size, h.stream, h.streams) for h in mr.hazards]
        assert got == [
            ("freed_in_flight", a, nbytes, s1.ptr, (s1.ptr,)),
            ("reuse_before_fence", a, nbytes, s2.ptr, (s1.ptr,)),
        ], f"trial {trial}"
        if trial == 0:
            report = mr.report()
            print("\n" + report)
            assert "freed_in_flight" in report and "reuse_before_fence" in report
            assert __file__ in mr.hazards[0].stack  # where the free came from
        mr.reset()
    print(f"naive_cache: {corrupted}/{trials} corrupted, every trial reported")
    assert corrupted >= 1, "the hazard was not observed as corruption"


def _safe_chain(chain):
    if chain == "sync_on_free_deferred":
        # One fence per free: a block goes upstream as soon as its own free's fence completed
        # (the control below relies on the reuse at once).
        return SyncOnFreeResourceAdaptor(
            NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()),
            mode="deferred",
            max_batch_frees=1,
        )
    return StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered_control", "ordered"])
@pytest.mark.parametrize("chain", ["sync_on_free_deferred", "rmm_fences_pool"])
def test_safe_chains_report_a_cross_stream_free_exactly_when_unordered(
    cupy, scenarios, rng, chain, ordered
):
    """The race trial with the free on the overwriting stream s2 while s1's slow kernel still
    reads the block. Control (unordered): both safe chains reuse the block on s2 at once, the
    kernel's checksum is corrupted and the tracker reports every trial. Ordered (s2 waits for
    an event recorded on s1 before the free): correct checksums, no report, and the tracker
    did check (fences recorded on s1 while its kernel ran, each check settled)."""
    mr = HazardTrackingResourceAdaptor(_safe_chain(chain), on_hazard="record")
    assert mr.upstream_stream_ordered is True
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    count, nbytes, trials = 1 << 20, 4 << 20, 10
    out = cupy.empty(1, dtype=cupy.float64)
    corrupted = 0
    for trial in range(trials):
        host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
        a = mr.allocate(nbytes, s1)
        scenarios.as_array(a, count, np.float32).set(host, stream=s1)
        with s1:
            out.fill(0.0)
        scenarios.slow_checksum(a, count, 50, out, s1)  # reads a after 50 ms
        if ordered:
            s2.wait_event(s1.record())
        mr.deallocate(a, nbytes, s2)
        s2.synchronize()  # the free's fence completed; unordered, s1's kernel still spins
        _ = mr.hazards  # settles the check now (a later settle would find s1 done too)
        b = mr.allocate(nbytes, s2)
        scenarios.fill(b, count, pattern=trial + 1, stream=s2)
        s1.synchronize()
        s2.synchronize()
        corrupted += not np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
        mr.deallocate(b, nbytes, s2)
    got = [(h.kind, h.stream, h.streams) for h in mr.hazards]  # settles every check
    stats = mr.stats
    print(
        f"\ntracking({chain}), {'ordered' if ordered else 'unordered'}: {corrupted}/{trials} "
        f"corrupted, hazards {len(got)}, stats {stats}"
    )
    assert stats["fences"] >= trials and stats["pending_checks"] == 0
    assert stats["unchecked"] == 0
    if ordered:
        assert corrupted == 0 and got == []
        mr.check()
    else:
        assert got == [("cross_stream_free", s2.ptr, (s1.ptr,))] * trials
        assert corrupted >= 1, "the race was reported but not observed"
    assert mr.allocated_bytes == 0 and mr.outstanding() == []


def test_free_from_another_threads_per_thread_stream_is_reported(cupy, scenarios, rng):
    """Thread A allocates on its per-thread default stream, where a slow kernel reads the
    block; thread B frees it on its own per-thread default stream (the same handle, another
    stream) and the naive cache hands it to B's next allocation, which B overwrites. The
    tracker cannot order or check B's free after A's stream: it reports it, every trial."""
    from rmm_fences._hazards import is_per_thread_key

    mr = HazardTrackingResourceAdaptor(
        NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()), on_hazard="record"
    )
    ptds = cupy.cuda.Stream.ptds
    count, nbytes, trials = 1 << 20, 4 << 20, 5
    out = cupy.zeros(1, dtype=cupy.float64)
    corrupted = 0
    for trial in range(trials):
        host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
        launched, freed = threading.Event(), threading.Event()
        box, errors = {}, []

        def thread_a():
            try:
                a = mr.allocate(nbytes, ptds)  # A's per-thread stream
                scenarios.as_array(a, count, np.float32).set(host, stream=ptds)
                with ptds:
                    out.fill(0.0)
                scenarios.slow_checksum(a, count, 100, out, ptds)  # reads a after 100 ms
                box["a"] = a
                launched.set()
                freed.wait(60)
                ptds.synchronize()  # A's per-thread stream, from A
                box["sum"] = float(out.get(stream=ptds)[0])
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
                launched.set()

        def thread_b():
            try:
                launched.wait(60)
                a = box["a"]
                mr.deallocate(a, nbytes, ptds)  # B's per-thread stream
                b = mr.allocate(nbytes, ptds)
                box["same"] = b == a
                scenarios.fill(b, count, pattern=trial + 1, stream=ptds)
                ptds.synchronize()
                mr.deallocate(b, nbytes, ptds)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                freed.set()

        threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert box["same"], "the naive cache did not hand the block to thread B"
        corrupted += not np.isclose(box["sum"], host.astype(np.float64).sum(), rtol=1e-9)
        hazards = mr.hazards
        assert [h.kind for h in hazards] == ["cross_stream_free"], f"trial {trial}: {hazards}"
        [h] = hazards
        assert h.pointer == box["a"] and h.size == nbytes
        assert is_per_thread_key(h.stream) and len(h.streams) == 1
        assert is_per_thread_key(h.streams[0]) and h.streams[0] != h.stream
        assert "cannot be ordered" in h.message
        mr.reset()
    stats = mr.stats
    print(
        f"\nper-thread streams of two threads: {corrupted}/{trials} corrupted, "
        f"every trial reported; stats {stats}"
    )
    assert stats["unchecked"] >= trials  # each free from B could not be checked against A
    assert corrupted >= 1, "the hazard was not observed as corruption"
    assert mr.allocated_bytes == 0


@pytest.mark.parametrize("declare", [False, True])
def test_missing_record_stream_is_a_cross_stream_free(cupy, scenarios, rng, declare):
    """A buffer used on a side stream and freed on the main stream: the pool reuses it on the
    main stream at once, racing the side stream's kernel, unless the use was declared."""
    mr = HazardTrackingResourceAdaptor(
        StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource()), on_hazard="record"
    )
    side = cupy.cuda.Stream(non_blocking=True)
    main = cupy.cuda.Stream(non_blocking=True)
    count, nbytes = 1 << 20, 4 << 20
    host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
    out = cupy.zeros(1, dtype=cupy.float64)
    buf = mr.allocate(nbytes, side)
    scenarios.as_array(buf, count, np.float32).set(host, stream=side)
    side.synchronize()
    scenarios.slow_checksum(buf, count, 300, out, side)  # reads buf after 300 ms
    if declare:
        mr.record_stream(buf, side)
    mr.deallocate(buf, nbytes, main)
    again = mr.allocate(nbytes, main)
    assert again == buf  # same-stream reuse on main
    scenarios.fill(again, count, pattern=7, stream=main)
    main.synchronize()  # with the declaration main waited for the side kernel
    hazards = [(h.kind, h.pointer, h.stream, h.streams) for h in mr.hazards]
    side.synchronize()
    correct = np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
    mr.deallocate(again, nbytes, main)
    if declare:
        assert hazards == [] and correct
        assert mr.stats["stream_waits"] == 1
    else:
        assert hazards == [("cross_stream_free", buf, main.ptr, (side.ptr,))]
        assert not correct, "the race was reported but not observed"


def test_bad_frees_from_python_raise_and_leave_the_upstream_untouched():
    stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    mr = HazardTrackingResourceAdaptor(stats, on_hazard="raise")
    a = mr.allocate(4096)
    b = mr.allocate(8192)
    mr.deallocate(a, 4096)
    before = stats.allocation_counts
    with pytest.raises(HazardError, match="double_free") as err:
        mr.deallocate(a, 4096)
    assert err.value.hazards[0].kind == "double_free" and err.value.hazards[0].pointer == a
    with pytest.raises(HazardError, match="foreign_free"):
        mr.deallocate(b + 256, 4096)
    with pytest.raises(HazardError, match="size_mismatch.*allocated with 8192"):
        mr.deallocate(b, 4096)
    assert stats.allocation_counts == before
    assert [r.pointer for r in mr.outstanding()] == [b]
    mr.check()  # raised hazards are not raised again
    mr.deallocate(b, 8192)
    assert stats.allocation_counts.current_bytes == 0


def test_hazards_from_cpp_callers_are_raised_by_check():
    cuda = rmm.mr.CudaMemoryResource()
    mr = HazardTrackingResourceAdaptor(cuda, on_hazard="raise")
    outer = rmm.mr.StatisticsResourceAdaptor(mr)  # its C++ calls reach the tracker's C++
    p = outer.allocate(4096)
    outer.deallocate(p, 4096)
    outer.deallocate(p, 4096)  # recorded, not raised (noexcept C++ path)
    with pytest.raises(HazardError, match="double_free"):
        mr.check()
    mr.check()  # reported once


def test_warn_mode_warns_and_records():
    mr = HazardTrackingResourceAdaptor(rmm.mr.CudaMemoryResource())
    p = mr.allocate(1024)
    with pytest.warns(HazardWarning, match="size_mismatch"):
        mr.deallocate(p, 2048)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mr.deallocate(p, 1024)
    assert [h.kind for h in mr.hazards] == ["size_mismatch"]


def test_freed_in_flight_raises_and_keeps_the_block(cupy, scenarios, rng):
    naive = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    mr = HazardTrackingResourceAdaptor(naive, on_hazard="raise")
    s = cupy.cuda.Stream(non_blocking=True)
    count = 1 << 18
    host = rng.standard_normal(count, dtype=np.float32)
    a = mr.allocate(count * 4, s)
    scenarios.as_array(a, count, np.float32).set(host, stream=s)
    out = cupy.zeros(1, dtype=cupy.float64)
    s.synchronize()
    scenarios.slow_checksum(a, count, 100, out, s)
    with pytest.raises(HazardError, match="freed_in_flight") as err:
        mr.deallocate(a, count * 4, s)
    assert err.value.hazards[0].streams == (s.ptr,)
    assert naive.cached_bytes == 0 and mr.allocated_bytes == count * 4  # nothing went upstream
    s.synchronize()
    mr.deallocate(a, count * 4, s)
    assert naive.cached_bytes == count * 4
    assert np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)


def test_device_buffers_cupy_and_stacks(cupy):
    mr = HazardTrackingResourceAdaptor(
        rmm.mr.CudaAsyncMemoryResource(), capture_stacks=True, on_hazard="raise"
    )
    assert mr.upstream_stream_ordered is True
    s = cupy.cuda.Stream(non_blocking=True)
    buf = rmm.DeviceBuffer(size=1 << 20, stream=rmm_stream(s), mr=mr)  # through C++, nogil
    [record] = mr.outstanding()
    assert record.pointer == buf.ptr and record.size == 1 << 20 and record.stream == s.ptr
    assert __file__ in record.stack  # Python frames, though the C++ call released the GIL
    assert mr.stream_bytes == {s.ptr: 1 << 20} and mr.peak_bytes == 1 << 20
    assert mr.nvtx_active is False  # no tool attached: the annotations switched themselves off
    del buf
    assert mr.outstanding() == [] and mr.allocated_bytes == 0
    rmm.mr.set_current_device_resource(mr)
    try:
        from rmm.allocators.cupy import rmm_cupy_allocator

        cupy.cuda.set_allocator(rmm_cupy_allocator)
        x = cupy.arange(1000, dtype=cupy.float64)
        assert float(x.sum()) == 999 * 1000 / 2
        assert mr.allocated_bytes >= 8000
        del x
        cupy.cuda.Device().synchronize()
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        rmm.mr.set_current_device_resource(rmm.mr.CudaMemoryResource())
    mr.check()


#: A child process: the tracker with capture_stacks over the pool, asked for stacks at once by
#: C++ threads that have no Python thread state (rmm_fences_bench.threaded_alloc_free, without
#: the GIL), by a Python thread, and by an asyncio loop whose callbacks allocate through C with
#: no Python frame of their own (functools.partial of rmm.DeviceBuffer: the innermost frame is
#: the loop's, as on cudf-polars' streaming-engine threads) or free a block as their frame,
#: which C called, is torn down (the interpreter's entry frame is current then).
STACKS_ON_EVERY_KIND_OF_THREAD = r"""
import asyncio, functools, json, sys, threading
import cupy, rmm
from rmm_fences import HazardTrackingResourceAdaptor, StreamOrderedPoolMemoryResource
from rmm_fences_bench import threaded_alloc_free

mr = HazardTrackingResourceAdaptor(
    StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource()),
    capture_stacks=True,
    on_hazard="raise",
)
stop, counts = threading.Event(), {"python": 0, "loop": 0}

def python_thread():
    while not stop.is_set():
        buf = rmm.DeviceBuffer(size=4096, mr=mr)
        del buf
        counts["python"] += 1

def loop_thread():
    loop = asyncio.new_event_loop()

    def holds():  # called from C: its block is freed while its frame is torn down
        buf = rmm.DeviceBuffer(size=4096, mr=mr)
        return buf.size

    def tick():
        counts["loop"] += 1
        if stop.is_set():
            loop.stop()
            return
        loop.call_soon(functools.partial(rmm.DeviceBuffer, size=8192, mr=mr))
        loop.call_soon(holds)
        loop.call_soon(tick)

    loop.call_soon(tick)
    loop.run_forever()
    loop.close()

threads = [threading.Thread(target=python_thread), threading.Thread(target=loop_thread)]
for t in threads:
    t.start()
streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(4)]
iterations = int(sys.argv[1])
threaded_alloc_free(mr, 1 << 20, iterations, streams)
stop.set()
for t in threads:
    t.join()
for s in streams:
    s.synchronize()
mr.check()
print(json.dumps({**counts, "stats": dict(mr.stats), "outstanding": len(mr.outstanding())}))
"""


def test_stacks_are_captured_on_native_python_and_event_loop_threads_at_once(json_child):
    """capture_stacks asks each allocating thread for its Python frames: C++ threads with no
    Python thread state, a Python thread and an asyncio loop's callbacks at the same time. A run
    of cudf-polars' tests under the tracker with capture_stacks died with SIGSEGV on a thread of
    its streaming engine: here a crash is the child's exit code, and every pair is counted."""
    iterations = 5_000  # per C++ thread; each takes the GIL for its stacks
    rc, out, stdout, stderr = json_child(
        STACKS_ON_EVERY_KIND_OF_THREAD, iterations, timeout=600, env=child_env()
    )
    assert rc == 0 and out is not None, stdout[-2000:] + stderr[-4000:]
    assert out["python"] > 0 and out["loop"] > 0, out
    stats = out["stats"]
    native = 4 * iterations
    assert stats["allocations"] >= native + out["python"], out
    assert stats["allocations"] == stats["deallocations"] and out["outstanding"] == 0, out
    assert stats["hazards"] == 0 and stats["allocated_bytes"] == 0, out


def test_report_lists_leaks_as_text_and_json(cupy):
    mr = HazardTrackingResourceAdaptor(rmm.mr.CudaMemoryResource(), capture_stacks=True)
    p = mr.allocate(3000)
    text = mr.report()
    assert "leak" in text and f"{p:#x}" in text and __file__ in text
    data = json.loads(mr.report(format="json"))
    assert data["leaks"][0]["pointer"] == p and data["leaks"][0]["kind"] == "leak"
    assert data["allocated_bytes"] == 3000
    mr.deallocate(p, 3000)
    assert "hazards: none" in mr.report()


def test_report_at_exit_lists_leaks():
    code = (
        "import rmm, rmm_fences\n"
        "mr = rmm_fences.HazardTrackingResourceAdaptor(rmm.mr.CudaMemoryResource(),"
        " report_at_exit=True)\n"
        "keep = mr.allocate(12345)\n"
    )
    res = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "leak: 12345 bytes" in res.stderr


def test_many_threads_and_streams_stay_consistent(cupy):
    mr = HazardTrackingResourceAdaptor(
        rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 28),
        on_hazard="record",
    )
    streams = [rmm_stream(cupy.cuda.Stream(non_blocking=True)) for _ in range(4)]

    def work(k):
        rng = np.random.default_rng(k)
        held = []
        for i in range(3000):
            s = streams[(k + i) % len(streams)]
            size = int(rng.integers(1, 1 << 16))
            held.append((mr.allocate(size, s), size, s))
            if len(held) > 16:
                mr.deallocate(*held.pop(int(rng.integers(len(held)))))
        for args in held:
            mr.deallocate(*args)

    errors = run_threads(8, work)
    assert errors == []
    assert mr.hazards == [] and mr.allocated_bytes == 0 and mr.outstanding() == []
    assert mr.stats["allocations"] == mr.stats["deallocations"] == 8 * 3000


def _sanitizer():
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in ("/usr/local/cuda/bin", *sorted(pathlib.Path("/usr/local").glob("cuda-*/bin"))):
        candidate = pathlib.Path(root) / "compute-sanitizer"
        if candidate.exists():
            return str(candidate)
    return None


@pytest.mark.parametrize("annotate", [True, False])
def test_compute_sanitizer_sees_out_of_bounds_writes_inside_the_pool(annotate):
    sanitizer = _sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not installed on this host")
    child = SANITIZER_CHILD
    env = dict(os.environ)
    res = subprocess.run(
        [
            sanitizer,
            "--tool",
            "memcheck",
            sys.executable,
            "-P",
            str(child),
            "annotate" if annotate else "plain",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    output = res.stdout + res.stderr
    print(
        f"\ncompute-sanitizer ({'annotated' if annotate else 'not annotated'}):\n"
        + "\n".join(
            line
            for line in output.splitlines()
            if "ERROR SUMMARY" in line or "Invalid" in line or "child:" in line
        )
    )
    assert "child: launched" in output, output[-3000:]
    if annotate:
        assert "Invalid __global__ write of size 4" in output, output[-3000:]
        assert "nvtx_active=True" in output
    else:
        assert "child: the kernel completed; nvtx_active=False" in output, output[-3000:]
        assert "ERROR SUMMARY: 0 errors" in output, output[-3000:]
