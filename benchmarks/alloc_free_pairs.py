# SPDX-License-Identifier: Apache-2.0
"""Allocate + deallocate per pair, from Python and in the native loop, for resource specs:

    python benchmarks/alloc_free_pairs.py [--resource SPEC ...] [--nbytes B] [--iters K]

A row per spec: the microseconds of a pair called from Python, and the nanoseconds of a pair in
the native loop without the GIL (the median of three runs of --iters pairs), on a non-blocking
stream. Needs a CUDA GPU, CuPy, and the benchmarks built in place (``make install``).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from rmm_fences_bench.cli import size

DEFAULT_SPECS = ("pool(cuda_async)", "rmm_pool(cuda)", "cuda_async")


def parser() -> argparse.ArgumentParser:
    from rmm_fences._cli._args import COUNT_HELP, count

    top = argparse.ArgumentParser(
        prog="alloc_free_pairs.py",
        description="Times an allocate + deallocate pair of --nbytes for each resource spec: "
        "from Python (us per pair) and in the native loop (ns per pair).",
    )
    top.add_argument(
        "--resource",
        metavar="SPEC",
        action="append",
        help="resource spec; repeat to compare (default: " + ", ".join(DEFAULT_SPECS) + ")",
    )
    top.add_argument(
        "--nbytes", type=size, default=1 << 20, help="bytes per allocation (default 1MiB)"
    )
    top.add_argument(
        "--iters",
        type=count,
        default=100000,
        help=f"native pairs timed (default 100000; {COUNT_HELP})",
    )
    return top


def run(args) -> int:
    """A row per spec: us per pair from Python, ns per pair in the native loop."""
    import cupy
    import rmm

    from rmm_fences.specs import compose

    from rmm_fences_bench import alloc_free_ns, python_pair_us

    specs, nbytes, iters = args.resource or list(DEFAULT_SPECS), args.nbytes, args.iters
    stream = rmm.pylibrmm.stream.Stream(cupy.cuda.Stream(non_blocking=True))
    width = max(len(s) for s in specs)
    print(f"{'resource':<{width}}  {'python us':>10}  {'native ns':>10}   ({nbytes} bytes)")
    for spec in specs:
        mr = compose(spec)
        py = python_pair_us(mr, nbytes, stream, pairs=max(iters // 20, 100))
        native = statistics.median(alloc_free_ns(mr, nbytes, iters, stream) for _ in range(3))
        print(f"{spec:<{width}}  {py:>10.3f}  {native:>10.1f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exits 2, saying why, on a bad spec or without a CUDA device; else prints the rows."""
    from rmm_fences._cli._args import spec_error
    from rmm_fences._cuda import device_count, no_device_reason

    args = parser().parse_args(argv)
    problem = spec_error(args)
    if problem:
        problem = f"bad --resource: {problem}"
    elif device_count() == 0:
        problem = f"{no_device_reason()}; this needs a CUDA GPU"
    if problem:
        print(f"alloc_free_pairs.py: {problem}", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
