# SPDX-License-Identifier: Apache-2.0
"""The repository's folders and files that the tests read, wherever a test module lives."""

import pathlib

#: This package (tests/helpers), the tests' folder and the repository's root.
HELPERS = pathlib.Path(__file__).resolve().parent
TESTS = HELPERS.parent
ROOT = TESTS.parent
#: The host test harness (``rmm_fences_testing``, the policy cores on host memory), built beside
#: its sources by ``make install`` (CMake option RMM_FENCES_BUILD_TESTS=ON); no part of the
#: installed package.
NATIVE_TESTS = TESTS / "native"
#: The benchmarks' library (``rmm_fences_bench``: timing loops, log replay and reader, stress),
#: whose native loops ``make install`` builds in place (CMake option
#: RMM_FENCES_BUILD_BENCHMARKS=ON); no part of the installed package either.
BENCHMARKS = ROOT / "benchmarks"
TOOLS = ROOT / "tools"
DOCS = ROOT / "docs"
DOCS_DATA = DOCS / "data"

#: Scripts the tests run in child processes (see each one's docstring).
TORCH_CHILD = HELPERS / "torch_child.py"
VMM_CHILD = HELPERS / "vmm_child.py"
VMM_POOL_CHILD = HELPERS / "vmm_pool_child.py"
SANITIZER_CHILD = HELPERS / "sanitizer_child.py"
#: Preloaded by each Dask worker of the GPU tests (a file, as dask-cuda's ``preload`` takes it).
ROW_STACK = HELPERS / "numpy_row_stack.py"
