# SPDX-License-Identifier: Apache-2.0
"""Native multi-threaded stress (rmm_fences_bench.stress): 8 C++ threads, each on its own
stream, fill every block with a pattern of its own by a kernel and check it by a kernel before
each free; frees go to the thread's own stream or, after an event wait, to another thread's;
blocks kept live fill a bounded pool into out-of-memory; a Python thread calls ``release()``
(or ``flush()``) meanwhile. A device-side counter adds every word a check found wrong.

Each run is a child process, so a fault (error 700) fails the test instead of the session.
RMM_FENCES_STRESS_SECONDS sets the duration of each run (default 5). The argument checks run
on any machine.
"""

import os
import textwrap

import pytest

from helpers.children import child_env, run_json

SECONDS = float(os.environ.get("RMM_FENCES_STRESS_SECONDS", "5"))
THREADS = 8

CHILD = textwrap.dedent(
    """
    import json, sys, threading
    import cupy, rmm
    import rmm_fences
    from rmm_fences_bench import stress
    from rmm_fences.unsafe import NaiveCachingMemoryResource

    chain, seconds, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    if chain == "pool":
        mr = rmm_fences.StreamOrderedPoolMemoryResource(
            rmm.mr.CudaAsyncMemoryResource(), maximum_pool_size="64MiB")
        background = mr.release
    elif chain == "sync_on_free":
        mr = rmm_fences.SyncOnFreeResourceAdaptor(
            NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()), mode="deferred")
        background = mr.flush
    else:
        mr = NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
        background = None
    stop = threading.Event()
    calls = [0]

    def loop():  # runs while the stress threads (which hold no GIL) allocate and free
        while not stop.wait(0.002):
            background()
            calls[0] += 1

    if background is not None:
        thread = threading.Thread(target=loop)
        thread.start()
    try:
        stats = stress(mr, threads, seconds, max_bytes="4MiB", max_live=32, random_state=12345)
    finally:
        stop.set()
        if background is not None:
            thread.join()
    stats["background_calls"] = calls[0]
    if chain == "pool":
        stats["pool_stats"] = mr.stats
    cupy.cuda.Device().synchronize()
    print(json.dumps(stats))
    """
)


def run_stress(chain):
    rc, stats, out, err = run_json(
        CHILD,
        chain,
        SECONDS,
        THREADS,
        timeout=SECONDS * 3 + 240,
        env=child_env(),  # the benchmarks' library from the checkout, as this process has it
    )
    print(f"\nstress {chain}, {THREADS} threads, {SECONDS} s: exit {rc}, {stats}")
    assert rc == 0, f"child exit {rc}\n{out}\n{err[-4000:]}"
    assert stats is not None, out + err
    assert stats["allocations"] > 0 and stats["checks"] > 0
    assert stats["cross_stream_frees"] > 0  # the test cannot pass without them
    return stats


@pytest.mark.gpu
def test_bounded_pool_under_native_threads_oom_and_release_keeps_every_pattern():
    stats = run_stress("pool")
    assert stats["out_of_memory"] > 0, stats  # the 64 MiB bound was hit and reclaimed from
    assert stats["background_calls"] > 0, stats  # release() ran during the traffic
    assert stats["errors"] == 0, stats


@pytest.mark.gpu
def test_sync_on_free_deferred_over_the_naive_cache_keeps_every_pattern():
    stats = run_stress("sync_on_free")
    assert stats["background_calls"] > 0, stats  # flush() ran during the traffic
    assert stats["errors"] == 0, stats


@pytest.mark.gpu
def test_control_naive_cache_alone_is_seen_corrupting():
    """The stress can see corruption: the naive cache hands a block to another stream while
    its check kernel is still queued, and the checks count the overwritten words."""
    stats = run_stress("naive_cache")
    assert stats["errors"] > 0, stats


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seconds": 0.0}, "seconds must be positive and finite, got 0.0"),
        ({"seconds": float("nan")}, "seconds must be positive and finite"),
        ({"seconds": float("inf")}, "seconds must be positive and finite"),
        ({"max_bytes": 255}, "max_bytes must be at least 256, got 255"),
        ({"max_bytes": "1MB?"}, "max_bytes"),
        ({"fill_kernel": 0}, "fill_kernel must be a non-null handle"),
        ({"check_kernel": 0}, "check_kernel must be a non-null handle"),
        ({"errors": 0}, "errors must be a non-null handle or device address"),
        ({"streams": []}, "streams must hold at least one stream"),
    ],
)
def test_native_stress_rejects_bad_arguments_naming_them(kwargs, match):
    import rmm

    from rmm_fences_bench._loops import stress

    args = {"streams": [None], "seconds": 1.0, "fill_kernel": 1, "check_kernel": 1, "errors": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        stress(rmm.mr.CudaMemoryResource(), **args)


@pytest.mark.parametrize(
    ("streams", "error", "match"),
    [
        (0, ValueError, "streams must be at least 1, got 0"),
        (True, TypeError, "streams must be a number of streams or a list of streams, got bool"),
        ("8", TypeError, "got str"),
    ],
)
def test_public_stress_rejects_bad_streams_naming_them(streams, error, match):
    import rmm

    from rmm_fences_bench import stress

    with pytest.raises(error, match=match):
        stress(rmm.mr.CudaMemoryResource(), streams, 1.0)
