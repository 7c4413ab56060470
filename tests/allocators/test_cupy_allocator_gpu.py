# SPDX-License-Identifier: Apache-2.0
"""CupyAllocator when an array outlives the stream it was allocated on (the pattern of CuPy's
own ``cuda_tests/test_stream.py::TestStream::test_del_default``): CuPy destroys a stream when
its last reference dies; the free of the array must not use the destroyed handle.

Each chain runs in a child process, so a segmentation fault is seen as a crash exit code.
"""

import pytest

pytestmark = pytest.mark.gpu

SETUP = """
import gc, json, sys
import numpy as np, cupy, rmm, rmm_fences
from rmm_fences.allocators.cupy import CupyAllocator

chain = sys.argv[1]
pool = rmm_fences.StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
if chain == "pool":
    mr = pool
elif chain == "sync_on_free":
    mr = rmm_fences.SyncOnFreeResourceAdaptor(pool, mode="deferred")
elif chain == "tracking":
    mr = rmm_fences.HazardTrackingResourceAdaptor(pool, on_hazard="record")
if chain == "rmm_cupy_allocator":  # rmm's own allocator over rmm's own CudaAsync (the control)
    from rmm.allocators.cupy import rmm_cupy_allocator
    rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())
    cupy.cuda.set_allocator(rmm_cupy_allocator)
else:
    cupy.cuda.set_allocator(CupyAllocator(mr))
bad = []
"""

REPORT = """
cupy.cuda.Device().synchronize()
if chain == "sync_on_free":
    mr.flush()
hazards = len(mr.hazards) if chain == "tracking" else None
print(json.dumps({"chain": chain, "trials": trials, "bad": bad, "hazards": hazards}))
"""

OUTLIVING = """
rng = np.random.default_rng(2024)
trials = 20
for trial in range(trials):
    n = int(rng.integers(1000, 1 << 20))
    host = rng.random(n) + 0.5  # float64, no zeros
    stream = cupy.cuda.Stream().use()  # CuPy's check_del(null=False, ptds=False)
    assert stream is cupy.cuda.get_current_stream()
    x = cupy.asarray(host)
    y = x * 2.0 + 1.0
    del stream  # the current-stream slot still holds it
    cupy.cuda.Stream.null.use()  # its last reference dies: CuPy destroys the stream
    got = (float(x.sum()), float(y.sum()))
    ref = (float(host.sum()), float((host * 2.0 + 1.0).sum()))
    if not np.allclose(got, ref, rtol=1e-9, atol=0.0):
        bad.append((trial, got, ref))
    del x, y  # freed on the stream they were allocated on
    gc.collect()
"""

CYCLE = """
rng = np.random.default_rng(7)
trials = 50
gc.disable()  # collect only where the test says, as a test suite's collector would
for trial in range(trials):
    n = int(rng.integers(1000, 1 << 20))
    host = rng.random(n) + 0.5  # float64, no zeros
    stream = cupy.cuda.Stream(non_blocking=True)  # created first: finalized first
    with stream:
        x = cupy.asarray(host)
        y = cupy.sqrt(x) * 3.0 + x
        got = (float(x.sum()), float(y.sum()))
    ref = (float(host.sum()), float((np.sqrt(host) * 3.0 + host).sum()))
    if not np.allclose(got, ref, rtol=1e-9, atol=0.0):
        bad.append((trial, got, ref))
    # An exception's traceback holding the stream and the arrays makes the same cycle
    # (CuPy's cuda_tests/test_graph.py failure tests under pytest.raises).
    cycle = {"stream": stream, "arrays": [x, y]}
    cycle["self"] = cycle
    del stream, x, y, cycle
    if trial % 5 == 4:
        gc.collect()  # Stream.__del__ may destroy the stream before the arrays' frees
gc.collect()
gc.enable()
"""


def run_child(json_child, body, chain, what):
    """Runs SETUP + body + REPORT for ``chain`` in a child process (a crash is an exit code)."""
    rc, report, out, err = json_child(SETUP + body + REPORT, chain)
    print(f"\nCupyAllocator over {chain}, {what}: exit {rc}, {report}")
    assert rc == 0, f"child exit {rc}\n{out}\n{err[-4000:]}"
    assert report is not None
    return report


@pytest.mark.parametrize("chain", ["pool", "sync_on_free", "tracking"])
def test_array_outliving_its_stream_is_freed_safely(json_child, chain):
    report = run_child(json_child, OUTLIVING, chain, "arrays outliving their stream")
    assert report["trials"] == 20
    assert report["bad"] == []  # every sum matched its float64 reference


@pytest.mark.parametrize("chain", ["pool", "sync_on_free", "tracking"])
def test_stream_and_arrays_dying_in_one_reference_cycle(json_child, chain):
    """The cyclic collector runs ``__del__`` in any order; the stream may be destroyed before
    the arrays allocated on it are freed. Before the fix this crashed (SIGSEGV in the driver,
    freeing on a destroyed stream), as CuPy's test_graph.py did under every chain."""
    report = run_child(json_child, CYCLE, chain, "stream and arrays in one cycle")
    assert report["trials"] == 50
    assert report["bad"] == []
    if chain == "tracking":
        assert report["hazards"] == 0


def test_rmm_cupy_allocator_frees_on_the_destroyed_stream(json_child):
    """The control of the cycle test: rmm's ``rmm_cupy_allocator`` over rmm's CudaAsync (no
    rmm_fences in the process's allocations) frees an array on a stream the collector destroyed
    first, and the child crashes, as it did under every chain in CuPy's test_graph.py. When rmm
    fixes it this test fails: then docs/compatibility.md's advice against it can go."""
    rc, report, out, err = json_child(SETUP + CYCLE + REPORT, "rmm_cupy_allocator")
    print(f"\nrmm_cupy_allocator over cuda_async, stream and arrays in one cycle: exit {rc}")
    assert rc != 0 and report is None, f"rmm's allocator survived the cycle: {report}"
