# SPDX-License-Identifier: Apache-2.0
import pytest

from rmm_fences._cuda import device_count, no_device_reason


def pytest_collection_modifyitems(config, items):
    if device_count() > 0:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {no_device_reason()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cupy():
    """CuPy, imported only by GPU tests."""
    import cupy

    return cupy


@pytest.fixture(scope="session")
def scenarios(cupy):
    """rmm_fences._scenarios (the seed's race and its kernels)."""
    from rmm_fences import _scenarios

    return _scenarios


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's id so failures reproduce."""
    import numpy as np

    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
