# SPDX-License-Identifier: Apache-2.0
"""The multi-GPU benchmark's tables on a GPU: CuPy makes exactly the rows that the host-side
checks rebuild with NumPy (rmm_fences_bench.multi_gpu)."""

import numpy as np
import pytest

from rmm_fences_bench import multi_gpu as M

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("start", [0, 12_345_678_901])
def test_the_device_makes_the_rows_the_host_rebuilds(cupy, start):
    keys = 1_000_003
    device = M.left_columns(cupy, start, start + 100_000, keys)
    host = M.left_columns(np, start, start + 100_000, keys)
    for name, column in host.items():
        np.testing.assert_array_equal(cupy.asnumpy(device[name]), column, err_msg=name)
    right = M.right_columns(cupy, start, start + 1000)
    np.testing.assert_array_equal(
        cupy.asnumpy(right["z"]), M.right_columns(np, start, start + 1000)["z"]
    )
