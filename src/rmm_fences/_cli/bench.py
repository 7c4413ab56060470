# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences bench``: allocate + deallocate per pair, from Python and in the native loop,
for the resource specs given on the command line."""

from __future__ import annotations

import statistics
import time

from rmm_fences._optional import require

HELP = "allocate + deallocate per pair, Python and native"
DESCRIPTION = (
    "Times an allocate + deallocate pair of --nbytes on a non-blocking stream for each "
    "resource spec: from Python (microseconds per pair) and in a native loop without the GIL "
    "(nanoseconds per pair, the median of three runs of --iters pairs)."
)
DEFAULT_SPECS = ("pool(cuda_async)", "rmm_pool(cuda)", "cuda_async")


def add_arguments(parser) -> None:
    from rmm_fences._cli._args import COUNT_HELP, count, size

    parser.add_argument(
        "--resource",
        metavar="SPEC",
        action="append",
        help="resource spec; repeat to compare (default: " + ", ".join(DEFAULT_SPECS) + ")",
    )
    parser.add_argument(
        "--nbytes", type=size, default=1 << 20, help="bytes per allocation (default 1MiB)"
    )
    parser.add_argument(
        "--iters",
        type=count,
        default=100000,
        help=f"native pairs timed (default 100000; {COUNT_HELP})",
    )


def python_round_trip_us(mr, stream, nbytes: int, iterations: int, rounds: int = 5) -> float:
    """Median over rounds of the mean microseconds of ``deallocate(allocate())`` from Python."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iterations):
            mr.deallocate(mr.allocate(nbytes, stream), nbytes, stream)
        times.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(times)


def run(args) -> int:
    """A row per spec: us per pair from Python, ns per pair in the native loop."""
    cupy = require("cupy", "rmm-fences bench")
    import rmm

    from rmm_fences.bench import alloc_free_ns
    from rmm_fences.specs import compose

    specs, nbytes, iters = args.resource or list(DEFAULT_SPECS), args.nbytes, args.iters
    stream = rmm.pylibrmm.stream.Stream(cupy.cuda.Stream(non_blocking=True))
    width = max(len(s) for s in specs)
    print(f"{'resource':<{width}}  {'python us':>10}  {'native ns':>10}   ({nbytes} bytes)")
    for spec in specs:
        mr = compose(spec)
        py = python_round_trip_us(mr, stream, nbytes, iterations=max(iters // 20, 100))
        native = statistics.median(alloc_free_ns(mr, nbytes, iters, stream) for _ in range(3))
        print(f"{spec:<{width}}  {py:>10.3f}  {native:>10.1f}")
    return 0
