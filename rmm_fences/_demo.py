# SPDX-License-Identifier: Apache-2.0
"""``python -m rmm_fences demo``: the race trial, unsafe and fixed, and what each fix costs."""

from __future__ import annotations

import statistics

import rmm

from rmm_fences import SyncOnFreeResourceAdaptor
from rmm_fences.bench import alloc_free_ns, fence_call_ns
from rmm_fences.unsafe import NaiveCachingMemoryResource

MODES = ("device", "stream", "deferred")


def race_chains():
    """(name, factory) of the chains the race is run on: the unsafe cache, then each fix."""
    yield "naive_cache(cuda)", lambda: NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource())
    for mode in MODES:
        yield (
            f"sync_on_free(naive_cache(cuda), mode={mode})",
            lambda mode=mode: SyncOnFreeResourceAdaptor(
                NaiveCachingMemoryResource(rmm.mr.CudaMemoryResource()), mode=mode
            ),
        )


def native_costs(nbytes: int = 1 << 20, iterations: int = 20000, rounds: int = 11):
    """Native alloc+free ns per pair, bare and under each SyncOnFree mode, for rmm's pool and
    CudaAsync as upstreams.

    Each round times the upstream and then every adaptor over it, back to back; the overhead
    of a mode is the per-round difference (paired, so drift of the machine cancels), reported
    as median, min and max over the rounds.

    Returns rows of (upstream name, median upstream ns, {mode: (median adaptor ns,
    median overhead, min overhead, max overhead)}).
    """
    upstreams = {
        "rmm_pool": rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(),
                                              initial_pool_size=1 << 30),
        "cuda_async": rmm.mr.CudaAsyncMemoryResource(),
    }
    rows = []
    for name, upstream in upstreams.items():
        adaptors = {mode: SyncOnFreeResourceAdaptor(upstream, mode=mode) for mode in MODES}
        bare, wrapped = [], {mode: [] for mode in MODES}
        for _ in range(rounds):
            bare.append(alloc_free_ns(upstream, nbytes, iterations))
            for mode, mr in adaptors.items():
                wrapped[mode].append(alloc_free_ns(mr, nbytes, iterations))
        for mr in adaptors.values():
            mr.flush()
        modes = {}
        for mode, times in wrapped.items():
            over = [t - b for t, b in zip(times, bare)]
            modes[mode] = (statistics.median(times), statistics.median(over), min(over), max(over))
        rows.append((name, statistics.median(bare), modes))
    return rows


def run(trials: int = 200) -> int:
    from rmm_fences._scenarios import race

    print(f"race: {trials} trials per chain, 4 MiB blocks, slow reader spins 0.5 ms")
    header = f"{'chain':<44} {'trials':>6} {'corrupted':>9} {'rate':>6} {'cost/free us':>12}"
    print(header)
    print("-" * len(header))
    for name, make in race_chains():
        res = race(make(), trials=trials)
        print(
            f"{name:<44} {res.trials:>6} {res.corrupted:>9} {res.rate:>6.0%} "
            f"{res.median_free_us:>12.2f}"
        )
    print()
    print("native alloc+free of 1 MiB, no kernel (rmm_fences.bench.alloc_free_ns);")
    print("medians of 11 rounds; overhead = paired per-round difference [min, max]")
    header = f"{'resource':<40} {'ns/pair':>8} {'over upstream ns':>24}"
    print(header)
    print("-" * len(header))
    for name, base, modes in native_costs():
        print(f"{name:<40} {base:>8.0f}")
        for mode, (ns, over, lo, hi) in modes.items():
            label = f"sync_on_free({name}, mode={mode})"
            print(f"{label:<40} {ns:>8.0f} {over:>8.0f} [{lo:>6.0f}, {hi:>6.0f}]")
    costs = fence_call_ns()
    print("CUDA calls of a deferred free, ns: "
          + ", ".join(f"{k} {v:.0f}" for k, v in costs.items()))
    return 0
