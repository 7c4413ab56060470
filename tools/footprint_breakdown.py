# SPDX-License-Identifier: Apache-2.0
"""Where the stream-ordered pool's bytes go on the recorded allocation logs: a fragmentation
breakdown per log, on the pool's C++ core over host chunks (no GPU).

    python tools/footprint_breakdown.py                  # every log in asv_bench/traces
    python tools/footprint_breakdown.py reduce_1m cupy_pipeline
    python tools/footprint_breakdown.py --traces DIR --gpu-replay FILE
    python tools/footprint_breakdown.py --maximum-growth-size 128MiB   # growths bounded

Needs the host test harness (``rmm_fences_testing``, tests/native) and the benchmarks' library
(``rmm_fences_bench``, benchmarks/), both built in place by ``make install``.

Each log is replayed through ``HostStreamOrderedPool`` one event at a time in recorded order,
each recorded stream a stream of its own, as tests/pool/test_pool_core_traces.py does (the
H200 replay runs each recorded thread on a thread of its own, so its interleaving, and its
footprint, may differ). A census of the pool (``HostStreamOrderedPool.census``: every byte of
its chunks by place, owner stream, size class and chunk, summing to the pool's size) is taken
before each growth, when the pool reaches its peak (after its last growth), at the log's live
peak and at the end. The report, in markdown: a summary table over the logs (live peak, the
pool at its peak and at the end, the ratio, the H200 replay's figures from ``--gpu-replay``,
and the peak of the pool over a page arena of 2 MiB pages, VmmPoolMemoryResource's core,
replayed on idle streams), then per log the censuses, the free bytes by size class and by
stream, the chunks, the growths (what was free when the pool grew, and why no free block
served the request) and the excess over the live peak split into its contributors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "native"), str(ROOT / "benchmarks")]
from rmm_fences._cli._args import positive  # noqa: E402

from rmm_fences_bench import read_allocation_log  # noqa: E402
from rmm_fences_bench.alloc_log import ALLOCATE  # noqa: E402
from rmm_fences_bench.cli import size as size_argument  # noqa: E402
from rmm_fences_testing import (  # noqa: E402
    POOL_CENSUS_PLACES,
    POOL_CENSUS_SIZE_CLASSES,
    HostStreamOrderedPool,
)

TRACES = ROOT / "asv_bench" / "traces"
GPU_REPLAY = ROOT / "docs" / "data" / "replay" / "replay_2026-12-05.jsonl"
MIB = 1 << 20
GRANULE = 256
#: Recorded stream k replays as host stream STREAM_BASE + k (0 is the default stream's identity).
STREAM_BASE = 100
FREE_PLACES = tuple(p for p in POOL_CENSUS_PLACES if p != "live")
MOMENTS = ("pool peak", "live peak", "end")
PLACE_MEANING = {
    "live": "handed out (rounded to 256 B)",
    "cached": "a stream's cache, freed after its last fence record: only that stream reuses it",
    "cached_covered": "a stream's cache under a record: shared once another stream runs short",
    "shared": "shared list, no fence: any stream takes it",
    "shared_fenced": "shared list behind fences: another stream takes it after a stream wait",
    "graph": "a captured stream's cache, or kept for a graph that may replay it",
    "orphan": "left by a slot retired without a record: only a device sync frees it",
}
TOP = 5


@dataclasses.dataclass
class Growth:
    """One growth: the event that asked for it, the request (rounded), the chunk, and the
    census just before it (after the pool's own attempts to find a block)."""

    event: int
    stream: int
    request: int
    chunk: int
    census: dict


@dataclasses.dataclass
class Breakdown:
    """A log's replay: its live peak (requested bytes), the pool's peak and end, and a census
    at each of ``MOMENTS`` (with the requested bytes live then)."""

    name: str
    live_peak: int
    live_peak_event: int
    pool_peak: int
    pool_peak_event: int
    pool_end: int
    censuses: dict[str, dict]
    requested: dict[str, int]
    growths: list[Growth]
    chunk_order: dict[int, int]  # chunk address -> the index of the growth that made it
    arena_peak: int = 0  # the most bytes of pages the pool over 2 MiB pages held (arena_peak)
    repeated: int = 0  # bytes held after the log repeated (repeated_size); 0: not replayed so

    @property
    def excess(self) -> int:
        return self.pool_end - self.live_peak

    def chunk_origin(self, ptr: int) -> int:
        """The index of the growth that made the chunk at ``ptr``."""
        return self.chunk_order[ptr]


def rounded(n: int) -> int:
    return max(GRANULE, (n + GRANULE - 1) // GRANULE * GRANULE)


def mib(n: int) -> str:
    """`n` bytes in MiB, to 0.1 (a few bytes show as such, not as nothing)."""
    return "<0.1" if 0 < n < MIB // 20 else f"{n / MIB:.1f}"


def human(n: int) -> str:
    """`n` bytes in the largest unit that keeps it at least 1 (B, KiB, MiB, GiB)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def share(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%" if total else "-"


def live_peak_event(trace) -> int:
    """The first event after which the log's live bytes (as requested) are at their peak."""
    live = peak = at = 0
    sizes = {}
    for i, (action, ident, size) in enumerate(
        zip(trace.action.tolist(), trace.id.tolist(), trace.size.tolist())
    ):
        if action == ALLOCATE:
            sizes[ident] = size
            live += size
        else:
            live -= sizes.pop(ident)
        if live > peak:
            peak, at = live, i
    return at


def log_names(traces) -> list[str]:
    """The logs recorded in the folder ``traces`` (``<name>.csv.gz``), by name, sorted."""
    return sorted(p.name[: -len(".csv.gz")] for p in pathlib.Path(traces).glob("*.csv.gz"))


def events_of(trace) -> list[tuple[int, int, int, int]]:
    """The log's events: (action, id, bytes, recorded stream)."""
    events = zip(trace.action.tolist(), trace.id.tolist(), trace.size.tolist(), trace.stream)
    return [(a, i, n, int(s)) for a, i, n, s in events]


def log_events(traces, name: str) -> list[tuple[int, int, int, int]]:
    """The events (``events_of``) of the log ``name`` recorded in the folder ``traces``."""
    return events_of(read_allocation_log(pathlib.Path(traces) / f"{name}.csv.gz"))


def one_pass(pool, events) -> None:
    """The log once, in order (recorded stream k is host stream STREAM_BASE + k); what it
    leaves live is freed after it."""
    live = {}
    for action, ident, nbytes, stream in events:
        if action == ALLOCATE:
            live[ident] = (pool.allocate(nbytes, stream=STREAM_BASE + stream), nbytes, stream)
        elif ident in live:
            ptr, n, _ = live.pop(ident)
            pool.deallocate(ptr, n, stream=STREAM_BASE + stream)
    for ptr, nbytes, stream in live.values():
        pool.deallocate(ptr, nbytes, stream=STREAM_BASE + stream)


def arena_peak(events) -> int:
    """The most bytes of pages the pool over a page arena of 2 MiB pages (VmmPoolMemoryResource's
    core) held replaying a log's ``events`` (``events_of``) in recorded order on idle streams
    (every fence complete at once, as on the GPU, where the replay runs no kernel)."""
    pool = HostStreamOrderedPool(arena_page_size=2 * MIB)
    pool.set_idle()
    one_pass(pool, events)
    if pool.violations:
        raise RuntimeError(f"the oracle saw {pool.violations}")
    return pool.arena["peak_physical_bytes"]


def repeated_size(events, maximum_growth_size: int | None, passes: int) -> int:
    """The bytes the pool over host chunks holds after replaying a log's ``events``
    (``events_of``) ``passes`` times in a row, on idle streams (what it left live freed after
    each pass): where a workload that repeats settles."""
    pool = HostStreamOrderedPool(maximum_growth_size=maximum_growth_size)
    pool.set_idle()
    for _ in range(passes):
        one_pass(pool, events)
    if pool.violations:
        raise RuntimeError(f"the oracle saw {pool.violations}")
    return pool.pool_size()


def replay(
    name: str,
    traces: pathlib.Path = TRACES,
    maximum_growth_size: int | None = None,
    passes: int = 1,
) -> Breakdown:
    """Replays the log ``name`` on a host pool (growths bounded by ``maximum_growth_size``, as
    the resource's argument) with a census at each of ``MOMENTS``; with ``passes`` above 1, also
    what a fresh pool holds after that many replays in a row (``repeated_size``)."""
    trace = read_allocation_log(traces / f"{name}.csv.gz")
    peak_event = live_peak_event(trace)
    pool = HostStreamOrderedPool(maximum_growth_size=maximum_growth_size)
    pool.record_growths()
    ptrs, grown, censuses, requested = {}, [], {}, {}
    live = pool_peak_event = 0
    events = events_of(trace)
    for i, (action, ident, size, stream) in enumerate(events):
        held = pool.pool_size()
        if action == ALLOCATE:
            ptrs[ident] = pool.allocate(size, stream=STREAM_BASE + stream)
            live += size
        else:
            pool.deallocate(ptrs.pop(ident), size, stream=STREAM_BASE + stream)
            live -= size
        if pool.pool_size() != held:
            grown.append((i, stream, rounded(size)))
            censuses["pool peak"], requested["pool peak"], pool_peak_event = pool.census(), live, i
        if i == peak_event:
            censuses["live peak"], requested["live peak"] = pool.census(), live
    censuses["end"], requested["end"] = pool.census(), live
    censuses.setdefault("pool peak", censuses["end"])
    requested.setdefault("pool peak", live)
    censuses.setdefault("live peak", censuses["end"])
    requested.setdefault("live peak", live)
    if pool.violations:
        raise RuntimeError(f"{name}: the oracle saw {pool.violations}")
    growths = [
        Growth(event, stream, request, g["chunk"], g["census"])
        for (event, stream, request), g in zip(grown, pool.growths, strict=True)
    ]
    chunk_order = {
        ptr: k
        for k, (_, ptr, *_) in enumerate(c for c in pool.upstream_calls if c[0] == "allocate")
    }
    return Breakdown(
        name=name,
        live_peak=trace.peak_live_bytes,
        live_peak_event=peak_event,
        pool_peak=max(censuses["pool peak"]["pool_bytes"], censuses["end"]["pool_bytes"]),
        pool_peak_event=pool_peak_event,
        pool_end=pool.pool_size(),
        censuses=censuses,
        requested=requested,
        growths=growths,
        chunk_order=chunk_order,
        arena_peak=arena_peak(events),
        repeated=repeated_size(events, maximum_growth_size, passes) if passes > 1 else 0,
    )


# --- the H200 replay's figures ----------------------------------------------------------------


def gpu_footprints(path: pathlib.Path) -> dict[tuple[str, str], float]:
    """(log, chain) -> footprint in MiB, from the H200 replay's JSON lines (none: empty)."""
    if not path.is_file():
        return {}
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {(r["trace"], r["chain"]): r["footprint_mib"] for r in rows if "trace" in r}


# --- the report -------------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def free_bytes(census: dict) -> int:
    return census["pool_bytes"] - census["places"]["live"]


def ratio(n: float, of: int) -> str:
    return f"{n / of:.3f}x"


def chunk_label(b: Breakdown, k: int) -> str:
    g = b.growths[k]
    return f"growth {k} (event {g.event}: {mib(g.chunk)} MiB for {human(g.request)})"


def excess_parts(b: Breakdown) -> list[tuple[str, int]]:
    """The excess over the live peak, most first: the free bytes of each chunk at the live
    peak (at least 1 MiB), labelled with the growth that made the chunk, and each growth after
    the live peak. With the chunks' smaller free bytes and the live blocks' rounding, they sum
    to the excess."""
    c = b.censuses["live peak"]
    parts = [
        (f"free in the chunk of {chunk_label(b, b.chunk_origin(ch['ptr']))}", ch["free"])
        for ch in c["chunks"]
        if ch["free"] >= MIB
    ]
    parts += [
        (f"{chunk_label(b, k)}, after the live peak: {why_grown(g)}", g.chunk)
        for k, g in enumerate(b.growths)
        if g.event > b.live_peak_event
    ]
    return sorted(parts, key=lambda part: -part[1])


def main_contributor(b: Breakdown) -> str:
    """The largest part of the excess over the live peak, with its share."""
    parts = excess_parts(b)
    if not parts or b.excess <= 0:
        return "-"
    label, n = parts[0]
    return f"{label} ({share(n, b.excess)})"


def summary(breakdowns: list[Breakdown], gpu: dict, passes: int = 1) -> list[str]:
    """One row per log: live peak, the pool's peak and end (and after ``passes`` replays in a
    row, when more than 1), and the H200 replay's figures."""
    repeats = [f"after {passes} passes MiB (÷ live peak)"] if passes > 1 else []
    header = [
        "log",
        "live peak MiB",
        "pool peak MiB",
        "pool end MiB",
        "end ÷ live peak",
        *repeats,
        "H200 pool MiB (÷ live peak)",
        "host − H200 MiB",
        "H200 CudaAsync MiB (÷ live peak)",
        "vmm_pool peak MiB (÷ live peak)",
        "most of the excess",
    ]
    rows = []
    for b in breakdowns:
        pool, cuda = gpu.get((b.name, "rmm_fences_pool")), gpu.get((b.name, "cuda_async"))
        rows.append(
            [
                b.name,
                mib(b.live_peak),
                mib(b.pool_peak),
                mib(b.pool_end),
                ratio(b.pool_end, b.live_peak),
                *([f"{mib(b.repeated)} ({ratio(b.repeated, b.live_peak)})"] if repeats else []),
                "-" if pool is None else f"{pool:.1f} ({ratio(pool * MIB, b.live_peak)})",
                "-" if pool is None else f"{b.pool_end / MIB - pool:+.1f}",
                "-" if cuda is None else f"{cuda:.1f} ({ratio(cuda * MIB, b.live_peak)})",
                f"{mib(b.arena_peak)} ({ratio(b.arena_peak, b.live_peak)})",
                main_contributor(b),
            ]
        )
    return table(header, rows)


def census_rows(b: Breakdown) -> list[str]:
    """The places at each moment, then the chunk-level view."""
    header = ["place"] + [f"{m} {x}" for m in MOMENTS for x in ("MiB", "%")] + ["what it is"]
    rows = []
    for place in POOL_CENSUS_PLACES:
        cells = []
        for m in MOMENTS:
            c = b.censuses[m]
            cells += [mib(c["places"][place]), share(c["places"][place], c["pool_bytes"])]
        rows.append([place, *cells, PLACE_MEANING[place]])
    totals = []
    for m in MOMENTS:
        totals += [mib(b.censuses[m]["pool_bytes"]), "100%"]
    rows.append(["total", *totals, "the pool's size (the places sum to it)"])
    return table(header, rows)


def chunk_level(b: Breakdown) -> list[str]:
    """Chunk-level waste at each moment: free bytes in chunks with no live block and beside
    live blocks, the largest free block, the live blocks' rounding to the granule."""
    header = ["chunk level", *(f"{m} MiB" for m in MOMENTS)]

    def row(label, f):
        return [label, *(f(b.censuses[m], m) for m in MOMENTS)]

    def whole_free(c, _):
        return mib(sum(ch["free"] for ch in c["chunks"] if ch["live"] == 0))

    def beside_live(c, _):
        return mib(sum(ch["free"] for ch in c["chunks"] if ch["live"] > 0))

    def largest(c, _):
        return mib(max((ch["largest_free"] for ch in c["chunks"]), default=0))

    def rounding(c, m):
        return mib(c["places"]["live"] - b.requested[m])

    rows = [
        row("chunks", lambda c, _: str(len(c["chunks"]))),
        row("free in chunks with no live block", whole_free),
        row("free beside live blocks (same chunk)", beside_live),
        row("largest free block", largest),
        row("live blocks' rounding to 256 B", rounding),
    ]
    return table(header, rows)


def size_classes(census: dict) -> list[str]:
    """Bytes by size class (rows) and place (columns with any bytes)."""
    places = [p for p in POOL_CENSUS_PLACES if census["places"][p]]
    rows = []
    for cls in POOL_CENSUS_SIZE_CLASSES:
        cells = [census["by_size_class"].get((p, cls), 0) for p in places]
        if any(cells):
            rows.append([cls, *map(mib, cells)])
    return table(["block size", *(f"{p} MiB" for p in places)], rows)


def owner_name(owner) -> str:
    return owner if isinstance(owner, str) else f"stream {owner - STREAM_BASE}"


def by_stream(census: dict) -> list[str]:
    """Free bytes by (place, owner stream), most first."""
    free = free_bytes(census)
    items = sorted(
        ((n, place, owner) for (place, owner), n in census["by_owner"].items() if place != "live"),
        reverse=True,
    )
    rows = [[place, owner_name(owner), mib(n), share(n, free)] for n, place, owner in items]
    return table(["free place", "owner (fence of)", "MiB", "% of free"], rows)


def chunks(b: Breakdown, census: dict) -> list[str]:
    """Each chunk, in growth order, with the growth that made it."""
    rows = []
    for ch in sorted(census["chunks"], key=lambda ch: b.chunk_origin(ch["ptr"])):
        k = b.chunk_origin(ch["ptr"])
        g = b.growths[k]
        rows.append(
            [
                k,
                g.event,
                human(g.request),
                mib(ch["size"]),
                mib(ch["live"]),
                mib(ch["free"]),
                mib(ch["largest_free"]),
                ch["free_blocks"],
            ]
        )
    header = ["growth", "event", "request", "chunk MiB", "live MiB", "free MiB"]
    return table(header + ["largest free MiB", "free blocks"], rows)


def why_grown(g: Growth) -> str:
    """Why no free block served the request that grew the pool."""
    c, need = g.census, g.request
    free = free_bytes(c)
    fits = [p for p in FREE_PLACES if c["largest"][p] >= need]
    if fits:
        return "a block that fits sat in " + ", ".join(fits)
    if free < need:
        return f"short: {human(need - free)} more than all free"
    if max((ch["free"] for ch in c["chunks"]), default=0) < need:
        return "enough free bytes in all, but no chunk holds enough"
    return "a chunk holds enough free bytes, split by its live blocks"


def growth_rows(b: Breakdown) -> list[str]:
    """Each growth: the request, the chunk, and what was free just before it."""
    rows = []
    for k, g in enumerate(b.growths):
        c = g.census
        largest = max(FREE_PLACES, key=lambda p: c["largest"][p])
        held = ", ".join(
            f"{p} {mib(c['places'][p])}" for p in FREE_PLACES if c["places"][p] >= MIB // 10
        )
        rows.append(
            [
                k,
                g.event,
                f"stream {g.stream}",
                human(g.request),
                mib(c["pool_bytes"]),
                mib(g.chunk),
                mib(g.chunk - g.request),
                mib(free_bytes(c)),
                held or "-",
                f"{mib(c['largest'][largest])} ({largest})" if c["largest"][largest] else "-",
                why_grown(g),
            ]
        )
    header = ["#", "event", "on", "request", "pool before MiB", "chunk MiB", "beyond MiB"]
    header += ["free before MiB"]
    return table(header + ["free by place MiB", "largest free MiB", "why it grew"], rows)


def contributors(b: Breakdown) -> list[str]:
    """The excess over the live peak, split: by chunk and later growth (`excess_parts`), then
    the free bytes at the live peak by place and stream."""
    c = b.censuses["live peak"]
    rounding = c["places"]["live"] - b.live_peak
    later = b.pool_end - c["pool_bytes"]
    lines = [
        f"Excess over the live peak: {mib(b.excess)} MiB = free at the live peak (event "
        f"{b.live_peak_event}) {mib(free_bytes(c))} + live blocks' rounding {mib(rounding)} "
        f"+ growth after the live peak {mib(later)}.",
        "",
    ]
    rows = [[label, mib(n), share(n, b.excess)] for label, n in excess_parts(b)[:TOP]]
    lines += table(["top contributors: where the excess is", "MiB", "% of excess"], rows)
    rows = [
        [place, owner_name(owner), mib(n), share(n, b.excess)]
        for (place, owner), n in sorted(c["by_owner"].items(), key=lambda kv: -kv[1])
        if place != "live" and n >= MIB
    ][:TOP]
    header = ["free at the live peak: place", "owner (fence of)", "MiB", "% of excess"]
    return [*lines, "", *table(header, rows)]


def report(b: Breakdown) -> list[str]:
    """A log's section."""
    peak = b.censuses["pool peak"]
    out = [
        f"## {b.name}",
        "",
        f"Live peak {mib(b.live_peak)} MiB (event {b.live_peak_event}); the pool reached "
        f"{mib(b.pool_peak)} MiB at event {b.pool_peak_event} and held {mib(b.pool_end)} MiB at "
        f"the end ({ratio(b.pool_end, b.live_peak)} the live peak), in {len(b.growths)} "
        f"growths, which took {mib(sum(g.chunk - g.request for g in b.growths))} MiB beyond "
        "their requests.",
        "",
        "Census (pool peak: after the last growth):",
        "",
        *census_rows(b),
        "",
        *chunk_level(b),
        "",
        "At the pool's peak, by size class:",
        "",
        *size_classes(peak),
        "",
        "At the pool's peak, free bytes by stream:",
        "",
        *by_stream(peak),
        "",
        "Chunks at the live peak:",
        "",
        *chunks(b, b.censuses["live peak"]),
        "",
        "Growths (the census just before each):",
        "",
        *growth_rows(b),
        "",
        *contributors(b),
        "",
    ]
    return out


def stamp(gpu_replay: pathlib.Path) -> str:
    """The line under the title: the checkout's commit (the pool's core that ran), and where the
    H200 columns come from."""
    from asv_bodies import checkout_commit

    source = gpu_replay.name if gpu_replay.is_file() else "none"
    return (
        f"commit `{checkout_commit() or 'unknown'}`; the pool's core over host chunks, no GPU; "
        f"H200 columns from `{source}`"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="*", help="log names (default: every log in --traces)")
    parser.add_argument("--traces", type=pathlib.Path, default=TRACES)
    parser.add_argument("--gpu-replay", type=pathlib.Path, default=GPU_REPLAY)
    parser.add_argument(
        "--maximum-growth-size",
        type=lambda text: size_argument(text, "maximum_growth_size"),
        metavar="SIZE",
        help="bound each growth beyond its request, as the pool's maximum_growth_size "
        "(bytes or a size such as 128MiB; default: the pool's own growth rule)",
    )
    parser.add_argument(
        "--passes",
        type=positive,
        default=1,
        help="also replay each log this many times in a row on a fresh pool and report what it "
        "holds then (default 1: not)",
    )
    args = parser.parse_args(argv)
    names = args.logs or log_names(args.traces)
    breakdowns = [
        replay(name, args.traces, args.maximum_growth_size, args.passes) for name in names
    ]
    lines = ["# Footprint breakdown (host pool)", "", stamp(args.gpu_replay), ""]
    if args.maximum_growth_size is not None:
        lines[2] += f"; maximum_growth_size {args.maximum_growth_size} bytes"
    lines += summary(breakdowns, gpu_footprints(args.gpu_replay), args.passes) + [""]
    for b in breakdowns:
        lines += report(b)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
