# SPDX-License-Identifier: Apache-2.0
"""The census of the stream-ordered pool's core (host memory, no GPU): where every byte of its
chunks is (``HostStreamOrderedPool.census``), and the tool that reports it on the recorded
allocation logs (tools/footprint_breakdown.py).

A census lists each block of the chunks with its place (live, a stream's cache, covered by a
fence record or not, shared, behind fences, a graph's, orphaned); the harness checks that the
blocks tile the chunks, so that the places sum to the pool's size. Here that holds at every
step of a recorded log's replay and of generated programs, and each place is the one the
pool's rules put the block in.
"""

import importlib
import subprocess
import sys

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from helpers.paths import ROOT, TOOLS
from helpers.scripts import load_script
from helpers.stateful import machine_settings
from rmm_fences_bench import read_allocation_log
from rmm_fences_bench.alloc_log import ALLOCATE
from rmm_fences_testing import (
    POOL_CENSUS_PLACES,
    POOL_CENSUS_SIZE_CLASSES,
    HostStreamOrderedPool,
)

TRACES = ROOT / "asv_bench" / "traces"
KiB = 1 << 10
MiB = 1 << 20
GRANULE = 256
#: Frees of a new stream that are each covered by a fence record (the core's `young_frees`).
YOUNG_FREES = 16
STREAMS = st.sampled_from([1, 2, 3, 4])


def rounded(n):
    return max(GRANULE, (n + GRANULE - 1) // GRANULE * GRANULE)


def check_census(p, live_bytes):
    """The census of `p` tiles its chunks (the harness raises otherwise), its places sum to
    the pool's size, its live bytes are `live_bytes`, and each of its views (by owner, by
    size class, by chunk) sums to the same bytes."""
    c = p.census()
    size = p.pool_size()
    assert c["pool_bytes"] == size == sum(n for _, n in p.chunks)
    assert set(c["places"]) == set(POOL_CENSUS_PLACES)
    assert sum(c["places"].values()) == size
    assert c["places"]["live"] == live_bytes
    assert size - live_bytes == sum(n for _, n, _ in p.free_blocks)
    for view in ("by_owner", "by_size_class"):
        for place in POOL_CENSUS_PLACES:
            part = sum(n for (where, _), n in c[view].items() if where == place)
            assert part == c["places"][place], (view, place)
    assert {cls for _, cls in c["by_size_class"]} <= set(POOL_CENSUS_SIZE_CLASSES)
    assert sum(ch["size"] for ch in c["chunks"]) == size
    assert sum(ch["live"] for ch in c["chunks"]) == live_bytes
    for ch in c["chunks"]:
        assert ch["live"] + ch["free"] == ch["size"]
        assert ch["largest_free"] <= ch["free"]
    return c


def places_held(c):
    """The places that hold bytes, as {place: bytes}."""
    return {k: v for k, v in c["places"].items() if v}


# --- each place, as the pool's rules make it -----------------------------------------------


def test_a_young_stream_s_free_is_cached_covered_and_its_chunk_s_rest_fenced():
    """A new stream's frees are each covered by a fence record (they stay in its cache); the
    rest of the chunk grown for it is shared behind its fence."""
    p = HostStreamOrderedPool()
    ptr = p.allocate(4 * KiB, stream=1)
    c = check_census(p, 4 * KiB)
    assert c["by_owner"] == {("live", 1): 4 * KiB, ("shared_fenced", 1): 2 * MiB - 4 * KiB}
    p.deallocate(ptr, 4 * KiB, stream=1)
    c = check_census(p, 0)
    assert c["by_owner"][("cached_covered", 1)] == 4 * KiB
    assert c["largest"]["cached_covered"] == 4 * KiB


def test_a_grown_up_stream_s_free_is_cached_until_another_stream_runs_short():
    """Past its young frees, a stream's free stays in its cache with no record after it; a
    stream that runs short asks for its fence, and its next free shares the cache."""
    p = HostStreamOrderedPool()
    for _ in range(YOUNG_FREES):
        p.deallocate(p.allocate(256, stream=1), 256, stream=1)
    kept = p.allocate(64 * KiB, stream=1)
    ptr = p.allocate(4 * KiB, stream=1)
    p.deallocate(ptr, 4 * KiB, stream=1)
    c = check_census(p, 64 * KiB)
    # the whole cache, the block its young frees reused included: one record covers it or none
    assert c["by_owner"][("cached", 1)] == 4 * KiB + 256
    other = p.allocate(2 * MiB, stream=2)  # more than is free: stream 2 runs short
    p.deallocate(kept, 64 * KiB, stream=1)  # fenced and shared at its next free
    c = check_census(p, 2 * MiB)
    assert c["places"]["cached"] == 0
    assert c["by_owner"][("shared_fenced", 1)] >= 68 * KiB
    p.deallocate(other, 2 * MiB, stream=2)


def test_a_reclaim_leaves_every_free_block_shared_without_fences():
    p = HostStreamOrderedPool()
    for s in (1, 2):
        p.deallocate(p.allocate(8 * KiB, stream=s), 8 * KiB, stream=s)
    assert p.synchronize_and_reclaim()
    c = check_census(p, 0)
    assert places_held(c) == {"shared": p.pool_size()}
    assert set(c["by_owner"]) == {("shared", "shared")}


def test_a_captured_stream_s_free_is_its_graph_s_and_shared_once_the_graph_is_gone():
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    cid = p.begin_capture(2)
    ptr = p.allocate(16 * KiB, stream=2)
    p.deallocate(ptr, 16 * KiB, stream=2)
    p.end_capture(2)
    c = check_census(p, 0)
    assert c["places"]["graph"] == 16 * KiB
    assert p.destroy_graph(cid)
    # stats() hands back what graphs that are gone held (as the next miss would)
    assert p.stats["graph_bytes"] == 0
    c = check_census(p, 0)
    assert c["places"]["graph"] == 0


def test_an_idle_stream_s_uncovered_cache_is_orphaned_by_the_sweep():
    """A stream past its young frees, idle through two sweeps of the slots, leaves its cache
    (freed after its last record) to the orphans, which only a device sync frees."""
    p = HostStreamOrderedPool(initial_pool_size=1 * MiB)
    for _ in range(YOUNG_FREES):
        p.deallocate(p.allocate(256, stream=1), 256, stream=1)
    p.deallocate(p.allocate(32 * KiB, stream=1), 32 * KiB, stream=1)
    for s in range(1 << 20, (1 << 20) + 200):  # a stream per task: the sweeps retire idle slots
        p.deallocate(p.allocate(256, stream=s), 256, stream=s)
    c = check_census(p, 0)
    assert c["by_owner"][("orphan", "orphans")] >= 32 * KiB
    assert c["places"]["orphan"] == p.stats["orphan_bytes"]


# --- every step of a recorded log ----------------------------------------------------------


def test_the_census_sums_to_the_pool_at_every_step_of_a_recorded_log():
    """The CuPy pipeline's log (three streams, 1220 events): a census after every event."""
    trace = read_allocation_log(TRACES / "cupy_pipeline.csv.gz")
    p = HostStreamOrderedPool()
    ptrs = {}
    live = 0
    for action, ident, size, stream in zip(
        trace.action.tolist(), trace.id.tolist(), trace.size.tolist(), trace.stream.tolist()
    ):
        if action == ALLOCATE:
            ptrs[ident] = p.allocate(size, stream=100 + stream)
            live += rounded(size)
        else:
            p.deallocate(ptrs.pop(ident), size, stream=100 + stream)
            live -= rounded(size)
        check_census(p, live)
    assert p.violations == []


# --- generated programs --------------------------------------------------------------------


class CensusModel(RuleBasedStateMachine):
    """Allocations and frees on several streams, captures and their graphs, streams that come
    and go (sweeps), retirement, release, reclaim, completed work and failed records: after
    each step the census tiles the chunks and agrees with the pool's counts."""

    @initialize(
        initial=st.sampled_from([0, 256 * KiB, 1 * MiB]),
        maximum=st.none() | st.sampled_from([2 * MiB, 4 * MiB]),
    )
    def setup(self, initial, maximum):
        self.p = HostStreamOrderedPool(initial, maximum)
        self.live = {}  # allocation number -> (ptr, bytes)
        self.allocations = 0
        self.capturing = {}  # stream -> capture id
        self.graphs = []
        self.next_stream = 1 << 20

    @rule(
        nbytes=st.integers(0, 600 * KiB),
        stream=STREAMS,
        alignment=st.sampled_from([256, 256, 4096]),
    )
    def allocate(self, nbytes, stream, alignment):
        try:
            ptr = self.p.allocate(nbytes, stream, alignment)
        except MemoryError:
            return
        self.live[self.allocations] = (ptr, nbytes)
        self.allocations += 1

    @rule(pick=st.integers(0, 1 << 16), stream=STREAMS)
    def free(self, pick, stream):
        if self.live:
            ptr, nbytes = self.live.pop(sorted(self.live)[pick % len(self.live)])
            self.p.deallocate(ptr, nbytes, stream)

    @rule(nbytes=st.integers(0, 200 * KiB), stream=STREAMS)
    def temporary(self, nbytes, stream):
        """Allocated and freed at once (in a capture: the graph's from then on)."""
        try:
            self.p.deallocate(self.p.allocate(nbytes, stream), nbytes, stream)
        except MemoryError:
            pass

    @rule(stream=STREAMS)
    def begin_capture(self, stream):
        if stream not in self.capturing:
            self.capturing[stream] = self.p.begin_capture(stream, mode="relaxed")

    @rule(stream=STREAMS)
    def end_capture(self, stream):
        cid = self.capturing.pop(stream, None)
        if cid is not None:
            self.p.end_capture(stream)
            self.p.instantiate(cid)
            self.graphs.append(cid)

    @rule(pick=st.integers(0, 1 << 16))
    def destroy_graph(self, pick):
        if self.graphs:
            cid = self.graphs.pop(pick % len(self.graphs))
            while self.p.destroy_exec(cid):
                pass
            self.p.destroy_graph(cid)

    @rule(count=st.integers(1, 150))
    def short_lived_streams(self, count):
        for s in range(self.next_stream, self.next_stream + count):
            try:
                self.p.deallocate(self.p.allocate(256, s), 256, s)
            except MemoryError:
                pass
        self.next_stream += count

    @rule(stream=STREAMS)
    def retire(self, stream):
        self.p.retire_stream(stream)

    @rule()
    def release(self):
        self.p.release()

    @rule()
    def reclaim(self):
        if not self.capturing:  # a device sync while a capture is live is not allowed
            self.p.synchronize_and_reclaim()

    @rule()
    def complete_all(self):
        self.p.complete_all()

    @rule()
    def fail_next_record(self):
        self.p.fail_next("record")

    @invariant()
    def census_agrees(self):
        if not hasattr(self, "p"):
            return
        stats = self.p.stats  # first: it hands back what gone graphs held
        c = check_census(self.p, sum(rounded(n) for _, n in self.live.values()))
        assert c["places"]["live"] == stats["current_bytes"]
        assert c["places"]["orphan"] == stats["orphan_bytes"]
        assert c["places"]["graph"] == stats["graph_bytes"]
        assert self.p.violations == []


TestCensusModel = CensusModel.TestCase
TestCensusModel.settings = machine_settings(max_examples=150, steps=30)


# --- the tool ------------------------------------------------------------------------------


def test_the_footprint_breakdown_runs_on_a_small_log(tmp_path):
    """tools/footprint_breakdown.py, run as a script, on the CUB temp-storage loop's log (410
    events): the summary row, and the log's section with its census (the places sum to the
    pool), its growths and the contributors to its excess over the live peak (the chunk grown
    for a small request right after the first one). Without the H200 figures, their columns
    say so."""
    res = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "footprint_breakdown.py"),
            "reduce_1m",
            "--gpu-replay",
            str(tmp_path / "none.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = res.stdout
    assert "| reduce_1m | 12.0 | 16.0 | 16.0 | 1.329x | - | - | - |" in out, out
    assert "## reduce_1m" in out
    for place in POOL_CENSUS_PLACES:
        assert f"\n| {place} |" in out, place
    assert "| total | 16.0 | 100% | 16.0 | 100% | 16.0 | 100% |" in out, out
    assert "| free in the chunk of growth 1 (event 1: 4.0 MiB for 1.0 KiB) | 4.0 | 100% |" in out
    assert "; the pool's core over host chunks, no GPU; H200 columns from `none`" in out
    # docs/performance.md publishes the summary and each log's census at the pool's peak
    report = load_script(TOOLS / "asv_report.py")
    (tmp_path / "breakdown.md").write_text(out)
    meta, summary = report.render_footprint(tmp_path / "breakdown.md", "b.md", {})
    assert meta["commit"] and "no GPU" in meta["note"]
    assert summary.splitlines()[2].startswith("| reduce_1m | 12.0 | 16.0 | 16.0 | 1.329x |")
    _, places = report.render_footprint(tmp_path / "breakdown.md", "b.md", {"part": "places"})
    assert places.splitlines()[0] == "| log | " + " | ".join([*POOL_CENSUS_PLACES, "total"]) + " |"
    assert places.splitlines()[2].startswith("| reduce_1m |") and places.endswith("| 16.0 |")
    with pytest.raises(ValueError, match="part=chunks: expected summary or places"):
        report.render_footprint(tmp_path / "breakdown.md", "b.md", {"part": "chunks"})


def test_the_footprint_breakdown_reports_what_the_pool_holds_when_the_log_repeats(monkeypatch):
    """``--passes N``: a column of what a fresh pool holds after N replays in a row. With
    growths bounded to 2 MiB, cupy_pipeline's pool holds 1.224x the live peak after one pass but
    more once the log repeats (its free space, broken up differently from the first pass's, no
    longer fits the pass's requests); with the pool's own rule it holds what it held after the
    first. The figures are the same whatever ran before in the process (the harness places
    chunks as the device does, lowest free address first)."""
    monkeypatch.syspath_prepend(str(TOOLS))  # its dataclasses need it imported as a module
    fb = importlib.import_module("footprint_breakdown")
    trace = read_allocation_log(ROOT / "asv_bench" / "traces" / "cupy_pipeline.csv.gz")
    peak, events = trace.peak_live_bytes, fb.events_of(trace)
    first = fb.repeated_size(events, 2 << 20, 1)
    assert first / peak == pytest.approx(1.224, abs=5e-4)
    assert fb.repeated_size(events, 2 << 20, 1) == first
    assert fb.repeated_size(events, 2 << 20, 8) / peak > 1.4
    own = fb.repeated_size(events, None, 1)
    assert fb.repeated_size(events, None, 8) == own
    out = fb.summary([fb.replay("reduce_1m", passes=3)], {}, passes=3)
    assert out[0].split(" | ")[5] == "after 3 passes MiB (÷ live peak)", out[0]
    assert out[2].startswith("| reduce_1m | 12.0 | 16.0 | 16.0 | 1.329x | 16.0 (1.329x) | - |")
