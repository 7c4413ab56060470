# SPDX-License-Identifier: Apache-2.0
"""rmm's pool's free lists on the recorded allocation logs, alone and under deferred SyncOnFree
(a host model, no GPU): what the upstream of deferred SyncOnFree does with the blocks it gets
back on another stream than the one that freed them.

    python tools/rmm_pool_lists.py                  # every log in asv_bench/traces
    python tools/rmm_pool_lists.py cupy_pipeline reduce_256m

Needs the host test harness (``rmm_fences_testing``, tests/native) and the benchmarks' library
(``rmm_fences_bench``, benchmarks/), both built in place by ``make install``.

``RmmPoolModel`` follows rmm's ``PoolMemoryResource`` (``stream_ordered_memory_resource.hpp``,
``coalescing_free_list.hpp`` and ``pool_memory_resource_impl.cpp`` of rmm 26.x) with no
initial size and no maximum, as the replay benchmark builds it: a free list per stream, each
ordered by address and coalescing a freed block with its neighbours of the same upstream chunk;
an allocation takes the best fit of its own stream's list, else the first other stream's list
(in stream order) holding a block that fits, after a stream wait on that stream's event (the
remainder stays in that list), else merges the other lists into its own one by one (a stream
wait each) until a block fits, else grows the pool by the larger of the request and the pool's
size. Sizes are rounded to 256 bytes.

Each log is replayed three ways, one event at a time in recorded order, each recorded stream a
stream of its own: rmm's pool alone; rmm's pool under deferred SyncOnFree's core
(``HostSyncOnFree``, default batches, every fence complete from the next call on: the calls it
makes to its upstream, in order, each block handed back on the stream of the call that found
its fence complete); and the same with every block handed back on the stream that freed it,
which the adaptor cannot do safely (that stream may be destroyed by then) and which is there to
show what the stream of the release costs its upstream. The report gives, per way: the
allocations rmm's pool served from its own stream's list, from another stream's list (a stream
wait each), after merging lists, and by growing; the lists merged; the free blocks a best-fit
search looked at per allocation (rmm scans the whole list); and the bytes it took from the
device.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "native"), str(ROOT / "benchmarks"), str(ROOT / "tools")]
from asv_bodies import checkout_commit  # noqa: E402
from fence_calls import replay_calls  # noqa: E402
from footprint_breakdown import TRACES, log_events, log_names, one_pass  # noqa: E402

from rmm_fences_bench.alloc_log import ALLOCATE  # noqa: E402
from rmm_fences_testing import HostSyncOnFree  # noqa: E402

ALIGNMENT = 256
#: Gap between upstream chunks, so that two chunks are never contiguous (rmm never merges two
#: chunks anyway: a chunk's first block is a head, which no block before it absorbs).
CHUNK_GAP = 1 << 30


def align_up(nbytes: int) -> int:
    return max(ALIGNMENT, (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


class FreeList:
    """rmm's coalescing free list: blocks (ptr, size, head) ordered by ptr; a block merges into
    the one before it when contiguous and not a head, and so does the one after it."""

    def __init__(self):
        self.ptrs: list[int] = []
        self.blocks: dict[int, tuple[int, bool]] = {}  # ptr -> (size, head)

    def __len__(self) -> int:
        return len(self.ptrs)

    def insert(self, ptr: int, size: int, head: bool) -> None:
        i = bisect.bisect_left(self.ptrs, ptr)
        if i > 0:
            prev = self.ptrs[i - 1]
            prev_size, prev_head = self.blocks[prev]
            if prev + prev_size == ptr and not head:
                del self.blocks[prev]
                self.ptrs.pop(i - 1)
                ptr, size, head, i = prev, prev_size + size, prev_head, i - 1
        if i < len(self.ptrs):
            nxt = self.ptrs[i]
            nxt_size, nxt_head = self.blocks[nxt]
            if ptr + size == nxt and not nxt_head:
                del self.blocks[nxt]
                self.ptrs.pop(i)
                size += nxt_size
        self.ptrs.insert(i, ptr)
        self.blocks[ptr] = (size, head)

    def best_fit(self, size: int) -> tuple[int, int, bool] | None:
        """Takes out the smallest block of at least ``size`` bytes (the first of equals)."""
        best = None
        for ptr in self.ptrs:
            s = self.blocks[ptr][0]
            if s >= size and (best is None or s < self.blocks[best][0]):
                best = ptr
        if best is None:
            return None
        s, head = self.blocks.pop(best)
        self.ptrs.pop(bisect.bisect_left(self.ptrs, best))
        return best, s, head


class RmmPoolModel:
    """rmm's PoolMemoryResource with no initial size and no maximum, over host addresses."""

    def __init__(self):
        self.lists: dict[int, FreeList] = {}
        self.pool_size = 0
        self.next_chunk = CHUNK_GAP
        self.sizes: dict[int, int] = {}  # live ptr -> rounded size
        self.heads: set[int] = set()  # chunk starts
        self.counts = dict(own=0, other=0, merged=0, grown=0, lists_merged=0, scanned=0)

    def _take(self, block, size: int, into: FreeList) -> int:
        ptr, s, head = block
        if s > size:
            into.insert(ptr + size, s - size, False)
        self.sizes[ptr] = size
        return ptr

    def _scan(self, free: FreeList, size: int):
        self.counts["scanned"] += len(free)
        return free.best_fit(size)

    def allocate(self, nbytes: int, stream: int) -> int:
        size = align_up(nbytes)
        own = self.lists.get(stream)
        if own is not None and (block := self._scan(own, size)) is not None:
            self.counts["own"] += 1
            return self._take(block, size, own)
        own = self.lists.setdefault(stream, FreeList())
        for other in sorted(self.lists):
            if other != stream and (block := self._scan(self.lists[other], size)) is not None:
                self.counts["other"] += 1
                return self._take(block, size, self.lists[other])
        for other in sorted(self.lists):
            if other == stream:
                continue
            for ptr in self.lists[other].ptrs:
                s, head = self.lists[other].blocks[ptr]
                own.insert(ptr, s, head)
            del self.lists[other]
            self.counts["lists_merged"] += 1
            if (block := self._scan(own, size)) is not None:
                self.counts["merged"] += 1
                return self._take(block, size, own)
        chunk = max(size, self.pool_size)
        ptr, self.next_chunk = self.next_chunk, self.next_chunk + chunk + CHUNK_GAP
        self.pool_size += chunk
        self.heads.add(ptr)
        self.counts["grown"] += 1
        return self._take((ptr, chunk, True), size, own)

    def deallocate(self, ptr: int, nbytes: int | None = None, *, stream: int) -> None:
        """Frees ``ptr`` on ``stream`` (``nbytes``: as a pool's deallocate takes it; the model
        knows the block's size)."""
        size = self.sizes.pop(ptr)
        self.lists.setdefault(stream, FreeList()).insert(ptr, size, ptr in self.heads)


def alone(events) -> RmmPoolModel:
    """rmm's pool replaying the log by itself."""
    pool = RmmPoolModel()
    one_pass(pool, events)
    return pool


def under_sync_on_free(events, release_on_free_stream: bool = False) -> RmmPoolModel:
    """rmm's pool as deferred SyncOnFree's upstream: the adaptor's core replays the log
    (``fence_calls.replay_calls``), and each call's upstream calls reach the model in order
    (the blocks whose fence completed first, then the call's own allocation when it took no
    block back). With ``release_on_free_stream`` a block goes back on the stream that freed
    it."""
    core, pool, mapped = HostSyncOnFree(), RmmPoolModel(), {}
    _ = core.calls  # the counts start from the first call
    for action, ptr, nbytes, stream, reached_upstream, releases in replay_calls(core, events):
        for rptr, freed, on in releases:
            pool.deallocate(mapped.pop(rptr), stream=freed if release_on_free_stream else on)
        if action == ALLOCATE and reached_upstream:
            mapped[ptr] = pool.allocate(nbytes, stream=stream)
    return pool


WAYS = (
    ("rmm's pool", alone),
    ("under SyncOnFree", under_sync_on_free),
    (
        "released on the freeing stream",
        functools.partial(under_sync_on_free, release_on_free_stream=True),
    ),
)


def row(name: str, way: str, pool: RmmPoolModel) -> str:
    c = pool.counts
    calls = max(c["own"] + c["other"] + c["merged"] + c["grown"], 1)
    cells = [
        name,
        way,
        f"{calls}",
        f"{c['own'] / calls:.1%}",
        f"{c['other'] / calls:.1%}",
        f"{c['merged'] / calls:.1%}",
        f"{c['grown']}",
        f"{c['lists_merged']}",
        f"{c['scanned'] / calls:.1f}",
        f"{pool.pool_size / 2**20:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def report(names, traces) -> list[str]:
    lines = [
        "# rmm's pool's free lists, alone and under deferred SyncOnFree (host model)",
        "",
        f"commit `{checkout_commit() or 'unknown'}`; rmm's pool (no initial size) over host"
        " addresses, no GPU; SyncOnFree's core with its default batches, every fence complete"
        " from the next call on",
        "",
        "| log | rmm's pool | allocations | from its stream's list | from another stream's "
        "list | after merging lists | grown | lists merged | blocks scanned per allocation "
        "| device MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        events = log_events(traces, name)
        lines.extend(row(name, way, replay(events)) for way, replay in WAYS)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="*", help="log names (default: every log in --traces)")
    parser.add_argument("--traces", type=pathlib.Path, default=TRACES)
    args = parser.parse_args(argv)
    print("\n".join(report(args.logs or log_names(args.traces), args.traces)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
