# SPDX-License-Identifier: Apache-2.0
"""rmm_fences chains on a dask-cuda cluster: a 4+ GB CuPy reduction with the plugin."""

import pytest

from rmm_fences._cuda import device_count

from helpers.paths import ROW_STACK as ROW_STACK_PRELOAD

pytestmark = pytest.mark.gpu

# Each worker preloads it: dask-cuda's workers import cuDF where it is installed, which fails on
# numpy 2.5 without the alias (the worker would not start).


def test_local_cuda_cluster_with_the_plugin():
    pytest.importorskip("dask_cuda")
    import cupy
    import dask.array as da
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from rmm_fences.dask import FencesPlugin, gather_stats

    workers = min(2, device_count())
    cluster = LocalCUDACluster(
        n_workers=workers, threads_per_worker=1, preload=[str(ROW_STACK_PRELOAD)]
    )
    with cluster, Client(cluster) as client:
        client.wait_for_workers(workers, timeout=120)  # a worker that cannot start fails here
        client.register_plugin(
            FencesPlugin("tracking(pool(cuda_async), on_hazard=record)", cupy_allocator=True)
        )
        n, period = 1 << 29, 1_000_003  # 4 GiB of float64
        x = da.arange(n, chunks=n // (8 * workers), dtype="float64").map_blocks(cupy.asarray)
        values = x % period  # real, varying data; the exact sum is known in closed form
        got = float(client.compute(values.sum()).result(timeout=600))
        full, rest = divmod(n, period)
        expected = full * period * (period - 1) / 2 + rest * (rest - 1) / 2
        assert got == expected
        stats = gather_stats(client)
    print(f"\n{workers} worker(s): {stats}")
    assert len(stats) == workers
    for address, entry in stats.items():
        tracker = entry["chain"][0]
        assert entry["spec"].startswith("tracking(")
        assert tracker["peak_bytes"] > 0, address  # allocations went through the chain
        assert tracker["hazards"] == [], address
        # ... and that is a checked answer: the tracker saw and looked up frees
        counters = tracker["stats"]
        assert counters["allocations"] > 0 and counters["deallocations"] > 0, (address, counters)
        assert counters["rejected_frees"] == 0, (address, counters)
