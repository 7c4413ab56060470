# SPDX-License-Identifier: Apache-2.0
"""Run under compute-sanitizer by test_tracking_gpu: a kernel writes past the end of a
sub-allocation of rmm_fences' pool, inside the pool's chunk.

argv[1]: "annotate" (the tracker registers NVTX regions) or "plain" (no annotations).
"""

import sys

import cupy
import numpy as np
import rmm

from rmm_fences import HazardTrackingResourceAdaptor, StreamOrderedPoolMemoryResource

_WRITE = cupy.RawKernel(
    r"""
extern "C" __global__ void write_at(unsigned int* p, unsigned long long index)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) { p[index] = 0xdeadbeefu; }
}
""",
    "write_at",
)

annotate = sys.argv[1] == "annotate"
pool = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size="64MiB")
mr = HazardTrackingResourceAdaptor(pool, nvtx=annotate)
nbytes = 4096
ptr = mr.allocate(nbytes)
# 1 MiB past the start: inside the pool's 64 MiB chunk, outside any sub-allocation.
_WRITE((1,), (32,), (np.uint64(ptr), np.uint64((1 << 20) // 4)))
print(
    f"child: launched a write 1 MiB past the start of a {nbytes}-byte block at {ptr:#x}", flush=True
)
try:
    cupy.cuda.runtime.deviceSynchronize()
except cupy.cuda.runtime.CUDARuntimeError as exc:  # memcheck stops a kernel it flags
    print(f"child: the kernel was stopped ({exc}); nvtx_active={mr.nvtx_active}", flush=True)
    sys.exit(3)
print(f"child: the kernel completed; nvtx_active={mr.nvtx_active}", flush=True)
mr.deallocate(ptr, nbytes)
