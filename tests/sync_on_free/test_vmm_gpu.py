# SPDX-License-Identifier: Apache-2.0
"""UnmappingVmmMemoryResource on a GPU: the unmap-under-a-running-kernel fault reproduced in a
child process, and fixed by SyncOnFreeResourceAdaptor(mode="deferred")."""

import json
import subprocess
import sys

import numpy as np
import pytest
import rmm

from rmm_fences.unsafe import UnmappingVmmMemoryResource

from helpers.paths import VMM_CHILD

pytestmark = pytest.mark.gpu


def child(*args, timeout=300):
    res = subprocess.run(
        [sys.executable, "-P", str(VMM_CHILD), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
    return res, (json.loads(lines[-1]) if lines else None)


def test_unmap_under_a_running_kernel_faults_in_a_child():
    res, report = child("crash")
    print(f"\nvmm_unmap, free while a kernel reads: exit {res.returncode}, {report}")
    assert res.returncode != 0, res.stdout + res.stderr
    assert report and report["error"], res.stdout + res.stderr
    assert "700" in report["error"] or "illegal" in report["error"].lower()


def test_sync_on_free_deferred_makes_it_safe_over_100_trials():
    res, report = child("fenced", "100")
    print(f"\nsync_on_free(vmm_unmap, deferred): exit {res.returncode}, {report}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert report == {"scenario": "fenced", "error": None, "corrupted": 0, "trials": 100}


@pytest.mark.parametrize("nbytes", [1, 1000, 2 << 20, (2 << 20) + 1, 100 << 20])
def test_allocations_are_usable_and_freed_memory_comes_back(cupy, scenarios, nbytes):
    mr = UnmappingVmmMemoryResource("4GiB")
    g = mr.granularity
    assert g > 0 and mr.reserve_size % g == 0
    s = cupy.cuda.Stream(non_blocking=True)
    rs = rmm.pylibrmm.stream.Stream(s)
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    ptrs = [mr.allocate(nbytes, rs) for _ in range(3)]
    assert mr.mapped_bytes == 3 * -(-nbytes // g) * g
    assert len(set(ptrs)) == 3 and all(p % g == 0 for p in ptrs)
    words = nbytes // 4
    errors = cupy.zeros(1, dtype=cupy.uint64)
    for i, p in enumerate(ptrs):  # writes and reads through every block
        if words:
            scenarios.fill(p, words, pattern=i + 11, stream=s)
    for i, p in enumerate(ptrs):
        if words:
            scenarios.check(p, words, pattern=i + 11, errors=errors, stream=s)
    s.synchronize()
    assert int(errors.get()[0]) == 0
    if nbytes >= 100 << 20:
        used = free_before - cupy.cuda.runtime.memGetInfo()[0]
        assert used >= 3 * nbytes  # physical memory really mapped
    for p in ptrs:
        mr.deallocate(p, nbytes, rs)
    assert mr.mapped_bytes == 0
    free_after = cupy.cuda.runtime.memGetInfo()[0]
    assert free_after >= free_before - 4 * g  # unmapped memory went back to the device


def test_exhausted_range_or_memory_is_a_memory_error():
    mr = UnmappingVmmMemoryResource("64MiB")
    with pytest.raises(MemoryError, match="reserved range"):
        mr.allocate(128 << 20)
    a = mr.allocate(32 << 20)
    mr.deallocate(a, 32 << 20)
    big = UnmappingVmmMemoryResource("1TiB")
    with pytest.raises(MemoryError, match="cuMemCreate"):
        big.allocate(int(np.uint64(1) << 39))  # 512 GiB: more than the device has
    assert big.mapped_bytes == 0
