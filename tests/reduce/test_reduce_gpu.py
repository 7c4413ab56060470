# SPDX-License-Identifier: Apache-2.0
"""The CUB temp-storage loop end to end on a GPU: CUB DeviceReduce through cuda.compute with its
temp storage from every chain, checked against float64 (or exact integer) references."""

import numpy as np
import pytest
import rmm

from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
)
from rmm_fences.unsafe import NaiveCachingMemoryResource

from helpers.reduce_cases import (
    ALL_CHAINS,
    BOUND,
    DTYPES,
    check_sum,
    fresh,
    lowest,
    make_chain,
)

pytestmark = pytest.mark.gpu

SIZES = (0, 1, 1023, (1 << 20) + 7, 64 << 20)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chain", ALL_CHAINS)
def test_sum_and_max_match_the_reference(cupy, reduce_mod, rng, chain, dtype):
    mr = make_chain(chain)
    stream = cupy.cuda.Stream(non_blocking=True)
    for n in SIZES:
        poison = cupy.nan if dtype.startswith("float") else BOUND[dtype] + 1  # never the max
        out = cupy.full(1, poison, dtype=dtype)
        x = fresh(cupy, n, dtype, rng)
        total = reduce_mod.device_sum(x, mr=mr, stream=stream)
        reduce_mod.device_reduce(
            x, out, "max", np.array(lowest(dtype), dtype=dtype), mr=mr, stream=stream
        )
        stream.synchronize()
        check_sum(total.item(), x, dtype)
        assert total.shape == () and total.dtype == np.add.reduce(np.zeros(1, dtype)).dtype
        expected_max = x.max().item() if n else lowest(dtype)
        assert out.item() == expected_max, (chain, dtype, n)
        del x
    if chain.startswith("tracking("):
        mr.check()
        assert mr.hazards == [] and mr.allocated_bytes == 0
        # ... and it saw every temp-storage block: each free was looked up and checked
        stats = mr.stats
        assert stats["allocations"] >= 2 * (len(SIZES) - 1), stats
        assert stats["deallocations"] == stats["allocations"] and stats["rejected_frees"] == 0


@pytest.mark.parametrize(
    "chain", ["rmm_fences_pool", "sync_on_free_deferred(naive_cache)", "tracking(rmm_fences_pool)"]
)
@pytest.mark.parametrize("through", ["device_sum", "ReducePlan"])
def test_1000_back_to_back_reduces_on_two_streams(cupy, reduce_mod, rng, chain, through):
    mr = make_chain(chain)
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    calls, n = 1000, 1 << 18
    data = fresh(cupy, calls * n, "float32", rng).reshape(calls, n)
    outs = cupy.full(calls, cupy.nan, dtype=cupy.float32)
    if through == "ReducePlan":  # one plan per stream, made once
        plans = [
            reduce_mod.ReducePlan(data[0], outs[:1], "sum", 0.0, mr=mr, stream=s) for s in streams
        ]
        sums = [lambda x, out, plan=plan: plan(x, out) for plan in plans]
    else:
        sums = [lambda x, out, s=s: reduce_mod.device_sum(x, out, mr=mr, stream=s) for s in streams]
    cupy.cuda.Device().synchronize()
    for i in range(calls):
        sums[i % 2](data[i], outs[i : i + 1])
    for s in streams:
        s.synchronize()
    ref = data.astype(cupy.float64).sum(axis=1)
    np.testing.assert_allclose(outs.get(), ref.get(), rtol=1e-4)
    if chain.startswith("tracking("):
        mr.check()
        stats = mr.stats
        assert stats["allocations"] == stats["deallocations"] >= calls, stats
        assert mr.hazards == []


def test_the_tracker_sees_the_temp_storage_freed_in_flight(cupy, scenarios, reduce_mod, rng):
    """The control of the tracker's empty reports above: over the naive cache, the loop's
    free of the temp storage right after the launch, behind a slow kernel on the same stream,
    is reported as freed_in_flight (and the sum is still right: same-stream reuse only)."""
    mr = HazardTrackingResourceAdaptor(
        NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()), on_hazard="record"
    )
    stream = cupy.cuda.Stream(non_blocking=True)
    x = fresh(cupy, (1 << 20) + 7, "float64", rng)
    busy = fresh(cupy, 1 << 16, "float32", rng)
    sink = cupy.zeros(1, dtype=cupy.float64)
    total = cupy.empty(1, dtype=cupy.float64)
    # The reduction's first call compiles it, which can outlast any spin: build it first.
    reduce_mod.device_sum(x, total, mr=rmm.mr.CudaMemoryResource(), stream=stream)
    cupy.cuda.Device().synchronize()
    # Nothing between the spin and the free may synchronize the device: the output is made
    # before, and CuPy allocates from its own pool (a process that imported cuDF has CuPy on
    # rmm_cupy_allocator over cudaMalloc/cudaFree, which wait for the whole device).
    with cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc):
        scenarios.slow_checksum(busy.data.ptr, busy.size, 200, sink, stream)  # the stream is busy
        reduce_mod.device_sum(x, total, mr=mr, stream=stream)
        busy_after_the_free = not stream.done
    stream.synchronize()
    check_sum(total[0].item(), x, "float64")
    assert busy_after_the_free, "the stream was idle when device_sum returned: no free in flight"
    hazards = [(h.kind, h.stream, h.streams) for h in mr.hazards]
    assert hazards == [("freed_in_flight", stream.ptr, (stream.ptr,))]
    assert mr.stats["allocations"] == mr.stats["deallocations"] == 1


def test_temp_storage_serves_a_cuda_compute_scan(cupy, rng):
    import cuda.compute as cc

    from rmm_fences._streams import StreamHandle
    from rmm_fences.reduce import temp_storage

    mr = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    stream = cupy.cuda.Stream(non_blocking=True)
    x = fresh(cupy, 100_003, "float64", rng)
    out = cupy.full_like(x, cupy.nan)
    init = np.zeros(1, dtype=np.float64)
    scan = cc.make_inclusive_scan(d_in=x, d_out=out, op=cc.OpKind.PLUS, init_value=init)
    cc_stream = StreamHandle(stream.ptr)
    nbytes = scan(
        temp_storage=None,
        d_in=x,
        d_out=out,
        op=cc.OpKind.PLUS,
        init_value=init,
        num_items=x.size,
        stream=cc_stream,
    )
    with temp_storage(nbytes, mr=mr, stream=stream) as tmp:
        assert tmp.nbytes == nbytes
        scan(
            temp_storage=tmp,
            d_in=x,
            d_out=out,
            op=cc.OpKind.PLUS,
            init_value=init,
            num_items=x.size,
            stream=cc_stream,
        )
    stream.synchronize()
    np.testing.assert_allclose(out.get(), np.cumsum(x.get()), rtol=1e-9)
    assert mr.stats["current_bytes"] == 0


def test_bad_inputs_leak_nothing(cupy, reduce_mod):
    mr = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    x = cupy.arange(10, dtype=cupy.float32)
    with pytest.raises(ValueError, match="d_out must hold at least one element"):
        reduce_mod.device_sum(x, cupy.empty(0, dtype=cupy.float32), mr=mr)
    with pytest.raises(TypeError, match="d_in must be a device array"):
        reduce_mod.device_sum(x.get(), mr=mr)
    with pytest.raises(ValueError, match="op 'median' is not known"):
        reduce_mod.device_reduce(x, cupy.empty(1, dtype=cupy.float32), "median", 0.0, mr=mr)
    assert mr.allocation_counts.total_count == 0


def test_streams_of_every_kind(cupy, reduce_mod, rng):
    from cuda.core import Device

    dev = Device()
    dev.set_current()
    x = fresh(cupy, 4099, "float64", rng)
    ref = x.sum().item()
    streams = [
        None,
        cupy.cuda.Stream(non_blocking=True),
        rmm.pylibrmm.stream.Stream(),
        dev.create_stream(),
    ]
    for s in streams:
        got = reduce_mod.device_sum(x, stream=s)
        cupy.cuda.Device().synchronize()
        assert got.item() == pytest.approx(ref, rel=1e-12)


def test_cupy_allocator_serves_cupy_sum_with_cub(cupy, rng):
    from cupy._core import _accelerator

    from rmm_fences.allocators.cupy import CupyAllocator

    stats = rmm.mr.StatisticsResourceAdaptor(
        StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    )
    alloc = CupyAllocator(stats)
    saved = (_accelerator.get_reduction_accelerators(), _accelerator.get_routine_accelerators())
    _accelerator.set_reduction_accelerators(["cub"])
    _accelerator.set_routine_accelerators(["cub"])
    try:
        with cupy.cuda.using_allocator(alloc):
            x = fresh(cupy, 1 << 20, "float32", rng)
            after_input = stats.allocation_counts.total_count
            total = x.sum()
            used = stats.allocation_counts.total_count - after_input
            got = total.item()
            ref = x.astype(cupy.float64).sum().item()
            del x, total
        cupy.cuda.Device().synchronize()
    finally:
        _accelerator.set_reduction_accelerators(saved[0])
        _accelerator.set_routine_accelerators(saved[1])
    assert got == pytest.approx(ref, rel=1e-4)
    assert used >= 2, f"cupy.sum made {used} allocations through the allocator (output, temp)"
    assert stats.allocation_counts.current_bytes == 0  # nothing leaked
