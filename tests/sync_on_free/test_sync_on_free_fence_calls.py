# SPDX-License-Identifier: Apache-2.0
"""tools/fence_calls.py: the CUDA calls deferred SyncOnFree makes per free on the recorded
allocation logs, on its core over host memory (no GPU)."""

import subprocess
import sys

from helpers.paths import TOOLS
from helpers.scripts import load_script


def _events(tool, name):
    return tool.events_of(tool.read_allocation_log(tool.TRACES / f"{name}.csv.gz"))


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
