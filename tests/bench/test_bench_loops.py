# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' native loops (benchmarks/rmm_fences_bench, built in place by ``make install``,
never installed): where they live, their stub, and argument validation before any CUDA call.
No GPU needed."""

import pathlib

import pytest
import rmm

import rmm_fences_bench
from helpers.paths import BENCHMARKS
from rmm_fences_bench import _loops, alloc_free_ns

LOOPS = (
    "alloc_free_ns",
    "core_pair_ns",
    "fence_call_ns",
    "page_call_ns",
    "random_allocations",
    "stress",
    "threaded_alloc_free",
    "threaded_stream_queries",
    "replay",
    "footprint_layer",
)


def test_the_loops_are_the_benchmarks_not_the_resources_module():
    from rmm_fences._lib import memory_resource

    stub = (pathlib.Path(_loops.__file__).parent / "_loops.pyi").read_text()
    resources_stub = (
        pathlib.Path(memory_resource.__file__).parent / "memory_resource.pyi"
    ).read_text()
    for name in LOOPS:
        assert callable(getattr(_loops, name))
        assert not hasattr(memory_resource, name)
        assert f"def {name}" in stub and f"def {name}" not in resources_stub
    assert rmm_fences_bench.alloc_free_ns is _loops.alloc_free_ns
    assert pathlib.Path(_loops.__file__).parent == BENCHMARKS / "rmm_fences_bench"


def test_benchmark_randomness_is_named_random_state():
    from rmm_fences_bench import random_allocations, stress

    mr = rmm.mr.CudaMemoryResource()
    # the argument is accepted, then validation fails before any CUDA call
    with pytest.raises(ValueError, match="max_live must be positive"):
        random_allocations(mr, 10, max_live=0, random_state=7)
    with pytest.raises(ValueError, match="streams must be at least 1"):
        stress(mr, 0, 1.0, random_state=7)
    for fn, args in ((random_allocations, (mr, 10)), (stress, (mr, 0, 1.0))):
        with pytest.raises(TypeError, match="seed"):
            fn(*args, seed=7)


def test_alloc_free_ns_validates_before_any_cuda_call():
    with pytest.raises(TypeError):
        alloc_free_ns(None, 1024)
    with pytest.raises(ValueError, match="nbytes"):
        alloc_free_ns(rmm.mr.CudaMemoryResource(), "much")
    with pytest.raises(ValueError, match="iterations must be positive"):
        alloc_free_ns(rmm.mr.CudaMemoryResource(), 1024, 0)


def test_threaded_benchmarks_validate_their_streams_before_any_cuda_call():
    from rmm_fences_bench import threaded_alloc_free, threaded_stream_queries

    with pytest.raises(ValueError, match="streams must hold at least one stream"):
        threaded_alloc_free(rmm.mr.CudaMemoryResource(), 1024, 10, [])
    with pytest.raises(TypeError, match="stream must be None, an rmm Stream"):
        threaded_alloc_free(rmm.mr.CudaMemoryResource(), 1024, 10, [object()])
    with pytest.raises(ValueError, match="query must be 'is_capturing' or 'get_id'"):
        threaded_stream_queries("flush", 10, [])
    with pytest.raises(ValueError, match="streams must hold at least one stream"):
        threaded_stream_queries("get_id", 10, [])


def test_page_call_ns_validates_before_any_cuda_call():
    from rmm_fences_bench import page_call_ns

    with pytest.raises(ValueError, match="pages and rounds must be positive, got 0 and 10"):
        page_call_ns(0)
    with pytest.raises(ValueError, match="got 4 and 0"):
        page_call_ns(4, 0)


@pytest.mark.gpu
def test_page_call_ns_times_each_call_and_gives_every_page_back(cupy):
    """The page moves' driver calls, timed on the device's pages: each is measured, the page is
    the device's granularity, and the device's free memory is what it was (32 pages of 2 MiB
    lost would show)."""
    from rmm_fences_bench import page_call_ns

    cupy.cuda.Device().synchronize()
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    costs = page_call_ns(32, 3)
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    assert costs["page"] >= 2 << 20 and int(costs["page"]) % (2 << 20) == 0
    for call in ("create", "map", "set_access", "unmap", "release"):
        assert costs[call] > 0, call
    assert free_after >= free_before - (2 << 20)


def test_core_pair_ns_times_the_policy_cores_alone_without_a_gpu():
    """The cores over platforms without CUDA calls: the pool's same-stream pair, and the
    tracker's over it, make no record and no upstream call; deferred SyncOnFree takes its block
    back (no upstream call) and records no fence below its batch's byte limit, one per pair at
    it (64 MiB)."""
    from rmm_fences_bench import core_pair_ns

    pairs = 20000
    for core in ("pool", "sync_on_free", "tracking_pool"):
        r = core_pair_ns(core, "1MiB", pairs)
        assert r["ns"] > 0 and r["fences"] == 0 and r["upstream_calls"] == 0, (core, r)
    assert core_pair_ns("pool", "64MiB", pairs)["fences"] == 0
    big = core_pair_ns("sync_on_free", "64MiB", pairs)
    assert big["fences"] == pairs and big["upstream_calls"] == 0
    with pytest.raises(ValueError, match="core must be 'pool', 'sync_on_free' or 'tracking_pool'"):
        core_pair_ns("arena", 256)
    with pytest.raises(ValueError, match="iterations must be positive"):
        core_pair_ns("pool", 256, 0)
    with pytest.raises(ValueError, match="nbytes"):
        core_pair_ns("pool", "lots")
