# SPDX-License-Identifier: Apache-2.0
"""ReducePlan on a GPU: CUB DeviceReduce through cuda.compute, the temp storage allocated and
freed per call from every chain (counted by rmm's StatisticsResourceAdaptor), fresh random
inputs checked against float64 (or exact integer) references."""

import numpy as np
import pytest
import rmm

from helpers.reduce_cases import ALL_CHAINS, DTYPES, check_sum, fresh, lowest, make_chain

pytestmark = pytest.mark.gpu

SIZES = (0, 1, 1023, (1 << 20) + 7)
CALLS = 3  # inputs per plan


def poison(cupy, dtype, end):
    """A value no reduce here returns: NaN, or the dtype's integer at ``end`` ("min" or
    "max"; the data and their sums stay far from both)."""
    return cupy.nan if np.dtype(dtype).kind == "f" else getattr(np.iinfo(dtype), end)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chain", ALL_CHAINS)
def test_plans_match_the_reference_and_allocate_once_per_call(cupy, reduce_mod, rng, chain, dtype):
    inner = make_chain(chain)
    stats = rmm.mr.StatisticsResourceAdaptor(inner)
    stream = cupy.cuda.Stream(non_blocking=True)
    acc = np.add.reduce(np.zeros(1, dtype)).dtype  # NumPy's sum accumulator
    calls = 0
    for n in SIZES:
        example = fresh(cupy, n, dtype, rng)
        sums = cupy.full(CALLS, poison(cupy, acc, "min"), acc)
        maxes = cupy.full(CALLS, poison(cupy, dtype, "max"), dtype)  # the empty max: lowest
        sum_plan = reduce_mod.ReducePlan(
            example, sums[:1], "sum", np.zeros((), acc), mr=stats, stream=stream
        )
        max_plan = reduce_mod.ReducePlan(
            example, maxes[:1], "max", np.array(lowest(dtype), dtype), mr=stats, stream=stream
        )
        assert stats.allocation_counts.total_count == calls  # making a plan allocates nothing
        xs = [fresh(cupy, n, dtype, rng) for _ in range(CALLS)]
        for i, x in enumerate(xs):
            sum_plan(x, sums[i : i + 1])
            max_plan(x, maxes[i : i + 1])
        calls += 2 * CALLS
        stream.synchronize()
        for i, x in enumerate(xs):
            check_sum(sums[i].item(), x, dtype)
            assert maxes[i].item() == (x.max().item() if n else lowest(dtype)), (chain, n, i)
        counts = stats.allocation_counts
        assert counts.total_count == calls, (chain, n)
        assert counts.current_bytes == 0 and counts.current_count == 0  # each freed
        assert sum_plan.nbytes >= 1 and max_plan.nbytes >= 1
    if chain.startswith("tracking("):
        inner.check()
        assert inner.hazards == [] and inner.allocated_bytes == 0
        assert inner.stats["allocations"] == inner.stats["deallocations"] == calls


def test_plan_bytes_are_what_each_call_allocates(cupy, reduce_mod, rng):
    from rmm_fences import StreamOrderedPoolMemoryResource

    stats = rmm.mr.StatisticsResourceAdaptor(
        StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    )
    stream = cupy.cuda.Stream(non_blocking=True)
    x = fresh(cupy, 1 << 20, "float32", rng)
    out = cupy.full(1, cupy.nan, cupy.float32)
    plan = reduce_mod.ReducePlan(x, out, "sum", 0.0, mr=stats, stream=stream)
    for _ in range(10):
        plan(x, out)
    stream.synchronize()
    counts = stats.allocation_counts
    assert counts.total_count == 10 and counts.total_bytes == 10 * plan.nbytes
    assert counts.peak_bytes == plan.nbytes and counts.current_bytes == 0
    check_sum(out.item(), x, "float32")


class CaiView:
    """Another library's device array: ``__cuda_array_interface__`` only (the plan's checked
    path, with a pointer query per call)."""

    def __init__(self, a):
        self.a = a
        self.__cuda_array_interface__ = a.__cuda_array_interface__


def test_arrays_of_other_libraries_take_the_checked_path(cupy, reduce_mod, rng):
    stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaAsyncMemoryResource())
    stream = cupy.cuda.Stream(non_blocking=True)
    x = fresh(cupy, 100_003, "float64", rng)
    out = cupy.full(1, cupy.nan, cupy.float64)
    plan = reduce_mod.ReducePlan(CaiView(x), CaiView(out), "sum", 0.0, mr=stats, stream=stream)
    y = fresh(cupy, 100_003, "float64", rng)
    plan(CaiView(y), CaiView(out))
    stream.synchronize()
    check_sum(out.item(), y, "float64")
    assert stats.allocation_counts.total_count == 1 and stats.allocation_counts.current_bytes == 0


def test_a_call_that_does_not_match_allocates_nothing(cupy, reduce_mod, rng):
    stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaAsyncMemoryResource())
    x = fresh(cupy, 4099, "float32", rng)
    out = cupy.full(1, cupy.nan, cupy.float32)
    plan = reduce_mod.ReducePlan(x, out, "sum", 0.0, mr=stats)
    with pytest.raises(TypeError, match="d_in has dtype float64 but the plan was made for float32"):
        plan(x.astype(cupy.float64), out)
    with pytest.raises(ValueError, match="d_in holds 4098 items but the plan was made for 4099"):
        plan(x[1:], out)
    with pytest.raises(ValueError, match="d_in must be C-contiguous"):
        plan(cupy.tile(x, 2)[::2], out)
    with pytest.raises(TypeError, match="d_in must be a device array"):
        plan(x.get(), out)
    assert stats.allocation_counts.total_count == 0
    plan(x, out)  # the default stream
    cupy.cuda.Device().synchronize()
    check_sum(out.item(), x, "float32")
    assert stats.allocation_counts.total_count == 1


def test_the_plan_over_a_buffer_sums_without_allocating(cupy, rng):
    """The benchmarks' floor of the plan loop (``plan_over_buffer``) reduces correctly and
    allocates from no resource per call: the current device resource counts nothing."""
    from rmm_fences_bench import plan_over_buffer

    stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.get_current_device_resource())
    previous = rmm.mr.get_current_device_resource()
    rmm.mr.set_current_device_resource(stats)
    try:
        stream = cupy.cuda.Stream(non_blocking=True)
        x = fresh(cupy, (1 << 20) + 7, "float32", rng)
        out = cupy.full(1, cupy.nan, cupy.float32)
        fn = plan_over_buffer(x, out, stream)
        before = stats.allocation_counts.total_count
        for _ in range(5):
            fn()
        stream.synchronize()
        assert stats.allocation_counts.total_count == before
        check_sum(out.item(), x, "float32")
    finally:
        rmm.mr.set_current_device_resource(previous)
