# SPDX-License-Identifier: Apache-2.0
"""VmmPoolMemoryResource on a real GPU: the stream-ordered pool over device pages it maps
itself. Scenarios that could unmap pages under a running kernel (error 700, the context lost)
run in a child process (helpers/vmm_pool_child.py)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import rmm

from rmm_fences import VmmPoolMemoryResource

from helpers.children import child_env
from helpers.paths import VMM_POOL_CHILD

pytestmark = pytest.mark.gpu
MIB = 1 << 20


def rs(s):
    return rmm.pylibrmm.stream.Stream(s)


def child(*args, timeout=600):
    res = subprocess.run(
        [sys.executable, "-P", str(VMM_POOL_CHILD), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
    )
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    return res, (json.loads(lines[-1]) if lines else None)


def test_a_growth_maps_fresh_pages_while_freed_ones_are_still_read():
    res, report = child("in_flight")
    print(f"\nvmm_pool in flight: exit {res.returncode}, {report}")
    assert report is not None, res.stdout + res.stderr
    assert report["error"] is None, res.stderr
    assert report["busy_at_growth"], "the kernel ended before the growth: nothing was tested"
    # 16 MiB freed but still read + a 64 KiB block's 2 MiB page + 32 MiB grown fresh
    assert report["held_while_busy"] == 50 * MIB
    assert np.isclose(report["sum"], report["reference"], rtol=1e-9)
    assert report["errors"] == 0
    # once read, the freed 16 MiB back the next growth (16 MiB mapped below the free 32 MiB
    # at the top): no more pages held (without the unmap: 66 MiB)
    assert report["held_after"] == report["held_while_busy"]
    assert res.returncode == 0


def test_threads_and_streams_with_real_kernels_while_pages_are_recycled():
    res, report = child("threads")
    print(f"\nvmm_pool 8 threads x 8 streams: exit {res.returncode}, {report}")
    assert report is not None, res.stdout + res.stderr
    assert report["error"] is None and report["failures"] == [], res.stderr
    assert report["errors"] == 0
    assert report["stats"]["current_bytes"] == 0
    assert res.returncode == 0


@pytest.mark.parametrize("pool", ["vmm_pool", "pool"])
def test_a_graph_outlives_its_pool(pool):
    """A block freed during a capture stays the graph's after the pool is destroyed: the pool
    leaves its chunk (its pages, mapped) for the graph's later launches, which neither fault
    nor overwrite memory handed out since."""
    res, report = child("graph_outlives_pool", pool)
    print(f"\n{pool}: graph launched after the pool went: exit {res.returncode}, {report}")
    assert report is not None, res.stdout + res.stderr
    assert report["error"] is None, res.stderr
    assert report["errors"] == 0 and report["victim_ok"]
    assert res.returncode == 0


def test_free_blocks_merge_across_growths(cupy, scenarios):
    pool = VmmPoolMemoryResource()
    s = cupy.cuda.Stream(non_blocking=True)
    a = pool.allocate(3 * MIB, rs(s))  # 4 MiB mapped (2 MiB pages)
    pool.deallocate(a, 3 * MIB, rs(s))
    b = pool.allocate(6 * MIB, rs(s))  # the free 4 MiB at the top and 2 MiB more
    assert b == a
    assert pool.pool_size() == pool.physical_bytes() == 6 * MIB
    errors = cupy.zeros(1, dtype=cupy.uint64)
    scenarios.fill(b, 6 * MIB // 4, pattern=3, stream=s)
    scenarios.check(b, 6 * MIB // 4, pattern=3, errors=errors, stream=s)
    s.synchronize()
    assert int(errors.get()[0]) == 0
    pool.deallocate(b, 6 * MIB, rs(s))


def test_release_gives_the_pages_back_to_the_device(cupy):
    pool = VmmPoolMemoryResource()
    s = cupy.cuda.Stream(non_blocking=True)
    a = pool.allocate(256 * MIB, rs(s))
    s.synchronize()
    free_while_held = cupy.cuda.runtime.memGetInfo()[0]
    pool.deallocate(a, 256 * MIB, rs(s))
    assert pool.synchronize_and_reclaim()
    assert pool.release() == 256 * MIB
    assert pool.physical_bytes() == 0 and pool.pool_size() == 0
    assert cupy.cuda.runtime.memGetInfo()[0] >= free_while_held + 255 * MIB


def test_as_current_device_resource_with_cupy(cupy, rng, current_resource):
    from rmm.allocators.cupy import rmm_cupy_allocator

    pool = VmmPoolMemoryResource()
    previous_cupy = cupy.cuda.get_allocator()
    rmm.mr.set_current_device_resource(pool)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        host = rng.standard_normal((512, 1024))
        x = cupy.asarray(host)
        for _ in range(20):  # temporaries freed and reused between kernels, growths
            y = cupy.tanh(x) @ x.T
            x = x + 1e-3 * y[:, :1]
        got = cupy.asnumpy(x)
        del x, y
    finally:
        cupy.cuda.set_allocator(previous_cupy)
    cupy.cuda.Device().synchronize()
    want = host.copy()
    for _ in range(20):
        y = np.tanh(want) @ want.T
        want = want + 1e-3 * y[:, :1]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert pool.stats["current_bytes"] == 0


def test_allocate_and_free_inside_stream_capture(cupy, scenarios):
    pool = VmmPoolMemoryResource()
    s = cupy.cuda.Stream(non_blocking=True)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    s.begin_capture()
    a = pool.allocate(3 * MIB, rs(s))  # a growth in capture: pages mapped, no stream work
    scenarios.fill(a, 3 * MIB // 4, pattern=13, stream=s)
    scenarios.check(a, 3 * MIB // 4, pattern=13, errors=errors, stream=s)
    pool.deallocate(a, 3 * MIB, rs(s))
    graph = s.end_capture()
    for _ in range(3):
        graph.launch(stream=s)
    s.synchronize()
    assert int(errors.get()[0]) == 0


def test_maximum_pool_size_bounds_the_pages_held(cupy):
    pool = VmmPoolMemoryResource(maximum_pool_size="16MiB")
    s = rs(cupy.cuda.Stream(non_blocking=True))
    a = pool.allocate(12 * MIB, s)
    with pytest.raises(MemoryError):
        pool.allocate(8 * MIB, s)
    pool.deallocate(a, 12 * MIB, s)
    b = pool.allocate(16 * MIB, s)  # the free 12 MiB at the top and 4 MiB more
    pool.deallocate(b, 16 * MIB, s)
    assert pool.physical_bytes() <= 16 * MIB


def test_bad_frees_are_refused(cupy):
    pool = VmmPoolMemoryResource()
    s = rs(cupy.cuda.Stream(non_blocking=True))
    a = pool.allocate(MIB, s)
    with pytest.raises(ValueError, match="size mismatch"):
        pool.deallocate(a, MIB + 1, s)
    pool.deallocate(a, MIB, s)
    with pytest.raises(ValueError, match="double free"):
        pool.deallocate(a, MIB, s)
    assert pool.stats["rejected_frees"] == 2


def synchronize_relaxed(stream):
    """``stream.synchronize()`` from a thread in relaxed capture mode: the test's own wait,
    which a global-mode capture in another thread would otherwise refuse (the pool's calls run
    in the caller's mode, and must not need this)."""
    from cuda.bindings import runtime as cudart

    relaxed = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
    err, previous = cudart.cudaThreadExchangeStreamCaptureMode(relaxed)
    assert err == cudart.cudaError_t.cudaSuccess, err
    try:
        stream.synchronize()
    finally:
        cudart.cudaThreadExchangeStreamCaptureMode(previous)


def test_a_global_capture_in_another_thread_survives_growths_that_unmap(
    cupy, scenarios, capture_elsewhere
):
    """While another thread holds a global-mode capture, growths map pages and unmap the pages
    of finished frees (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, fence queries):
    none may invalidate the other thread's capture."""
    pool = VmmPoolMemoryResource()
    s = cupy.cuda.Stream(non_blocking=True)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    with capture_elsewhere() as result:
        for i, mib in enumerate((4, 16, 8, 64, 32, 128)):
            keep = pool.allocate(64 << 10, rs(s))  # a live block above: no growth at the top
            a = pool.allocate(mib * MIB, rs(s))
            scenarios.fill(a, mib * MIB // 4, i + 1, s)
            scenarios.check(a, mib * MIB // 4, i + 1, errors, s)
            pool.deallocate(a, mib * MIB, rs(s))
            pool.retire_stream(s)  # shared behind a fence, which completes
            synchronize_relaxed(s)
            pool.deallocate(keep, 64 << 10, rs(s))
    print(f"\nvmm_pool with a global capture elsewhere: {pool.stats}, capture: {result}")
    assert "error" not in result, f"the other thread's capture failed: {result['error']!r}"
    assert result["errors"] == 0
    assert int(errors.get()[0]) == 0


def view(cupy, ptr, nbytes):
    """A float64 CuPy array over ``nbytes`` of pool memory at ``ptr``."""
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
    return cupy.ndarray((nbytes // 8,), dtype=np.float64, memptr=cupy.cuda.MemoryPointer(mem, 0))


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_remap_time_fraction_decides_whether_pages_move(cupy, rng, fraction):
    """Two finished 8 MiB blocks between live 2 MiB ones, then a 16 MiB request on another
    stream with the peak in use not rising: at 1 their pages move to back it, at 0 the pool
    maps fresh pages instead. Either way the live blocks keep their data and the new block
    holds what a kernel wrote (checked against a float64 reference)."""
    pool = VmmPoolMemoryResource(remap_time_fraction=fraction)
    assert pool.remap_time_fraction == fraction
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    blocks = []
    for nbytes in (8 * MIB, 2 * MIB, 8 * MIB, 2 * MIB):
        blocks.append((pool.allocate(nbytes, rs(s1)), nbytes))
    kept = {}
    with s1:
        for ptr, nbytes in blocks:
            host = rng.standard_normal(nbytes // 8)
            view(cupy, ptr, nbytes)[:] = cupy.asarray(host)
            kept[ptr] = host
    for ptr, nbytes in blocks[0::2]:
        pool.deallocate(ptr, nbytes, rs(s1))
    pool.retire_stream(rs(s1))  # fenced and shared
    s1.synchronize()  # their work done: a query finds the fences complete
    held = pool.physical_bytes()
    c = pool.allocate(16 * MIB, rs(s2))
    host = rng.standard_normal(2 * MIB)
    with s2:
        got = float(cupy.tanh(cupy.asarray(host)).sum())
        view(cupy, c, 16 * MIB)[:] = cupy.tanh(cupy.asarray(host))
        total = float(view(cupy, c, 16 * MIB).sum())
    s2.synchronize()
    want = float(np.tanh(host).sum())
    assert np.isclose(got, want, rtol=1e-9) and np.isclose(total, want, rtol=1e-9)
    for ptr, nbytes in blocks[1::2]:
        np.testing.assert_array_equal(cupy.asnumpy(view(cupy, ptr, nbytes)), kept[ptr])
    stats = pool.stats
    if fraction == 1.0:
        assert stats["remapped_bytes"] == 16 * MIB and stats["remap_ns"] > 0
        assert pool.physical_bytes() == held
    else:
        assert stats["remapped_bytes"] == 0 and stats["remap_ns"] == 0
        assert pool.physical_bytes() == held + 16 * MIB
    pool.deallocate(c, 16 * MIB, rs(s2))
    for ptr, nbytes in blocks[1::2]:
        pool.deallocate(ptr, nbytes, rs(s1))
