# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences reduce``: the CUB temp-storage loop over one resource spec."""

from __future__ import annotations

from rmm_fences._optional import require

HELP = "the CUB temp-storage loop (allocate, CUB reduce, free without a sync) over a resource"
DESCRIPTION = (
    "Times the CUB temp-storage loop on this GPU: each call allocates CUB's temporary storage "
    "from the resource, runs a sum reduce of --n float32 items on a non-blocking stream and "
    "frees the storage without a sync. Prints microseconds per call, GB/s and the ratio to the "
    "same reduce with a preallocated buffer, then the same through a ReducePlan made once."
)


def add_arguments(parser) -> None:
    from rmm_fences._cli._args import COUNT_HELP, count

    parser.add_argument(
        "--resource",
        metavar="SPEC",
        default="pool(cuda_async)",
        help="resource spec (default: pool(cuda_async))",
    )
    parser.add_argument(
        "--n",
        type=count,
        default=1 << 20,
        help=f"float32 items per reduce (default 1M = 1,048,576; {COUNT_HELP})",
    )
    parser.add_argument(
        "--iters", type=count, default=1000, help=f"calls timed (default 1000; {COUNT_HELP})"
    )


def run(args) -> int:
    """us per call, GB/s and the ratio to a preallocated temp buffer, for ``--resource``;
    then the same loop through a ReducePlan made once."""
    cupy = require("cupy", "rmm-fences reduce")

    from rmm_fences.bench import cub_temp_loop_us
    from rmm_fences.specs import compose

    spec, n, iters = args.resource, args.n, args.iters
    mr = compose(spec)
    stream = cupy.cuda.Stream(non_blocking=True)
    x = cupy.random.RandomState(1).standard_normal(n, dtype=cupy.float32)
    out = cupy.empty(1, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    floor = cub_temp_loop_us(x, out, None, stream, iters)
    us = cub_temp_loop_us(x, out, mr, stream, iters)
    gbs = x.nbytes / (us * 1e-6) / 1e9
    plan_us = cub_temp_loop_us(x, out, mr, stream, iters, plan=True)
    print(
        f"{spec}: sum of {n} float32, {iters} calls: {us:.2f} us per call, {gbs:.1f} GB/s, "
        f"{us / floor:.2f}x the preallocated temp buffer ({floor:.2f} us)"
    )
    print(
        f"{spec}: through a ReducePlan: {plan_us:.2f} us per call, "
        f"{plan_us / floor:.2f}x the preallocated temp buffer"
    )
    return 0
