# SPDX-License-Identifier: Apache-2.0
"""CuPy's CUB max (``core_tests/test_ndarray_reduction.py::TestCubReduction::test_cub_max``)
reduced to its essence: a full-array ``max`` through CUB's DeviceReduce, whose input is freed
while the reduction may still be running, and whose memory the next array, filled on another
stream with values larger than any input, may take at once.

An allocator that hands the block to the other stream without ordering it after the reduction
lets the fill overwrite the input under CUB: the max comes back as the fill value (or garbage),
the wrong results once reported through ``rmm_cupy_allocator`` over the pool. A spin kernel
queued before each reduction keeps it in flight while the other stream fills. The naive cache
(no fences) is the control that shows the check sees the overwrite; the pool and the tracker
around it must match the float64 reference in every trial. Each case runs in a child process.
"""

import pytest

pytestmark = pytest.mark.gpu

CHILD = r"""
import json, sys
import numpy as np, cupy, rmm, rmm_fences
from cupy._core import _accelerator
from rmm_fences.unsafe import NaiveCachingMemoryResource

allocator, chain = sys.argv[1], sys.argv[2]
if chain == "naive_cache":
    mr = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
else:
    mr = rmm_fences.StreamOrderedPoolMemoryResource(rmm.mr.CudaAsyncMemoryResource())
    if chain == "tracking":
        mr = rmm_fences.HazardTrackingResourceAdaptor(mr, on_hazard="record")
if allocator == "CupyAllocator":
    from rmm_fences.allocators.cupy import CupyAllocator
    cupy.cuda.set_allocator(CupyAllocator(mr))
else:
    from rmm.allocators.cupy import rmm_cupy_allocator
    rmm.mr.set_current_device_resource(mr)
    cupy.cuda.set_allocator(rmm_cupy_allocator)
_accelerator.set_reduction_accelerators(["cub"])
_accelerator.set_routine_accelerators(["cub"])

spin = cupy.RawKernel(
    'extern "C" __global__ void spin(long long cycles) {'
    "  long long t0 = clock64(); while (clock64() - t0 < cycles) {} }",
    "spin",
)
cycles = np.int64(cupy.cuda.Device().attributes["ClockRate"])  # kHz: the cycles of ~1 ms
reducer = cupy.cuda.Stream(non_blocking=True)
filler = cupy.cuda.Stream(non_blocking=True)  # not ordered after `reducer`
rng = np.random.default_rng(11)
shapes = [(1 << 22,), (1024, 4099), (64, 129, 513)]  # test_cub_max's 1-3 dimensions, larger
trials, bad, checked = 24, [], 0
for trial in range(trials):
    shape = shapes[trial % len(shapes)]
    order = "CF"[(trial // len(shapes)) % 2]
    host = rng.standard_normal(shape) * 10.0 + 1.0  # float64, signs mixed, no zeros
    ref = float(host.max())
    with reducer:
        x = cupy.asarray(host.astype(np.float32), order=order)
        spin((1,), (1,), (cycles,))  # the reduction waits behind ~1 ms of work
        m = x.max()  # CUB DeviceReduce; its temp storage is freed as soon as it is queued
        del x  # free while in flight: the input block goes back on `reducer`
    with filler:
        y = cupy.full(shape, 1e30, dtype=cupy.float32)  # may take x's block at once
    got = float(m.get(stream=reducer))
    filler.synchronize()
    checked += 1
    if got != float(np.float32(ref)):
        bad.append((trial, list(shape), order, got, ref))
    del y, m
cupy.cuda.Device().synchronize()
hazards = len(mr.hazards) if chain == "tracking" else None
print(json.dumps({"trials": checked, "bad": bad[:3], "bad_count": len(bad), "hazards": hazards}))
"""


def run_child(json_child, allocator, chain):
    rc, report, out, err = json_child(CHILD, allocator, chain)
    print(f"\nCUB max through {allocator} over {chain}: exit {rc}, {report}")
    assert rc == 0, f"child exit {rc}\n{out}\n{err[-4000:]}"
    assert report is not None and report["trials"] == 24
    return report


@pytest.mark.parametrize("allocator", ["CupyAllocator", "rmm_cupy_allocator"])
def test_cub_max_with_its_input_freed_in_flight_matches_float64(json_child, allocator):
    for chain in ("pool", "tracking"):
        report = run_child(json_child, allocator, chain)
        assert report["bad_count"] == 0, report["bad"]
        if chain == "tracking":
            assert report["hazards"] == 0


@pytest.mark.parametrize("allocator", ["CupyAllocator", "rmm_cupy_allocator"])
def test_the_naive_cache_shows_the_overwrite(json_child, allocator):
    """The control: without fences the other stream's fill lands under the reduction."""
    report = run_child(json_child, allocator, "naive_cache")
    assert report["bad_count"] > 0, "the check did not see the overwrite it exists for"
