# SPDX-License-Identifier: Apache-2.0
"""The stream-ordered pool's core over a page arena (no GPU).

A page arena backs one reserved address range with pages on demand: the pool grows at the top
of its mapped range by what the free block below the top lacks, its free blocks merge across
growths, and when it would hold more than 1/16 over the most bytes it had in use, a growth
first unmaps whole pages of free blocks whose work is done (a query found their fences
complete) and the arena maps those pages again where the pool grows. The host arena's oracle
fails an unmap of bytes whose last use may still run; the state machines of test_pool_core.py
and test_pool_core_graphs.py run every actor (streams, threads, captures, graphs that replay
later) over it too.
"""

import pytest

from helpers.alloc_shapes import SHAPES, peak_live_bytes, replay_pass
from helpers.paths import ROOT
from rmm_fences_bench import read_allocation_log
from rmm_fences_testing import HostStreamOrderedPool

KIB, MIB = 1 << 10, 1 << 20
PAGE = 64 * KIB
TRACES = ROOT / "asv_bench" / "traces"
NAMES = sorted(p.name[: -len(".csv.gz")] for p in TRACES.glob("*.csv.gz"))


def arena_pool(**kwargs):
    return HostStreamOrderedPool(arena_page_size=PAGE, **kwargs)


def maps(p):
    """The arena's maps so far: (address, bytes)."""
    return [(a, n) for kind, a, n, *_ in p.upstream_calls if kind == "allocate"]


def test_growth_maps_only_what_the_free_block_at_the_top_lacks():
    p = arena_pool()
    a = p.allocate(100 * KIB, stream=1)
    assert maps(p) == [(a, 128 * KIB)]
    p.deallocate(a, 100 * KIB, stream=1)
    b = p.allocate(200 * KIB, stream=1)  # the free 128 KiB at the top, and 128 KiB more
    assert b == a
    assert maps(p) == [(a, 128 * KIB), (a + 128 * KIB, 128 * KIB)]
    assert p.chunks == [(a, 256 * KIB)], "the two growths are one range"
    assert p.arena["physical_bytes"] == 256 * KIB and p.violations == []


def pages_behind_a_fence(p):
    """Stream 1 frees a 1 MiB block below a live 64 KiB one and retires: the block is shared,
    behind a fence of stream 1 that has not completed. Returns the live block."""
    a = p.allocate(1 * MIB, stream=1)
    top = p.allocate(64 * KIB, stream=1)
    p.deallocate(a, 1 * MIB, stream=1)
    p.retire_stream(1)
    return a, top


def test_growth_unmaps_no_page_whose_work_may_still_run():
    p = arena_pool()
    a, _ = pages_behind_a_fence(p)
    b = p.allocate(2 * MIB, stream=2)  # over the budget, but stream 1's work may still run
    assert b != a
    assert p.arena["unmaps"] == 0
    assert p.arena["physical_bytes"] == 1 * MIB + 64 * KIB + 2 * MIB
    assert p.violations == []


def test_growth_maps_the_pages_of_finished_work_where_it_grows():
    p = arena_pool()
    a, top = pages_behind_a_fence(p)
    p.complete(1)  # stream 1's work ran: a query finds its fence complete
    b = p.allocate(2 * MIB, stream=2)
    assert b == top + 64 * KIB, "grown at the top"
    assert p.arena["unmaps"] == 1, "the 1 MiB block's pages back the new range"
    assert p.arena["physical_bytes"] == 64 * KIB + 2 * MIB
    assert p.chunks == [(top, 64 * KIB + 2 * MIB)]
    assert p.violations == []


def test_a_captured_stream_grows_a_range_of_its_own_above_a_fenced_block():
    """The block at the top carries a fence of another stream, which a captured stream cannot
    wait on: the growth leaves it alone and maps the whole request, which stays a chunk
    apart."""
    p = arena_pool()
    a = p.allocate(1 * MIB, stream=1)
    p.deallocate(a, 1 * MIB, stream=1)
    p.retire_stream(1)  # at the top, behind stream 1's fence
    p.begin_capture(2)
    b = p.allocate(1 * MIB + 64 * KIB, stream=2)
    assert b == a + 1 * MIB
    assert p.waits == [] and p.violations == []
    assert sorted(p.chunks) == [(a, 1 * MIB), (b, 1 * MIB + 64 * KIB)]


def test_release_unmaps_finished_pages_and_frees_the_spare_ones():
    p = arena_pool()
    a, top = pages_behind_a_fence(p)
    assert p.release() == 0, "stream 1's work may still run"
    p.complete(1)
    assert p.release() == 1 * MIB
    assert p.arena["physical_bytes"] == 64 * KIB
    assert p.chunks == [(top, 64 * KIB)] and p.violations == []


def test_maximum_pool_size_bounds_the_pages_held():
    p = arena_pool(maximum_pool_size=2 * MIB)
    a, _ = pages_behind_a_fence(p)
    with pytest.raises(MemoryError):  # 1 MiB + 64 KiB held: 1 MiB behind a fence
        p.allocate(1 * MIB + 512 * KIB, stream=2)
    p.complete(1)
    p.allocate(1 * MIB + 512 * KIB, stream=2)  # the finished 1 MiB mapped again at the top
    assert p.arena["physical_bytes"] <= 2 * MIB and p.violations == []


def test_out_of_pages_a_growth_maps_finished_pages_again():
    p = arena_pool(upstream_limit=2 * MIB)
    a, _ = pages_behind_a_fence(p)
    p.complete(1)
    p.allocate(1 * MIB + 512 * KIB, stream=2)
    assert p.arena["physical_bytes"] <= 2 * MIB and p.violations == []


# --- footprint on recorded logs and on shapes of other workloads --------------------------------


def replay(events, page=2 * MIB):
    """Replays (action, id, bytes, stream) events in order on idle streams (as a replay on the
    GPU runs: every fence complete at once); the most bytes of pages the arena held."""
    p = HostStreamOrderedPool(arena_page_size=page) if page else HostStreamOrderedPool()
    p.set_idle()
    ptrs, held = {}, 0
    for action, ident, size, stream in events:
        if action == 0:
            ptrs[ident] = p.allocate(size, stream=100 + stream)
        else:
            p.deallocate(ptrs.pop(ident), size, stream=100 + stream)
        held = max(held, p.pool_size())
    assert p.violations == []
    return p.arena["peak_physical_bytes"] if page else held


def log_events(name):
    trace = read_allocation_log(TRACES / f"{name}.csv.gz")
    events = zip(
        trace.action.tolist(), trace.id.tolist(), trace.size.tolist(), trace.stream.tolist()
    )
    return list(events), trace.peak_live_bytes


@pytest.mark.parametrize("name", NAMES)
def test_on_every_recorded_log_the_arena_holds_less_than_chunks(name):
    events, peak = log_events(name)
    arena, chunks = replay(events), replay(events, page=0)
    assert arena <= chunks, f"{name}: arena {arena / MIB:.1f} MiB, chunks {chunks / MIB:.1f} MiB"
    # Within 1.10x the log's live peak, but where the 2 MiB page is a sixth of the log
    # (reduce_1m: 12 MiB live). cupy_pipeline (three streams in phases) held 1.16x while a
    # stream stopped sharing its cache at the first block it took back in its next phase.
    bound = {"reduce_1m": peak + 2 * MIB}.get(name, 1.10 * peak)
    assert arena <= bound, f"{name}: {arena / MIB:.1f} MiB for {peak / MIB:.1f} MiB live"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_on_shapes_of_other_workloads_the_arena_holds_little_more_than_the_live_peak(shape):
    """Sizes from 256 B to GiB, long- and short-lived blocks, one or four streams: chunks
    hold 1.2x-2.3x the live peak there, the arena at most 1.15x."""
    events = SHAPES[shape]()
    peak = peak_live_bytes(events)
    arena = replay(events)
    assert arena <= 1.15 * peak, f"{shape}: {arena / MIB:.0f} MiB for {peak / MIB:.0f} MiB live"
    assert arena <= replay(events, page=0)


@pytest.mark.parametrize("name", ["cupy_pipeline", "torch_gpt2_small"])
def test_address_space_stays_bounded_over_many_passes(name):
    """A log replayed 60 times (what it never frees freed after each pass): growths map into
    the ranges unmapped pages left (holes) before the top, joining the free blocks on both
    sides, so the address space the pool used stops growing at a few times the live peak.
    Growing at the top alone used 55x (cupy_pipeline) and 3.8x (torch_gpt2_small) after 40
    passes, and went on growing; holes joined on one side only, 2.2x and still growing."""
    events, peak = log_events(name)
    p = HostStreamOrderedPool(arena_page_size=2 * MIB)
    p.set_idle()
    marks = []
    for _ in range(60):
        replay_pass(p, events)
        marks.append(p.arena["address_high_mark"])
    assert p.violations == []
    assert marks[-1] <= 3 * peak, f"{marks[-1] / peak:.1f}x the live peak after 60 passes"
    assert marks[-1] - marks[39] <= peak / 100, "still growing after 40 passes"
    assert p.arena["peak_physical_bytes"] <= 1.30 * peak
