# SPDX-License-Identifier: Apache-2.0
"""A Dask worker preload (``LocalCUDACluster(preload=[this file])``): ``numpy.row_stack`` where
numpy no longer has it (2.5). numba-cuda up to 0.30.4, which cuDF imports, registers it; without
the alias a worker where cuDF is installed fails to start (docs/rapids.md)."""

import numpy

if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack
