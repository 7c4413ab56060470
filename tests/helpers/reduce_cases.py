# SPDX-License-Identifier: Apache-2.0
"""The GPU tests of the CUB temp-storage loop (rmm_fences.reduce): the chains its temp storage
comes from, fresh random inputs, and the float64 (or exact integer) reference checks."""

import numpy as np
import pytest
import rmm

from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)
from rmm_fences.unsafe import NaiveCachingMemoryResource

DTYPES = ("float32", "float64", "int32", "int64")
#: The integers of ``fresh`` lie in [-BOUND, BOUND).
BOUND = {"int32": 1000, "int64": 10**9}

CHAINS = {
    "cuda": lambda: rmm.mr.CudaMemoryResource(),
    "cuda_async": lambda: rmm.mr.CudaAsyncMemoryResource(),
    "rmm_pool": lambda: rmm.mr.PoolMemoryResource(
        rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 28
    ),
    "rmm_fences_pool": lambda: StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource()),
    **{
        f"sync_on_free_{mode}(naive_cache)": (
            lambda mode=mode: SyncOnFreeResourceAdaptor(
                NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()), mode=mode
            )
        )
        for mode in ("device", "stream", "deferred")
    },
}


def make_chain(name):
    """A new chain of ``ALL_CHAINS``: one of ``CHAINS``, or ``tracking(...)`` of one (the
    tracker raising on a hazard)."""
    if name.startswith("tracking("):
        return HazardTrackingResourceAdaptor(CHAINS[name[9:-1]](), on_hazard="raise")
    return CHAINS[name]()


ALL_CHAINS = list(CHAINS) + [f"tracking({c})" for c in CHAINS]


def lowest(dtype):
    """The lowest value of ``dtype``: the max of no element."""
    return np.finfo(dtype).min if dtype.startswith("float") else np.iinfo(dtype).min


def fresh(cupy, n, dtype, rng):
    """New random data on the device: floats around 1, integers of both signs."""
    g = cupy.random.RandomState(int(rng.integers(1 << 62)))
    if dtype.startswith("float"):
        x = (g.standard_normal(n, dtype=cupy.float64) + 1.0).astype(dtype)
    else:
        x = g.randint(-BOUND[dtype], BOUND[dtype], size=n, dtype=dtype)
    cupy.cuda.Device().synchronize()  # the reduces run on other (non-blocking) streams
    return x


def check_sum(got, x, dtype):
    """``got`` is the sum of ``x``: within float32's or float64's rounding of the float64 sum,
    or the exact int64 sum."""
    ref = x.astype("float64").sum() if dtype.startswith("float") else x.astype("int64").sum()
    ref = ref.item()
    if dtype == "float32":
        assert got == pytest.approx(ref, rel=1e-4, abs=1e-3)
    elif dtype == "float64":
        assert got == pytest.approx(ref, rel=1e-10, abs=1e-9)
    else:
        assert got == ref
