# SPDX-License-Identifier: Apache-2.0
"""rmm's statistics count over every rmm_fences resource, and the ``stats`` say how they
relate (CPU: rmm's StatisticsResourceAdaptor over a fake upstream;
tests/rmm_contract/test_statistics_gpu.py runs rmm.statistics on a GPU)."""

import pytest
import rmm
import rmm.statistics

from rmm_fences import (
    HazardTrackingResourceAdaptor,
    StreamOrderedPoolMemoryResource,
    SyncOnFreeResourceAdaptor,
)

from helpers.fake_upstream import FakeUpstream


def _pool(up):
    return StreamOrderedPoolMemoryResource(up)


def _sync_on_free(up):
    return SyncOnFreeResourceAdaptor(up, mode="deferred")


def _tracker(up):
    return HazardTrackingResourceAdaptor(
        up, upstream_stream_ordered=True, nvtx=False, on_hazard="record"
    )


@pytest.mark.parametrize("make", [_pool, _sync_on_free, _tracker], ids=lambda f: f.__name__[1:])
def test_rmm_statistics_adaptor_counts_over_each_resource(make):
    up = FakeUpstream()
    ours = make(up.mr)
    stats = rmm.mr.StatisticsResourceAdaptor(ours)
    sizes = [256, 1000, 4096]
    ptrs = [stats.allocate(n) for n in sizes]
    assert stats.allocation_counts == rmm.statistics.Statistics(
        current_bytes=5352,
        current_count=3,
        peak_bytes=5352,
        peak_count=3,
        total_bytes=5352,
        total_count=3,
    )
    stats.deallocate(ptrs[1], 1000)
    ptrs[1] = stats.allocate(8)
    stats.deallocate(ptrs[0], 256)
    assert stats.allocation_counts == rmm.statistics.Statistics(
        current_bytes=4104,
        current_count=2,
        peak_bytes=5352,
        peak_count=3,
        total_bytes=5360,
        total_count=4,
    )
    if isinstance(ours, StreamOrderedPoolMemoryResource):  # docs/index.md#statistics
        # the pool counts its blocks, each rounded up to 256 bytes (4096 + 8 asked)
        assert ours.stats["current_bytes"] == 4096 + 256
    if isinstance(ours, HazardTrackingResourceAdaptor):
        assert ours.stats["allocated_bytes"] == stats.allocation_counts.current_bytes
    for ptr, n in zip(ptrs[1:], [8, 4096]):
        stats.deallocate(ptr, n)
    assert stats.allocation_counts.current_count == 0


def test_the_stats_docstrings_point_at_rmm_statistics():
    for cls in (
        StreamOrderedPoolMemoryResource,
        SyncOnFreeResourceAdaptor,
        HazardTrackingResourceAdaptor,
    ):
        assert "rmm.statistics" in cls.stats.__doc__, cls.__name__
