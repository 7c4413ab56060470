# SPDX-License-Identifier: Apache-2.0
"""Reproduce a CUDA hang that involves no rmm_fences code: a thread exits while a kernel still
runs on its per-thread default stream, in a process that has used cudaMallocAsync; the next
cudaMalloc of another thread then never returns.

    python tools/ptds_exit_hang.py              # uses CuPy's MemoryAsyncPool first
    python tools/ptds_exit_hang.py --no-async   # control: no cudaMallocAsync, no hang
    python tools/ptds_exit_hang.py --keep-alive # thread A syncs its stream before it exits

Prints one line and exits 0 (returned) or 1 (still blocked after --timeout seconds). Seen on an
H200 with driver 580.159.04 (CUDA 13.0 driver API, runtime 13.2) and CuPy 14.2: the first
form hangs, the two others return (docs/data/trust/ptds_exit_hang.txt). It is why the tests keep a
thread alive until its per-thread stream is idle (docs/index.md, stream rules).
"""

import argparse
import os
import threading

import cupy

SPIN = cupy.RawKernel(
    r"""
extern "C" __global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
}
""",
    "spin",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-async", action="store_true", help="skip cudaMallocAsync")
    parser.add_argument("--keep-alive", action="store_true", help="A syncs its stream first")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds (default 20)")
    args = parser.parse_args()
    if not args.no_async:
        block = cupy.cuda.MemoryAsyncPool().malloc(1 << 20)  # one cudaMallocAsync...
        del block  # ...and its cudaFreeAsync
    cupy.cuda.Device().synchronize()
    ptds = cupy.cuda.Stream.ptds
    clock_khz = cupy.cuda.Device().attributes["ClockRate"]
    a_done = threading.Event()

    def thread_a():
        SPIN((1,), (1,), (cupy.int64(clock_khz * 100),), stream=ptds)  # about 100 ms
        if args.keep_alive:
            ptds.synchronize()
        a_done.set()  # ...and the thread exits with the kernel still running

    def thread_b():
        a_done.wait()
        ptr = cupy.cuda.runtime.malloc(256)
        cupy.cuda.runtime.free(ptr)

    a = threading.Thread(target=thread_a, daemon=True)
    b = threading.Thread(target=thread_b, daemon=True)
    a.start()
    b.start()
    a.join(args.timeout)
    b.join(args.timeout)
    blocked = b.is_alive()
    outcome = f"still blocked after {args.timeout:.0f} s" if blocked else "returned"
    print(
        f"{'hang' if blocked else 'ok'}: async pool used={not args.no_async}, "
        f"A synced before exit={args.keep_alive}, B's cudaMalloc {outcome}",
        flush=True,
    )
    os._exit(1 if blocked else 0)  # a blocked thread would keep a normal exit waiting


if __name__ == "__main__":
    main()
