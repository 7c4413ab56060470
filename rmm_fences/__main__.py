# SPDX-License-Identifier: Apache-2.0
"""Command line of rmm_fences: ``rmm-fences`` or ``python -m rmm_fences``."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rmm-fences",
        description="RMM resources that make freeing GPU memory safe without a host sync.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="reproduce the free-while-in-use race and show each SyncOnFree mode fixing it",
    )
    demo.add_argument("--trials", type=int, default=200, help="trials per chain (default 200)")
    sub.add_parser(
        "pool-bench",
        help="StreamOrderedPoolMemoryResource against rmm's pool and CudaAsync (P1-P4)",
    )
    sub.add_parser(
        "reduce-bench",
        help="the seed's reduce loop per chain (P5) and cupy.sum per CuPy allocator (P6)",
    )
    sub.add_parser(
        "tracking-bench",
        help="what HazardTrackingResourceAdaptor adds to each upstream's alloc+free",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rmm_fences._cuda import device_count, no_device_reason

    if device_count() == 0:
        print(f"rmm-fences {args.command}: {no_device_reason()}; this command needs a CUDA GPU.",
              file=sys.stderr)
        return 2
    if args.command == "pool-bench":
        from rmm_fences import _pool_bench

        return _pool_bench.run()
    if args.command == "reduce-bench":
        from rmm_fences import _reduce_bench

        return _reduce_bench.run()
    if args.command == "tracking-bench":
        from rmm_fences import _tracking_bench

        return _tracking_bench.run()
    if args.trials < 1:
        print("rmm-fences demo: --trials must be at least 1", file=sys.stderr)
        return 2
    from rmm_fences import _demo

    return _demo.run(trials=args.trials)


if __name__ == "__main__":
    sys.exit(main())
