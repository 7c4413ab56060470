# SPDX-License-Identifier: Apache-2.0
"""On the GPU host: where the host time of device_sum goes (cProfile, 3000 calls at 1K)."""

import cProfile
import pstats

import cupy
import rmm

from rmm_fences import StreamOrderedPoolMemoryResource
from rmm_fences.reduce import device_sum

mr = StreamOrderedPoolMemoryResource(rmm.mr.CudaMemoryResource(), "256MiB")
s = cupy.cuda.Stream(non_blocking=True)
x = cupy.ones(1024, dtype=cupy.float32)
out = cupy.empty(1, dtype=cupy.float32)
for _ in range(200):
    device_sum(x, out, mr=mr, stream=s)
s.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(3000):
    device_sum(x, out, mr=mr, stream=s)
prof.disable()
s.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(22)
