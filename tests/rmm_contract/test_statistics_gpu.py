# SPDX-License-Identifier: Apache-2.0
"""``rmm.statistics`` over every rmm_fences resource, on a GPU: enable_statistics, the
statistics() context and the profiler count exactly over each chain; where the adaptor sits
says what it counts; how the pool's own counters relate (docs/index.md#statistics)."""

import pytest
import rmm
import rmm.statistics
from rmm.statistics import Statistics

from rmm_fences import StreamOrderedPoolMemoryResource
from rmm_fences.specs import use_resource

pytestmark = pytest.mark.gpu

MiB = 1 << 20


CHAINS = [
    "pool(cuda)",
    "pool(cuda_async)",
    "sync_on_free(cuda, mode=deferred)",
    "sync_on_free(pool(cuda), mode=stream)",
    "sync_on_free(naive_cache(cuda), mode=deferred)",
    "tracking(pool(cuda), on_hazard=raise)",
    "tracking(cuda_async)",
]


@pytest.mark.parametrize("spec", CHAINS)
def test_rmm_statistics_count_over_each_chain(spec, current_resource):
    sizes = [1000, MiB, 3 * MiB, 256]
    total = sum(sizes)
    with use_resource(spec) as chain:
        rmm.statistics.enable_statistics()  # rmm's adaptor over the chain
        top = rmm.mr.get_current_device_resource()
        assert isinstance(top, rmm.mr.StatisticsResourceAdaptor)
        assert top.get_upstream() is chain
        bufs = [rmm.DeviceBuffer(size=n) for n in sizes]
        assert rmm.statistics.get_statistics() == Statistics(
            current_bytes=total,
            current_count=4,
            peak_bytes=total,
            peak_count=4,
            total_bytes=total,
            total_count=4,
        )
        del bufs[1]
        with rmm.statistics.statistics():  # new counters pushed for the block
            inner = rmm.DeviceBuffer(size=4096)
            assert rmm.statistics.get_statistics() == Statistics(4096, 1, 4096, 1, 4096, 1)
            del inner
        assert rmm.statistics.get_statistics() == Statistics(
            current_bytes=total - MiB,
            current_count=3,
            peak_bytes=total,
            peak_count=4,
            total_bytes=total + 4096,
            total_count=5,
        )
        records = rmm.statistics.ProfilerRecords()
        with rmm.statistics.profiler(records=records, name="block"):
            tmp = rmm.DeviceBuffer(size=2 * MiB)
            del tmp
        block = records.records["block"]
        assert (block.num_calls, block.memory_total, block.memory_peak) == (1, 2 * MiB, 2 * MiB)
        del bufs
        assert rmm.statistics.get_statistics().current_bytes == 0
        assert rmm.statistics.get_statistics().current_count == 0
        rmm.mr.set_current_device_resource(chain)  # the statistics adaptor goes
    assert rmm.mr.get_current_device_resource() is current_resource


def test_where_the_statistics_adaptor_sits_says_what_it_counts(current_resource):
    # outermost: rmm.statistics reads it, and a free counts at once
    with use_resource("statistics(sync_on_free(pool(cuda), mode=deferred))") as mr:
        buf = rmm.DeviceBuffer(size=MiB)
        assert rmm.statistics.get_statistics() == mr.allocation_counts
        assert mr.allocation_counts.current_bytes == MiB
        del buf
        assert rmm.statistics.get_statistics().current_bytes == 0
    # beneath sync_on_free: what reached the upstream; rmm.statistics does not read it
    with use_resource("sync_on_free(statistics(cuda), mode=deferred)") as mr:
        beneath = mr.get_upstream()
        assert rmm.statistics.get_statistics() is None
        buf = rmm.DeviceBuffer(size=MiB)
        del buf
        pending = mr.pending_bytes
        assert beneath.allocation_counts.current_bytes == pending  # 0 or the pending block
        mr.flush()
        assert beneath.allocation_counts.current_bytes == 0
        assert beneath.allocation_counts.total_bytes == MiB


def test_pool_current_bytes_counts_blocks_rounded_to_256_bytes(current_resource):
    """docs/index.md#statistics: the pool's current_bytes against rmm's over it."""
    pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    stats = rmm.mr.StatisticsResourceAdaptor(pool)
    bufs = [rmm.DeviceBuffer(size=n, mr=stats) for n in (100, 5 * MiB, 12345)]
    assert stats.allocation_counts.current_bytes == 100 + 5 * MiB + 12345
    assert pool.stats["current_bytes"] == 256 + 5 * MiB + 12544
    del bufs[0]
    assert pool.stats["current_bytes"] == 5 * MiB + 12544
    del bufs
    assert pool.stats["current_bytes"] == 0 == stats.allocation_counts.current_bytes
