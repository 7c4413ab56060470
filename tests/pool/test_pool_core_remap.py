# SPDX-License-Identifier: Apache-2.0
"""The time a pool over a page arena spends moving pages (no GPU).

To stay within 1/16 over its peak in use, a growth unmaps free pages and maps them where it
grows. Each page moved is two driver calls. While the peak in use rises, a move saves pages the
pool would hold from then on, and it always may. Once the peak stops rising, a workload whose
free bytes seldom sit where its next request needs them would move pages on every pass: those
moves take at most ``remap_time_fraction`` of the time (a token bucket that holds that fraction
of a second). The host arena models time: ``arena_call_ns`` per call of the pool (the work
between calls too), ``arena_page_ns`` per page mapped or unmapped and per range mapped.
"""

import inspect
import subprocess
import sys

import pytest

from rmm_fences import VmmPoolMemoryResource

from helpers.alloc_shapes import SHAPES, replay_pass
from helpers.paths import ROOT, TOOLS
from helpers.scripts import load_script
from rmm_fences_bench import read_allocation_log
from rmm_fences_testing import HostStreamOrderedPool

KIB, MIB = 1 << 10, 1 << 20
PAGE = 2 * MIB
CALL_NS, PAGE_NS = 200, 3000  # a pool call, a page's map or unmap (the model's costs)
WINDOW_NS = 1e9  # the bucket holds the fraction of this
DEFAULT = inspect.signature(VmmPoolMemoryResource).parameters["remap_time_fraction"]
TRACES = ROOT / "asv_bench" / "traces"
NAMES = sorted(p.name[: -len(".csv.gz")] for p in TRACES.glob("*.csv.gz"))


def costly_pool(fraction, page=PAGE, call_ns=CALL_NS, **kwargs):
    return HostStreamOrderedPool(
        arena_page_size=page,
        arena_call_ns=call_ns,
        arena_page_ns=PAGE_NS,
        arena_remap_time_fraction=fraction,
        **kwargs,
    )


def replay(p, events, passes=1):
    """Replays (action, id, bytes, stream) events in order on idle streams, `passes` times
    (what a pass leaves live is freed after it)."""
    p.set_idle()
    for _ in range(passes):
        replay_pass(p, events)
    assert p.violations == []
    return p


def test_the_default_share_is_a_twentieth():
    assert DEFAULT.default == 0.05


def moves_after_the_first_pass(fraction, shape, passes=8):
    """Replays `shape` with 20 us of work after each call (its peak in use reached in the first
    pass): (ns spent moving pages after the first pass, ns that passed, bound at `DEFAULT`)."""
    p = costly_pool(fraction, call_ns=20_000)
    events = SHAPES[shape]()
    replay(p, events)
    moved, began = p.stats["remap_ns"], p.arena["now_ns"]
    replay(p, events, passes=passes - 1)
    spent, passed = p.stats["remap_ns"] - moved, p.arena["now_ns"] - began
    one_move = PAGE_NS * (2 * p.arena["peak_physical_bytes"] // PAGE + 1)  # every page, both ways
    return spent, passed, DEFAULT.default * (passed + WINDOW_NS) + one_move


@pytest.mark.parametrize("shape", ["mixed_1", "big_1"])
def test_once_the_peak_stops_rising_moves_take_at_most_their_share(shape):
    """Random sizes on four streams near a 16 GiB cap: at the default share the moves after
    the first pass take at most a twentieth of the time (plus the bucket and one move)."""
    spent, passed, bound = moves_after_the_first_pass(DEFAULT.default, shape)
    assert 0 < spent <= bound, f"{spent / passed:.1%} of {passed / 1e6:.0f} ms"


@pytest.mark.parametrize("shape", ["mixed_1", "big_1"])
def test_without_the_bound_moves_take_more_than_that(shape):
    """The control: ``remap_time_fraction=1`` (every move the budget asks for, the pool before
    the allowance) breaks the same bound on the same logs (a third to most of its time)."""
    spent, passed, bound = moves_after_the_first_pass(1.0, shape)
    assert spent > bound, f"{spent / passed:.1%} of {passed / 1e6:.0f} ms"


def log_events(name):
    trace = read_allocation_log(TRACES / f"{name}.csv.gz")
    return list(
        zip(trace.action.tolist(), trace.id.tolist(), trace.size.tolist(), trace.stream.tolist())
    )


@pytest.mark.parametrize("name", NAMES)
def test_recorded_logs_hold_what_they_held_without_the_bound(name):
    """On the recorded logs the moves fit the default share: four passes hold exactly the
    pages they hold with no bound (test_pool_core_arena.py gives those footprints)."""
    events = log_events(name)
    bounded = replay(costly_pool(DEFAULT.default), events, passes=4).arena
    unbounded = replay(costly_pool(1.0), events, passes=4).arena
    assert bounded["peak_physical_bytes"] == unbounded["peak_physical_bytes"]


def two_finished_blocks_between_live_ones(p):
    """Two 1 MiB blocks freed between live 64 KiB ones, their work done: free pages that no
    2 MiB request fits in, with the peak in use at 2 MiB + 128 KiB."""
    a = p.allocate(1 * MIB, stream=1)
    p.allocate(64 * KIB, stream=1)
    b = p.allocate(1 * MIB, stream=1)
    p.allocate(64 * KIB, stream=1)
    p.deallocate(a, 1 * MIB, stream=1)
    p.deallocate(b, 1 * MIB, stream=1)
    p.retire_stream(1)
    p.complete(1)


def test_at_zero_pages_move_only_when_the_device_is_out_of_memory():
    p = costly_pool(0.0, page=64 * KIB)
    two_finished_blocks_between_live_ones(p)
    p.allocate(2 * MIB, stream=2)  # over the budget, the peak not rising: fresh pages
    assert p.arena["unmaps"] == 0
    assert p.arena["physical_bytes"] == 4 * MIB + 128 * KIB
    assert p.stats["remapped_bytes"] == 0

    q = costly_pool(0.0, page=64 * KIB, upstream_limit=2 * MIB + 128 * KIB)
    two_finished_blocks_between_live_ones(q)
    q.allocate(2 * MIB, stream=2)  # no fresh page left: the finished blocks' pages move
    assert q.arena["unmaps"] == 2
    assert q.arena["physical_bytes"] == 2 * MIB + 128 * KIB
    assert q.stats["remapped_bytes"] == 2 * MIB
    assert q.violations == []


def test_while_the_peak_rises_pages_move_whatever_the_share():
    p = costly_pool(0.0, page=64 * KIB)
    two_finished_blocks_between_live_ones(p)
    p.allocate(3 * MIB, stream=2)  # a new peak: the move saves pages held from now on
    assert p.stats["remapped_bytes"] == 2 * MIB
    assert p.arena["physical_bytes"] == 3 * MIB + 128 * KIB
    assert p.violations == []


def test_stats_count_the_moves_and_their_time_not_release():
    p = costly_pool(1.0, page=64 * KIB)
    two_finished_blocks_between_live_ones(p)
    c = p.allocate(2 * MIB, stream=2)
    stats = p.stats
    assert stats["remapped_bytes"] == 2 * MIB
    # The growth's page calls: 2 x 16 pages unmapped, 32 mapped, one range's access.
    assert stats["remap_ns"] == PAGE_NS * (2 * 16 + 32 + 1)
    p.deallocate(c, 2 * MIB, stream=2)
    p.retire_stream(2)
    p.complete(2)
    assert p.release() == 2 * MIB
    assert p.stats["remapped_bytes"] == 2 * MIB, "a release is no move"
    assert p.violations == []


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused_before_any_cuda_call(bad):
    with pytest.raises(ValueError, match="remap_time_fraction must be within \\[0, 1\\]"):
        VmmPoolMemoryResource(remap_time_fraction=bad)


def test_a_fraction_that_is_no_number_is_refused():
    with pytest.raises(TypeError, match="remap_time_fraction must be a number"):
        VmmPoolMemoryResource(remap_time_fraction="half")


def test_at_zero_pages_move_when_maximum_pool_size_leaves_no_other_way():
    p = costly_pool(0.0, page=64 * KIB, maximum_pool_size=2 * MIB + 128 * KIB)
    two_finished_blocks_between_live_ones(p)
    p.allocate(2 * MIB, stream=2)  # fresh pages would pass the bound: the freed pages move
    assert p.arena["physical_bytes"] == 2 * MIB + 128 * KIB
    assert p.stats["remapped_bytes"] == 2 * MIB
    assert p.violations == []


def test_the_remap_model_tool_reports_footprints_and_time_moving_per_page_cost():
    """tools/remap_model.py, run as a script: a row per log and page cost; the CUB loop's log
    moves no page and keeps its first pass's footprint; bad passes and fractions are refused."""
    script = [sys.executable, str(TOOLS / "remap_model.py")]
    run = subprocess.run(
        [*script, "reduce_1m", "--passes", "8", "--page-ns", "3000", "30000"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    rows = [x for x in run.stdout.splitlines() if x.startswith("| reduce_1m |")]
    assert [r.split(" | ")[1:3] for r in rows] == [["200", "3000"], ["200", "30000"]]
    for r in rows:
        cells = r.strip("| ").split(" | ")
        assert cells[4] == cells[5] == cells[6] == "1.163x"  # 14 MiB of 2 MiB pages for 12 live
        assert cells[7:10] == ["0%", "0%", "0%"]
    assert "remap_time_fraction 0.05, 8 passes" in run.stdout
    for bad, message in (
        (["--passes", "4"], "expected at least 8"),
        (["--fraction", "2"], "[0, 1]"),
    ):
        res = subprocess.run([*script, *bad], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and message in res.stderr, res.stderr


def test_the_remap_model_paces_training_logs_as_the_training_benchmark_ran():
    """A log of PyTorch training steps is also modelled at the pace of the training benchmark:
    PyTorch's allocator's median step time for its model and batch over the log's calls per
    step (GPT-2, batch 8: 48.3 ms for 30613 / 13 calls, about 20.5 us a call). At that pace
    the pool moves the pages it needs within its allowance and settles within 1.03x the live
    peak, where calls back to back spend the allowance's credit and grow it to 1.19x."""
    remap = load_script(TOOLS / "remap_model.py")
    traces, training = TRACES, remap.TRAINING
    pace = remap.training_pace("torch_gpt2_small_train", traces, training)
    assert pace == pytest.approx(48.3e6 / (30613 / 13), rel=0.01)
    assert remap.training_pace("cupy_pipeline", traces, training) is None
    assert remap.training_pace("torch_gpt2_small_train", traces, ROOT / "none.json") is None
    events, peak = remap.load("torch_gpt2_small_train", traces)
    paced = remap.model(events, peak, 8, pace, 30000, 0.05)
    back_to_back = remap.model(events, peak, 8, 200, 30000, 0.05)
    assert paced["footprint_n"] < 1.03 < 1.15 < back_to_back["footprint_n"]
    assert paced["moving_last_4"] <= 0.05
