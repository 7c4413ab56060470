# SPDX-License-Identifier: Apache-2.0
"""rmm_fences.dask without a GPU: the plugin checks its spec up front and travels by pickle."""

import pickle
import subprocess
import sys

import pytest

distributed = pytest.importorskip("distributed")

from rmm_fences.dask import FencesPlugin, chain_stats  # noqa: E402
from rmm_fences.specs import SpecError  # noqa: E402


def test_a_bad_spec_is_refused_before_any_worker():
    with pytest.raises(SpecError, match="unknown resource 'pooll'") as err:
        FencesPlugin("tracking(pooll(cuda))")
    assert "^" in str(err.value)
    with pytest.raises(TypeError, match="cupy_allocator must be a bool"):
        FencesPlugin("cuda", cupy_allocator="yes")


@pytest.mark.parametrize(
    "dumps, loads",
    [
        (pickle.dumps, pickle.loads),
        (distributed.protocol.pickle.dumps, distributed.protocol.pickle.loads),
    ],
)
def test_the_plugin_round_trips(dumps, loads):
    plugin = FencesPlugin(
        "sync_on_free(naive_cache(cuda_async), mode=deferred)", cupy_allocator=True
    )
    again = loads(dumps(plugin))
    assert again == plugin and again.resource is None
    assert isinstance(again, distributed.WorkerPlugin) and again.name == "rmm-fences"


def test_the_package_does_not_import_dask():
    code = (
        "import sys, rmm_fences, rmm_fences.reduce, rmm_fences.specs; "
        "assert not {'dask', 'distributed', 'dask_cuda'} & set(sys.modules)"
    )
    res = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr


def test_chain_stats_walks_the_chain():
    import rmm

    from rmm_fences import HazardTrackingResourceAdaptor

    mr = HazardTrackingResourceAdaptor(
        rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    )
    stats = chain_stats(mr)
    assert [s["resource"] for s in stats] == [
        "HazardTrackingResourceAdaptor",
        "StatisticsResourceAdaptor",
        "CudaMemoryResource",
    ]
    assert stats[0]["hazards"] == [] and stats[0]["allocated_bytes"] == 0
    assert stats[1]["allocation_counts"]["total_count"] == 0
