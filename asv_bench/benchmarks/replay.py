# SPDX-License-Identifier: Apache-2.0
"""Recorded allocation logs (asv_bench/traces/*.csv.gz, recorded on a GPU host by
tools/record_traces.py) replayed through each chain by ``rmm_fences_bench.replay`` (one native
thread per recorded thread, no GIL, no memory touched): allocations + frees per second
(free-running replays), the footprint (the most bytes the chain held from the device: a
statistics adaptor over the chain's leaf, or a CudaAsync leaf's memory pool) and the
fragmentation (footprint / the trace's own peak of live bytes), both from an ordered replay (the
trace's recorded order, so that every chain sees the same interleaving and the same peak).
Without a GPU or without a recorded trace every benchmark is skipped."""

import pathlib

from ._common import require_gpu

TRACES_DIR = pathlib.Path(__file__).resolve().parents[1] / "traces"
#: The parameter when no trace is recorded: its benchmarks skip.
NO_TRACE = "no_trace_recorded"


def trace_names(directory=TRACES_DIR):
    """The recorded traces, by name (``<name>.csv.gz``), sorted; ``[NO_TRACE]`` when none."""
    names = sorted(p.name[: -len(".csv.gz")] for p in pathlib.Path(directory).glob("*.csv.gz"))
    return names or [NO_TRACE]


#: The chains, as specs before ``rmm_fences_bench.with_footprint`` puts the statistics adaptor
#: over their leaf. Not _common.CHAINS: the pools start empty here (no initial size), so that
#: their footprint is what the trace made them take, not a size chosen in advance.
SPECS = {
    "rmm_fences_pool": "pool(cuda)",  # 64 MiB first, then doubling
    "rmm_fences_vmm_pool": "vmm_pool",  # footprint: the most bytes of pages it held
    # moves pages whenever over its budget, whatever the time it takes
    "rmm_fences_vmm_pool_unbounded": "vmm_pool(remap_time_fraction=1)",
    "rmm_pool": "rmm_pool(cuda, initial_pool_size=0)",  # grows by the larger of request, size
    "cuda_async": "cuda_async",  # footprint: the memory pool's reserved bytes
    "arena": "arena(cuda, arena_size={arena_size})",  # its size taken at once: see arena_size
    "sync_on_free_deferred": "sync_on_free(rmm_pool(cuda, initial_pool_size=0), mode=deferred)",
    "tracking_pool": "tracking(pool(cuda), on_hazard=record)",
}
#: rmm's BinningMemoryResource over ``rmm_pool(cuda, initial_pool_size=0)``: fixed-size bins of
#: 2^BINS[0] .. 2^BINS[1] bytes (each takes 128 blocks from the pool when made), larger
#: allocations from the pool.
BINS = (12, 20)
CHAINS = [*SPECS, "binning"]


def arena_size(trace):
    """rmm's arena takes its whole size from its upstream when made: a power of two of at least
    twice the trace's peak of live bytes and 256 MiB (its footprint is this, by construction)."""
    need = max(2 * trace.peak_live_bytes, 256 << 20)
    return 1 << (need - 1).bit_length()


def make_chain(chain, trace):
    """The chain ``chain`` for replaying ``trace``, with a layer that measures its footprint."""
    from rmm_fences import compose

    from rmm_fences_bench import with_footprint

    if chain == "binning":
        import rmm

        pool = compose(with_footprint("rmm_pool(cuda, initial_pool_size=0)"))
        return rmm.mr.BinningMemoryResource(pool, *BINS)
    return compose(with_footprint(SPECS[chain].format(arena_size=arena_size(trace))))


_loaded = {}


def load_trace(name):
    from rmm_fences_bench import read_allocation_log

    if name not in _loaded:
        _loaded[name] = read_allocation_log(TRACES_DIR / f"{name}.csv.gz")
    return _loaded[name]


class Replay:
    """One ordered replay of a fresh chain (every event in the trace's recorded order: its peak
    of live bytes is the trace's, whatever the chain's speed) gives the footprint and the
    fragmentation (the pools grow here); the free-running timed replays then run on that chain,
    warm."""

    params = [trace_names(), CHAINS]
    param_names = ["trace", "chain"]
    timeout = 600
    repeat_replays = 3

    def setup(self, trace, chain):
        require_gpu()
        if trace == NO_TRACE:
            raise NotImplementedError(
                f"no allocation log in {TRACES_DIR}: record them on a GPU host with "
                "tools/record_traces.py"
            )
        from rmm_fences_bench import replay

        self.trace = load_trace(trace)
        self.mr = make_chain(chain, self.trace)
        self.first = replay(self.mr, self.trace, ordered=True)
        self.timed = None
        if self.first["errors"]:  # out of memory: no number for a replay it could not finish
            raise NotImplementedError(f"{chain}: {self.first['errors']} allocations failed")

    def teardown(self, trace, chain):
        self.mr = None

    def track_allocations_per_s(self, trace, chain):
        from rmm_fences_bench import replay

        self.timed = replay(self.mr, self.trace, repeat=self.repeat_replays)
        return self.timed["allocations_per_s"]

    track_allocations_per_s.unit = "calls/s"

    def track_event_records_per_free(self, trace, chain):
        """Events the chain's top resource recorded per free over one free-running replay (its
        ``stats["fences"]``: the pool, the tracker and SyncOnFree count them; a chain whose top
        counts none skips). Every block is freed: what the log leaves live, after it."""
        from rmm_fences_bench import replay

        stats = getattr(self.mr, "stats", None)
        if not isinstance(stats, dict) or "fences" not in stats:
            raise NotImplementedError(f"{chain}: its top resource counts no events")
        before = stats["fences"]
        replay(self.mr, self.trace)
        return (self.mr.stats["fences"] - before) / max(self.trace.allocations, 1)

    track_event_records_per_free.unit = "events/free"

    def track_footprint_mib(self, trace, chain):
        return self.first["footprint_bytes"] / 2**20

    track_footprint_mib.unit = "MiB"

    def track_footprint_after_timed_mib(self, trace, chain):
        """The most the chain held from the device up to the end of the timed replays (the
        ordered one's footprint included): a pool that keeps growing when a workload repeats
        shows it here."""
        if getattr(self, "timed", None) is None:
            self.track_allocations_per_s(trace, chain)
        footprint = self.timed["footprint_bytes"]
        if footprint is None:
            raise NotImplementedError(f"{chain}: no footprint layer")
        return footprint / 2**20

    track_footprint_after_timed_mib.unit = "MiB"

    def track_fragmentation(self, trace, chain):
        return self.first["fragmentation"]

    track_fragmentation.unit = "ratio"
