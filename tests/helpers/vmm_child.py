# SPDX-License-Identifier: Apache-2.0
"""The VMM scenarios, each in its own process: a fault loses the CUDA context for good.

    python -P tests/helpers/vmm_child.py crash          free while a kernel reads: error 700
    python -P tests/helpers/vmm_child.py fenced TRIALS  the race over SyncOnFree(deferred)

The last line printed is a JSON object: scenario, error (the CUDA error or null), corrupted,
trials. ``crash`` exits 3 when the kernel faulted, 0 when it did not; ``fenced`` exits 0 when
every trial was right and nothing faulted.
"""

from __future__ import annotations

import json
import sys


def crash() -> int:
    import cupy
    import numpy as np
    import rmm

    from rmm_fences import _scenarios
    from rmm_fences.unsafe import UnmappingVmmMemoryResource

    mr = UnmappingVmmMemoryResource("4GiB")
    s = cupy.cuda.Stream(non_blocking=True)
    count = 16 << 20
    rs = rmm.pylibrmm.stream.Stream(s)
    a = mr.allocate(count * 4, rs)
    rng = np.random.default_rng()
    _scenarios.as_array(a, count, np.float32).set(
        rng.standard_normal(count, dtype=np.float32), stream=s
    )
    out = cupy.zeros(1, dtype=cupy.float64)
    s.synchronize()
    _scenarios.slow_checksum(a, count, 200, out, s)  # reads the block after 200 ms
    mr.deallocate(a, count * 4, rs)  # unmaps at once: free while in flight, no sync
    error = None
    try:
        s.synchronize()
    except Exception as exc:  # CUDARuntimeError: the context is lost
        error = f"{type(exc).__name__}: {exc}"
    print(
        json.dumps({"scenario": "crash", "error": error, "corrupted": None, "trials": 1}),
        flush=True,
    )
    return 3 if error else 0


def fenced(trials: int) -> int:
    from rmm_fences import SyncOnFreeResourceAdaptor, _scenarios
    from rmm_fences.unsafe import UnmappingVmmMemoryResource

    mr = SyncOnFreeResourceAdaptor(UnmappingVmmMemoryResource("8GiB"), mode="deferred")
    error, corrupted = None, None
    try:
        res = _scenarios.race(mr, trials=trials)
        corrupted = res.corrupted
        mr.flush()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    print(
        json.dumps(
            {"scenario": "fenced", "error": error, "corrupted": corrupted, "trials": trials}
        ),
        flush=True,
    )
    return 0 if error is None and corrupted == 0 else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["crash"]:
        return crash()
    if argv[:1] == ["fenced"]:
        return fenced(int(argv[1]) if len(argv) > 1 else 100)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
