# SPDX-License-Identifier: Apache-2.0
"""The race trial on a real GPU: a slow kernel still reads a block when the host frees it.

Needs CuPy and a CUDA device. Used by the tests and by ``rmm-fences doctor`` (one
:func:`race` per cell of its matrix).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time

import numpy as np
import rmm

from rmm_fences._optional import require

cupy = require("cupy", "the race trial (rmm-fences doctor)")

_SOURCE = r"""
extern "C" __global__ void slow_checksum(const float* a, unsigned long long n,
                                         long long spin_cycles, double* out)
{
    // Spin first, so the host frees the block while this kernel still needs it.
    long long start = clock64();
    while (clock64() - start < spin_cycles) { }
    __shared__ double partial[256];
    double sum = 0.0;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        sum += (double)a[i];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) { partial[threadIdx.x] += partial[threadIdx.x + s]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { atomicAdd(out, partial[0]); }
}

extern "C" __global__ void fill_pattern(unsigned int* a, unsigned long long n, unsigned int pattern)
{
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        a[i] = (unsigned int)(i * 2654435761ull) ^ pattern;
    }
}

extern "C" __global__ void check_pattern(const unsigned int* a, unsigned long long n,
                                         unsigned int pattern, unsigned long long* errors)
{
    unsigned long long bad = 0;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        bad += (a[i] != ((unsigned int)(i * 2654435761ull) ^ pattern));
    }
    if (bad) { atomicAdd(errors, bad); }
}
"""

THREADS = 256


@functools.cache
def _module() -> cupy.RawModule:
    return cupy.RawModule(code=_SOURCE)


def kernel(name: str) -> cupy.RawKernel:
    """One of ``slow_checksum``, ``fill_pattern``, ``check_pattern``."""
    return _module().get_function(name)


def spin_cycles(milliseconds: float) -> int:
    """clock64() cycles that last about ``milliseconds`` on the current device."""
    rt = cupy.cuda.runtime
    rate_khz = rt.deviceGetAttribute(rt.cudaDevAttrClockRate, rt.getDevice())
    return int(rate_khz * milliseconds)


def as_array(ptr: int, count: int, dtype, owner=None) -> cupy.ndarray:
    """A CuPy view of ``count`` elements of ``dtype`` at device address ``ptr``."""
    nbytes = count * np.dtype(dtype).itemsize
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner)
    return cupy.ndarray((count,), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


def grid_for(count: int) -> int:
    return max(1, min(1024, (count + THREADS - 1) // THREADS))


def slow_checksum(
    ptr: int, count: int, spin_ms: float, out: cupy.ndarray, stream, grid: int | None = None
) -> None:
    """On ``stream``: spin ``spin_ms``, then add the float64 sum of ``count`` float32 at
    ``ptr`` to ``out[0]`` (which the caller zeroes)."""
    kernel("slow_checksum")(
        (grid or grid_for(count),),
        (THREADS,),
        (ptr, np.uint64(count), np.int64(spin_cycles(spin_ms)), out),
        stream=stream,
    )


def fill(ptr: int, count: int, pattern: int, stream: cupy.cuda.Stream) -> None:
    """Write pattern number ``pattern`` to ``count`` uint32 words at ``ptr`` on ``stream``."""
    kernel("fill_pattern")(
        (grid_for(count),), (THREADS,), (ptr, np.uint64(count), np.uint32(pattern)), stream=stream
    )


def check(ptr: int, count: int, pattern: int, errors: cupy.ndarray, stream) -> None:
    """Add to ``errors[0]`` the words at ``ptr`` that differ from pattern number ``pattern``."""
    kernel("check_pattern")(
        (grid_for(count),),
        (THREADS,),
        (ptr, np.uint64(count), np.uint32(pattern), errors),
        stream=stream,
    )


#: What the host does after freeing the block the slow kernel still reads (see :func:`race`).
SCENARIOS = ("same_stream_reuse", "cross_stream_reuse", "free_in_flight")


@dataclasses.dataclass
class RaceResult:
    """Outcome of ``race`` over several trials (``crashed``: the error that ended them, where
    ``race`` was asked to catch it)."""

    trials: int
    corrupted: int
    same_address: int
    free_us: list[float]
    crashed: str | None = None

    @property
    def rate(self) -> float:
        return self.corrupted / self.trials if self.trials else 0.0

    @property
    def median_free_us(self) -> float:
        return statistics.median(self.free_us) if self.free_us else float("nan")


def race(
    mr,
    *,
    trials: int = 200,
    nbytes: int = 4 << 20,
    spin_ms: float = 0.5,
    rng: np.random.Generator | None = None,
    scenario: str = "cross_stream_reuse",
    catch: bool = False,
) -> RaceResult:
    """Free a block while a slow kernel still reads it, then (by ``scenario``) overwrite
    whatever ``mr`` hands out next, and check the slow kernel's checksum.

    Each trial: fresh random float32 data in block A (stream s1); ``slow_checksum`` on s1
    spins ``spin_ms`` then sums A in float64; the host frees A on s1 at once, then

    - ``cross_stream_reuse`` (the default): allocates the same size on s2 and overwrites it
      there;
    - ``same_stream_reuse``: allocates the same size on s1 and overwrites it there;
    - ``free_in_flight``: allocates nothing; the free alone must not hurt the running kernel.

    A checksum that differs from the float64 reference of the data is a corruption. With
    ``catch``, an exception (a CUDA error once the context is lost) ends the trials and is
    stored in ``crashed`` instead of raised.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}; got {scenario!r}")
    rng = rng or np.random.default_rng()
    count = nbytes // 4
    s1 = cupy.cuda.Stream(non_blocking=True)
    s2 = cupy.cuda.Stream(non_blocking=True)
    r1, r2 = rmm.pylibrmm.stream.Stream(s1), rmm.pylibrmm.stream.Stream(s2)
    reuse = {"same_stream_reuse": (s1, r1), "cross_stream_reuse": (s2, r2)}.get(scenario)
    out = cupy.empty(1, dtype=cupy.float64)
    result = RaceResult(trials, 0, 0, [])
    try:
        for _ in range(trials):
            host = rng.standard_normal(count, dtype=np.float32) + np.float32(1.0)
            reference = host.astype(np.float64).sum()
            a = mr.allocate(nbytes, r1)
            as_array(a, count, np.float32).set(host, stream=s1)
            with s1:
                out.fill(0.0)  # the checksum accumulates; an unrun kernel leaves 0, never the sum
            slow_checksum(a, count, spin_ms, out, s1)
            start = time.perf_counter()
            mr.deallocate(a, nbytes, r1)
            result.free_us.append((time.perf_counter() - start) * 1e6)
            b = None
            if reuse is not None:
                b = mr.allocate(nbytes, reuse[1])
                result.same_address += b == a
                fill(b, count, pattern=int(rng.integers(1, 2**32)), stream=reuse[0])
            s1.synchronize()
            s2.synchronize()
            got = float(out.get()[0])
            if not np.isclose(got, reference, rtol=1e-9, atol=1e-6):
                result.corrupted += 1
            if b is not None:
                mr.deallocate(b, nbytes, reuse[1])
        s1.synchronize()
        s2.synchronize()
    except Exception as exc:  # CUDARuntimeError once the context is lost
        if not catch:
            raise
        result.crashed = f"{type(exc).__name__}: {exc}".replace("CUDARuntimeError: ", "")
    return result
