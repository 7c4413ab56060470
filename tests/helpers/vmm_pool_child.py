# SPDX-License-Identifier: Apache-2.0
"""VmmPoolMemoryResource's scenarios, each in its own process (an unmap under a running kernel
loses the CUDA context for good):

    python -P tests/helpers/vmm_pool_child.py in_flight   a growth over the budget while a
                                                          kernel still reads freed pages
    python -P tests/helpers/vmm_pool_child.py threads     8 threads x 8 streams of real kernels,
                                                          growths unmapping pages all along
    python -P tests/helpers/vmm_pool_child.py graph_outlives_pool POOL
                                                          a graph launched after its pool
                                                          (POOL: vmm_pool or pool) is destroyed

The last line printed is a JSON object (the scenario's findings, ``error``: the CUDA error or
null); the exit code is 0 when nothing faulted and every check held, else 1.
"""

from __future__ import annotations

import json
import sys

MIB = 1 << 20


def in_flight() -> dict:
    """Stream 1 fills a 16 MiB block with random float32, starts a kernel that spins 300 ms
    and then sums it, frees it below a live 64 KiB block and is retired (the block is shared
    behind its fence, not complete). Stream 2 asks for 32 MiB: over the budget, but the
    freed pages' work still runs, so the growth must map fresh pages. Once stream 1 is done,
    stream 3's 49 MiB growth maps the freed block's pages again (no more pages held)."""
    import cupy
    import numpy as np
    import rmm

    from rmm_fences import VmmPoolMemoryResource, _scenarios

    pool = VmmPoolMemoryResource()
    s1, s2, s3 = (cupy.cuda.Stream(non_blocking=True) for _ in range(3))
    r1, r2, r3 = (rmm.pylibrmm.stream.Stream(s) for s in (s1, s2, s3))
    count = 16 * MIB // 4
    host = np.random.default_rng(7).standard_normal(count, dtype=np.float32)
    a = pool.allocate(16 * MIB, r1)
    top = pool.allocate(64 << 10, r1)
    _scenarios.as_array(a, count, np.float32).set(host, stream=s1)
    out = cupy.zeros(1, dtype=cupy.float64)
    _scenarios.slow_checksum(a, count, 300, out, s1)
    pool.deallocate(a, 16 * MIB, r1)
    pool.retire_stream(s1)
    b = pool.allocate(32 * MIB, r2)
    busy = not s1.done
    held_while_busy = pool.physical_bytes()
    _scenarios.fill(b, 32 * MIB // 4, pattern=5, stream=s2)
    s1.synchronize()
    s2.synchronize()
    pool.deallocate(b, 32 * MIB, r2)
    pool.retire_stream(s2)
    c = pool.allocate(48 * MIB + (1 << 20), r3)  # past the free 32 MiB at the top: a growth
    errors = cupy.zeros(1, dtype=cupy.uint64)
    _scenarios.fill(c, (48 * MIB + (1 << 20)) // 4, pattern=6, stream=s3)
    _scenarios.check(c, (48 * MIB + (1 << 20)) // 4, 6, errors, s3)
    s3.synchronize()
    held_after = pool.physical_bytes()
    pool.deallocate(c, 48 * MIB + (1 << 20), r3)
    pool.deallocate(top, 64 << 10, r1)
    return {
        "busy_at_growth": busy,
        "held_while_busy": held_while_busy,
        "held_after": held_after,
        "sum": float(out.get()[0]),
        "reference": float(host.astype(np.float64).sum()),
        "errors": int(errors.get()[0]),
        "ok": bool(
            np.isclose(float(out.get()[0]), host.astype(np.float64).sum(), rtol=1e-9)
            and int(errors.get()[0]) == 0
        ),
    }


def threads() -> dict:
    """8 threads x 8 streams, 5,000 random steps each (growths past 1/16 over the peak in use
    unmap finished pages all along); blocks filled and checked by kernels, some freed on
    another stream after an event wait."""
    import cupy
    import rmm

    from rmm_fences import VmmPoolMemoryResource, _scenarios

    from helpers.fill_check import fill_check
    from helpers.threads import run_threads

    pool = VmmPoolMemoryResource()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(8)]
    rstreams = [rmm.pylibrmm.stream.Stream(s) for s in streams]
    errors = cupy.zeros(1, dtype=cupy.uint64)

    def worker(tid):
        fill_check(
            pool,
            _scenarios,
            streams,
            rstreams,
            errors,
            seed=3000 + tid,
            ops=5_000,
            max_live=16,
            max_words=1 << 18,
            free_elsewhere=True,
        )

    failures = run_threads(8, worker)
    for s in streams:
        s.synchronize()
    stats = pool.stats
    return {
        "failures": [repr(f) for f in failures],
        "errors": int(errors.get()[0]),
        "stats": stats,
        "ok": not failures and int(errors.get()[0]) == 0 and stats["current_bytes"] == 0,
    }


def graph_outlives_pool(kind: str) -> dict:
    """A captured stream allocates 4 MiB from the pool, fills and checks it with kernels and
    frees it (the block is the graph's); the graph is launched, the pool destroyed, 64 MiB of
    random data put in device memory by CuPy, and the graph launched twice more: the block's
    memory must stay the graph's (no fault, no overwritten data)."""
    import gc

    import cupy
    import numpy as np
    import rmm

    from rmm_fences import StreamOrderedPoolMemoryResource, VmmPoolMemoryResource, _scenarios

    pool = (
        VmmPoolMemoryResource()
        if kind == "vmm_pool"
        else StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource())
    )
    s = cupy.cuda.Stream(non_blocking=True)
    r = rmm.pylibrmm.stream.Stream(s)
    errors = cupy.zeros(1, dtype=cupy.uint64)
    count = 4 * MIB // 4
    s.begin_capture()
    a = pool.allocate(4 * MIB, r)
    _scenarios.fill(a, count, 21, s)
    _scenarios.check(a, count, 21, errors, s)
    pool.deallocate(a, 4 * MIB, r)
    graph = s.end_capture()
    graph.launch(stream=s)
    s.synchronize()
    del pool
    gc.collect()
    host = np.random.default_rng(11).standard_normal(16 * MIB, dtype=np.float32)
    victim = cupy.asarray(host)
    graph.launch(stream=s)
    graph.launch(stream=s)
    s.synchronize()
    errors_seen = int(errors.get()[0])
    victim_ok = bool(np.array_equal(victim.get(), host))
    return {"errors": errors_seen, "victim_ok": victim_ok, "ok": errors_seen == 0 and victim_ok}


def main(argv: list[str]) -> int:
    scenarios = {
        "in_flight": in_flight,
        "threads": threads,
        "graph_outlives_pool": lambda: graph_outlives_pool(argv[1] if len(argv) > 1 else ""),
    }
    if argv[:1] not in ([k] for k in scenarios):
        print(__doc__, file=sys.stderr)
        return 2
    out = {"scenario": argv[0], "error": None}
    try:
        out.update(scenarios[argv[0]]())
    except Exception as exc:  # CUDARuntimeError, MemoryError: reported, not raised
        out["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out, default=str), flush=True)
    return 0 if out["error"] is None and out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
