# SPDX-License-Identifier: Apache-2.0
"""tools/rmm_pool_lists.py: a host model of rmm's pool's free lists, alone and as deferred
SyncOnFree's upstream (no GPU). Its footprints are held to the replay benchmark's on the GPU."""

import json

import pytest

from helpers.paths import ROOT, TOOLS
from helpers.scripts import load_script

REPLAY = ROOT / "docs" / "data" / "replay" / "replay_2026-12-05_h100.jsonl"
MIB = 1 << 20


@pytest.fixture(scope="module")
def tool():
    return load_script(TOOLS / "rmm_pool_lists.py")


def _events(tool, name):
    return tool.log_events(tool.TRACES, name)


def test_a_free_list_coalesces_within_a_chunk_and_takes_the_best_fit(tool):
    free = tool.FreeList()
    free.insert(1000, 100, True)  # a chunk's head
    free.insert(1100, 50, False)  # contiguous: merges into the head
    free.insert(900, 100, False)  # contiguous before a head: stays apart
    free.insert(2000, 60, True)
    assert [(p, free.blocks[p]) for p in free.ptrs] == [
        (900, (100, False)),
        (1000, (150, True)),
        (2000, (60, True)),
    ]
    assert free.best_fit(55) == (2000, 60, True)  # the smallest that fits, not the first
    assert free.best_fit(200) is None and len(free) == 2


def test_the_pool_grows_by_its_size_and_takes_from_another_stream_before_growing(tool):
    pool = tool.RmmPoolModel()
    a = pool.allocate(1 * MIB, stream=1)
    b = pool.allocate(1 * MIB, stream=1)  # no free block: doubles to 2 MiB
    assert pool.pool_size == 2 * MIB and pool.counts["grown"] == 2
    pool.deallocate(a, stream=1)
    assert pool.allocate(512 << 10, stream=2) == a  # from stream 1's list: a stream wait
    assert pool.counts["other"] == 1 and pool.counts["grown"] == 2
    pool.deallocate(b, stream=2)
    c = pool.allocate(300, stream=1)  # stream 1's list holds a's other half
    assert c == a + (512 << 10) and pool.counts["own"] == 1


def _device_footprints(chain):
    rows = [json.loads(x) for x in REPLAY.read_text().splitlines() if x.strip()]
    return {
        r["trace"]: r["footprint_mib"]
        for r in rows
        if r.get("chain") == chain and r.get("round") == 0 and "footprint_mib" in r
    }


@pytest.mark.parametrize(
    "chain, way",
    [("rmm_pool", "alone"), ("sync_on_free_deferred", "under_sync_on_free")],
)
def test_the_model_takes_what_the_gpu_replay_took_on_every_log(tool, chain, way):
    """rmm's pool alone and under deferred SyncOnFree, replayed in recorded order on the GPU
    (the replay benchmark's footprint): the model grows the pool to the same bytes."""
    device = _device_footprints(chain)
    assert len(device) == 8
    for name, mib in device.items():
        pool = getattr(tool, way)(_events(tool, name))
        assert pool.pool_size / MIB == pytest.approx(mib, abs=0.1), name


def test_releasing_on_the_freeing_stream_would_not_spare_rmm_s_pool_its_stream_waits(tool):
    """On the CuPy log of three streams, deferred SyncOnFree's upstream takes blocks from
    another stream's list more often than rmm's pool alone; handing each block back on the
    stream that freed it (which the adaptor cannot do safely) would not lower that. On a
    log of one stream nothing changes."""
    events = _events(tool, "cupy_pipeline")
    rates = {}
    for key, pool in (
        ("alone", tool.alone(events)),
        ("sof", tool.under_sync_on_free(events)),
        ("on_free_stream", tool.under_sync_on_free(events, release_on_free_stream=True)),
    ):
        c = pool.counts
        rates[key] = c["other"] / (c["own"] + c["other"] + c["merged"] + c["grown"])
    assert rates["alone"] < rates["sof"] <= rates["on_free_stream"]
    one = tool.under_sync_on_free(_events(tool, "torch_resnet50"))
    assert one.counts["other"] == one.counts["merged"] == 0


def test_the_report_has_three_rows_per_log(tool, capsys):
    assert tool.main(["reduce_1m"]) == 0
    rows = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| reduce_1m")]
    assert [r.split(" | ")[1] for r in rows] == [way for way, _ in tool.WAYS]
