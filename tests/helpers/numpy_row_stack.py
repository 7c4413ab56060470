# SPDX-License-Identifier: Apache-2.0
"""Importing this gives numpy back ``row_stack``: numba-cuda <= 0.30.4, which cuDF loads,
registers it, and numpy 2.5 removed it (docs/rapids.md, "Known problem on numpy 2.5").
test_rapids_gpu.py imports it before cuDF; test_dask_gpu.py has each Dask worker preload this
file (dask-cuda's workers import cuDF where it is installed)."""

import numpy

if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack
