# SPDX-License-Identifier: Apache-2.0
"""Command line of rmm_fences: ``rmm-fences`` or ``python -m rmm_fences``."""

from __future__ import annotations

import argparse
import sys


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _size(text: str) -> int:
    from rmm_fences._sizes import parse_bytes

    try:
        return parse_bytes(text, "size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rmm-fences",
        description="RMM resources that make freeing GPU memory safe without a host sync.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser(
        "doctor",
        help="the hazard matrix: which chains survive freeing while a kernel still reads",
        description="Run the race trial in three scenarios (same-stream reuse, cross-stream "
        "reuse, free while a kernel is in flight) on every chain and print the outcome of each "
        "cell (correct, corrupted, crashed, hazards reported) with the cost per free.",
    )
    doctor.add_argument("--trials", type=_positive, default=100,
                        help="trials per cell (default 100; 20 with --quick)")
    doctor.add_argument("--quick", action="store_true", help="20 trials per cell")
    doctor.add_argument("--json", metavar="PATH", help="also write the matrix as JSON")
    doctor.add_argument("--plot", metavar="PATH",
                        help="also draw cost against outcome per chain (PNG, needs matplotlib)")
    reduce = sub.add_parser(
        "reduce",
        help="the CUB temp-storage loop (allocate, CUB reduce, free without a sync) over a "
        "resource",
    )
    reduce.add_argument("--resource", metavar="SPEC", default="pool(cuda_async)",
                        help="resource spec (default: pool(cuda_async))")
    reduce.add_argument("--n", type=_size, default=1 << 20,
                        help="float32 items per reduce (default 1M; '16M' style accepted)")
    reduce.add_argument("--iters", type=_positive, default=1000, help="calls timed (default 1000)")
    bench = sub.add_parser("bench", help="allocate + deallocate per pair, Python and native")
    bench.add_argument("--resource", metavar="SPEC", action="append",
                       help="resource spec; repeat to compare (default: pool(cuda_async), "
                       "rmm_pool(cuda), cuda_async)")
    bench.add_argument("--nbytes", type=_size, default=1 << 20, help="bytes per allocation")
    bench.add_argument("--iters", type=_positive, default=100000, help="native pairs timed")
    demo = sub.add_parser(
        "demo",
        help="reproduce the free-while-in-use race and show each SyncOnFree mode fixing it",
    )
    demo.add_argument("--trials", type=_positive, default=200,
                      help="trials per chain (default 200)")
    sub.add_parser(
        "pool-bench",
        help="StreamOrderedPoolMemoryResource against rmm's pool and CudaAsync: Python and "
        "native allocate + deallocate, random allocations, threads",
    )
    sub.add_parser(
        "reduce-bench",
        help="the CUB temp-storage loop per chain and size, and cupy.sum per CuPy allocator",
    )
    sub.add_parser(
        "tracking-bench",
        help="what HazardTrackingResourceAdaptor adds to each upstream's alloc+free",
    )
    return parser


def _check_specs(args) -> str | None:
    """The first spec error of the command's --resource arguments (checked without a GPU)."""
    from rmm_fences.compose import SpecError, parse_spec

    specs = getattr(args, "resource", None)
    for spec in [specs] if isinstance(specs, str) else (specs or []):
        try:
            parse_spec(spec)
        except SpecError as exc:
            return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    error = _check_specs(args)
    if error:
        print(f"rmm-fences {args.command}: bad --resource: {error}", file=sys.stderr)
        return 2
    from rmm_fences._cuda import device_count, no_device_reason

    if device_count() == 0:
        print(f"rmm-fences {args.command}: {no_device_reason()}; this command needs a CUDA GPU.",
              file=sys.stderr)
        return 2
    if args.command == "doctor":
        from rmm_fences import _doctor

        trials = 20 if args.quick and args.trials == 100 else args.trials
        return _doctor.run(trials, json_path=args.json, plot_path=args.plot, quick=args.quick)
    if args.command == "reduce":
        from rmm_fences import _cli_tools

        return _cli_tools.reduce_loop(args.resource, args.n, args.iters)
    if args.command == "bench":
        from rmm_fences import _cli_tools

        return _cli_tools.bench(args.resource or ["pool(cuda_async)", "rmm_pool(cuda)",
                                                  "cuda_async"], args.nbytes, args.iters)
    if args.command == "pool-bench":
        from rmm_fences import _pool_bench

        return _pool_bench.run()
    if args.command == "reduce-bench":
        from rmm_fences import _reduce_bench

        return _reduce_bench.run()
    if args.command == "tracking-bench":
        from rmm_fences import _tracking_bench

        return _tracking_bench.run()
    from rmm_fences import _demo

    return _demo.run(trials=args.trials)


if __name__ == "__main__":
    sys.exit(main())
