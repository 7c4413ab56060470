# SPDX-License-Identifier: Apache-2.0
"""The adaptor as the current device resource under rmm, CuPy and PyTorch."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import rmm

from rmm_fences import SyncOnFreeResourceAdaptor

pytestmark = pytest.mark.gpu


@pytest.fixture
def installed():
    previous = rmm.mr.get_current_device_resource()
    mr = SyncOnFreeResourceAdaptor(rmm.mr.CudaAsyncMemoryResource(), mode="deferred")
    rmm.mr.set_current_device_resource(mr)
    yield mr
    rmm.mr.set_current_device_resource(previous)


def test_device_buffer(installed, rng):
    data = rng.integers(1, 255, size=1 << 20, dtype=np.uint8)
    buf = rmm.DeviceBuffer.to_device(data.tobytes())
    assert buf.size == data.size
    assert np.array_equal(np.frombuffer(buf.tobytes(), dtype=np.uint8), data)
    del buf
    installed.flush()
    assert installed.stats["deferred"] >= 1 and installed.pending_count == 0


def test_cupy_through_rmm_allocator(installed, rng):
    import cupy
    from rmm.allocators.cupy import rmm_cupy_allocator

    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    try:
        x = rng.standard_normal(1_000_003)
        d = cupy.asarray(x)
        assert np.isclose(float(cupy.sum(d * 2.0)), (x * 2.0).sum(), rtol=1e-12)
        del d
        cupy.cuda.Device().synchronize()
    finally:
        cupy.cuda.set_allocator(previous)
    installed.flush()
    assert installed.stats["deferred"] >= 2 and installed.pending_count == 0


def test_pytorch_through_rmm_allocator():
    pytest.importorskip("torch")
    script = textwrap.dedent(
        """
        import numpy as np, rmm, torch
        from rmm.allocators.torch import rmm_torch_allocator
        from rmm_fences import SyncOnFreeResourceAdaptor
        mr = SyncOnFreeResourceAdaptor(rmm.mr.CudaAsyncMemoryResource())
        rmm.mr.set_current_device_resource(mr)
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        x = np.random.default_rng(5).standard_normal((512, 512))
        t = torch.from_numpy(x).cuda()
        got = (t @ t).sum().item()
        ref = float((x @ x).sum())
        assert abs(got - ref) <= 1e-9 * max(1.0, abs(ref)), (got, ref)
        del t
        torch.cuda.synchronize()
        mr.flush()
        assert mr.stats["deferred"] >= 1 and mr.pending_count == 0, mr.stats
        print("torch ok", mr.stats)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch ok" in proc.stdout


def test_readme_example_runs():
    import re

    from helpers.paths import ROOT

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    total = float(proc.stdout.split()[0])
    assert total == float(sum(range(1 << 20)))  # exact in float64
    assert "'deferred':" in proc.stdout
