# SPDX-License-Identifier: Apache-2.0
"""``rmm-fences reduce``: the CUB temp-storage loop over one resource spec.

The loop and its timing are here, with the command that runs them (:func:`cub_temp_loop`,
:func:`cub_temp_loop_us`); the asv suite (asv_bench/) times the same functions.
"""

from __future__ import annotations

import functools

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


def cub_temp_loop(x, out, mr=None, stream=None, *, plan: bool = False):
    """One call of the CUB temp-storage loop on ``stream`` (a CuPy stream), as a function of
    no argument: ``rmm_fences.reduce.device_sum(x, out, mr=mr, stream=stream)``, which
    allocates CUB's temp storage from ``mr``, reduces and frees it without a sync.

    ``plan=True``: the same loop through a :class:`rmm_fences.reduce.ReducePlan` made once
    (sum, zero of ``out``'s dtype), called as ``plan(x, out)``.

    ``mr=None``: the floor, cuda.compute's reducer called directly on a temp buffer allocated
    once (no wrapper, no allocation); the buffer lives as long as the function.
    """
    import cupy
    import numpy as np

    from rmm_fences import reduce as rf
    from rmm_fences._streams import StreamHandle

    stream = stream or cupy.cuda.get_current_stream()
    if plan:
        if mr is None:
            raise ValueError("plan=True needs mr (mr=None is the preallocated floor)")
        made = rf.ReducePlan(x, out, "sum", np.zeros(1, dtype=out.dtype), mr=mr, stream=stream)
        return functools.partial(made, x, out)
    if mr is not None:
        return lambda: rf.device_sum(x, out, mr=mr, stream=stream)
    n = x.size
    init = np.zeros(1, dtype=out.dtype)
    reducer, op = rf._reducer(x, out, "sum", init, x.dtype, out.dtype)
    reducer = reducer.fn  # the floor calls cuda.compute directly
    cc_stream = StreamHandle(stream.ptr)
    nbytes = reducer(
        temp_storage=None, d_in=x, d_out=out, num_items=n, op=op, h_init=init, stream=cc_stream
    )
    pre = cupy.empty(max(nbytes, 1), dtype=cupy.uint8)
    tmp = rf.TempStorage(pre.data.ptr, max(nbytes, 1))

    def fn():
        reducer(
            temp_storage=tmp, d_in=x, d_out=out, num_items=n, op=op, h_init=init, stream=cc_stream
        )

    fn.buffer = pre  # the preallocated temp lives as long as the function
    return fn


def event_time_us(fn, stream, iterations: int, rounds: int = 5) -> float:
    """Microseconds per call of ``fn()``: CUDA events on ``stream`` (a CuPy stream) around
    ``iterations`` back-to-back calls, median of ``rounds`` (a host-bound loop shows as
    such)."""
    import statistics

    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(rounds):
        start.record(stream)
        for _ in range(iterations):
            fn()
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / iterations)
    return statistics.median(times)


def cub_temp_loop_us(
    x, out, mr=None, stream=None, iterations: int = 1000, rounds: int = 5, *, plan: bool = False
) -> float:
    """Microseconds per call of :func:`cub_temp_loop` (:func:`event_time_us`, after a warm-up
    call), the sum in ``out[0]`` checked against a float64 sum of ``x`` (AssertionError
    otherwise)."""
    import cupy
    import numpy as np

    stream = stream or cupy.cuda.get_current_stream()
    fn = cub_temp_loop(x, out, mr, stream, plan=plan)
    fn()  # warm up (and JIT)
    stream.synchronize()
    us = event_time_us(fn, stream, iterations, rounds)
    got, ref = float(out.get()[0]), float(x.astype(cupy.float64).sum().get())
    if not np.isclose(got, ref, rtol=1e-3, atol=1e-2):
        raise AssertionError(f"CUB temp-storage loop over {mr!r}: wrong sum {got} vs {ref}")
    return us
