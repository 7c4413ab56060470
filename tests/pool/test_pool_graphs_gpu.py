# SPDX-License-Identifier: Apache-2.0
"""StreamOrderedPoolMemoryResource next to CUDA graphs and other threads' captures, on a GPU.

What these tests prove:

1. A block that a graph allocated and freed inside its capture (its temporary) belongs to the
   graph for as long as the graph may run again. Slot sweeps that retire the capture's slot (a
   stream per task: 300 short-lived streams), the reclaim before out-of-memory and
   ``release()`` must not hand it to another stream or back to the upstream; the next launch
   would overwrite that stream's data (or write freed memory: error 700, seen in a child
   process). Once the graph and its exec are destroyed and the device synchronized, the bytes
   come back: 20 capture/launch/destroy rounds keep the pool bounded.
2. An ordinary call never breaks another thread's global-mode capture (the default mode of
   ``cudaStreamBeginCapture`` and ``torch.cuda.graph``): an allocation that misses while
   orphans (blocks of streams dropped without ``retire_stream``) hold a quarter of the pool,
   ``release()``, and an allocation that runs out of memory all used to synchronize the device,
   which invalidates that capture (its ``end_capture`` raised
   ``cudaErrorStreamCaptureInvalidated``).

The pool never synchronizes the device on its own (``stats["reclaim_syncs"]`` stays 0);
``stats["graph_bytes"]`` counts the free bytes held for graphs that may still replay and
``stats["orphan_bytes"]`` the free bytes of streams that went away. Assertions on those two keys
come after the behaviour the test is about, so that a build without them fails on the
behaviour first; the controls (which pass before the fix too) do not read them.
"""

import contextlib
import threading
import time

import numpy as np
import pytest
import rmm

from rmm_fences import StreamOrderedPoolMemoryResource

pytestmark = pytest.mark.gpu

MiB = 1 << 20
#: The pool of the graph tests, and the graph's temporary (40 of its 64 MiB: the rest cannot
#: hold another temporary, so a second 40 MiB block can only be the graph's or a new chunk).
POOL_BYTES = 64 * MiB
TEMP_BYTES = 40 * MiB
TEMP_COUNT = TEMP_BYTES // 4  # float32 elements
THREADS = 256

_KERNELS = r"""
// The graph's temporary: element i of launch k holds ((7 i + 131 k) mod 1000003) + 1, a
// non-zero integer below 2^24 (exact in float32). `launch` is read when the kernel runs, so
// each launch of the graph writes other values.
__device__ float graph_value(unsigned long long i, unsigned long long k)
{
    return (float)((i * 7ull + k * 131ull) % 1000003ull + 1ull);
}

extern "C" __global__ void graph_write(float* a, unsigned long long n, const unsigned int* launch)
{
    unsigned long long const k = *launch;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        a[i] = graph_value(i, k);
    }
}

extern "C" __global__ void graph_check(const float* a, unsigned long long n,
                                       const unsigned int* launch, unsigned long long* errors)
{
    unsigned long long const k = *launch;
    unsigned long long bad = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        bad += (a[i] != graph_value(i, k));
    }
    if (bad) { atomicAdd(errors, bad); }
}

extern "C" __global__ void bump(unsigned int* launch)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) { *launch += 1u; }
}

extern "C" __global__ void scale_add(const float* x, float* y, unsigned long long n, float a,
                                     float b)
{
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        y[i] = a * x[i] + b;
    }
}
"""


def rs(s):
    return rmm.pylibrmm.stream.Stream(s)


def _grid(count: int) -> tuple[int]:
    return (max(1, min(1024, (count + THREADS - 1) // THREADS)),)


class _Kernels:
    """The kernels above, loaded (one launch each) before any capture begins."""

    def __init__(self, cupy):
        self.cupy = cupy
        module = cupy.RawModule(code=_KERNELS)
        names = ("graph_write", "graph_check", "bump", "scale_add")
        self._write, self._check, self._bump, self._scale_add = map(module.get_function, names)
        self._warm_up()

    def write(self, ptr, count, launch, stream):
        self._write(_grid(count), (THREADS,), (ptr, np.uint64(count), launch), stream=stream)

    def check(self, ptr, count, launch, errors, stream):
        self._check(
            _grid(count), (THREADS,), (ptr, np.uint64(count), launch, errors), stream=stream
        )

    def bump(self, launch, stream):
        self._bump((1,), (1,), (launch,), stream=stream)

    def scale_add(self, x, y, a, b, stream):
        """``y = a * x + b`` on float32 CuPy arrays."""
        args = (x, y, np.uint64(x.size), np.float32(a), np.float32(b))
        self._scale_add(_grid(x.size), (THREADS,), args, stream=stream)

    def _warm_up(self):
        # Lazy module loading would otherwise load the kernels at their first launch, which
        # may fall inside a capture.
        cp = self.cupy
        s = cp.cuda.Stream(non_blocking=True)
        a = cp.zeros(1024, dtype=cp.float32)
        y = cp.zeros(1024, dtype=cp.float32)
        launch = cp.zeros(1, dtype=cp.uint32)
        errors = cp.zeros(1, dtype=cp.uint64)
        self.write(a.data.ptr, a.size, launch, s)
        self.check(a.data.ptr, a.size, launch, errors, s)
        self.bump(launch, s)
        self.scale_add(a, y, 2.0, 1.0, s)
        s.synchronize()
        assert int(errors.get()[0]) == 0 and int(launch.get()[0]) == 1


@pytest.fixture(scope="module")
def kernels(cupy):
    return _Kernels(cupy)


def _capture_temporary(cupy, kernels, pool, stream, launch, errors, nbytes=TEMP_BYTES):
    """Captures on ``stream`` (relaxed mode) a graph that allocates ``nbytes`` from ``pool`` on
    the capturing stream, writes it (values of the element index and the launch number
    ``launch[0]``), checks it (mismatches into ``errors[0]``), counts the launch and frees the
    temporary on the capturing stream. CuPy instantiates the graph at ``end_capture``. Returns
    ``(graph, address of the temporary)``."""
    r = rs(stream)
    count = nbytes // 4
    stream.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeRelaxed)
    try:
        tmp = pool.allocate(nbytes, r)
        kernels.write(tmp, count, launch, stream)
        kernels.check(tmp, count, launch, errors, stream)
        kernels.bump(launch, stream)
        pool.deallocate(tmp, nbytes, r)
    except BaseException:
        with contextlib.suppress(Exception):
            stream.end_capture()
        raise
    return stream.end_capture(), tmp


#: Frees of a new stream that the pool fences each (its first ones).
YOUNG_FREES = 16


def _launched_graph(cupy, kernels, pool):
    """A graph whose temporary came from ``pool`` (see ``_capture_temporary``), launched once,
    and another stream: (capturing stream, other stream, its rmm view, launch counter, error
    counter, graph, address of the temporary)."""
    s = cupy.cuda.Stream(non_blocking=True)
    other = cupy.cuda.Stream(non_blocking=True)
    launch = cupy.zeros(1, dtype=cupy.uint32)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    cupy.cuda.Device().synchronize()
    graph, tmp = _capture_temporary(cupy, kernels, pool, s, launch, errors)
    graph.launch(stream=s)
    s.synchronize()
    return s, other, rs(other), launch, errors, graph, tmp


def _streams_per_task(cupy, pool, tasks, nbytes, grown_up=False):
    """``tasks`` short-lived streams, each allocating and freeing one block of ``nbytes`` and
    then destroyed without ``retire_stream`` (a stream per task): once more than 64 stream
    slots exist, the pool's slot sweeps retire the idle ones. A new stream's first frees are
    fenced; with ``grown_up`` each stream first spends them on 256-byte pairs, so that its last
    free is one that no fence covers (an orphan once its slot is retired)."""
    for _ in range(tasks):
        s = cupy.cuda.Stream(non_blocking=True)
        r = rs(s)
        for _ in range(YOUNG_FREES if grown_up else 0):
            pool.deallocate(pool.allocate(256, r), 256, r)
        p = pool.allocate(nbytes, r)
        pool.deallocate(p, nbytes, r)
        del r, s


def _overlap(a, b, nbytes):
    """Bytes shared by the blocks of ``nbytes`` at ``a`` and at ``b``."""
    return max(0, min(a, b) + nbytes - max(a, b))


def _stats_once_graphs_died(pool, stream, attempts=500):
    """The pool's stats once it reports no free bytes held for graphs, making one small
    allocation on ``stream`` per attempt. A graph's destruction may reach the pool through the
    driver's own thread (user object destructors run asynchronously), so the first allocation
    after the destruction and a device synchronization may come too early: a few attempts are
    allowed (10 ms apart: a bound on the wait, not an assertion on time)."""
    stats = pool.stats
    for _ in range(attempts):
        p = pool.allocate(256, stream)
        pool.deallocate(p, 256, stream)
        stats = pool.stats
        if stats.get("graph_bytes", 0) == 0:
            return stats
        time.sleep(0.01)
    return stats


def _graph_temporary_after_streams_per_task(cupy, kernels, rng, tasks):
    """Test 1's scenario (see the tests below); returns what it observed."""
    from rmm_fences._scenarios import as_array

    pool = StreamOrderedPoolMemoryResource(
        rmm.mr.CudaAsyncMemoryResource(), initial_pool_size=POOL_BYTES
    )
    s = cupy.cuda.Stream(non_blocking=True)
    other = cupy.cuda.Stream(non_blocking=True)
    launch = cupy.zeros(1, dtype=cupy.uint32)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    cupy.cuda.Device().synchronize()

    graph, tmp = _capture_temporary(cupy, kernels, pool, s, launch, errors)
    seen = {"after_capture": pool.stats}
    graph.launch(stream=s)
    s.synchronize()

    _streams_per_task(cupy, pool, tasks, 256)
    seen["after_tasks"] = pool.stats

    # An ordinary allocation on another stream, filled with data the graph must leave alone.
    ro = rs(other)
    b = pool.allocate(TEMP_BYTES, ro)
    host = rng.standard_normal(TEMP_COUNT, dtype=np.float32)
    reference = host.astype(np.float64)
    view = as_array(b, TEMP_COUNT, np.float32)
    view.set(host, stream=other)
    other.synchronize()
    graph.launch(stream=s)  # the graph writes its temporary again
    s.synchronize()
    got = view.get(stream=other).astype(np.float64)
    seen["corrupted"] = int(np.count_nonzero(got != reference))
    seen["overlap"] = _overlap(b, tmp, TEMP_BYTES)
    seen["graph_errors"] = int(errors.get()[0])
    seen["launches"] = int(launch.get()[0])
    seen["after_launch"] = pool.stats
    pool.deallocate(b, TEMP_BYTES, ro)

    del graph  # CuPy's Graph holds the exec (it destroys the cudaGraph_t once instantiated)
    cupy.cuda.Device().synchronize()
    seen["after_destroy"] = _stats_once_graphs_died(pool, ro)
    print(f"\ngraph temporary after {tasks} streams per task: {seen}")
    return seen


def test_graph_temporary_is_not_handed_to_another_stream_after_slot_sweeps(cupy, kernels, rng):
    """A relaxed-mode capture allocates a 40 MiB temporary from a 64 MiB pool, writes it,
    frees it on the capturing stream; the graph runs once. Then 300 short-lived streams each
    make one 256-byte pair (their slots' sweeps retire the capture's slot), and another stream
    allocates 40 MiB and fills it with random floats. The graph's next launch must leave those
    floats intact. Before the fix, the capture's cached block became an orphan, the pool
    reclaimed it with a device synchronization and gave it to the other stream: the relaunch
    overwrote every element the two blocks share."""
    seen = _graph_temporary_after_streams_per_task(cupy, kernels, rng, tasks=300)
    assert seen["corrupted"] == 0, (
        f"the graph's relaunch overwrote {seen['corrupted']} of {TEMP_COUNT} floats of another "
        f"stream's live block (it shares {seen['overlap']} bytes with the graph's temporary): "
        f"{seen['after_launch']}"
    )
    assert seen["overlap"] == 0, "another stream got the bytes of a graph that may replay"
    assert seen["graph_errors"] == 0 and seen["launches"] == 2
    assert seen["after_launch"]["reclaim_syncs"] == 0, "the pool synchronized the device"
    # while the graph exists its temporary is held for it; after its destruction it is not
    for when in ("after_capture", "after_tasks", "after_launch"):
        assert seen[when]["graph_bytes"] >= TEMP_BYTES, (when, seen[when])
    assert seen["after_destroy"]["graph_bytes"] == 0, seen["after_destroy"]
    assert seen["after_destroy"]["reclaim_syncs"] == 0


def test_graph_temporary_with_few_streams_per_task_control(cupy, kernels, rng):
    """The control (passes before the fix too): 30 short-lived streams make no slot sweep, the
    capture's slot keeps the temporary, the other stream's 40 MiB comes from a new chunk."""
    seen = _graph_temporary_after_streams_per_task(cupy, kernels, rng, tasks=30)
    assert seen["corrupted"] == 0, seen
    assert seen["overlap"] == 0
    assert seen["graph_errors"] == 0 and seen["launches"] == 2
    assert seen["after_launch"]["reclaim_syncs"] == 0


def test_reclaim_before_out_of_memory_keeps_a_live_graphs_temporary(cupy, kernels, rng):
    """With ``maximum_pool_size`` = the 64 MiB pool, the graph's 40 MiB temporary leaves room
    for no second 40 MiB block: another stream's request must raise ``MemoryError`` while the
    graph exists (before the fix, the reclaim before out-of-memory synchronized the device and
    handed it the graph's block, which the next launch overwrote). Once the graph is destroyed
    and the device synchronized, the same request succeeds without growing the pool."""
    from rmm_fences._scenarios import as_array

    pool = StreamOrderedPoolMemoryResource(
        rmm.mr.CudaAsyncMemoryResource(), initial_pool_size=POOL_BYTES, maximum_pool_size=POOL_BYTES
    )
    s, other, ro, launch, errors, graph, tmp = _launched_graph(cupy, kernels, pool)

    try:
        b = pool.allocate(TEMP_BYTES, ro)
    except MemoryError:
        b = None
    corrupted = 0
    if b is not None:  # before the fix: the graph's block, reclaimed through a device sync
        host = rng.standard_normal(TEMP_COUNT, dtype=np.float32)
        view = as_array(b, TEMP_COUNT, np.float32)
        view.set(host, stream=other)
        other.synchronize()
        graph.launch(stream=s)
        s.synchronize()
        got = view.get(stream=other).astype(np.float64)
        corrupted = int(np.count_nonzero(got != host.astype(np.float64)))
        overlap = _overlap(b, tmp, TEMP_BYTES)
        pool.deallocate(b, TEMP_BYTES, ro)
        assert corrupted == 0 and overlap == 0, (
            f"the reclaim before out-of-memory handed a live graph's temporary to another "
            f"stream ({overlap} bytes shared); the relaunch overwrote {corrupted} of "
            f"{TEMP_COUNT} floats: {pool.stats}"
        )
    assert b is None, f"a 40 MiB block next to a live 40 MiB temporary in 64 MiB: {pool.stats}"
    held = pool.stats
    graph.launch(stream=s)
    s.synchronize()
    assert int(errors.get()[0]) == 0 and int(launch.get()[0]) == 2

    del graph
    cupy.cuda.Device().synchronize()
    after = _stats_once_graphs_died(pool, ro)
    c = pool.allocate(TEMP_BYTES, ro)  # the graph's bytes are reusable now
    pool.deallocate(c, TEMP_BYTES, ro)
    stats = pool.stats
    print(f"\nout of memory next to a graph: while it lives {held}, after {stats}")
    assert pool.pool_size() == POOL_BYTES
    assert stats["reclaim_syncs"] == 0, "the pool synchronized the device"
    assert held["graph_bytes"] >= TEMP_BYTES, held
    assert after["graph_bytes"] == 0, after


def test_graph_bytes_come_back_after_the_graph_is_destroyed(cupy, kernels):
    """20 rounds of capture (a 40 MiB temporary from the pool), launch, destroy, device sync,
    one ordinary allocation: every round's temporary must come back once its graph is gone, so
    the pool stays below 4x its size after the first round. Before the fix each capture's
    cached temporary stayed reserved for its (dead) capture and every round grew the pool by
    40 MiB."""
    pool = StreamOrderedPoolMemoryResource(
        rmm.mr.CudaAsyncMemoryResource(), initial_pool_size=POOL_BYTES
    )
    s = cupy.cuda.Stream(non_blocking=True)
    q = rs(cupy.cuda.Stream(non_blocking=True))
    launch = cupy.zeros(1, dtype=cupy.uint32)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    cupy.cuda.Device().synchronize()
    rounds, sizes = 20, []
    for _ in range(rounds):
        graph, _tmp = _capture_temporary(cupy, kernels, pool, s, launch, errors)
        graph.launch(stream=s)
        s.synchronize()
        sizes.append(pool.pool_size())
        del graph
        cupy.cuda.Device().synchronize()
        p = pool.allocate(1 * MiB, q)  # one ordinary allocation after the graph's death
        pool.deallocate(p, 1 * MiB, q)
    after = _stats_once_graphs_died(pool, q)
    print(f"\n{rounds} capture/launch/destroy rounds: pool sizes {sizes}, {after}")
    assert int(errors.get()[0]) == 0 and int(launch.get()[0]) == rounds
    assert max(sizes) < 4 * sizes[0], f"the pool grew from {sizes[0]} to {max(sizes)} bytes"
    assert after["reclaim_syncs"] == 0, "the pool synchronized the device"
    assert after["graph_bytes"] == 0, after


# ---- another thread's global-mode capture ------------------------------------------------


@contextlib.contextmanager
def _global_capture_elsewhere(cupy, kernels, rng, count=1 << 20):
    """``with _global_capture_elsewhere(...) as out:`` while the block runs, another thread
    holds a global-mode capture open on its own stream, with one kernel captured
    (``y = 2.5 x + 1`` on float32). On leaving the block the capture ends, the graph runs once
    and ``out`` holds ``"y"`` (what it computed) and ``"reference"`` (float64), or ``"error"``
    (e.g. the capture invalidated by a call made in the block). Order: capture begun -> block
    -> capture ends."""
    x_host = rng.standard_normal(count, dtype=np.float32)
    x = cupy.asarray(x_host)
    y = cupy.zeros(count, dtype=cupy.float32)
    cs = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    begun, finish, out = threading.Event(), threading.Event(), {}

    def capture():
        try:
            cs.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeGlobal)
            try:
                kernels.scale_add(x, y, 2.5, 1.0, cs)
            finally:
                begun.set()
                finish.wait(60)
                graph = cs.end_capture()  # raises if a call elsewhere invalidated the capture
            graph.launch(stream=cs)
            cs.synchronize()
            out["y"] = y.get(stream=cs)
        except Exception as exc:  # reported by the test
            out["error"] = exc
            begun.set()

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    try:
        assert begun.wait(60), "the capturing thread did not begin its capture"
        assert "error" not in out, f"could not begin the capture: {out['error']!r}"
        yield out
    finally:
        finish.set()
        thread.join(60)
        if thread.is_alive():
            from helpers.threads import dump_stacks

            dump_stacks("the capturing thread is still running after 60 s")
    assert not thread.is_alive()
    out["reference"] = x_host.astype(np.float64) * 2.5 + 1.0


def _assert_capture_survived(out):
    assert "error" not in out, f"the other thread's global-mode capture failed: {out['error']!r}"
    np.testing.assert_allclose(out["y"], out["reference"], rtol=1e-6, atol=1e-6)


#: Orphans for the global-capture tests: 120 streams (past their young frees) of 320 KiB
#: dropped without retire_stream (37.5 MiB of the 64 MiB pool), then 150 streams of 256
#: bytes, whose new slots make the sweeps that retire the first 120 (a slot is retired at the
#: second sweep after its last use; a sweep comes every 64 new slots). The shared list keeps
#: about 26.5 MiB.
ORPHAN_STREAMS, ORPHAN_BYTES, FILLER_STREAMS = 120, 320 << 10, 150
#: More than the shared list holds, less than the orphans: the request that used to reclaim
#: the orphans through a device synchronization.
MISS_BYTES = 32 * MiB


def _pool_with_orphans(cupy):
    pool = StreamOrderedPoolMemoryResource(
        rmm.mr.CudaAsyncMemoryResource(), initial_pool_size=POOL_BYTES
    )
    _streams_per_task(cupy, pool, ORPHAN_STREAMS, ORPHAN_BYTES, grown_up=True)
    _streams_per_task(cupy, pool, FILLER_STREAMS, 256)
    cupy.cuda.Device().synchronize()
    return pool


def test_a_miss_with_orphans_keeps_another_threads_global_capture(cupy, kernels, rng, scenarios):
    """Orphans hold more than a quarter of the pool; while another thread holds a global-mode
    capture (a kernel captured), this thread allocates more than the shared list holds on a new
    stream. Before the fix the pool synchronized the device to reclaim the orphans, and the
    other thread's end_capture raised cudaErrorStreamCaptureInvalidated. The capture must end,
    its graph compute y = 2.5 x + 1, and the allocation succeed."""
    pool = _pool_with_orphans(cupy)
    before = pool.stats
    t = cupy.cuda.Stream(non_blocking=True)
    rt = rs(t)
    failure, p = None, None
    with _global_capture_elsewhere(cupy, kernels, rng) as out:
        try:
            p = pool.allocate(MISS_BYTES, rt)  # only pool calls here: no CuPy allocation
        except Exception as exc:  # reported below, after the capture's outcome
            failure = exc
    stats = pool.stats
    print(f"\nmiss with orphans beside a global capture: before {before}, after {stats}")
    _assert_capture_survived(out)
    assert failure is None, f"the allocation failed: {failure!r}"
    errors = cupy.zeros(1, dtype=cupy.uint64)
    scenarios.fill(p, MISS_BYTES // 4, 77, t)  # the block is usable
    scenarios.check(p, MISS_BYTES // 4, 77, errors, t)
    t.synchronize()
    assert int(errors.get()[0]) == 0
    pool.deallocate(p, MISS_BYTES, rt)
    assert stats["reclaim_syncs"] == 0, "the pool synchronized the device"
    # the scenario reached what it is about: orphans held the request and a quarter of the pool
    orphans = before["orphan_bytes"]
    assert orphans >= MISS_BYTES and 4 * orphans >= before["pool_bytes"], before


def test_release_keeps_another_threads_global_capture(cupy, kernels, rng):
    """``release()`` while another thread holds a global-mode capture: before the fix it
    synchronized the device and invalidated that capture. It must return only what needs no
    device synchronization, and the capture must end and compute its result."""
    pool = _pool_with_orphans(cupy)
    m = rs(cupy.cuda.Stream(non_blocking=True))
    held = pool.allocate(4 * MiB, m)  # a live block too
    size_before = pool.pool_size()
    failure, returned = None, None
    with _global_capture_elsewhere(cupy, kernels, rng) as out:
        try:
            returned = pool.release()
        except Exception as exc:  # reported below, after the capture's outcome
            failure = exc
        size_after = pool.pool_size()
    stats = pool.stats
    print(f"\nrelease beside a global capture: returned {returned}, {stats}")
    _assert_capture_survived(out)
    assert failure is None, f"release() raised: {failure!r}"
    assert isinstance(returned, int) and size_after == size_before - returned
    assert stats["reclaim_syncs"] == 0, "release() synchronized the device during a capture"
    pool.deallocate(held, 4 * MiB, m)


def test_out_of_memory_keeps_another_threads_global_capture(cupy, kernels, rng):
    """An allocation that cannot fit (``maximum_pool_size`` 16 MiB, 12 MiB live) while another
    thread holds a global-mode capture must raise ``MemoryError`` without invalidating that
    capture (before the fix, the reclaim before out-of-memory synchronized the device)."""
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaAsyncMemoryResource(), "16MiB", "16MiB")
    m = rs(cupy.cuda.Stream(non_blocking=True))
    t = rs(cupy.cuda.Stream(non_blocking=True))
    held = pool.allocate(12 * MiB, m)
    raised = None
    with _global_capture_elsewhere(cupy, kernels, rng) as out:
        try:
            p = pool.allocate(8 * MiB, t)
            pool.deallocate(p, 8 * MiB, t)
        except Exception as exc:  # checked below, after the capture's outcome
            raised = exc
    stats = pool.stats
    print(f"\nout of memory beside a global capture: {raised!r}, {stats}")
    _assert_capture_survived(out)
    assert isinstance(raised, MemoryError), f"expected MemoryError, got {raised!r}"
    assert stats["reclaim_syncs"] == 0, "the pool synchronized the device"
    assert pool.pool_size() <= 16 * MiB
    pool.deallocate(held, 12 * MiB, m)


# ---- a hazard seen in a child process ------------------------------------------------------


def _child_release_while_a_graph_lives():
    """Run in a child process (``test_release_keeps_a_live_graphs_temporary``): over
    ``CudaMemoryResource``, a graph's temporary lives in the pool's only chunk; ``release()``
    must keep that chunk. Before the fix it went back to cudaFree: another cudaMalloc may get
    its bytes (the relaunch overwrites them) or the relaunch writes unmapped memory (error
    700, which ends the CUDA context: hence the child process). Prints JSON reports, the last
    one complete."""
    import json

    import cupy

    from rmm_fences._scenarios import as_array

    kernels = _Kernels(cupy)
    upstream = rmm.mr.CudaMemoryResource()
    pool = StreamOrderedPoolMemoryResource(upstream, initial_pool_size=POOL_BYTES)
    s, other, ro, launch, errors, graph, tmp = _launched_graph(cupy, kernels, pool)

    report = {"released": int(pool.release()), "pool_size_after_release": pool.pool_size()}
    report["graph_bytes"] = pool.stats.get("graph_bytes")
    # Another user of the upstream: cudaMalloc may hand out the bytes release() returned.
    victim = upstream.allocate(TEMP_BYTES, ro)
    host = np.random.default_rng(2027).standard_normal(TEMP_COUNT, dtype=np.float32)
    view = as_array(victim, TEMP_COUNT, np.float32)
    view.set(host, stream=other)
    other.synchronize()
    report["victim_overlap"] = _overlap(victim, tmp, TEMP_BYTES)
    print(json.dumps(report), flush=True)  # in case the launch ends the process
    try:
        graph.launch(stream=s)
        s.synchronize()
        got = view.get(stream=other).astype(np.float64)
        report["corrupted"] = int(np.count_nonzero(got != host.astype(np.float64)))
        report["graph_errors"] = int(errors.get()[0])
        report["launches"] = int(launch.get()[0])
    except Exception as exc:
        report["launch_error"] = repr(exc)
        print(json.dumps(report), flush=True)
        return
    upstream.deallocate(victim, TEMP_BYTES, ro)
    del graph
    cupy.cuda.Device().synchronize()
    after = _stats_once_graphs_died(pool, ro)
    report["graph_bytes_after_destroy"] = after.get("graph_bytes")
    report["released_after_destroy"] = int(pool.release())
    report["pool_size_final"] = pool.pool_size()
    print(json.dumps(report), flush=True)


_CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("pool_graphs_child", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module._child_release_while_a_graph_lives()
"""


def test_release_keeps_a_live_graphs_temporary(json_child):
    """``release()`` while a graph whose temporary came from the pool still exists must not
    return that temporary's chunk to the upstream; the graph's next launch must neither fault
    nor overwrite the memory the upstream handed to someone else. After the graph is destroyed
    (and the device synchronized), ``release()`` returns the whole pool."""
    rc, report, out, err = json_child(_CHILD, __file__)
    print(f"\nrelease while a graph lives (child): exit {rc}, {report}")
    assert report is not None, f"child exit {rc}\n{out}\n{err[-4000:]}"
    assert "launch_error" in report or "corrupted" in report, (
        f"the child ended before the graph's launch after release() completed: exit {rc}, "
        f"{report}\n{err[-4000:]}"
    )
    assert "launch_error" not in report, (
        f"the graph's launch after release() failed (its temporary went back upstream): "
        f"{report}\n{err[-4000:]}"
    )
    assert report["corrupted"] == 0, (
        f"the graph's launch after release() overwrote {report['corrupted']} floats of memory "
        f"the upstream handed out again: {report}"
    )
    assert report["victim_overlap"] == 0, report
    assert report["graph_errors"] == 0 and report["launches"] == 2, report
    assert report["pool_size_after_release"] >= TEMP_BYTES, report
    assert rc == 0, f"child exit {rc}\n{out}\n{err[-4000:]}"
    assert report["graph_bytes"] >= TEMP_BYTES, report
    assert report["graph_bytes_after_destroy"] == 0, report
    assert report["pool_size_final"] == 0, report
