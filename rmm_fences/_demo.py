# SPDX-License-Identifier: Apache-2.0
"""``python -m rmm_fences demo``: the seed's race, unsafe and fixed, and what each fix costs."""

from __future__ import annotations

import rmm

from rmm_fences import SyncOnFreeResourceAdaptor
from rmm_fences.bench import alloc_free_ns
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


def native_costs(nbytes: int = 1 << 20, iterations: int = 20000) -> list[tuple[str, float]]:
    """Native alloc+free ns per pair over rmm's pool, bare and under each SyncOnFree mode."""
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
    rows = [("rmm_pool", alloc_free_ns(pool, nbytes, iterations))]
    for mode in MODES:
        mr = SyncOnFreeResourceAdaptor(pool, mode=mode)
        rows.append((f"sync_on_free(rmm_pool, mode={mode})", alloc_free_ns(mr, nbytes, iterations)))
        mr.flush()
    rows.append(("cuda_async", alloc_free_ns(rmm.mr.CudaAsyncMemoryResource(), nbytes, iterations)))
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
    print("native alloc+free of 1 MiB, no kernel (rmm_fences.bench.alloc_free_ns)")
    rows = native_costs()
    base = rows[0][1]
    header = f"{'resource':<44} {'ns/pair':>9} {'over pool ns':>12}"
    print(header)
    print("-" * len(header))
    for name, ns in rows:
        print(f"{name:<44} {ns:>9.0f} {ns - base:>12.0f}")
    return 0
