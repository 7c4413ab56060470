# SPDX-License-Identifier: Apache-2.0
"""tools/fence_calls.py: the CUDA calls deferred SyncOnFree makes per free on the recorded
allocation logs, on its core over host memory (no GPU)."""

import json
import subprocess
import sys

import pytest

from helpers.paths import TOOLS
from helpers.scripts import load_script


def _events(tool, name):
    return tool.log_events(tool.TRACES, name)


def test_the_cub_loop_records_almost_no_event_and_one_batch_per_free_records_one_per_free():
    """The CUB temp-storage loop's log (one free and one allocation of a size per step): its
    allocations take their block back (no event, no upstream call), so its frees share one
    event in a hundred. With batches of one free, every free that is not taken back before it
    is fenced records its own event: one per free."""
    tool = load_script(TOOLS / "fence_calls.py")
    events = _events(tool, "reduce_1m")
    c = tool.count(events)
    assert c["allocations"] == c["frees"] == 205
    assert c["take_backs"] >= 0.95 * c["allocations"] and c["record"] <= 0.02 * c["frees"]
    assert c["upstream_allocate"] == c["allocations"] - c["take_backs"]
    one = tool.count(events, max_batch_frees=1)
    assert one["record"] == one["frees"]


def test_larger_batches_record_fewer_events_per_free_on_a_training_log():
    tool = load_script(TOOLS / "fence_calls.py")
    events = _events(tool, "torch_resnet50")
    default = tool.count(events)
    larger = tool.count(events, max_batch_frees=64, max_batch_bytes=256 << 20)
    assert 0 < larger["record"] < default["record"] / 2
    assert default["record"] == default["acquire_fence"]  # an event per record, from the pool


def test_blocks_go_upstream_on_another_stream_only_on_a_log_of_several_streams():
    """A block goes upstream on the stream of the call that found its fence complete: on a
    log of one stream that is always the freeing stream; on cupy_pipeline (three streams) it
    often is not."""
    tool = load_script(TOOLS / "fence_calls.py")
    one = tool.count(_events(tool, "torch_resnet50"))
    assert one["released"] > 1000 and one["released_elsewhere"] == 0
    several = tool.count(_events(tool, "cupy_pipeline"))
    assert 0 < several["released_elsewhere"] <= several["released"]
    assert several["released"] == several["upstream_deallocate"]


def test_the_tool_prints_a_row_per_log_and_refuses_a_batch_of_no_frees():
    script = [sys.executable, str(TOOLS / "fence_calls.py")]
    run = subprocess.run(
        [*script, "reduce_1m", "reduce_256m"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    rows = [x for x in run.stdout.splitlines() if x.startswith("| reduce_")]
    assert [r.split(" | ")[0] for r in rows] == ["| reduce_1m", "| reduce_256m"]
    assert "max_batch_frees 16, max_batch_bytes 67108864 bytes" in run.stdout
    bad = subprocess.run([*script, "--max-batch-frees", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--max-batch-frees must be at least 1" in bad.stderr


def test_priced_calls_are_the_counts_at_the_measured_costs_over_the_upstreams_call(tmp_path):
    """--costs prices each counted call at its FenceCalls cost; --replay divides by one call of
    rmm's pool (1e9 over the median of its rounds' calls per second)."""
    tool = load_script(TOOLS / "fence_calls.py")
    native = tmp_path / "native.jsonl"
    ns = {"cu_event_record": 100.0, "cu_event_query": 10.0, "cu_stream_get_id": 1.0}
    native.write_text(
        '{"environment": {}}\n'
        + json.dumps({"bench": "FenceCalls", "ns": {**ns, "cu_stream_is_capturing": 0.5}})
        + "\n"
    )
    replay = tmp_path / "replay.jsonl"
    rounds = [(1e6, 0), (2e6, 1), (4e6, 2)]  # median 2e6 calls/s: 500 ns a call
    replay.write_text(
        "".join(
            json.dumps({"trace": "reduce_1m", "chain": c, "round": k, "alloc_per_s": rate}) + "\n"
            for rate, k in rounds
            for c in ("rmm_pool", "rmm_fences_pool")
        )
    )
    costs = tool.call_costs(native)
    assert costs == {"record": 100.0, "ready": 10.0, "stream_id": 1.0, "is_capturing": 0.5}
    assert tool.upstream_call_ns(replay) == {"reduce_1m": 500.0}
    c = tool.count(_events(tool, "reduce_1m"))
    want = (100 * c["record"] + 10 * c["ready"] + c["stream_id"] + 0.5 * c["is_capturing"]) / (
        c["allocations"] + c["frees"]
    )
    assert tool.cuda_ns_per_call(c, costs) == pytest.approx(want)
    cells = tool.row("reduce_1m", c, costs, {"reduce_1m": 500.0}).strip("| ").split(" | ")
    assert cells[-2:] == [f"{want:.1f}", f"{want / 500:.1%}"]
    script = [sys.executable, str(TOOLS / "fence_calls.py"), "reduce_1m"]
    bad = subprocess.run([*script, "--replay", str(replay)], capture_output=True, text=True)
    assert bad.returncode == 2 and "--replay needs --costs" in bad.stderr
    with pytest.raises(ValueError, match="no FenceCalls row"):
        tool.call_costs(replay)
