# SPDX-License-Identifier: Apache-2.0
"""The multi-threaded fill/check traffic of the GPU tests of the resources: each thread makes
random allocations and frees on a resource, every block filled with a pattern of its own by a
kernel and checked by another kernel before its free, which a device-side counter adds up.

    failures = run_threads(8, lambda tid: fill_check(mr, scenarios, streams, rstreams, errors,
                                                     seed=1000 + tid, ops=10_000, ...))
"""

import numpy as np


def fill_check(
    mr,
    scenarios,
    streams,
    rstreams,
    errors,
    *,
    seed,
    ops,
    max_live,
    max_words,
    free_elsewhere=False,
):
    """One thread's traffic: ``ops`` random steps on ``mr``, then a free of what is left.

    A step frees a random live block (always once more than ``max_live`` blocks are live, else
    with probability 1/2) or allocates one of 1 to ``max_words`` - 1 32-bit words on a random
    stream of ``streams`` (CuPy streams; ``rstreams``: the same streams as rmm's). A new block
    is filled with a random pattern (``scenarios.fill``) on its stream; before its free it is
    checked there (``scenarios.check``), every wrong word added to ``errors`` (a device
    counter). With ``free_elsewhere`` the free goes to a random stream, ordered after the check
    by an event wait when that stream is another; else to the block's own stream. The random
    steps are a function of ``seed`` alone."""
    rng = np.random.default_rng(seed)
    live = []
    for _ in range(ops):
        if live and (len(live) > max_live or rng.random() < 0.5):
            ptr, nbytes, s, pattern = live.pop(int(rng.integers(len(live))))
            scenarios.check(ptr, nbytes // 4, pattern, errors, streams[s])
            if free_elsewhere:
                t = int(rng.integers(len(streams)))
                if t != s:  # free on another stream, ordered after the check
                    streams[t].wait_event(streams[s].record())
            else:
                t = s
            mr.deallocate(ptr, nbytes, rstreams[t])
        else:
            nbytes = int(rng.integers(1, max_words)) * 4
            s = int(rng.integers(len(streams)))
            pattern = int(rng.integers(1, 2**32))
            ptr = mr.allocate(nbytes, rstreams[s])
            scenarios.fill(ptr, nbytes // 4, pattern, streams[s])
            live.append((ptr, nbytes, s, pattern))
    for ptr, nbytes, s, pattern in live:
        scenarios.check(ptr, nbytes // 4, pattern, errors, streams[s])
        mr.deallocate(ptr, nbytes, rstreams[s])
